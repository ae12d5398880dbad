"""Checks for the optimizers chapter's exercises: your code against the package's or torch's.

Each check runs the reader's function (or optimizer class) and a reference side by side (the
package's :func:`~trainfast.optim.sgd.sgd` and :func:`~trainfast.optim.adam.adam`,
:func:`~trainfast.landscapes.trajectory`, or ``torch.optim`` itself) over several steps and
settings, prints one line per case through :func:`trainfast.checks.report`, and raises
``AssertionError`` naming the first case that differs. Tolerances are float32 rounding: an
equivalent formula written in another order passes, a missing term does not. Several exercises
come from ARENA's optimizer chapter (``opt_fn_with_sgd``, optimizers written from scratch, SGD
with parameter groups).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from trainfast.checks import Case, report
from trainfast.landscapes import SURFACES, SurfaceFn, trajectory
from trainfast.optim.adam import adam
from trainfast.optim.groups import NO_DECAY_MODULES, weight_decay_groups
from trainfast.optim.sgd import sgd

__all__ = [
    "check_adam",
    "check_adam_step",
    "check_decay_groups",
    "check_decay_rule",
    "check_momentum_step",
    "check_opt_fn_with_sgd",
    "check_rmsprop",
    "check_sgd",
    "check_sgd_param_groups",
]

MomentumStep = Callable[[Tensor, Tensor, Tensor, float, float, float], None]
AdamStep = Callable[[Tensor, Tensor, Tensor, Tensor, int, float, float, float, float], None]

_RTOL, _ATOL = 1e-5, 1e-6


def _difference(name: str, ours: Tensor, reference: Tensor) -> str | None:
    if not torch.allclose(ours, reference, rtol=_RTOL, atol=_ATOL):
        return f"{name} differs by up to {(ours - reference).abs().max().item():.2e}"
    return None


def check_momentum_step(step: MomentumStep, *, steps: int = 5, seed: int = 0) -> None:
    """Check ``step(param, grad, buffer, lr, momentum, dampening)``, SGD with momentum.

    ``step`` must update ``param`` and ``buffer`` in place. The check takes the first step
    itself (the buffer starts as a copy of the first gradient, as in ``torch.optim.SGD``) and
    calls ``step`` from the second step on.
    """
    results = []
    for lr, momentum, dampening in [(0.1, 0.9, 0.0), (0.01, 0.5, 0.1), (0.5, 0.99, 0.5)]:
        case = f"lr={lr}, momentum={momentum}, dampening={dampening}, {steps} steps"
        generator = torch.Generator().manual_seed(seed)
        param = torch.randn(4, 3, generator=generator)
        reference = param.clone()
        buffer: Tensor | None = None
        reference_buffers: list[Tensor | None] = [None]
        problem = None
        for _ in range(steps):
            grad = torch.randn(4, 3, generator=generator)
            if buffer is None:
                buffer = grad.clone()  # b_1 = g_1; the step below then applies it
                param.add_(buffer, alpha=-lr)
            else:
                step(param, grad.clone(), buffer, lr, momentum, dampening)
            sgd(
                [reference],
                [grad],
                reference_buffers,
                lr=lr,
                weight_decay=0.0,
                momentum=momentum,
                dampening=dampening,
                nesterov=False,
                maximize=False,
            )
            problem = _difference("param", param, reference) or _difference(
                "buffer",
                buffer,
                reference_buffers[0],  # type: ignore[arg-type]
            )
            if problem:
                break
        results.append((case, problem))
    report(results)


def check_adam_step(step: AdamStep, *, steps: int = 5, seed: int = 0) -> None:
    """Check ``step(param, grad, exp_avg, exp_avg_sq, t, lr, beta1, beta2, eps)``, Adam at step t.

    ``t`` counts from 1; ``step`` must update ``param``, ``exp_avg`` and ``exp_avg_sq`` in place.
    """
    results = []
    for lr, beta1, beta2, eps in [(1e-3, 0.9, 0.999, 1e-8), (0.1, 0.5, 0.9, 1e-3)]:
        case = f"lr={lr}, betas=({beta1}, {beta2}), eps={eps}, {steps} steps"
        generator = torch.Generator().manual_seed(seed)
        param = torch.randn(5, generator=generator)
        reference = param.clone()
        exp_avg, exp_avg_sq = torch.zeros(5), torch.zeros(5)
        ref_avg, ref_avg_sq, ref_step = torch.zeros(5), torch.zeros(5), torch.tensor(0.0)
        problem = None
        for t in range(1, steps + 1):
            grad = torch.randn(5, generator=generator)
            step(param, grad.clone(), exp_avg, exp_avg_sq, t, lr, beta1, beta2, eps)
            adam(
                [reference],
                [grad],
                [ref_avg],
                [ref_avg_sq],
                [],
                [ref_step],
                lr=lr,
                beta1=beta1,
                beta2=beta2,
                eps=eps,
                weight_decay=0.0,
                amsgrad=False,
                maximize=False,
                decoupled_weight_decay=False,
            )
            problem = (
                _difference(f"exp_avg at t={t}", exp_avg, ref_avg)
                or _difference(f"exp_avg_sq at t={t}", exp_avg_sq, ref_avg_sq)
                or _difference(f"param at t={t}", param, reference)
            )
            if problem:
                break
        results.append((case, problem))
    report(results)


def check_decay_groups(
    optimizer: torch.optim.Optimizer, model: nn.Module, weight_decay: float
) -> None:
    """Check that ``optimizer`` decays exactly the weight matrices of ``model``.

    Every parameter must appear in exactly one group; weight matrices (2-D or more, outside
    normalisation and embedding modules) must have ``weight_decay``, everything else 0.
    """
    decay_of = {}
    results: list[Case] = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) in decay_of:
                results.append(("every parameter in one group", "a parameter is in two groups"))
            decay_of[id(param)] = group["weight_decay"]
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            is_matrix = param.ndim >= 2 and not isinstance(module, NO_DECAY_MODULES)
            expected = weight_decay if is_matrix else 0.0
            if id(param) not in decay_of:
                results.append((full, "missing from the optimizer"))
            elif decay_of[id(param)] != expected:
                results.append((full, f"weight_decay={decay_of[id(param)]}, expected {expected}"))
            else:
                results.append((f"{full} {tuple(param.shape)}: weight_decay={expected}", None))
    report(results)


OptFn = Callable[[SurfaceFn, Tensor, float, float, int], Tensor]


def check_opt_fn_with_sgd(opt_fn: OptFn) -> None:
    """Check ``opt_fn(fn, xy, lr, momentum, n_iters)``: the points SGD visits minimising ``fn``.

    ``xy`` is the start, a tensor of shape ``(2,)``; the result must have shape
    ``(n_iters + 1, 2)``: row 0 the start, row ``t`` the point after ``t`` steps of
    ``torch.optim.SGD(lr=lr, momentum=momentum)`` on ``fn(x, y)``. The reference is
    :func:`~trainfast.landscapes.trajectory`. ``xy`` must not be modified.
    """
    results: list[Case] = []
    for name, lr, momentum, n_iters in [
        ("pathological_curvature", 0.1, 0.0, 20),
        ("pathological_curvature", 0.1, 0.9, 20),
        ("rosenbrock", 1e-3, 0.9, 30),
        ("neg_gaussians", 0.3, 0.9, 25),
    ]:
        surface = SURFACES[name]
        case = f"{name}, lr={lr}, momentum={momentum}, {n_iters} steps"
        start = torch.tensor(surface.start)
        xy = start.clone()
        reference = trajectory(
            surface, start, partial(torch.optim.SGD, lr=lr, momentum=momentum), n_iters
        )
        path = torch.as_tensor(opt_fn(surface.fn, xy, lr, momentum, n_iters)).detach()
        if not torch.equal(xy, start):
            results.append((case, "xy was modified in place; optimise a copy"))
        elif path.shape != reference.shape:
            expected = tuple(reference.shape)
            results.append(
                (case, f"shape {tuple(path.shape)}, expected {expected} (start included)")
            )
        else:
            results.append((case, _difference("path", path.to(reference.dtype), reference)))
    report(results)


def _train_side_by_side(
    build_ours: Callable[[Iterable[Any]], Any],
    build_torch: Callable[[Iterable[Any]], torch.optim.Optimizer],
    *,
    steps: int,
    seed: int,
) -> str | None:
    """Train two copies of a small MLP, one per optimizer; the first difference, or None.

    The gradients are never zeroed: each backward adds to what the last step left in ``.grad``,
    on both copies alike, so a ``step()`` that rewrites ``p.grad`` in place (the pitfall of an
    aliased ``g = p.grad; g += ...``) changes every later step. It is also caught at once: each
    ``.grad`` must be the same after our ``step()`` as before it.
    """
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    twin = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    twin.load_state_dict(model.state_dict())
    ours, theirs = build_ours(model), build_torch(twin)
    generator = torch.Generator().manual_seed(seed)
    for t in range(1, steps + 1):
        inputs = torch.randn(16, 4, generator=generator)  # (batch, features)
        targets = torch.randint(0, 3, (16,), generator=generator)
        for network in (model, twin):
            nn.functional.cross_entropy(network(inputs), targets).backward()
        before = {name: p.grad.clone() for name, p in model.named_parameters()}
        ours.step()
        theirs.step()
        for name, p in model.named_parameters():
            if p.grad is None or not torch.equal(p.grad, before[name]):
                return (
                    f"step {t} changed {name}.grad, the caller's gradient: compute the update "
                    "out of place (grad + wd * param, not grad.add_) and leave .grad alone"
                )
        for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
            if (
                problem := _difference(f"{name} after step {t}", p.detach(), q.detach())
            ) is not None:
                return problem
    return None


def _check_against_torch(
    optimizer_class: type, torch_class: type, settings: list[dict[str, Any]], steps: int
) -> None:
    results: list[Case] = []
    for index, config in enumerate(settings):
        case = f"{optimizer_class.__name__}({', '.join(f'{k}={v}' for k, v in config.items())})"
        try:
            problem = _train_side_by_side(
                lambda m, c=config: optimizer_class(m.parameters(), **c),
                lambda m, c=config: torch_class(m.parameters(), **c),
                steps=steps,
                seed=index,
            )
        except Exception as error:  # the reader's class raised: report it as this case's problem
            problem = f"raised {type(error).__name__}: {error}"
        results.append((f"{case} vs torch.optim.{torch_class.__name__}, {steps} steps", problem))
    report(results)


def check_sgd(optimizer_class: type, *, steps: int = 5) -> None:
    """Check an SGD written from scratch against ``torch.optim.SGD`` over ``steps`` steps.

    ``optimizer_class(params, lr, momentum=0.0, weight_decay=0.0)`` must take an iterable of
    parameters and have a ``step()`` that updates them from their ``.grad`` and leaves every
    ``.grad`` as it found it (the check never zeroes the gradients, on either copy, so a
    rewritten ``.grad`` would carry into the next step).
    """
    settings = [
        {"lr": 0.1},
        {"lr": 0.1, "momentum": 0.9},
        {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.1},
    ]
    _check_against_torch(optimizer_class, torch.optim.SGD, settings, steps)


def check_rmsprop(optimizer_class: type, *, steps: int = 5) -> None:
    """Check an RMSprop written from scratch against ``torch.optim.RMSprop``.

    ``optimizer_class(params, lr, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0)``, with
    a ``step()`` as in :func:`check_sgd`.
    """
    settings = [
        {"lr": 0.01},
        {"lr": 0.01, "alpha": 0.9, "momentum": 0.5},
        {"lr": 0.005, "alpha": 0.95, "eps": 1e-3, "weight_decay": 0.1, "momentum": 0.9},
    ]
    _check_against_torch(optimizer_class, torch.optim.RMSprop, settings, steps)


def check_adam(optimizer_class: type, *, steps: int = 5) -> None:
    """Check an Adam written from scratch against ``torch.optim.Adam``.

    ``optimizer_class(params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)`` (L2 weight
    decay, as ``torch.optim.Adam``), with a ``step()`` as in :func:`check_sgd`.
    """
    settings = [
        {"lr": 0.01},
        {"lr": 0.01, "betas": (0.5, 0.9)},
        {"lr": 0.005, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.1},
    ]
    _check_against_torch(optimizer_class, torch.optim.Adam, settings, steps)


def check_sgd_param_groups(optimizer_class: type, *, steps: int = 5) -> None:
    """Check an SGD that accepts parameter groups against ``torch.optim.SGD``.

    ``optimizer_class(params, **defaults)``, where ``params`` is a list of dicts with a
    ``"params"`` entry and optional ``"lr"``, ``"momentum"``, ``"weight_decay"``: a group's own
    value wins over ``defaults``, and ``momentum``/``weight_decay`` default to 0. A group with
    no ``lr`` when ``defaults`` has none must raise ``ValueError``.
    """

    def groups(model: nn.Module, with_lr: bool = True) -> list[dict[str, Any]]:
        first, second = model[0], model[2]
        return [
            {"params": [first.weight], "lr": 0.01} if with_lr else {"params": [first.weight]},
            {"params": [first.bias], "momentum": 0.5},
            {"params": list(second.parameters()), "weight_decay": 0.1, "lr": 0.2},
        ]

    results: list[Case] = []
    for index, defaults in enumerate([{"lr": 0.1}, {"lr": 0.1, "momentum": 0.9}]):
        case = f"three groups, defaults {defaults}, {steps} steps vs torch.optim.SGD"
        try:
            problem = _train_side_by_side(
                lambda m, d=defaults: optimizer_class(groups(m), **d),
                lambda m, d=defaults: torch.optim.SGD(groups(m), **d),
                steps=steps,
                seed=index,
            )
        except Exception as error:
            problem = f"raised {type(error).__name__}: {error}"
        results.append((case, problem))
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    case = "a group without lr, and no default lr: ValueError"
    try:
        optimizer_class(groups(model, with_lr=False), momentum=0.9)
        results.append((case, "no error raised"))
    except ValueError:
        results.append((case, None))
    except Exception as error:
        results.append((case, f"raised {type(error).__name__}, expected ValueError"))
    report(results)


DecayRule = Callable[[nn.Module, str, Tensor], bool]


def check_decay_rule(decays: DecayRule) -> None:
    """Check ``decays(module, name, param)``: should this parameter get weight decay?

    ``module`` is the module that holds the parameter directly, ``name`` its name there. The
    reference is :func:`~trainfast.optim.groups.weight_decay_groups`, on a transformer block
    (whose attention keeps a packed ``in_proj_bias``), an embedding, a small CNN, a layer
    with ``nn.RMSNorm`` and ``nn.PReLU``, which :data:`NO_DECAY_MODULES` does not list, and an
    ``nn.EmbeddingBag``, which is not an ``nn.Embedding``.
    """
    models = {
        "TransformerEncoderLayer": nn.TransformerEncoderLayer(d_model=16, nhead=2),
        "embedding + LayerNorm + head": nn.Sequential(
            nn.Embedding(10, 8), nn.LayerNorm(8), nn.Linear(8, 10)
        ),
        "CNN with BatchNorm": nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()),
        "RMSNorm + PReLU": nn.Sequential(nn.Linear(8, 8, bias=False), nn.RMSNorm(8), nn.PReLU()),
        # not a subclass of nn.Embedding: a rule that names only nn.Embedding decays its table
        "EmbeddingBag + head": nn.Sequential(nn.EmbeddingBag(10, 8), nn.Linear(8, 2)),
    }
    results: list[Case] = []
    for model_name, model in models.items():
        decayed = {id(p) for p in weight_decay_groups(model, 0.1)[0]["params"]}
        for module_name, module in model.named_modules():
            for name, param in module.named_parameters(recurse=False):
                full = f"{model_name}: {module_name + '.' if module_name else ''}{name}"
                expected = id(param) in decayed
                answer = decays(module, name, param)
                word = "decay" if expected else "no decay"
                problem = None if answer == expected else f"got {answer}, expected {expected}"
                results.append((f"{full} {tuple(param.shape)}: {word}", problem))
    report(results)


#: The optimizers of :func:`check_optimizer_for_budget`, most preferred first
BUDGET_PREFERENCE = ("adamw", "momentum", "sgd")


def check_optimizer_for_budget(choose: Callable[[float, float], str | None]) -> None:
    """Check ``choose(n_params, budget_gb)``: the most preferred optimizer whose memory fits.

    Preference is AdamW, then SGD with momentum, then plain SGD (:data:`BUDGET_PREFERENCE`);
    the memory is the float32 weights, gradients and optimizer state,
    :func:`trainfast.accounting.bytes_per_parameter` per parameter, in GB of 10⁹ bytes; a total
    equal to the budget fits. ``None`` when not even SGD fits.
    """
    from trainfast.accounting import bytes_per_parameter

    def reference(n_params: float, budget_gb: float) -> str | None:
        for name in BUDGET_PREFERENCE:
            if bytes_per_parameter("fp32", name).total * n_params <= budget_gb * 1e9:
                return name
        return None

    # 1.05e9 parameters in 16 GB: momentum in GB of 10^9 bytes, AdamW in GiB of 2^30
    cases = [(1e9, 20.0), (1e9, 16.0), (1e9, 14.0), (1e9, 10.0), (1e9, 7.0), (3e8, 5.0)]
    cases.append((1.05e9, 16.0))
    results: list[Case] = []
    for n_params, budget in cases:
        expected, answer = reference(n_params, budget), choose(n_params, budget)
        problem = None if answer == expected else f"got {answer!r}, expected {expected!r}"
        results.append((f"{n_params:.3g} parameters in {budget:g} GB: {expected}", problem))
    report(results)
