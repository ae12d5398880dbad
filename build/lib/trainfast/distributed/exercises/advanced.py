"""Checks for the parallelism chapter's exercises on experts, rings and choosing a layout.

The decision exercises (a layout for a model and a cluster; the next change from a step's
breakdown) are checked with the step model, :func:`trainfast.distributed.step_time.estimate`:
a wrong choice is one the model finds slower, or one that does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from trainfast.checks import Case, report
from trainfast.distributed.context_parallel import ring_block_kind
from trainfast.distributed.moe import capacity_mask

__all__ = [
    "NEXT_CHANGES",
    "breakdown_exercise_setups",
    "check_capacity_mask",
    "check_causal_ring_work",
    "check_layout_choice",
    "check_next_change",
    "layout_cases",
    "layout_exercise_setup",
]


def check_capacity_mask(mask: Callable[[Tensor, int, int], Tensor]) -> None:
    """Check ``mask(experts, n_experts, capacity)``: which (token, choice) assignments fit.

    ``experts`` is (tokens, k); first choices queue before second ones, earlier tokens before
    later ones, and each expert takes the first ``capacity`` in its queue.
    """
    results: list[Case] = []
    generator = torch.Generator().manual_seed(0)
    for tokens, n_experts, k, capacity in [
        (4, 3, 2, 2),
        (8, 4, 1, 2),
        (16, 4, 2, 5),
        (12, 8, 2, 3),
        (6, 2, 1, 6),
    ]:
        experts = torch.stack(
            [torch.randperm(n_experts, generator=generator)[:k] for _ in range(tokens)]
        )
        expected = capacity_mask(experts, n_experts, capacity)
        got = mask(experts.clone(), n_experts, capacity)
        dropped = int((~expected).sum())
        case = (
            f"{tokens} tokens, {n_experts} experts, top-{k}, capacity {capacity}: {dropped} dropped"
        )
        if not isinstance(got, Tensor) or got.shape != expected.shape:
            problem = f"got {got!r}, expected a bool tensor of shape {tuple(expected.shape)}"
        else:
            wrong = (got.bool() != expected).nonzero().tolist()
            problem = None if not wrong else f"wrong at (token, choice) {wrong[0]}"
        results.append((case, problem))
    report(results)


def check_causal_ring_work(work: Callable[[int, int], int]) -> None:
    """Check ``work(rank, world_size)``: how many key blocks rank ``rank`` attends to.

    The count is that of causal ring attention over ``world_size`` ranks.
    """
    results: list[Case] = []
    for world_size in (1, 2, 4, 8):
        for rank in sorted({0, world_size // 2, world_size - 1}):
            kinds = [ring_block_kind(rank, step, world_size, True) for step in range(world_size)]
            expected = sum(kind != "skip" for kind in kinds)
            got = work(rank, world_size)
            case = f"rank {rank} of {world_size}: {expected} blocks"
            results.append((case, None if got == expected else f"got {got!r}"))
    report(results)


# ------------------------------------------------------------------------ decision exercises
def layout_exercise_setup() -> tuple[Any, int]:
    """The layout exercise: a 39B-parameter decoder (48 layers of width 8,192), 4,096-token
    sequences, 128 sequences per step, selective recomputation and sequence parallelism, on 32
    H100s (4 nodes of 8)."""
    from trainfast.distributed.step_time import TrainingSetup
    from trainfast.transformer import TransformerShape

    shape = TransformerShape.gpt_like(n_layers=48, d_model=8192, n_heads=64, seq_len=4096)
    return TrainingSetup(shape, global_batch=128, sequence_parallel=True), 32


def layout_cases() -> list[tuple[str, Any, int]]:
    """The layout exercise's cases: ``(name, base setup, devices)``. The exercise's model on its 32
    H100s with a fifth and with half of each GPU's memory held back (``reserve``), then on 64
    H100s with the default reserve and no overlap of the gradient traffic with the backward
    (``overlap=0``): there the first layout that fits, in the order practitioners reach for
    them (:func:`~trainfast.distributed.layout.propose_layout`), is not the fastest."""
    from dataclasses import replace

    from trainfast.distributed.step_time import StepAssumptions

    base, n_devices = layout_exercise_setup()
    return [
        (f"{n_devices} H100s, {reserve:.0%} of the memory held back", x, n_devices)
        for reserve in (0.2, 0.5)
        for x in [replace(base, assumptions=StepAssumptions(reserve=reserve))]
    ] + [
        (
            f"{2 * n_devices} H100s, no overlap of the gradient traffic",
            replace(base, assumptions=StepAssumptions(overlap=0.0)),
            2 * n_devices,
        )
    ]


def check_layout_choice(choose: Callable[[Any, int], Any], tolerance: float = 0.03) -> None:
    """Exercise: ``choose(base, n_devices)`` returns a ``TrainingSetup`` (``base`` with ``data``,
    ``tensor``, ``pipeline`` and ``zero_stage`` chosen) for each of :func:`layout_cases` (a test
    checks that in each the fastest layout is not at the memory limit and no other layout is
    within 1.5 ``tolerance``, and that the first layout that fits fails the last). A case passes
    when the layout uses every device, fits, keeps tensor parallelism inside a node, and is
    within ``tolerance`` of the fastest layout the step model finds
    (:func:`~trainfast.distributed.layout.recommend_layout`)."""
    from dataclasses import replace

    from trainfast.distributed.layout import describe, recommend_layout
    from trainfast.distributed.step_time import estimate

    results: list[Case] = []
    for case, setup, n_devices in layout_cases():
        best = recommend_layout(setup, n_devices).estimate
        try:
            answer = choose(setup, n_devices)
            layout = {k: getattr(answer, k) for k in ("data", "tensor", "pipeline", "zero_stage")}
            chosen = estimate(replace(setup, **layout))  # the layout, on this case's setup
        except Exception as error:  # the reader's bug is a failed case, not a crash
            results.append((case, f"{type(error).__name__}: {error}"))
            continue
        s = chosen.setup
        if s.n_gpus != n_devices:
            problem = f"{describe(s)} uses {s.n_gpus} devices, not {n_devices}"
        elif not chosen.fits:
            problem = (
                f"{describe(s)} needs {chosen.memory.total / 1e9:.0f} GB per GPU: it does not fit"
            )
        elif s.tensor > s.assumptions.gpus_per_node:
            problem = f"{describe(s)}: tensor parallelism across nodes"
        elif chosen.step_s > best.step_s * (1 + tolerance):
            problem = (
                f"{describe(s)} takes {chosen.step_s:.2f} s; {describe(best.setup)} takes "
                f"{best.step_s:.2f} s"
            )
        else:
            problem = None
        results.append((case, problem))
    report(results)


#: The changes the step-breakdown exercise offers, each a function of the setup.
NEXT_CHANGES: dict[str, Callable[[Any], Any]] = {
    "interleave two virtual stages": lambda s: _replace(s, virtual_stages=2 * s.virtual_stages),
    "halve the pipeline stages, double data parallelism": lambda s: _replace(
        s, pipeline=s.pipeline // 2, data=s.data * 2
    ),
    "ZeRO-1 instead of ZeRO-3": lambda s: _replace(s, zero_stage=1),
    "selective instead of full recomputation": lambda s: _replace(s, recompute="selective"),
    "halve tensor parallelism, double data parallelism": lambda s: _replace(
        s, tensor=s.tensor // 2, data=s.data * 2
    ),
}


def _replace(setup: Any, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(setup, **changes)


def breakdown_exercise_setups() -> list[Any]:
    """The step-breakdown exercise's layouts of a 7B model, each with one overhead that
    dominates: a deep pipeline with few micro-batches; ZeRO-3 across nodes with small steps;
    full recomputation where selective fits; tensor parallelism spilling over the network."""
    from trainfast.distributed.step_time import StepAssumptions, TrainingSetup
    from trainfast.transformer import TransformerShape

    shape = TransformerShape.gpt_like(n_layers=32, d_model=4096, n_heads=32, seq_len=4096)
    slow = StepAssumptions(overlap=0.0)
    return [
        TrainingSetup(shape, data=4, pipeline=8, tensor=2, global_batch=32, sequence_parallel=True),
        TrainingSetup(shape, zero_stage=3, data=64, global_batch=64, assumptions=slow),
        TrainingSetup(
            shape, data=8, tensor=2, global_batch=64, recompute="full", sequence_parallel=True
        ),
        TrainingSetup(shape, data=2, tensor=16, global_batch=64, sequence_parallel=True),
    ]


def _after(change: str, setup: Any) -> float:
    """The step time after ``change``, or infinity where it is not possible or does not fit."""
    from trainfast.distributed.step_time import estimate

    try:
        result = estimate(NEXT_CHANGES[change](setup))
    except (ValueError, ZeroDivisionError):
        return math.inf
    return result.step_s if result.fits else math.inf


def check_next_change(name_change: Callable[[Any], str]) -> None:
    """Exercise: ``name_change(estimate)`` reads a step's breakdown (a ``StepEstimate``) and
    returns the key of :data:`NEXT_CHANGES` that shortens the step most while still fitting. A
    case passes when the step model agrees: no other offered change gives a shorter step."""
    from trainfast.distributed.layout import describe
    from trainfast.distributed.step_time import estimate

    results: list[Case] = []
    for setup in breakdown_exercise_setups():
        times = {change: _after(change, setup) for change in NEXT_CHANGES}
        best = min(times, key=times.get)
        case = f"{describe(setup)}, {setup.recompute} recomputation"
        try:
            got = name_change(estimate(setup))
        except Exception as error:  # the reader's bug is a failed case, not a crash
            results.append((case, f"{type(error).__name__}: {error}"))
            continue
        if got not in NEXT_CHANGES:
            problem = f"{got!r} is not one of {sorted(NEXT_CHANGES)}"
        elif times[got] > times[best] * (1 + 1e-9):
            problem = f"{got!r} gives {times[got]:.2f} s; {best!r} gives {times[best]:.2f} s"
        else:
            problem = None
        results.append((case, problem))
    report(results)
