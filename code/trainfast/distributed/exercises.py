"""Automatic checks for the parallelism chapter's exercises.

Each ``check_*`` function calls the reader's function on many cases, compares it with the
package's reference, prints one line per case and raises ``AssertionError`` naming the first
failing case (the book's one convention, :func:`trainfast.checks.report`).

The distributed exercises (``broadcast``, ``all_reduce``, distributed evaluation) must run in
several processes, and a function defined in a notebook cannot be looked up by name in a new
process. So their checks send the function's *source* to the ranks, which define it there with
``torch`` and ``torch.distributed as dist`` in scope and call it inside a real process group. The
function must therefore be self-contained: it may use ``torch`` and ``dist``, not other notebook
names.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from trainfast.accounting import zero_memory
from trainfast.checks import Case, report
from trainfast.distributed.collectives import ring_chunks
from trainfast.distributed.context_parallel import ring_block_kind
from trainfast.distributed.moe import capacity_mask
from trainfast.distributed.pipeline import one_f_one_b_schedule, peak_activations

__all__ = [
    "check_all_reduce",
    "check_broadcast",
    "check_capacity_mask",
    "check_causal_ring_work",
    "check_distributed_evaluation",
    "check_function",
    "check_layout_choice",
    "check_next_change",
    "check_peak_activations_1f1b",
    "check_ring_chunks",
    "check_tree_all_reduce_time",
    "check_zero_memory",
    "breakdown_exercise_setups",
    "layout_exercise_setup",
    "NEXT_CHANGES",
]


def _same(got: Any, expected: Any, rel_tol: float) -> bool:
    if isinstance(expected, float):
        return isinstance(got, (int, float)) and math.isclose(got, expected, rel_tol=rel_tol)
    if isinstance(expected, (tuple, list)):
        return (
            isinstance(got, (tuple, list))
            and len(got) == len(expected)
            and all(_same(g, e, rel_tol) for g, e in zip(got, expected, strict=True))
        )
    return got == expected


def _cases(
    name: str,
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    cases: list[tuple],
    rel_tol: float,
) -> list[Case]:
    results = []
    for case in cases:
        expected = reference(*case)
        try:
            got = candidate(*case)
        except Exception as error:  # the reader's bug is a failed case, not a crash
            got = f"{type(error).__name__}: {error}"
        problem = None if _same(got, expected, rel_tol) else f"expected {expected!r}, got {got!r}"
        results.append((f"{name}{case}", problem))
    return results


def check_function(
    name: str,
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    cases: list[tuple],
    rel_tol: float = 1e-9,
) -> None:
    """Compare ``candidate(*case)`` with ``reference(*case)`` for every case; report."""
    report(_cases(name, candidate, reference, list(cases), rel_tol))


def check_ring_chunks(candidate: Callable[[int, int, int, str], tuple[int, int]]) -> None:
    """Exercise: the (sent, received) chunk of every rank at every step of both ring phases."""
    cases = [
        (rank, step, n, phase)
        for n in range(2, 6)
        for phase in ("reduce-scatter", "all-gather")
        for step in range(n - 1)
        for rank in range(n)
    ]
    check_function("ring_chunks", candidate, ring_chunks, cases)


def _tree_time(n_bytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Binomial-tree reduce then broadcast: ``2 ceil(log2 N) (alpha + n beta)``."""
    return (
        2 * math.ceil(math.log2(world_size)) * (alpha + n_bytes * beta) if world_size > 1 else 0.0
    )


def check_tree_all_reduce_time(candidate: Callable[[float, int, float, float], float]) -> None:
    """Exercise: the alpha-beta time of an all-reduce by binomial tree."""
    cases = [
        (float(n_bytes), n, 1e-5, 1e-10) for n_bytes in (4, 2**26) for n in (1, 2, 3, 4, 8, 13, 64)
    ]
    check_function("tree_all_reduce_time", candidate, _tree_time, cases, rel_tol=1e-6)


def check_zero_memory(candidate: Callable[[float, int, int], float]) -> None:
    """Exercise: bytes of model state per rank under ZeRO stage 0-3 (mixed-precision Adam)."""
    cases = [(n, ranks, stage) for n in (7.5e9, 1e6) for ranks in (1, 8, 64) for stage in range(4)]
    check_function(
        "zero_bytes_per_rank", candidate, lambda n, r, s: zero_memory(n, r, s).total, cases, 1e-6
    )


def check_peak_activations_1f1b(candidate: Callable[[int, int], list[int]]) -> None:
    """Exercise: per stage, the most micro-batches 1F1B keeps alive, for p stages, m micro."""
    cases = [(p, m) for p in (1, 2, 4, 6) for m in (1, 3, 8)]
    check_function(
        "peak_activations_1f1b",
        candidate,
        lambda p, m: peak_activations(one_f_one_b_schedule(p, m)),
        cases,
    )


# -------------------------------------------------------------------- distributed exercises
def _source(candidate: Callable[..., Any]) -> tuple[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(candidate))
    except (OSError, TypeError) as error:
        raise ValueError(
            f"Invalid candidate: {candidate!r} (the check needs a function defined with def, "
            f"whose source it can read: {error})"
        ) from error
    return source, candidate.__name__


def _define(source: str, name: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"torch": torch, "dist": dist}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # the reader's own function
    return namespace[name]


#: The collectives of ``torch.distributed`` an exercise built "from send and recv" may not call.
FORBIDDEN_COLLECTIVES: tuple[str, ...] = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
)


class ForbiddenCollectiveError(RuntimeError):
    """The reader's function called a collective where only send and recv are allowed."""


def _forbid(name: str) -> Callable[..., Any]:
    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise ForbiddenCollectiveError(
            f"dist.{name} was called: this exercise builds it from dist.send and dist.recv only"
        )

    return forbidden


def collective_exercise_worker(
    rank: int, world_size: int, source: str, name: str, kind: str, cases: list[tuple]
) -> list[torch.Tensor]:
    """In each rank: define the reader's function and run it on every case, with
    ``torch.distributed``'s collectives replaced by functions that raise; return results."""
    candidate = _define(source, name)
    results = []
    for collective in FORBIDDEN_COLLECTIVES:  # this rank's process only, for the whole run
        setattr(dist, collective, _forbid(collective))
    for shape, dtype, root in cases:
        generator = torch.Generator().manual_seed(100 * rank + len(results))
        tensor = (torch.rand(shape, generator=generator) * 100).to(dtype)
        if kind == "broadcast":
            candidate(tensor, root)
        else:
            candidate(tensor)
        results.append(tensor)
    return results


def _collective_cases() -> list[tuple]:
    return [((1,), torch.float32, 0), ((7,), torch.int64, 1), ((3, 5), torch.float32, 2)]


def _check_collective(candidate: Callable[..., Any], kind: str) -> None:
    from trainfast.distributed.launch import SpawnError, spawn

    source, name = _source(candidate)
    cases = _collective_cases()
    results: list[Case] = []
    for world_size in (2, 3, 4):
        inputs = [
            [
                (torch.rand(shape, generator=torch.Generator().manual_seed(100 * r + i)) * 100).to(
                    dtype
                )
                for i, (shape, dtype, _) in enumerate(cases)
            ]
            for r in range(world_size)
        ]
        try:
            got = spawn(
                collective_exercise_worker,
                world_size,
                source,
                name,
                kind,
                [(s, d, root % world_size) for s, d, root in cases],
                timeout=120,
                collective_timeout=20,
            )
        except SpawnError as error:
            results.append((f"{name} on {world_size} ranks", str(error).splitlines()[0]))
            continue
        for i, (shape, dtype, root) in enumerate(cases):
            root %= world_size
            if kind == "broadcast":
                expected = inputs[root][i]
            else:
                expected = torch.stack([inputs[r][i] for r in range(world_size)]).sum(0)
            wrong = [
                r
                for r in range(world_size)
                if not torch.allclose(got[r][i].double(), expected.double(), rtol=1e-5, atol=1e-3)
            ]
            case = f"{name}: {world_size} ranks, shape {shape}, {dtype}" + (
                f", root {root}" if kind == "broadcast" else ""
            )
            results.append((case, f"wrong result on ranks {wrong}" if wrong else None))
    report(results)


def check_broadcast(candidate: Callable[[torch.Tensor, int], None]) -> None:
    """Exercise: ``broadcast(tensor, src)`` from ``dist.send``/``dist.recv`` only (a call of
    ``dist.broadcast`` or any other collective fails the case), in place, on 2-4 ranks, several
    roots, integers and floats."""
    _check_collective(candidate, "broadcast")


def check_all_reduce(candidate: Callable[[torch.Tensor], None]) -> None:
    """Exercise: ``all_reduce(tensor)`` (the sum) from send and receive only, in place, on 2-4
    ranks."""
    _check_collective(candidate, "all_reduce")


def evaluation_exercise_worker(
    rank: int, world_size: int, source: str, name: str
) -> tuple[int, int, int]:
    """In each rank: the reader's ``(correct, total)`` for the chapter's digits model, and how
    many examples the model saw on this rank."""
    from trainfast.datasets import digits
    from trainfast.distributed.data_parallel import DataParallelConfig, make_model

    candidate = _define(source, name)
    model = make_model(DataParallelConfig(), seed=0)
    seen = [0]
    model.register_forward_pre_hook(
        lambda module, args: seen.__setitem__(0, seen[0] + len(args[0]))
    )
    correct, total = candidate(model, digits("test"), rank, world_size)
    return int(correct), int(total), seen[0]


def check_distributed_evaluation(
    candidate: Callable[[torch.nn.Module, Any, int, int], tuple[int, int]],
) -> None:
    """Exercise: ``(correct, total)`` over the whole test set, summed across 2-4 ranks, on
    every rank, each example evaluated once, on one rank (the ranks split the work)."""
    from trainfast.datasets import digits
    from trainfast.distributed.data_parallel import (
        DataParallelConfig,
        evaluate_distributed,
        make_model,
    )
    from trainfast.distributed.launch import SpawnError, spawn

    source, name = _source(candidate)
    expected = evaluate_distributed(make_model(DataParallelConfig(), seed=0), digits("test"), 0, 1)
    results: list[Case] = []
    for world_size in (2, 3, 4):
        case = f"{name} on {world_size} ranks"
        try:
            got = spawn(
                evaluation_exercise_worker,
                world_size,
                source,
                name,
                timeout=120,
                collective_timeout=20,
            )
        except SpawnError as error:
            results.append((case, str(error).splitlines()[0]))
            continue
        want = (expected.correct, expected.total)
        wrong = {r: g[:2] for r, g in enumerate(got) if g[:2] != want}
        seen = [g[2] for g in got]
        share = -(-expected.total // world_size)  # each rank's share, rounded up
        if wrong:
            problem = f"expected {want} on every rank, got {wrong}"
        elif sum(seen) != expected.total or max(seen) > share:
            problem = (
                f"the ranks evaluated {seen} examples: each of the {expected.total} must be "
                f"evaluated once, on one of the ranks, at most {share} per rank"
            )
        else:
            problem = None
        results.append((case, problem))
    report(results)


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


def check_layout_choice(choose: Callable[[Any, int], Any], tolerance: float = 0.03) -> None:
    """Exercise: ``choose(base, n_devices)`` returns a ``TrainingSetup`` (``base`` with ``data``,
    ``tensor``, ``pipeline`` and ``zero_stage`` chosen) for the exercise's model and cluster, with
    the whole memory and with half of it held back (``reserve``). A case passes when the layout
    uses every device, fits, keeps tensor parallelism inside a node, and is within ``tolerance``
    of the fastest layout the step model finds
    (:func:`~trainfast.distributed.layout.recommend_layout`)."""
    from dataclasses import replace

    from trainfast.distributed.layout import describe, recommend_layout
    from trainfast.distributed.step_time import StepAssumptions, estimate

    base, n_devices = layout_exercise_setup()
    results: list[Case] = []
    for reserve in (0.1, 0.5):
        setup = replace(base, assumptions=StepAssumptions(reserve=reserve))
        best = recommend_layout(setup, n_devices).estimate
        case = f"{n_devices} H100s, {reserve:.0%} of the memory held back"
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
