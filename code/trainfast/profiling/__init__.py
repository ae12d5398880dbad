"""Profiling: timing correctly, reading traces, and the first optimisations to try.

:func:`benchmark` is the package's one timer (CUDA events on a GPU, ``perf_counter`` on a CPU,
every sample kept); every benchmark in the package times through it.
"""

from trainfast.profiling.timing import Timing, benchmark

__all__ = ["Timing", "benchmark"]
