"""Training memory by part: model state per parameter for a precision recipe and an optimizer,
its sharding over data-parallel ranks by ZeRO, and what one device holds in all.

Model state (weights, gradients, fp32 master weights, optimizer moments) comes from the
recipe's bytes (:mod:`trainfast.recipes`) and :data:`OPTIMIZER_MOMENTS`, checked against the
state a real optimizer keeps (:func:`trainfast.optim.state.state_bytes_per_param`); activations
and the loss's buffers come from :mod:`trainfast.accounting.activations`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from trainfast.accounting.activations import loss_buffer_bytes, model_activation_bytes
from trainfast.accounting.parameters import parameter_count
from trainfast.recipes import RECIPES, Recipe
from trainfast.transformer import Attention, TransformerShape
from trainfast.validation import check_instance, check_int, check_non_negative, check_positive

__all__ = [
    "OPTIMIZER_MOMENTS",
    "MemoryBreakdown",
    "bytes_per_parameter",
    "training_memory",
    "zero_memory",
]


#: Optimizer moments (copies of the weights' size) kept per parameter. Muon's single momentum
#: buffer is for the hidden matrices it orthogonalises; the embeddings, head and vectors usually
#: get AdamW's two, so a whole model lands in between.
OPTIMIZER_MOMENTS: dict[str, int] = {
    "sgd": 0,
    "momentum": 1,
    "rmsprop": 1,
    "adam": 2,
    "adamw": 2,
    "muon": 1,
}


def _recipe(recipe: str | Recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if recipe not in RECIPES:
        raise ValueError(f"Unknown recipe: {recipe!r} (expected one of {sorted(RECIPES)})")
    return RECIPES[recipe]


def _moments(optimizer: str) -> int:
    if optimizer not in OPTIMIZER_MOMENTS:
        raise ValueError(
            f"Unknown optimizer: {optimizer!r} (expected one of {sorted(OPTIMIZER_MOMENTS)})"
        )
    return OPTIMIZER_MOMENTS[optimizer]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of training memory by part (per device, or per parameter from
    :func:`bytes_per_parameter`). A part that was not counted is 0."""

    parameters: float
    gradients: float
    master_weights: float
    optimizer_state: float
    activations: float = 0.0
    loss_buffers: float = 0.0  # not in total: alive only at the start of backward

    @property
    def total(self) -> float:
        """Model state and saved activations: what stays allocated through the forward."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "loss_buffers")

    @property
    def peak(self) -> float:
        """The peak of a step: :attr:`total` and the loss's float32 buffers at the start of
        backward (:func:`~trainfast.accounting.loss_buffer_bytes`), what
        ``torch.cuda.max_memory_allocated`` measures."""
        return self.total + self.loss_buffers


def bytes_per_parameter(recipe: str | Recipe, optimizer: str) -> MemoryBreakdown:
    """Model-state bytes per parameter for a precision recipe and an optimizer (no activations).

    Adam: "fp32" 16 (4 + 4 + 2 x 4), "bf16 + fp32 master" 16 (2 + 2 + 4 + 2 x 4, ZeRO's
    ``2 + 2 + K`` with ``K = 12``), "bf16, fp32 moments" 12, "pure bf16" 8. The optimizer part is
    what :func:`trainfast.optim.state.state_bytes_per_param` measures on a real optimizer.
    """
    r = _recipe(recipe)
    return MemoryBreakdown(
        parameters=r.weight_bytes,
        gradients=r.gradient_bytes,
        master_weights=r.master_bytes,
        optimizer_state=_moments(optimizer) * r.state_bytes_per_moment,
    )


def _zero_shards(stage: int, world_size: int) -> tuple[float, float, float]:
    """Fractions of (weights, gradients, optimizer state and master weights) a rank keeps."""
    check_int("stage", stage, minimum=0, maximum=3)  # True is not stage 1
    check_positive("world_size", world_size)
    shard = 1.0 / world_size
    return (
        shard if stage >= 3 else 1.0,
        shard if stage >= 2 else 1.0,
        shard if stage >= 1 else 1.0,
    )


def zero_memory(
    n_params: float,
    world_size: int,
    stage: int,
    param_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> MemoryBreakdown:
    """Per-rank model-state memory for ZeRO ``stage`` 0 (plain data parallel) to 3.

    Defaults are the paper's mixed-precision Adam: fp16 parameters and gradients (2 + 2 bytes)
    and ``K = 12`` bytes of fp32 master weights, momentum and variance per parameter, all in
    ``optimizer_state``. Activations, buffers and fragmentation are not model state: 0 here.
    """
    check_non_negative("n_params", n_params)
    for name, value in (
        ("param_bytes", param_bytes),
        ("grad_bytes", grad_bytes),
        ("optimizer_bytes", optimizer_bytes),
    ):
        check_non_negative(name, value)
    weights, grads, state = _zero_shards(stage, world_size)
    return MemoryBreakdown(
        parameters=n_params * param_bytes * weights,
        gradients=n_params * grad_bytes * grads,
        master_weights=0.0,
        optimizer_state=n_params * optimizer_bytes * state,
    )


def training_memory(
    shape: TransformerShape,
    *,
    recipe: str | Recipe,
    optimizer: str,
    checkpointing: bool = False,
    dropout: bool = False,
    attention: Attention = "manual",
    zero_stage: int = 0,
    world_size: int = 1,
) -> MemoryBreakdown:
    """Memory of one device training the :class:`~trainfast.transformer.Transformer`.

    Model state from :func:`bytes_per_parameter` times
    :func:`~trainfast.accounting.parameter_count`, sharded by ZeRO ``zero_stage`` over
    ``world_size`` data-parallel ranks (master weights go with the optimizer state); activations
    from :func:`~trainfast.accounting.model_activation_bytes` at the recipe's bytes per value.
    Add headroom: real runs also hold the CUDA context, allocator slack, temporary buffers.
    """
    check_instance("shape", shape, TransformerShape)
    per_param = bytes_per_parameter(recipe, optimizer)
    weights, grads, state = _zero_shards(zero_stage, world_size)
    n = parameter_count(shape)
    value_bytes = _recipe(recipe).activation_bytes_per_value
    activations = model_activation_bytes(
        shape,
        value_bytes=value_bytes,
        dropout=dropout,
        attention=attention,
        checkpointing=checkpointing,
    )
    return MemoryBreakdown(
        parameters=n * per_param.parameters * weights,
        gradients=n * per_param.gradients * grads,
        master_weights=n * per_param.master_weights * state,
        optimizer_state=n * per_param.optimizer_state * state,
        activations=activations,
        loss_buffers=loss_buffer_bytes(shape, value_bytes=value_bytes),
    )
