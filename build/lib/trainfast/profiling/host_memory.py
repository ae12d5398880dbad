"""Where host (CPU) memory goes: Python's allocations by line, and the process's resident set.

Two views, both from the standard library, because neither alone tells the whole story:

* ``tracemalloc`` traces every allocation that goes through Python's allocator and can say
  which line made it. It sees Python objects (lists of token ids, dictionaries, batches
  collated as lists), but **not** tensor storage: PyTorch allocates that with its own C++
  allocator, out of tracemalloc's sight.
* The resident set size (``VmRSS`` in ``/proc/self/status`` on Linux; its peak is ``VmHWM``)
  counts every page the process holds, tensors included, but cannot say who allocated them.

:func:`host_memory_profile` runs a function between two tracemalloc snapshots and reads the
resident set before and after: the top lines by growth, and how much of the growth
tracemalloc could not attribute (tensors, native libraries). Tracing slows allocation down
(several times, for allocation-heavy Python code), so profile a few steps, not a run.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainfast.validation import check_int

__all__ = ["AllocationSite", "HostMemoryProfile", "host_memory_profile", "resident_bytes"]


def resident_bytes() -> dict[str, int]:
    """This process's resident set now (``rss``) and at its peak (``peak_rss``), in bytes.

    Read from ``/proc/self/status`` (Linux); elsewhere ``rss`` is 0 and ``peak_rss`` comes from
    ``resource.getrusage`` where it exists.
    """
    status = Path("/proc/self/status")
    if status.exists():
        fields = {}
        for line in status.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024  # reported in kB
        return {"rss": fields.get("VmRSS", 0), "peak_rss": fields.get("VmHWM", 0)}
    try:
        import resource
    except ImportError:  # Windows
        return {"rss": 0, "peak_rss": 0}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
    return {"rss": 0, "peak_rss": peak}


@dataclass(frozen=True)
class AllocationSite:
    """One source line and how much Python memory it held more after the profiled call."""

    file: str
    line: int
    size_bytes: int  # growth over the call (negative: the line freed memory)
    count: int  # growth in the number of live allocations


@dataclass(frozen=True)
class HostMemoryProfile:
    """What :func:`host_memory_profile` found: the top lines, and the totals around them."""

    sites: list[AllocationSite]
    traced_bytes: int  # growth of all memory tracemalloc saw
    traced_peak_bytes: int  # the largest traced total during the call, over the start
    rss_growth_bytes: int  # growth of the resident set (tensors included)

    @property
    def untraced_bytes(self) -> int:
        """Resident growth that tracemalloc cannot attribute: tensors and native buffers."""
        return self.rss_growth_bytes - self.traced_bytes


def host_memory_profile(
    fn: Callable[[], object], top: int = 10, frames: int = 1
) -> HostMemoryProfile:
    """Run ``fn`` between two tracemalloc snapshots; return the ``top`` lines by growth.

    Keep what ``fn`` allocates alive (return it, or append it to a list) if the question is
    what a step keeps; what it frees before returning only shows in ``traced_peak_bytes``.
    ``frames`` is how many frames of each allocation's stack to keep (1: the allocating line).
    """
    check_int("top", top, minimum=1)
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start(frames)
    try:
        before_rss = resident_bytes()["rss"]
        before = tracemalloc.take_snapshot()
        tracemalloc.reset_peak()  # after the snapshot, whose own allocations are not fn's
        traced_before, _ = tracemalloc.get_traced_memory()
        kept = fn()
        traced_after, traced_peak = tracemalloc.get_traced_memory()
        after = tracemalloc.take_snapshot()
        after_rss = resident_bytes()["rss"]
    finally:
        if started:
            tracemalloc.stop()
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    before, after = before.filter_traces(ignore), after.filter_traces(ignore)
    stats = after.compare_to(before, "lineno")
    del kept  # alive until the second snapshot
    sites = [
        AllocationSite(
            file=stat.traceback[0].filename,
            line=stat.traceback[0].lineno,
            size_bytes=stat.size_diff,
            count=stat.count_diff,
        )
        for stat in stats[:top]
    ]
    return HostMemoryProfile(
        sites=sites,
        traced_bytes=traced_after - traced_before,
        traced_peak_bytes=traced_peak - traced_before,
        rss_growth_bytes=after_rss - before_rss,
    )
