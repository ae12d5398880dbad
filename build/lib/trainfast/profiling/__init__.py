"""Profiling: reading traces, and the first optimisations to try.

The package's one timer, :func:`trainfast.timing.benchmark`, lives below the chapters in
:mod:`trainfast.timing`, since every chapter's benchmarks time through it; the profiling chapter
teaches it from there. :func:`profile_steps` records training steps with ``torch.profiler``, and
:func:`trace_times` measures busy and idle time in what it recorded.

The case study (:mod:`trainfast.profiling.case_study`) needs :mod:`trainfast.transformer`; import
it from its module.
"""

from trainfast.profiling.traces import (
    OperatorTime,
    StepProfile,
    TraceTimes,
    annotate,
    operator_table,
    profile_steps,
    trace_times,
)

__all__ = [
    "OperatorTime",
    "StepProfile",
    "TraceTimes",
    "annotate",
    "operator_table",
    "profile_steps",
    "trace_times",
]
