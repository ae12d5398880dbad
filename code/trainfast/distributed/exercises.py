"""Automatic checks for the parallelism chapter's exercises.

Each ``check_*`` function calls the reader's function on many inputs, compares it with the
package's reference, prints how many cases passed (and the first failure), and returns ``True``
when all did. A reader's function that raises counts as failing that case; the check never
raises, so it can run in a notebook before the exercise is done.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from trainfast.accounting import zero_memory
from trainfast.distributed.collectives import ring_chunks
from trainfast.distributed.pipeline import one_f_one_b_schedule, peak_activations

__all__ = [
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


def check_function(
    name: str,
    candidate: Callable[..., Any],
    reference: Callable[..., Any],
    cases: Iterable[tuple],
    rel_tol: float = 1e-9,
) -> bool:
    """Compare ``candidate(*case)`` with ``reference(*case)`` for every case; print a summary."""
    cases = list(cases)
    failures = []
    for case in cases:
        expected = reference(*case)
        try:
            got = candidate(*case)
        except Exception as error:  # the reader's bug is a failed case, not a crash
            got = f"{type(error).__name__}: {error}"
        if not _same(got, expected, rel_tol):
            failures.append((case, expected, got))
    passed = len(cases) - len(failures)
    print(f"{name}: {passed}/{len(cases)} cases passed")
    if failures:
        case, expected, got = failures[0]
        print(f"  first failure: {name}{case} should be {expected!r}, got {got!r}")
    return not failures


def check_ring_chunks(candidate: Callable[[int, int, int, str], tuple[int, int]]) -> bool:
    """Exercise: the (sent, received) chunk of every rank at every step of both ring phases."""
    cases = [
        (rank, step, n, phase)
        for n in range(2, 7)
        for rank in range(n)
        for step in range(n - 1)
        for phase in ("reduce-scatter", "all-gather")
    ]
    return check_function("ring_chunks", candidate, ring_chunks, cases)


def _tree_time(n_bytes: float, world_size: int, alpha: float, beta: float) -> float:
    """Binary-tree reduce then broadcast: ``2 ceil(log2 N) (alpha + n beta)``."""
    return (
        2 * math.ceil(math.log2(world_size)) * (alpha + n_bytes * beta) if world_size > 1 else 0.0
    )


def check_tree_all_reduce_time(candidate: Callable[[float, int, float, float], float]) -> bool:
    """Exercise: the alpha-beta time of an all-reduce by binary tree (reduce up, broadcast down)."""
    cases = [
        (float(n_bytes), n, alpha, beta)
        for n_bytes in (4, 4096, 2**26)
        for n in (1, 2, 3, 4, 8, 13, 64)
        for alpha, beta in ((1e-5, 1e-10), (5e-6, 4e-11))
    ]
    return check_function("tree_all_reduce_time", candidate, _tree_time, cases, rel_tol=1e-6)


def check_zero_memory(candidate: Callable[[float, int, int], float]) -> bool:
    """Exercise: bytes of model state per rank under ZeRO stage 0-3 (mixed-precision Adam)."""
    cases = [
        (n, ranks, stage) for n in (7.5e9, 1.5e9, 1e6) for ranks in (1, 8, 64) for stage in range(4)
    ]
    return check_function(
        "zero_bytes_per_rank", candidate, lambda n, r, s: zero_memory(n, r, s).total, cases, 1e-6
    )


def check_peak_activations_1f1b(candidate: Callable[[int, int], list[int]]) -> bool:
    """Exercise: per stage, the most micro-batches 1F1B keeps alive, for p stages, m micro."""
    cases = [(p, m) for p in range(1, 7) for m in range(1, 10)]
    return check_function(
        "peak_activations_1f1b",
        candidate,
        lambda p, m: peak_activations(one_f_one_b_schedule(p, m)),
        cases,
    )
