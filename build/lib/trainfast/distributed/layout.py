"""Which parallel layout fits a model on given devices, and which is fastest? A search.

Given a base :class:`~trainfast.distributed.step_time.TrainingSetup` (the model with its
micro-batch, the recipe, the global batch, the GPU, the recomputation choice, the assumptions)
and a number of devices, :func:`layout_choices` tries every ``devices = data x context x tensor
x pipeline`` (context and interleaving as in the base) with every ZeRO stage and estimates each
with the book's one step model, :func:`~trainfast.distributed.step_time.estimate`.
:func:`propose_layout` returns the first that fits in the order practitioners reach for them
(Narayanan et al., 2021, "Efficient Large-Scale Language Model Training on GPU Clusters"): the
fewest model-parallel devices (tensor x pipeline) first; among those, the lowest ZeRO stage;
then fewer pipeline stages (tensor parallelism inside a node before pipelining).
:func:`recommend_layout` returns the fastest that fits, its estimate and a sentence saying
why. Everything here is arithmetic: no training code is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainfast.distributed.step_time import NVLINK_GPUS, StepEstimate, TrainingSetup, estimate
from trainfast.validation import check_instance, check_int

__all__ = [
    "LayoutRecommendation",
    "describe",
    "layout_choices",
    "propose_layout",
    "recommend_layout",
]


def _preference(setup: TrainingSetup) -> tuple[int, int, int]:
    """Fewest model-parallel devices first, then the lowest ZeRO stage, then fewer stages."""
    return (setup.tensor * setup.pipeline, setup.zero_stage, setup.pipeline)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layout_choices(base: TrainingSetup, n_devices: int, max_tensor: int = 8) -> list[StepEstimate]:
    """Every (data, tensor, pipeline, ZeRO stage) layout of ``n_devices`` that ``base`` allows,
    estimated, in order of preference: fewest model-parallel devices, then the lowest ZeRO stage,
    then fewer stages.

    ``base`` gives everything else (its ``data``, ``tensor``, ``pipeline`` and ``zero_stage``
    are replaced; its ``context`` must divide ``n_devices``). Tensor parallelism needs fast
    links, so it stays within ``max_tensor`` devices; layouts the setup's checks refuse (the
    global batch does not split over ``data``, interleaving without a multiple of ``p``
    micro-batches, more stages than layers) are left out, and so are ZeRO stages 2 and 3 with
    pipeline stages unless ``base.assumptions.accumulate_before_reduce``: sharded gradients
    otherwise cost a reduce-scatter per micro-batch, and DeepSpeed's pipeline engine refuses
    them; accumulating whole gradients first is how PyTorch's pipelining and Llama 3 pair FSDP
    with pipelines.
    """
    check_instance("base", base, TrainingSetup)
    check_int("n_devices", n_devices, minimum=1)
    check_int("max_tensor", max_tensor, minimum=1)
    if n_devices % base.context:
        raise ValueError(
            f"Invalid n_devices: {n_devices!r} (expected a positive multiple of context "
            f"{base.context})"
        )
    choices = []
    for tensor in _divisors(n_devices // base.context):
        if tensor > max_tensor:
            continue
        for pipeline in _divisors(n_devices // (base.context * tensor)):
            data = n_devices // (base.context * tensor * pipeline)
            for stage in (0, 1, 2, 3) if data * base.context > 1 else (0,):
                if stage >= 2 and pipeline > 1 and not base.assumptions.accumulate_before_reduce:
                    continue  # a reduce-scatter per micro-batch (see the docstring)
                try:
                    setup = replace(
                        base,
                        data=data,
                        tensor=tensor,
                        pipeline=pipeline,
                        zero_stage=stage,
                        virtual_stages=base.virtual_stages if pipeline > 1 else 1,
                    )
                except ValueError:
                    continue
                choices.append(setup)
    return [estimate(setup) for setup in sorted(choices, key=_preference)]


def propose_layout(base: TrainingSetup, n_devices: int, max_tensor: int = 8) -> StepEstimate | None:
    """The preferred layout (:func:`layout_choices`' order) that fits in memory, or ``None``."""
    return next((e for e in layout_choices(base, n_devices, max_tensor) if e.fits), None)


@dataclass(frozen=True)
class LayoutRecommendation:
    """The layout :func:`recommend_layout` picked, its estimate, why, and what it beat."""

    estimate: StepEstimate
    reason: str
    considered: list[StepEstimate]  # every layout that fits, fastest first


def describe(setup: TrainingSetup) -> str:
    """``"data 8 x tensor 2 x pipeline 4, ZeRO-1"`` (with context and interleaving if used)."""
    parts = [f"data {setup.data}"]
    if setup.context > 1:
        parts.append(f"context {setup.context}")
    parts += [f"tensor {setup.tensor}", f"pipeline {setup.pipeline}"]
    interleaved = f" ({setup.virtual_stages} virtual)" if setup.virtual_stages > 1 else ""
    return " x ".join(parts) + interleaved + f", ZeRO-{setup.zero_stage}"


def recommend_layout(
    base: TrainingSetup, n_devices: int, max_tensor: int = 8
) -> LayoutRecommendation | None:
    """The fastest layout that fits in memory, with its estimated step time and the reason.

    Every layout of :func:`layout_choices` that fits and whose tensor-parallel group divides a
    node (so its all-reduces stay on NVLink), timed by
    :func:`~trainfast.distributed.step_time.estimate`; ties go to the simpler layout. ``None``
    if nothing fits. A model, not a measurement.
    """
    per_node = base.assumptions.gpus_per_node
    fitting = [
        e
        for e in layout_choices(base, n_devices, max_tensor)
        if e.fits and per_node % min(e.setup.tensor, per_node) == 0
    ]
    if not fitting:
        return None
    estimates = sorted(fitting, key=lambda e: (round(e.step_s, 6), _preference(e.setup)))
    best = estimates[0]
    parts = {
        "pipeline bubble": best.bubble_s,
        "tensor-parallel all-reduces": best.tensor_parallel_s,
        "context-parallel sends": best.context_parallel_s,
        "expert all-to-alls": best.expert_parallel_s,
        "pipeline messages": best.pipeline_s,
        "exposed data-parallel communication": best.data_parallel_s,
    }
    largest = max(parts, key=parts.get)
    overhead = (
        f"largest overhead: {largest}, {parts[largest]:.2f} s"
        if parts[largest] > 0
        else "no communication or bubble left exposed"
    )
    usable = best.memory.total / 1e9, _usable_gb(best)
    reason = (
        f"{describe(best.setup)}: {usable[0]:.0f} GB per device of {usable[1]:.0f} GB usable; "
        f"{best.setup.micro_batches} micro-batches of {base.shape.batch_size} per replica; "
        f"estimated {best.step_s:.2f} s per step, {best.compute_s / best.step_s:.0%} of it "
        f"compute ({overhead}). {len(estimates)} layouts fit; "
    )
    if len(estimates) > 1:
        runner_up = estimates[1]
        if round(runner_up.step_s, 6) == round(best.step_s, 6):
            reason += (
                f"{describe(runner_up.setup)} takes as long, and ties go to the simpler layout."
            )
        else:
            reason += (
                f"the next fastest, {describe(runner_up.setup)}, takes {runner_up.step_s:.2f} s."
            )
    else:
        reason += "it is the only one."
    return LayoutRecommendation(best, reason, estimates)


def _usable_gb(result: StepEstimate) -> float:
    gpu = NVLINK_GPUS[result.setup.gpu]
    return gpu.memory_bytes * (1 - result.setup.assumptions.reserve) / 1e9
