"""Checks for the parallelism chapter's exercises on collectives, their cost, ZeRO and pipelines.

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

from trainfast.accounting import zero_memory
from trainfast.checks import Case, report
from trainfast.distributed.collectives import ring_chunks
from trainfast.distributed.pipeline import one_f_one_b_schedule, peak_activations

__all__ = [
    "check_all_reduce",
    "check_broadcast",
    "check_distributed_evaluation",
    "check_function",
    "check_peak_activations_1f1b",
    "check_ring_chunks",
    "check_tree_all_reduce_time",
    "check_zero_memory",
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
    rank: int, world_size: int, source: str, name: str, test_set: Any
) -> tuple[int, int, int]:
    """In each rank: the reader's ``(correct, total)`` for the chapter's digits model on
    ``test_set`` (the digits test split, sent by the check: loading it costs each rank seconds),
    and how many examples the model saw on this rank."""
    from trainfast.distributed.data_parallel import DataParallelConfig, make_model

    candidate = _define(source, name)
    model = make_model(DataParallelConfig(), seed=0)
    seen = [0]
    model.register_forward_pre_hook(
        lambda module, args: seen.__setitem__(0, seen[0] + len(args[0]))
    )
    correct, total = candidate(model, test_set, rank, world_size)
    return int(correct), int(total), seen[0]


#: The evaluation exercise's small test sets, as (ranks, which examples the model gets right): so
#: few examples that the ranks' shares differ in size and in accuracy, so that averaging the
#: ranks' accuracies misses the count whether a rank takes every N-th example or a contiguous
#: block (the two-rank cases each catch one of the two).
EVALUATION_CASES: tuple[tuple[int, tuple[bool, ...]], ...] = (
    (2, (False, True, False)),
    (2, (False, False, True)),
    (3, (True, True, False, True, False)),
    (4, (True, True, False, False, True)),
)


def _evaluation_sets(model: torch.nn.Module, test_set: Any) -> list[tuple[int, Any]]:
    """The digits test set on 4 ranks, then ``EVALUATION_CASES``, each built from test
    examples that ``model`` gets right or wrong, in the case's order."""
    from torch.utils.data import TensorDataset

    inputs, labels = test_set[:]
    with torch.no_grad():
        right = (model(inputs).argmax(dim=-1) == labels).nonzero().flatten().tolist()
    wrong = sorted(set(range(len(labels))) - set(right))
    sets = [(4, test_set)]
    for world_size, pattern in EVALUATION_CASES:
        pools = {True: iter(right), False: iter(wrong)}
        index = [next(pools[r]) for r in pattern]
        sets.append((world_size, TensorDataset(inputs[index], labels[index])))
    return sets


def check_distributed_evaluation(
    candidate: Callable[[torch.nn.Module, Any, int, int], tuple[int, int]],
) -> None:
    """Exercise: ``(correct, total)`` over the whole test set, summed across ranks, on every
    rank, each example evaluated once, on one rank (the ranks split the work). Cases: the digits
    test split on 4 ranks, and ``EVALUATION_CASES``, where the shares differ in size and the
    model's accuracy differs between them."""
    from trainfast.datasets import digits
    from trainfast.distributed.data_parallel import (
        DataParallelConfig,
        evaluate_distributed,
        make_model,
    )
    from trainfast.distributed.launch import SpawnError, spawn

    source, name = _source(candidate)
    model = make_model(DataParallelConfig(), seed=0)  # the one each rank builds
    results: list[Case] = []
    for world_size, test_set in _evaluation_sets(model, digits("test")):
        expected = evaluate_distributed(model, test_set, 0, 1)
        want = (expected.correct, expected.total)
        case = f"{name} on {world_size} ranks, {want[0]} of {want[1]} right"
        try:
            got = spawn(
                evaluation_exercise_worker,
                world_size,
                source,
                name,
                test_set,
                timeout=120,
                collective_timeout=20,
            )
        except SpawnError as error:
            results.append((case, str(error).splitlines()[0]))
            continue
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
