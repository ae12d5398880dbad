"""Which parallel layout fits a model on given devices, and which is fastest? A calculator.

The public entry point is :func:`recommend_layout` (stable: the book's JavaScript calculator
mirrors it): the fastest layout that fits, its :class:`StepEstimate` and a sentence saying why.
:func:`propose_layout` and :func:`layout_choices` answer the memory question alone. Everything
here is arithmetic on :mod:`trainfast.accounting` (memory, FLOPs, GPU datasheets) and
:mod:`trainfast.distributed.cost_model` (the alpha-beta model): no training code is imported.

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

from dataclasses import dataclass, replace

from trainfast.accounting import (
    TransformerShape,
    activation_bytes,
    checkpointed_layer_bytes,
    parameter_count,
    training_flops,
    zero_memory,
)
from trainfast.distributed.cost_model import (
    INFINIBAND_NDR,
    NVLINK4,
    Link,
    all_gather_time,
    all_reduce_time,
)
from trainfast.gpus import GPUS, GPUSpec

# ``TransformerShape`` and ``activation_bytes`` are importable from here for older code; they
# live, and are documented, in trainfast.accounting.
__all__ = [
    "Cluster",
    "LayoutChoice",
    "LayoutRecommendation",
    "StepEstimate",
    "estimate_step",
    "recommend_layout",
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
    must divide the heads; there are at most as many pipeline stages as layers (uneven stages
    when they do not divide: the estimate uses the average stage).
    """
    if n_devices < 1:
        raise ValueError(f"Invalid n_devices: {n_devices!r} (expected >= 1)")
    choices = []
    for tensor in _divisors(n_devices):
        if tensor > max_tensor or shape.n_heads % tensor:
            continue
        for pipeline in _divisors(n_devices // tensor):
            if pipeline > shape.n_layers:
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


# --------------------------------------------------------------------------- step time
@dataclass(frozen=True)
class Cluster:
    """The devices a layout runs on: how many, how they are wired, how fast they compute.

    ``compute_efficiency`` is the fraction of peak FLOP/s the matmuls reach (an assumption: 40-50 %
    is typical of large runs, e.g. Llama 3's 38-43 % MFU on H100s, Dubey et al. 2024, Table 4).
    The links are :mod:`~trainfast.distributed.cost_model`'s NVLink 4 inside a node and one
    InfiniBand NDR port per GPU across nodes (a DGX H100 has eight ConnectX-7 400 Gb/s ports).
    """

    n_devices: int
    gpu: GPUSpec = GPUS["H100 SXM 80GB"]
    devices_per_node: int = 8
    intra_node: Link = NVLINK4
    inter_node: Link = INFINIBAND_NDR
    compute_efficiency: float = 0.45

    def __post_init__(self) -> None:
        if self.n_devices < 1:
            raise ValueError(f"Invalid n_devices: {self.n_devices!r} (expected >= 1)")
        if not 0 < self.compute_efficiency <= 1:
            raise ValueError(f"Invalid compute_efficiency: {self.compute_efficiency!r}")

    def link(self, group_span: int) -> Link:
        """The link a group of ranks ``group_span`` devices apart (stride x size) talks over."""
        return self.intra_node if group_span <= self.devices_per_node else self.inter_node


@dataclass(frozen=True)
class StepEstimate:
    """Seconds of one optimizer step of a layout, by part (the α-β model plus FLOPs; a model)."""

    choice: LayoutChoice
    micro_batch_size: int
    micro_batches: int  # per pipeline per step: gradient accumulation steps when pipeline = 1
    compute_s: float  # matmul FLOPs of this device / achieved FLOP/s
    bubble_s: float  # the pipeline's idle time: compute x (p - 1) / m
    tensor_parallel_s: float  # 4 all-reduces of activations per layer and micro-batch, exposed
    pipeline_s: float  # activations and their gradients between stages, exposed
    data_parallel_s: float  # gradient reduction (+ ZeRO-3 gathers) not hidden behind backward

    @property
    def step_s(self) -> float:
        return (
            self.compute_s + self.bubble_s + self.tensor_parallel_s + self.pipeline_s
            + self.data_parallel_s
        )  # fmt: skip


def estimate_step(
    shape: TransformerShape,
    choice: LayoutChoice,
    cluster: Cluster,
    global_batch_size: int,
    micro_batch_size: int = 1,
) -> StepEstimate:
    """Estimate one step of ``choice`` training ``global_batch_size`` sequences of ``shape``.

    Each of the ``d`` data-parallel replicas runs ``m = B / (d b)`` micro-batches of ``b``
    sequences (gradient accumulation when there is no pipeline). Compute is
    :func:`~trainfast.accounting.training_flops` split over ``t p`` devices; the 1F1B bubble adds
    ``(p - 1) / m`` of it. Tensor parallelism's all-reduces (two forward, two backward per layer
    and micro-batch, bf16 activations, ring, NVLink when ``t`` fits in a node) wait on the
    critical path. Pipeline messages are point to point. The data-parallel gradient all-reduce
    (bf16; ZeRO-3 adds two all-gathers of the weights) overlaps with the last micro-batch's
    backward, about 2/3 of its compute; only the rest is counted.
    """
    d, t, p = choice.data, choice.tensor, choice.pipeline
    if global_batch_size % (d * micro_batch_size):
        raise ValueError(
            f"Invalid global_batch_size: {global_batch_size} is not a multiple of data x "
            f"micro_batch_size = {d * micro_batch_size}"
        )
    m = global_batch_size // (d * micro_batch_size)
    micro = replace(shape, batch_size=micro_batch_size)
    flops_per_device = training_flops(micro) * m / (t * p)
    compute = flops_per_device / (cluster.gpu.peak_flops["bf16"] * cluster.compute_efficiency)
    bubble = compute * (p - 1) / m
    activation = 2 * micro_batch_size * shape.seq_len * shape.d_model  # bf16 bytes
    layers_per_stage = -(-shape.n_layers // p)
    tensor = 0.0
    if t > 1:
        one = all_reduce_time("ring", activation, t, cluster.link(t))
        tensor = 4 * layers_per_stage * m * one
    pipeline = 0.0
    if p > 1:
        hop = cluster.link(t * p)  # consecutive stages are t devices apart
        pipeline = 2 * m * (hop.alpha + activation * hop.beta)
    data = 0.0
    if d > 1:
        gradient_bytes = 2 * parameter_count(shape) / (t * p)
        link = cluster.link(d * t * p)
        data = all_reduce_time("ring", gradient_bytes, d, link)
        if choice.zero_stage == 3:
            data += 2 * all_gather_time(gradient_bytes, d, link)
        data = max(0.0, data - (2 / 3) * compute / m)
    return StepEstimate(choice, micro_batch_size, m, compute, bubble, tensor, pipeline, data)


@dataclass(frozen=True)
class LayoutRecommendation:
    """The layout :func:`recommend_layout` picked, its estimate, why, and what it beat."""

    estimate: StepEstimate
    reason: str
    considered: list[StepEstimate]  # every layout that fits, fastest first


def recommend_layout(
    shape: TransformerShape,
    cluster: Cluster,
    global_batch_size: int,
    micro_batch_size: int = 1,
    *,
    reserve: float = 0.2,
    recompute: bool = False,
    max_tensor: int = 8,
) -> LayoutRecommendation | None:
    """The fastest layout that fits in memory, with its estimated step time and the reason.

    The book's one public entry point for choosing a layout: every ``data x tensor x pipeline x
    ZeRO stage`` of ``cluster.n_devices`` whose memory estimate (:func:`layout_choices`, for
    one micro-batch of ``micro_batch_size`` sequences) fits in ``1 - reserve`` of a device, timed
    with :func:`estimate_step`; ties go to the simpler layout (lower ZeRO stage, fewer model-
    parallel devices). Tensor parallelism must divide a node (``devices_per_node``), so its
    all-reduces stay on NVLink. ``None`` if nothing fits. A model, not a measurement: it ignores kernel
    efficiency differences, overlap beyond the last backward, and stragglers.
    """
    if not 0 <= reserve < 1:
        raise ValueError(f"Invalid reserve: {reserve!r} (expected 0 <= reserve < 1)")
    micro = replace(shape, batch_size=micro_batch_size)
    budget = cluster.gpu.memory_bytes * (1 - reserve)
    fitting = [
        c for c in layout_choices(micro, cluster.n_devices, max_tensor, recompute=recompute)
        if c.total_bytes <= budget
        and global_batch_size % (c.data * micro_batch_size) == 0
        and cluster.devices_per_node % min(c.tensor, cluster.devices_per_node) == 0
    ]  # fmt: skip
    if not fitting:
        return None
    estimates = sorted(
        (estimate_step(shape, c, cluster, global_batch_size, micro_batch_size) for c in fitting),
        key=lambda e: (round(e.step_s, 6), _preference(e.choice)),
    )
    best = estimates[0]
    c = best.choice
    parts = {
        "compute": best.compute_s,
        "pipeline bubble": best.bubble_s,
        "tensor-parallel all-reduces": best.tensor_parallel_s,
        "pipeline messages": best.pipeline_s,
        "exposed data-parallel communication": best.data_parallel_s,
    }
    largest_overhead = max(list(parts)[1:], key=parts.get)
    reason = (
        f"data {c.data} x tensor {c.tensor} x pipeline {c.pipeline}, ZeRO-{c.zero_stage}: "
        f"{c.total_bytes / 1e9:.0f} GB per device of {budget / 1e9:.0f} GB usable; "
        f"{best.micro_batches} micro-batches of {micro_batch_size} per replica; estimated "
        f"{best.step_s:.2f} s per step, {best.compute_s / best.step_s:.0%} of it compute "
        f"(largest overhead: {largest_overhead}, {parts[largest_overhead]:.2f} s). "
        f"{len(estimates)} layouts fit; "
        + (
            "the next fastest, "
            f"data {estimates[1].choice.data} x tensor {estimates[1].choice.tensor} x pipeline "
            f"{estimates[1].choice.pipeline}, ZeRO-{estimates[1].choice.zero_stage}, "
            f"takes {estimates[1].step_s:.2f} s."
            if len(estimates) > 1 else "it is the only one."
        )
    )  # fmt: skip
    return LayoutRecommendation(best, reason, estimates)
