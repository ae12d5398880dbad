"""Automatic checks for the parallelism chapter's exercises.

Each ``check_*`` function calls the reader's function on many cases, compares it with the
package's reference, prints one line per case and raises ``AssertionError`` naming the first
failing case (the book's one convention, :func:`trainfast.checks.report`). Two modules:
:mod:`~trainfast.distributed.exercises.communication` (collectives, their cost, ZeRO, pipelines
and the exercises that run in real ranks) and :mod:`~trainfast.distributed.exercises.advanced`
(experts, rings and the decision exercises).
"""

from trainfast.distributed.exercises.advanced import (
    NEXT_CHANGES,
    breakdown_exercise_setups,
    check_capacity_mask,
    check_causal_ring_work,
    check_layout_choice,
    check_next_change,
    layout_cases,
    layout_exercise_setup,
)
from trainfast.distributed.exercises.communication import (
    check_all_reduce,
    check_broadcast,
    check_distributed_evaluation,
    check_function,
    check_peak_activations_1f1b,
    check_ring_chunks,
    check_tree_all_reduce_time,
    check_zero_memory,
)

__all__ = [
    "NEXT_CHANGES",
    "breakdown_exercise_setups",
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
    "layout_cases",
    "layout_exercise_setup",
]
