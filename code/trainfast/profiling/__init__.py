"""Profiling: timing correctly, reading traces, and the first optimisations to try.

:func:`benchmark` is the package's one timer (CUDA events on a GPU, ``perf_counter`` on a CPU,
every sample kept); every benchmark in the package times through it, or through its relatives
:func:`benchmark_side_by_side` (several functions taking turns) and :func:`timestamp` (a point on
a timeline).
"""

from trainfast.profiling.timing import Timing, benchmark, benchmark_side_by_side, timestamp

__all__ = ["Timing", "benchmark", "benchmark_side_by_side", "timestamp"]
