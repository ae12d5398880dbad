r"""Muon: momentum, orthogonalised by a Newton–Schulz iteration, for hidden weight matrices.

Keller Jordan's optimizer (https://kellerjordan.github.io/posts/muon/, code at
https://github.com/KellerJordan/Muon): run SGD-momentum on a weight matrix, then replace the
update :math:`G = U S V^\top` by (roughly) its nearest semi-orthogonal matrix :math:`U V^\top`,
which makes every singular direction move at the same rate. Five steps of a quintic
Newton–Schulz iteration in bfloat16 compute that cheaply on a GPU, with no SVD (``ns_dtype``
picks another format where bfloat16 products are slow, as on a CPU without bfloat16 units).

Muon is for the 2-D weights of hidden layers. Embeddings, the output layer, biases and norm
gains are trained with AdamW; :class:`Muon` does both in one optimizer, like Keller Jordan's
``MuonWithAuxAdam``, and :func:`muon_param_groups` splits a model's parameters between the two.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.optim.optimizer import ParamsT

from trainfast.optim._foreach import group_by_device_and_dtype
from trainfast.optim._validate import CheckedOptimizer, check_hyperparameters
from trainfast.optim.adam import adam, init_adam_state
from trainfast.validation import check_counts, check_int, check_number

__all__ = [
    "init_muon_state",
    "newton_schulz_flops",
    "multi_tensor_muon",
    "Muon",
    "muon",
    "muon_param_groups",
    "muon_update",
    "NS_DTYPES",
    "check_ns_dtype",
    "orthogonalized_update",
    "update_scale",
    "single_tensor_muon",
    "zeropower_via_newtonschulz5",
]

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # (a, b, c) of the quintic, from Keller Jordan


def zeropower_via_newtonschulz5(
    G: Tensor,
    steps: int,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    r"""Approximately orthogonalise the matrix ``G``: map :math:`U S V^\top` to :math:`U S' V^\top`.

    Each step applies the odd quintic :math:`p(X) = aX + b(XX^\top)X + c(XX^\top)^2X`, which acts
    on every singular value separately as :math:`s \mapsto as + bs^3 + cs^5`. The coefficients
    are tuned for the steepest slope at 0, so small singular values grow fast; the price is that
    after 5 steps they land in roughly [0.7, 1.2] rather than exactly at 1, which does not hurt
    training (Keller Jordan's measurement). Runs in ``dtype`` and returns it: bfloat16 as the
    original, or float32 on a machine whose bfloat16 products are slower than its float32 ones.

    Not an exact polar decomposition: for that use an SVD (``U @ Vh`` from
    ``torch.linalg.svd``).
    """
    if G.ndim != 2:
        raise ValueError(f"Newton-Schulz orthogonalises a 2-D matrix, got shape {tuple(G.shape)}")
    check_int("steps", steps, minimum=0)  # range(-3) would return G merely normalised
    check_ns_dtype(dtype)
    a, b, c = coefficients
    X = G.to(dtype)  # (rows, cols)
    transposed = G.size(0) > G.size(1)
    if transposed:
        X = X.T  # (cols, rows): keep the Gram matrix X Xᵀ the smaller of the two
    # dividing by the Frobenius norm (≥ the spectral norm) puts every singular value in [0, 1]
    X = X / (X.norm() + eps)
    for _ in range(steps):
        A = X @ X.T  # (m, m), m = min(rows, cols)
        B = b * A + c * A @ A  # (m, m)
        X = a * X + B @ X  # (m, n), n = max(rows, cols)
    if transposed:
        X = X.T  # (rows, cols)
    return X


def newton_schulz_flops(rows: int, cols: int, steps: int = 5) -> int:
    """The floating-point operations of :func:`zeropower_via_newtonschulz5` on a (rows, cols)
    matrix, counting a multiply-add as 2: per step, with ``m = min`` and ``n = max`` of the two,
    ``X Xᵀ`` (2·m·n·m), ``A @ A`` (2·m³) and ``B @ X`` (2·m·m·n), so ``steps · (4m²n + 2m³)``.

    The products' part only (the scalings and additions are ``O(m·n)``), which is what a FLOP
    counter counts: against a step's forward and backward passes, ``6·batch·m·n`` for the same
    matrix, the ratio is ``steps·(4 + 2m/n)·m / (6·batch)``, about ``steps·m / batch`` for a
    square one. Newton–Schulz is a large share of a step at a small batch and a negligible one
    at a language model's batch of hundreds of thousands of tokens.
    """
    if rows < 1 or cols < 1 or steps < 0:
        raise ValueError(f"Invalid shape ({rows}, {cols}) or steps {steps}")
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4 * m * m * n + 2 * m**3)


#: The formats the Newton–Schulz iteration may run in
NS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_ns_dtype(dtype: object) -> None:
    """``ValueError`` naming ``dtype`` unless it is one of :data:`NS_DTYPES`."""
    if dtype not in NS_DTYPES:
        raise ValueError(f"Invalid ns_dtype: {dtype!r} (expected one of {NS_DTYPES})")


#: How :func:`orthogonalized_update` scales the orthogonal matrix (torch's ``adjust_lr_fn``)
ADJUST_LR_FNS = ("original", "match_rms_adamw")


def update_scale(rows: int, cols: int, adjust_lr_fn: str = "original") -> float:
    """The factor that multiplies the orthogonalised (rows, cols) update.

    ``"original"`` (Keller Jordan): ``sqrt(max(1, rows / cols))``, so tall matrices' updates are
    as large as square ones'. ``"match_rms_adamw"`` (Liu et al. 2025, Moonlight):
    ``0.2 * sqrt(max(rows, cols))``, which gives the update an RMS of about 0.2, that of a
    typical AdamW update, so Muon can share AdamW's learning rate and weight decay.
    """

    check_counts(rows=rows, cols=cols)
    if adjust_lr_fn == "original":
        return max(1, rows / cols) ** 0.5
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * max(rows, cols) ** 0.5
    raise ValueError(f"Invalid adjust_lr_fn: {adjust_lr_fn!r} (expected one of {ADJUST_LR_FNS})")


def orthogonalized_update(
    update: Tensor,
    *,
    ns_steps: int = 5,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    adjust_lr_fn: str = "original",
    ns_dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """Orthogonalise a (rows, cols) update and scale it by :func:`update_scale`.

    The orthogonal matrix has entries of RMS ``1/sqrt(max(rows, cols))``; the original scale
    keeps tall matrices' updates as large as those of square ones. Returns ``ns_dtype``.
    """
    rows, cols = update.shape
    check_number("eps", eps, above=0.0)  # what keeps the first division finite
    scale = update_scale(rows, cols, adjust_lr_fn)
    update = zeropower_via_newtonschulz5(update, ns_steps, coefficients, eps, ns_dtype)
    update *= scale
    return update


def muon_update(
    grad: Tensor,
    momentum_buffer: Tensor,
    *,
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    adjust_lr_fn: str = "original",
    ns_dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    r"""Muon's update direction for one weight matrix; updates ``momentum_buffer`` in place.

    :math:`B_t = \mu B_{t-1} + (1-\mu) g_t`, then with Nesterov the look-ahead
    :math:`(1-\mu) g_t + \mu B_t`, orthogonalised and scaled by :func:`orthogonalized_update`.
    The caller applies it: :math:`\theta \leftarrow (1 - \gamma\lambda)\theta - \gamma \cdot
    \text{update}`. Unlike the original, ``grad`` is not modified.
    """
    if grad.ndim != 2:
        raise ValueError(
            f"Muon updates 2-D weight matrices, got a gradient of shape {tuple(grad.shape)}"
        )
    momentum_buffer.lerp_(grad, 1 - momentum)  # B_t = μ B_{t-1} + (1 - μ) g_t
    update = grad.lerp(momentum_buffer, momentum) if nesterov else momentum_buffer
    return orthogonalized_update(
        update,
        ns_steps=ns_steps,
        coefficients=coefficients,
        eps=eps,
        adjust_lr_fn=adjust_lr_fn,
        ns_dtype=ns_dtype,
    )


def muon(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffers: list[Tensor],
    *,
    lr: float,
    momentum: float,
    nesterov: bool,
    ns_steps: int,
    weight_decay: float,
    adjust_lr_fn: str = "original",
    ns_dtype: torch.dtype = torch.bfloat16,
    foreach: bool = False,
) -> None:
    """One Muon step on the 2-D ``params`` in place, with decoupled weight decay.

    ``foreach=True`` does the momentum, weight decay and final add with ``torch._foreach_*``
    ops; the Newton–Schulz iteration stays one matrix at a time (matrices of different shapes
    cannot share a batched matmul), so on a GPU the gain is small.
    """
    implementation = multi_tensor_muon if foreach else single_tensor_muon
    implementation(
        params,
        grads,
        momentum_buffers,
        lr=lr,
        momentum=momentum,
        nesterov=nesterov,
        ns_steps=ns_steps,
        weight_decay=weight_decay,
        adjust_lr_fn=adjust_lr_fn,
        ns_dtype=ns_dtype,
    )


def single_tensor_muon(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffers: list[Tensor],
    *,
    lr: float,
    momentum: float,
    nesterov: bool,
    ns_steps: int,
    weight_decay: float,
    adjust_lr_fn: str = "original",
    ns_dtype: torch.dtype = torch.bfloat16,
) -> None:
    for param, grad, buf in zip(params, grads, momentum_buffers, strict=True):
        update = muon_update(
            grad,
            buf,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
            ns_dtype=ns_dtype,
        )
        if weight_decay != 0:
            param.mul_(1 - lr * weight_decay)  # decoupled, as AdamW
        param.add_(update, alpha=-lr)  # (rows, cols), ns_dtype update added in param's dtype


def multi_tensor_muon(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffers: list[Tensor],
    *,
    lr: float,
    momentum: float,
    nesterov: bool,
    ns_steps: int,
    weight_decay: float,
    adjust_lr_fn: str = "original",
    ns_dtype: torch.dtype = torch.bfloat16,
) -> None:
    if len(params) == 0:
        return
    for lists, _ in group_by_device_and_dtype(params, grads, momentum_buffers):
        device_params, device_grads, device_bufs = (cast(list[Tensor], t) for t in lists)
        torch._foreach_lerp_(device_bufs, device_grads, 1 - momentum)
        if nesterov:
            updates = torch._foreach_lerp(device_grads, device_bufs, momentum)
        else:
            updates = device_bufs
        # in the parameters' dtype (exact from bfloat16), so _foreach_add_ sees one dtype
        updates = [
            orthogonalized_update(
                u, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn, ns_dtype=ns_dtype
            ).to(p.dtype)
            for u, p in zip(updates, device_params, strict=True)
        ]
        if weight_decay != 0:
            torch._foreach_mul_(device_params, 1 - lr * weight_decay)
        torch._foreach_add_(device_params, updates, alpha=-lr)


def init_muon_state(state: dict[str, Any], param: Tensor) -> None:
    """Create Muon's state for the matrix ``param``: one momentum buffer, zero at the start."""
    state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)


class Muon(CheckedOptimizer):
    """Muon for 2-D hidden weights and AdamW for everything else, in one optimizer.

    Each parameter group has ``use_muon`` (default ``True``). Groups with ``use_muon=True`` take
    Muon steps with settings ``lr``, ``momentum``, ``nesterov``, ``ns_steps``, ``ns_dtype``,
    ``adjust_lr_fn`` and ``weight_decay`` (decoupled); their parameters must be 2-D. Groups
    with ``use_muon=False`` take AdamW steps with ``lr``, ``betas``, ``eps`` and
    ``weight_decay``. A setting missing from a group comes from the matching constructor
    argument: ``lr`` etc. for Muon groups,
    ``adamw_lr``, ``adamw_betas``, ``adamw_eps``, ``adamw_weight_decay`` for AdamW groups.
    ``ns_dtype`` is the Newton–Schulz iteration's format (bfloat16, as the original; float32
    where bfloat16 products are slower, as on a CPU without bfloat16 units; float16 is allowed).
    Defaults are Keller Jordan's ``MuonWithAuxAdam`` (Muon lr 0.02, momentum 0.95, Nesterov;
    AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-10; no weight decay). Build the groups with
    :func:`muon_param_groups`::

        optimizer = Muon(muon_param_groups(model), lr=0.02, adamw_lr=3e-4)

    An LR scheduler scales both kinds of group's ``lr`` by the same factor. With the default
    ``adjust_lr_fn="original"``, ``lr`` is "in units of spectral norm per update" (Keller
    Jordan), so it is not comparable to an AdamW lr. ``adjust_lr_fn="match_rms_adamw"`` scales
    each update to AdamW's typical RMS, ``0.2 * sqrt(max(rows, cols))`` (Liu et al. 2025,
    Moonlight, who add decoupled weight decay too), so one lr and one weight decay can serve
    both kinds of group; the names are ``torch.optim.Muon``'s.
    Differences from the original: the AdamW groups run :func:`~trainfast.optim.adam.adam`, the
    same math as ``torch.optim.AdamW`` (the original's ``adam_update`` is algebraically equal,
    rounded differently); parameters without a gradient are skipped rather than given a zero
    gradient (that is for the original's distributed variant); 4-D conv filters are refused
    rather than flattened, and ``grad`` is never modified. When not to use it: on embeddings, the
    output layer or anything that is not a matrix (give those to the AdamW groups), and not
    without an AdamW baseline to compare: its gains are reported on transformer and CIFAR-10
    speedruns, not shown for every model.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        weight_decay: float = 0.0,
        *,
        adamw_lr: float = 3e-4,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_eps: float = 1e-10,
        adamw_weight_decay: float = 0.0,
        adjust_lr_fn: str = "original",
        ns_dtype: torch.dtype = torch.bfloat16,
        foreach: bool = False,
    ) -> None:
        check_int("ns_steps", ns_steps, minimum=0)
        update_scale(1, 1, adjust_lr_fn)  # raises on an unknown name
        check_ns_dtype(ns_dtype)
        self.muon_defaults = {
            "lr": lr,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "weight_decay": weight_decay,
            "adjust_lr_fn": adjust_lr_fn,
            "ns_dtype": ns_dtype,
        }
        self.adamw_defaults = {
            "lr": adamw_lr,
            "betas": adamw_betas,
            "eps": adamw_eps,
            "weight_decay": adamw_weight_decay,
        }
        check_hyperparameters(self.muon_defaults)
        check_hyperparameters(self.adamw_defaults)
        super().__init__(params, {"use_muon": True, "foreach": foreach})

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # load_state_dict comes here too, with the saved groups
        for group in self.param_groups:  # saved before ns_dtype existed: the original's format
            if group.get("use_muon"):
                group.setdefault("ns_dtype", torch.bfloat16)

    def __getstate__(self) -> dict[str, Any]:
        # torch.optim.Optimizer pickles only defaults, state and groups; keep ours for copies
        return {
            **super().__getstate__(),
            "muon_defaults": self.muon_defaults,
            "adamw_defaults": self.adamw_defaults,
        }

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group, filling its missing settings from the Muon or the AdamW defaults."""
        params = param_group["params"]
        param_group["params"] = [params] if isinstance(params, Tensor) else list(params)
        use_muon = param_group.setdefault("use_muon", True)
        for key, value in (self.muon_defaults if use_muon else self.adamw_defaults).items():
            param_group.setdefault(key, value)
        if use_muon:
            check_ns_dtype(param_group["ns_dtype"])
            for p in param_group["params"]:
                if p.ndim != 2:
                    raise ValueError(
                        f"Muon updates 2-D weight matrices only, got a parameter of shape "
                        f"{tuple(p.shape)} in a use_muon=True group: put it in a use_muon=False "
                        "(AdamW) group, e.g. with muon_param_groups(model)"
                    )
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Take one step for every parameter that has a gradient; return ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            if group["use_muon"]:
                params, grads, states = self.gather_group(group, init_muon_state)
                muon(
                    params,
                    grads,
                    [state["momentum_buffer"] for state in states],
                    lr=group["lr"],
                    momentum=group["momentum"],
                    nesterov=group["nesterov"],
                    ns_steps=group["ns_steps"],
                    weight_decay=group["weight_decay"],
                    adjust_lr_fn=group["adjust_lr_fn"],
                    ns_dtype=group["ns_dtype"],
                    foreach=group["foreach"],
                )
            else:
                params, grads, states = self.gather_group(
                    group, partial(init_adam_state, amsgrad=False)
                )
                beta1, beta2 = group["betas"]
                adam(
                    params,
                    grads,
                    [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states],
                    [],
                    [s["step"] for s in states],
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    amsgrad=False,
                    maximize=False,
                    decoupled_weight_decay=True,
                    foreach=group["foreach"],
                )
        return loss


def muon_param_groups(
    model: nn.Module,
    *,
    output_layer: nn.Module | None = None,
    input_layer: nn.Module | None = None,
) -> list[dict[str, Any]]:
    """Split ``model``'s parameters into a Muon group and an AdamW group, for :class:`Muon`.

    Muon gets the weights of the hidden ``nn.Linear`` layers; AdamW gets everything else:
    embeddings, the input and output layers, biases, norm gains, and any weight shared with
    another module (a tied embedding). The output layer is ``output_layer`` if given, else the
    last ``nn.Linear`` the model registers; pass it when the head is registered earlier or is
    not an ``nn.Linear``. A transformer's input layer is its embedding, which is not an
    ``nn.Linear``; an MLP's is its first ``nn.Linear``, which only the caller can name: pass it
    as ``input_layer`` (Keller Jordan keeps the first and last layers on AdamW). Add settings to
    the returned dicts (e.g. ``groups[1]["lr"] = 1e-3``) to override the optimizer's. Empty
    groups are left out.
    """
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    head = output_layer if output_layer is not None else (linears[-1] if linears else None)
    hidden = {id(m.weight) for m in linears if m is not head and m is not input_layer}
    # a hidden weight that another module also holds (weight tying) goes to AdamW
    elsewhere = {
        id(p)
        for m in model.modules()
        for name, p in m.named_parameters(recurse=False)
        if not (isinstance(m, nn.Linear) and id(m.weight) in hidden and name == "weight")
    }
    muon_params, adamw_params = [], []
    for p in model.parameters():  # each shared parameter once
        if id(p) in hidden and id(p) not in elsewhere:
            muon_params.append(p)
        else:
            adamw_params.append(p)
    groups = [
        {"params": muon_params, "use_muon": True},
        {"params": adamw_params, "use_muon": False},
    ]
    return [g for g in groups if g["params"]]
