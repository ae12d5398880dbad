"""Traces of training steps: ``torch.profiler`` with a schedule, named ranges, a Perfetto file.

A timer says *how long* a step took; a trace says *where the time went*: every operator the
step ran on the CPU, every kernel on the GPU, on one timeline, grouped under the names you gave
the parts of your step. ``profile_steps()`` wraps ``torch.profiler.profile`` the way its
documentation recommends for training loops (Kineto's schedule):

* ``wait`` steps are not recorded at all (the first steps of a run are unrepresentative:
  allocator growth, cuDNN/cuBLAS heuristics, compilation);
* ``warmup`` steps are recorded and thrown away, because the profiler's own start-up cost
  lands in the first recorded step;
* ``active`` steps are kept, exported as a Chrome/Perfetto trace (``trace.json.gz``: open it at
  https://ui.perfetto.dev or ``chrome://tracing``) and summarised as an operator table.

``annotate()`` names a part of a step twice: a ``record_function`` range, which the PyTorch
profiler shows, and on a CUDA machine an NVTX range, which Nsight Systems shows (NVTX costs
nanoseconds when no tool listens, so it can stay in the code).

:func:`trace_times` reads such a trace back and measures what a timeline shows by eye: how
much of the recorded steps the host spent inside operators, how much the GPU spent running
kernels, and how much of the two overlapped.

:func:`allocated_bytes_timeline` reads a snapshot of the CUDA caching allocator's history
(``torch.cuda.memory._record_memory_history``, then ``torch.cuda.memory._snapshot()``) as the
bytes allocated after each event, the curve that https://pytorch.org/memory_viz draws.

When not to use it: the profiler adds overhead per operator (microseconds), so never time with
it; time with :func:`~trainfast.timing.benchmark` and profile to explain the time.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from trainfast.device import parse_device
from trainfast.validation import check_flag, check_int, output_folder, plural

__all__ = [
    "OperatorTime",
    "StepProfile",
    "TraceTimes",
    "allocated_bytes_timeline",
    "annotate",
    "operator_table",
    "profile_steps",
    "profiler_activities",
    "trace_times",
]


@functools.cache
def _nvtx_available() -> bool:
    return torch.cuda.is_available()  # asked once: the answer costs tens of microseconds


@contextlib.contextmanager
def annotate(name: str) -> Iterator[None]:
    """A named range for the PyTorch profiler and, where CUDA is available, for Nsight (NVTX)."""
    nvtx = _nvtx_available()
    with record_function(name):
        if nvtx:
            torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()


@dataclass(frozen=True)
class OperatorTime:
    """One row of the operator table: an operator (or named range) summed over active steps.

    ``self`` times exclude the time of operators called inside this one; ``total`` times
    include it. Device times are zero on a CPU.
    """

    name: str
    calls: int
    self_cpu_s: float
    total_cpu_s: float
    self_device_s: float
    total_device_s: float
    self_cpu_memory_bytes: int  # allocated minus freed by this operator itself (profile_memory)


@dataclass(frozen=True)
class StepProfile:
    """What ``profile_steps()`` recorded: the table as printed, its rows, and the trace file."""

    table: str
    operators: list[OperatorTime]
    trace: Path  # gzip-compressed Chrome trace JSON
    active_steps: int

    def operator(self, name: str) -> OperatorTime:
        """The row named ``name``; ``KeyError`` naming the missing operator otherwise."""
        for row in self.operators:
            if row.name == name:
                return row
        raise KeyError(f"No operator {name!r} in this profile")


def _device_attribute(event: Any, prefix: str) -> str | None:
    """``{prefix}device_time_total`` (torch >= 2.4) or the older ``{prefix}cuda_time_total``."""
    for attribute in (f"{prefix}device_time_total", f"{prefix}cuda_time_total"):
        if hasattr(event, attribute):
            return attribute
    return None


def _device_time(event: Any, prefix: str) -> float:
    """Microseconds on the device (0 when this torch has no device time for the event)."""
    attribute = _device_attribute(event, prefix)
    return float(getattr(event, attribute)) if attribute else 0.0


def profiler_activities(device: torch.device | str | None) -> list[ProfilerActivity]:
    """What ``torch.profiler`` must record for work on ``device``: the CPU, and CUDA on a GPU.

    Without ``ProfilerActivity.CUDA`` the profiler records only the host side: the operators and
    their launches, and no kernel at all, so a GPU trace would show nothing of the GPU.
    """
    device = parse_device(device) if device is not None else torch.device("cpu")
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    return activities


def _check_profile_arguments(
    step_fn: object, wait: int, warmup: int, active: int, row_limit: int, *flags: bool
) -> None:
    """:func:`profile_steps`'s arguments, each named if wrong (``warmup=1.5`` would otherwise
    reach ``range()``, ``record_shapes='no'`` be taken for True)."""
    if not callable(step_fn):
        raise ValueError(f"Invalid step_fn: {step_fn!r:.80} (expected a function to call)")
    for name, value, least in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        check_int(name, value, minimum=least)
    check_int("row_limit", row_limit, minimum=1)
    for name, flag in zip(("record_shapes", "profile_memory", "with_stack"), flags, strict=True):
        check_flag(name, flag)


def profile_steps(
    step_fn: Callable[[], object],
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 2,
    out_dir: str | Path,
    device: torch.device | str | None = None,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    row_limit: int = 15,
) -> StepProfile:
    """Call ``step_fn`` ``wait + warmup + active`` times under ``torch.profiler``; keep ``active``.

    Each call is one training step (the profiler's schedule advances after it). Name its parts
    with ``annotate()``. Writes ``out_dir/trace.json.gz`` and returns the operator table,
    sorted by time on the device if ``device`` is CUDA, else by CPU time (``self``: the time
    spent in the operator itself, not in what it calls). ``record_shapes``, ``profile_memory``
    and ``with_stack`` are the profiler's own options; each makes the trace larger and slower
    to record. Pass the ``device`` the step runs on: the default, the CPU, records no kernel.
    """
    flags = (record_shapes, profile_memory, with_stack)
    _check_profile_arguments(step_fn, wait, warmup, active, row_limit, *flags)
    device = parse_device(device) if device is not None else torch.device("cpu")
    out_dir = output_folder("out_dir", out_dir)
    trace = out_dir / "trace.json.gz"
    activities = profiler_activities(device)

    def export(profiler: profile) -> None:
        profiler.export_chrome_trace(str(trace))  # gzip-compressed: the name ends in .gz

    with profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=export,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
    ) as profiler:
        for step in range(wait + warmup + active):
            if device.type == "cuda":
                torch.cuda.nvtx.range_push(f"step {step}")
            step_fn()
            if device.type == "cuda":
                torch.cuda.nvtx.range_pop()
            profiler.step()

    averages = profiler.key_averages()
    sort_by = "self_cpu_time_total"
    if device.type == "cuda" and averages:
        sort_by = _device_attribute(averages[0], "self_") or sort_by
    operators = [
        OperatorTime(
            name=event.key,
            calls=int(event.count),
            self_cpu_s=event.self_cpu_time_total / 1e6,
            total_cpu_s=event.cpu_time_total / 1e6,
            self_device_s=_device_time(event, "self_") / 1e6,
            total_device_s=_device_time(event, "") / 1e6,
            self_cpu_memory_bytes=int(getattr(event, "self_cpu_memory_usage", 0)),
        )
        for event in averages
    ]
    operators.sort(
        key=lambda row: row.self_device_s if device.type == "cuda" else row.self_cpu_s,
        reverse=True,
    )
    return StepProfile(
        table=averages.table(sort_by=sort_by, row_limit=row_limit),
        operators=operators,
        trace=trace,
        active_steps=active,
    )


def operator_table(profile: StepProfile, rows: int = 12) -> str:
    """The first ``rows`` rows of ``profile``'s operator table as Markdown, per recorded step.

    The same rows as ``profile.table`` (torch's text table, sorted by self time), in a table a
    page can lay out: milliseconds per step, each row's share of the step's self time, and the
    device columns only when the profile has device time.
    """
    check_int("rows", rows, minimum=1)
    steps = profile.active_steps
    on_device = any(row.self_device_s > 0 for row in profile.operators)
    kind = "self_device_s" if on_device else "self_cpu_s"
    total = sum(getattr(row, kind) for row in profile.operators) or 1.0
    header = ["operator or range", "calls per step", "self CPU (ms)", "total CPU (ms)"]
    header += ["self device (ms)", "total device (ms)"] if on_device else []
    header += ["share of self time"]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for row in profile.operators[:rows]:
        cells = [f"`{row.name}`".replace("|", "\\|"), f"{row.calls / steps:.3g}"]
        cells += [f"{1e3 * row.self_cpu_s / steps:.3g}", f"{1e3 * row.total_cpu_s / steps:.3g}"]
        if on_device:
            cells += [f"{1e3 * row.self_device_s / steps:.3g}"]
            cells += [f"{1e3 * row.total_device_s / steps:.3g}"]
        cells += [f"{100 * getattr(row, kind) / total:.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: Chrome-trace categories of work on the GPU itself (Kineto's names).
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

#: CUDA runtime calls in which the host thread waits for the GPU (category ``cuda_runtime``): a
#: synchronising read (``.item()``: ``aten::_local_scalar_dense`` around a copy and a
#: ``cudaStreamSynchronize``), a blocking copy, an explicit synchronize. The host is inside an
#: ATen operator then, but it is waiting, not working.
HOST_WAITS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaStreamWaitEvent",
    "cudaMemcpy",
)


@dataclass(frozen=True)
class TraceTimes:
    """Busy and idle time over the recorded steps of a trace (:func:`trace_times`), in seconds.

    ``host_busy_s``: some ATen operator was running on some host thread and that thread was not
    waiting for the GPU (the rest of the host's time went to Python, the data loader, the
    profiler, or waiting). ``host_waiting_s``: a host thread was inside one of the CUDA calls
    that wait for the GPU (:data:`HOST_WAITS`: a synchronising ``.item()``, a blocking copy, a
    synchronize), which happens inside an ATen operator but is not work. ``device_busy_s``: some
    kernel, copy or memset was running on the GPU (0 in a CPU-only trace). ``overlap_s``: the
    host busy while the GPU ran earlier work, which is what keeps a GPU fed. Each is a union of
    intervals, so nested or concurrent events count once.
    """

    span_s: float
    host_busy_s: float
    device_busy_s: float
    overlap_s: float
    host_waiting_s: float = 0.0

    @property
    def host_busy_fraction(self) -> float:
        return self.host_busy_s / self.span_s

    @property
    def device_busy_fraction(self) -> float:
        return self.device_busy_s / self.span_s

    @property
    def device_idle_s(self) -> float:
        """Time in the span with nothing running on the GPU (all of it in a CPU-only trace)."""
        return self.span_s - self.device_busy_s


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time as ``intervals``."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the overlap of two sorted, disjoint interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _difference(
    a: list[tuple[float, float]], b: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The parts of sorted, disjoint intervals ``a`` that no interval of ``b`` covers."""
    left: list[tuple[float, float]] = []
    for start, end in a:
        for cut_start, cut_end in b:
            if cut_end <= start or cut_start >= end:
                continue
            if cut_start > start:
                left.append((start, cut_start))
            start = max(start, cut_end)
            if start >= end:
                break
        if start < end:
            left.append((start, end))
    return left


def trace_times(trace: StepProfile | str | Path) -> TraceTimes:
    """Busy, idle and overlapping time in a Chrome trace from profile_steps().

    The span runs from the start of the first ProfilerStep# to the end of the last; events
    are clipped to it. Host time counts cpu_op events (ATen operators) less the CUDA calls of
    HOST_WAITS inside them, which are waiting (host_waiting_s); device time the
    DEVICE_CATEGORIES. Raises ValueError naming the file if it is not a complete JSON trace
    or has no step.
    """
    path = trace.trace if isinstance(trace, StepProfile) else Path(trace)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as file:
            events = json.load(file)["traceEvents"]
    except (json.JSONDecodeError, EOFError, gzip.BadGzipFile) as error:  # a cut-off trace
        raise ValueError(f"Invalid trace: {path} is not a complete JSON trace ({error})") from error
    except (KeyError, TypeError) as error:
        raise ValueError(f"Invalid trace: {path} has no traceEvents list") from error
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in complete if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError(f"Invalid trace: {path} has no ProfilerStep# event")
    first = min(float(e["ts"]) for e in steps)
    last = max(float(e["ts"]) + float(e["dur"]) for e in steps)

    def busy(categories: tuple[str, ...], names: tuple[str, ...] = ()) -> list[tuple[float, float]]:
        clipped = [
            (max(first, float(e["ts"])), min(last, float(e["ts"]) + float(e["dur"])))
            for e in complete
            if e.get("cat") in categories and (not names or e.get("name") in names)
        ]
        return _union([(start, end) for start, end in clipped if end > start])

    waiting = busy(("cuda_runtime", "cuda_driver"), HOST_WAITS)
    host, device = _difference(busy(("cpu_op",)), waiting), busy(DEVICE_CATEGORIES)
    return TraceTimes(
        span_s=(last - first) / 1e6,  # the trace's timestamps are microseconds
        host_busy_s=_length(host) / 1e6,
        device_busy_s=_length(device) / 1e6,
        overlap_s=_intersection(host, device) / 1e6,
        host_waiting_s=_length(waiting) / 1e6,
    )


def allocated_bytes_timeline(snapshot: dict[str, Any], device_index: int = 0) -> list[int]:
    """Net bytes allocated since recording began, after each event of an allocator snapshot.

    snapshot is what torch.cuda.memory._snapshot() returns after
    torch.cuda.memory._record_memory_history(): its device_traces[device_index] lists
    events with an action and a size in bytes. An alloc adds its size, a
    free_completed (the block really back in the pool, after the streams that used it are
    done) subtracts it; other actions (free_requested, segment_alloc, ...) change
    nothing that tensors hold. Memory allocated before recording began is not in the trace, so
    the curve starts at zero and may go below it.
    """
    traces = snapshot.get("device_traces", [])
    if not 0 <= device_index < len(traces):
        raise ValueError(
            f"Invalid device_index: {device_index} "
            f"(the snapshot has {plural(len(traces), 'device')})"
        )
    allocated, timeline = 0, []
    for event in traces[device_index]:
        if event["action"] == "alloc":
            allocated += int(event["size"])
        elif event["action"] == "free_completed":
            allocated -= int(event["size"])
        timeline.append(allocated)
    return timeline
