"""Profiling: timing correctly, reading traces, and the first optimisations to try.

:func:`benchmark` is the package's one timer (CUDA events on a GPU, ``perf_counter`` on a CPU,
every sample kept); every benchmark in the package times through it, or through its relatives
:func:`benchmark_side_by_side` (several functions taking turns) and :func:`timestamp` (a point on
a timeline). :func:`profile_steps` records training steps with ``torch.profiler``, and
:func:`trace_times` measures busy and idle time in what it recorded.

The case study (:mod:`trainfast.profiling.case_study`) needs :mod:`trainfast.transformer`; import
it from its module.
"""

from trainfast.profiling.timing import Timing, benchmark, benchmark_side_by_side, timestamp
from trainfast.profiling.traces import (
    OperatorTime,
    StepProfile,
    TraceTimes,
    annotate,
    profile_steps,
    trace_times,
)

__all__ = [
    "OperatorTime",
    "StepProfile",
    "Timing",
    "TraceTimes",
    "annotate",
    "benchmark",
    "benchmark_side_by_side",
    "profile_steps",
    "timestamp",
    "trace_times",
]
