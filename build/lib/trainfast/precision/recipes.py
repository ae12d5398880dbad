"""Training recipes side by side: fp32, bf16 and fp16 autocast, loss scaling, pure bf16.

A *recipe* (:class:`trainfast.recipes.Recipe`, one of :data:`trainfast.recipes.RECIPES`) says which
dtype each part of a training step uses, and what that costs in bytes. With ``torch.autocast`` the
parameters stay float32 (they are the *master weights*), the matrix products run in bf16 or fp16 on
copies cast on the fly, and the gradients arrive in float32. A *pure* bf16 recipe stores the
parameters themselves in bf16, so the optimizer adds each update to a bf16 weight: an update smaller
than half the weight's last bit is rounded away.

:func:`training_step` is one step under a recipe (the chapter's listing); :func:`train_recipe`
runs it on the digits classifier and records what the chapter plots: the loss, the loss scale,
skipped steps, the fraction of gradient elements that are exactly zero, and the fraction of
updates that left a weight unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer

from trainfast.precision.loss_scaling import GradScaler
from trainfast.precision.tf32 import tf32_matmuls
from trainfast.recipes import RECIPES, Recipe
from trainfast.validation import check_int, check_number

__all__ = [
    "RecipeRun",
    "activation_gradients",
    "check_runnable",
    "digits_classifier",
    "train_recipe",
    "training_step",
]


def check_runnable(recipe: Recipe) -> None:
    """Raise ``ValueError`` naming ``recipe`` if :func:`training_step` cannot run it as stated:
    it keeps no fp32 master copy of low-precision weights and runs no FP8 matmuls."""
    if recipe.master_bytes or recipe.compute_format == "fp8":
        raise ValueError(
            f"Invalid recipe for training_step: {recipe.name!r} (master_bytes="
            f"{recipe.master_bytes}, compute_format={recipe.compute_format!r}); it runs no "
            "master weights and no FP8 matmuls"
        )


def training_step(
    model: nn.Module,
    optimizer: Optimizer,
    inputs: Tensor,
    targets: Tensor,
    recipe: Recipe,
    scaler: GradScaler | torch.amp.GradScaler | None = None,
    loss_divisor: float = 1.0,
) -> Tensor:
    """One step of ``recipe``: autocast forward, (scaled) backward, update.

    The loss is the cross-entropy of ``model(inputs)``, ``(batch, classes)`` or
    ``(batch, seq, vocab)`` logits, in float32 in every recipe (autocast does
    that for cross-entropy; for pure bf16 we upcast the logits), divided by
    ``loss_divisor`` before backward: :func:`train_recipe` explains why.
    Matmuls of a ``"tf32"`` recipe run in TF32 on a GPU (:func:`tf32_matmuls`), of every other
    recipe in their own dtype. Returns the undivided loss, detached. Raises ``ValueError`` for a
    recipe this step cannot run: fp32 master weights (use ``torch.autocast``'s fp32 weights, or
    an optimizer that keeps the copy) and FP8 matmuls (:func:`~trainfast.precision.fp8.fp8_linear`).
    """
    check_runnable(recipe)
    optimizer.zero_grad(set_to_none=True)
    if inputs.is_floating_point():  # token ids stay integers
        inputs = inputs.to(recipe.param_dtype)
    # TF32 for the backward's matmuls too (two thirds of the FLOPs); autocast for the forward only
    with tf32_matmuls(recipe.compute_format == "tf32"):
        with torch.autocast(
            inputs.device.type,
            dtype=recipe.autocast_dtype or torch.float32,
            enabled=recipe.autocast_dtype is not None,
        ):
            logits = model(inputs).float()  # (batch, classes) or (batch, seq, vocab)
            loss = F.cross_entropy(logits.flatten(0, -2), targets.flatten())
        if scaler is not None:
            scaler.scale(loss / loss_divisor).backward()
            scaler.step(optimizer)  # skips optimizer.step() on an inf/NaN gradient
            scaler.update()
        else:
            (loss / loss_divisor).backward()
            optimizer.step()
    return loss.detach()


def digits_classifier(seed: int = 0, hidden: int = 64) -> nn.Module:
    """The chapter's model: an MLP 64 -> hidden -> hidden -> 10 with GELU, seeded."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Linear(hidden, 10),
    )


@dataclass
class RecipeRun:
    """Per-step history of one recipe: what the chapter plots."""

    recipe: str
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)  # loss scale used (1.0 without a scaler)
    skipped: list[int] = field(default_factory=list)  # steps whose update the scaler skipped
    zero_gradients: list[float] = field(default_factory=list)  # fraction of grad elements == 0
    lost_updates: list[float] = field(default_factory=list)  # nonzero grad, weight unchanged


def train_recipe(
    recipe: Recipe | str,
    inputs: Tensor,
    targets: Tensor,
    make_optimizer: Callable[[list[nn.Parameter]], Optimizer],
    *,
    steps: int,
    batch_size: int = 256,
    loss_divisor: float = 1.0,
    seed: int = 0,
) -> RecipeRun:
    """Train :func:`digits_classifier` with ``recipe`` on random batches of ``(inputs, targets)``.

    Every recipe starts from the same weights and sees the same batches. ``loss_divisor``
    stands in for a bigger step: the gradient reaching each output element of a loss averaged
    over ``N`` elements is proportional to ``1/N``, so dividing the loss by ``D`` gives each
    element the gradient it would get in a mean over ``D`` times more elements (a language
    model's step averages over millions of tokens). With Adam and a tiny ``eps`` the update
    does not depend on the gradient's overall scale, so an fp32 run is unchanged by it; an
    fp16 run is not. Models and batches live on ``inputs.device``.
    """
    recipe = RECIPES[recipe] if isinstance(recipe, str) else recipe
    check_int("steps", steps, minimum=1)
    check_int("batch_size", batch_size, minimum=1)
    check_number("loss_divisor", loss_divisor, above=0.0)
    check_int("seed", seed)
    if len(inputs) != len(targets):  # else random batches index only the shorter one's range
        raise ValueError(
            f"Invalid inputs and targets: {len(inputs)} inputs but {len(targets)} targets "
            "(expected one target per input)"
        )
    model = digits_classifier(seed).to(device=inputs.device, dtype=recipe.param_dtype)
    params = list(model.parameters())
    optimizer = make_optimizer(params)
    scaler = GradScaler(inputs.device.type) if recipe.loss_scaling else None
    generator = torch.Generator().manual_seed(seed)
    run = RecipeRun(recipe.name)
    for step in range(steps):
        batch = torch.randint(0, len(targets), (batch_size,), generator=generator).to(inputs.device)
        scale = scaler.get_scale() if scaler is not None else 1.0
        before = [p.detach().clone() for p in params]
        loss = training_step(
            model, optimizer, inputs[batch], targets[batch], recipe, scaler, loss_divisor
        )
        nonzero = [p.grad != 0 for p in params]
        unchanged = [p.detach() == b for p, b in zip(params, before, strict=True)]
        n_nonzero = sum(int(n.sum()) for n in nonzero)
        run.losses.append(float(loss))
        run.scales.append(scale)
        if scaler is not None and scaler.get_scale() < scale:  # it backed off: step skipped
            run.skipped.append(step)
        run.zero_gradients.append(1 - n_nonzero / sum(p.numel() for p in params))
        run.lost_updates.append(
            sum(int((n & u).sum()) for n, u in zip(nonzero, unchanged, strict=True))
            / max(n_nonzero, 1)
        )
    return run


def activation_gradients(
    model: nn.Module, inputs: Tensor, targets: Tensor, loss_divisor: float = 1.0
) -> dict[str, Tensor]:
    """The gradients of the loss with respect to every Linear layer's output, in float32.

    These are the tensors that flow backward through the network in the compute dtype: under
    fp16 autocast each of them is rounded to float16, so this is where underflow happens.
    Returns ``{layer name: gradient (batch, out_features)}`` from one fp32 forward/backward.
    """
    outputs: dict[str, Tensor] = {}

    def keep(name: str) -> Callable[[nn.Module, tuple[Tensor, ...], Tensor], None]:
        def hook(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
            output.retain_grad()
            outputs[name] = output

        return hook

    handles = [
        module.register_forward_hook(keep(name))
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]
    try:
        loss = F.cross_entropy(model(inputs), targets) / loss_divisor
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    model.zero_grad(set_to_none=True)
    return {name: output.grad.detach().float() for name, output in outputs.items()}
