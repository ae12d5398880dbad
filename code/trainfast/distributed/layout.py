"""Which parallel layout fits a model on given devices? A back-of-the-envelope calculator.

Given a transformer's shape, the memory of one device and the number of devices, the calculator
tries every layout ``devices = data x tensor x pipeline`` with every ZeRO stage, estimates the
memory per device of each and proposes the cheapest one that fits, in the order practitioners
reach for them (Narayanan et al., 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters"): no model parallelism if possible; then ZeRO stages (same traffic as data
parallelism up to stage 2); then tensor parallelism inside a node; then pipeline stages.

Memory per device is model state plus activations:

* model state (mixed-precision Adam, :func:`~trainfast.accounting.zero_memory`) of the
  parameters this device's tensor and pipeline slice holds, sharded over the data-parallel
  group by the ZeRO stage;
* activations of one micro-batch per layer (:func:`~trainfast.accounting.activation_bytes`
  with 2-byte values and dropout, ``s b h (34 + 5 a s / h)`` bytes without recomputation:
  Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models"),
  for the ``L / p`` layers of a stage, times the ``p`` micro-batches a 1F1B stage keeps alive,
  so ``L`` layers' worth in all. Tensor parallelism divides the attention and MLP parts by
  ``t``; sequence parallelism divides the rest (layer norms, dropout) too, giving
  ``s b h (34 + 5 a s / h) / t``. With full recomputation a layer keeps only its input,
  ``2 s b h`` bytes (over ``t`` with sequence parallelism), and one layer's full activations
  exist at a time during backward.

:class:`~trainfast.accounting.TransformerShape` and ``activation_bytes`` are imported here from
:mod:`trainfast.accounting`, the book's one home for this arithmetic, so old imports still work.

It ignores the embedding's activations, communication buffers, fragmentation and the CUDA
context; real runs need headroom (``reserve``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfast.accounting import (
    TransformerShape,
    activation_bytes,
    checkpointed_layer_bytes,
    parameter_count,
    zero_memory,
)

__all__ = [
    "LayoutChoice",
    "TransformerShape",
    "activation_bytes",
    "layout_choices",
    "propose_layout",
]


@dataclass(frozen=True)
class LayoutChoice:
    """One layout and its estimated memory per device, in bytes."""

    data: int
    tensor: int
    pipeline: int
    zero_stage: int
    model_state_bytes: float
    activation_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.model_state_bytes + self.activation_bytes


def _preference(choice: LayoutChoice) -> tuple[int, int, int]:
    """Fewest model-parallel devices first, then the lowest ZeRO stage, then fewer stages."""
    return (choice.tensor * choice.pipeline, choice.zero_stage, choice.pipeline)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_choices(
    shape: TransformerShape,
    n_devices: int,
    max_tensor: int = 8,
    sequence_parallel: bool = True,
    recompute: bool = False,
) -> list[LayoutChoice]:
    """Every (data, tensor, pipeline, ZeRO stage) layout of ``n_devices`` and its memory, in order
    of preference: fewest model-parallel devices, then the lowest ZeRO stage, then fewer stages.

    Tensor parallelism needs fast links (NVLink), so it stays within ``max_tensor`` devices and
    must divide the heads; pipeline stages must divide the layers.
    """
    if n_devices < 1:
        raise ValueError(f"Invalid n_devices: {n_devices!r} (expected >= 1)")
    choices = []
    for tensor in _divisors(n_devices):
        if tensor > max_tensor or shape.n_heads % tensor:
            continue
        for pipeline in _divisors(n_devices // tensor):
            if shape.n_layers % pipeline:
                continue
            data = n_devices // (tensor * pipeline)
            for stage in (0, 1, 2, 3) if data > 1 else (0,):
                state = zero_memory(parameter_count(shape) / (tensor * pipeline), data, stage).total
                layers_alive = shape.n_layers  # (L / p) layers x p micro-batches under 1F1B
                full = activation_bytes(shape, tensor, sequence_parallel, dropout=True)
                if recompute:
                    kept = checkpointed_layer_bytes(shape, tensor, sequence_parallel)
                    activations = layers_alive * kept + full
                else:
                    activations = layers_alive * full
                choices.append(LayoutChoice(data, tensor, pipeline, stage, state, activations))
    return sorted(choices, key=_preference)


def propose_layout(
    shape: TransformerShape,
    device_memory_bytes: float,
    n_devices: int,
    reserve: float = 0.2,
    max_tensor: int = 8,
    recompute: bool = False,
) -> LayoutChoice | None:
    """The preferred layout whose estimate fits in ``(1 - reserve)`` of a device, or ``None``."""
    if not 0 <= reserve < 1:
        raise ValueError(f"Invalid reserve: {reserve!r} (expected 0 <= reserve < 1)")
    budget = device_memory_bytes * (1 - reserve)
    choices = layout_choices(shape, n_devices, max_tensor, recompute=recompute)  # preferred first
    return next((c for c in choices if c.total_bytes <= budget), None)
