"""Three ways a timing goes wrong, each measured beside the right way.

1. **Not waiting for the device** (:func:`wrong_and_right`). CUDA calls return as soon as the
   kernel is queued; a host clock read right after measures the queueing. The first call also
   pays one-off costs (cuBLAS handles, kernel selection, memory pool growth) that no later call
   pays, so an un-warmed single sample is wrong too.
2. **Zeros instead of real data** (:func:`zeros_and_random`). A GPU's power draw depends on how
   many bits flip in its multipliers: multiplying zeros flips almost none, so the chip stays
   under its power limit, keeps its clock high and finishes sooner than it would on real
   (random) data (Horace He, "Strangely, Matrix Multiplications on GPUs Run Faster When Given
   'Predictable' Data!", 2024).
3. **A warm cache** (:func:`cold_and_warm`). A buffer read over and over stays in the last-level
   cache (50 MB of L2 on an H100; the L2/L3 on a CPU), so a benchmark that reuses its input
   measures cache bandwidth, not memory bandwidth. Triton's ``do_bench`` flushes the L2 before
   every sample for this reason; :func:`flush_cache` does the same through ``before_sample``.
   A sample of one short kernel on a GPU must also hide the kernel's launch behind queued work
   (the flush, or :func:`keep_busy`), or it times the launch.

Every timing goes through :func:`~trainfast.timing.benchmark`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from trainfast.timing import Timing, benchmark

__all__ = [
    "QUEUED",
    "cold_and_warm",
    "flush_cache",
    "keep_busy",
    "wrong_and_right",
    "zeros_and_random",
]

QUEUED = "queued behind"  # in the way of a GPU row of cold_and_warm whose launch is hidden
_FLUSH_BYTES = 256 * 2**20  # larger than any L2 (and most L3s) we time on; do_bench uses 256 MB


def flush_cache(device: torch.device | str, n_bytes: int = _FLUSH_BYTES) -> Any:
    """A ``before_sample`` function that evicts ``device``'s caches by writing ``n_bytes``."""
    buffer = torch.empty(n_bytes // 4, dtype=torch.int32, device=device)
    return buffer.zero_


def _row(case: str, way: str, timing: Timing, reference: Timing, note: str = "") -> dict[str, Any]:
    """One row of the ``timing-pitfalls`` record; ``ratio`` is this median over the reference's."""
    return {
        "case": case,
        "way": way,
        "median_ms": timing.median * 1e3,
        "iqr_ms": timing.iqr * 1e3,
        "samples": len(timing.samples),
        "ratio": timing.median / reference.median,
        "note": note,
    }


def wrong_and_right(
    device: torch.device, size: int, dtype: torch.dtype, repeats: int
) -> list[dict[str, Any]]:
    """A ``size x size`` matmul timed three ways: once cold, without sync, and correctly."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    first = benchmark(lambda: a @ b, warmup=0, repeats=1, device=device)  # the process's first
    no_sync = benchmark(lambda: a @ b, warmup=3, repeats=repeats, device=device, synchronize=False)
    right = benchmark(lambda: a @ b, warmup=3, repeats=repeats, device=device)
    case = f"{size}x{size} {str(dtype).removeprefix('torch.')} matmul"
    return [
        _row(case, "one call, no warm-up (the first of this shape)", first, right),
        _row(case, "host clock, no synchronize", no_sync, right),
        _row(case, "warm-up, synchronize (CUDA events on a GPU)", right, right),
    ]


def zeros_and_random(
    device: torch.device, size: int, dtype: torch.dtype, repeats: int, number: int
) -> list[dict[str, Any]]:
    """The same matmul on zeros and on random numbers; clocks and power where readable."""
    rows, timings = [], {}
    for kind in ("random", "zeros"):
        make = torch.randn if kind == "random" else torch.zeros
        a, b = (make(size, size, device=device, dtype=dtype) for _ in range(2))
        timings[kind] = benchmark(
            lambda a=a, b=b: a @ b, warmup=5, repeats=repeats, number=number, device=device
        )
    for kind, timing in timings.items():
        after = (timing.clocks or {}).get("after", {})
        note = ""
        if after:
            note = f"after: SM clock {after.get('clocks.sm')} MHz, {after.get('power.draw')} W"
        case = f"{size}x{size} {str(dtype).removeprefix('torch.')} matmul"
        rows.append(_row(case, f"inputs: {kind}", timing, timings["random"], note))
    return rows


def cold_and_warm(device: torch.device, n_bytes: int, repeats: int) -> list[dict[str, Any]]:
    """Sum a float32 buffer of ``n_bytes``: the cache flushed before each sample, or not.

    Each sample is one call (only the first call after a flush finds the cache cold), and on a
    GPU both ways queue it behind device work that takes longer than the host needs to launch
    it: the flush, or :func:`keep_busy` for the warm way. Without that, a sample of one call
    that takes microseconds would time its launch, not the cache (:data:`QUEUED` marks such
    rows; the H100 record of 2026-11-26 predates it and measured launches in both ways).
    """
    x = torch.randn(n_bytes // 4, device=device)
    warm = benchmark(
        x.sum, warmup=3, repeats=repeats, device=device, before_sample=keep_busy(device)
    )
    cold = benchmark(
        x.sum, warmup=3, repeats=repeats, device=device, before_sample=flush_cache(device)
    )
    case = f"sum of {n_bytes / 2**20:g} MiB"
    gpu = torch.device(device).type == "cuda"
    warm_way = "warm: same buffer every call" + (f", {QUEUED} a busy-wait kernel" if gpu else "")
    cold_way = "cold: cache flushed before each call" + (f", {QUEUED} the flush" if gpu else "")
    return [
        _row(case, warm_way, warm, cold, _bandwidth(n_bytes, warm)),
        _row(case, cold_way, cold, cold, _bandwidth(n_bytes, cold)),
    ]


def keep_busy(device: torch.device | str, cycles: int = 2_000_000) -> Any:
    """A ``before_sample`` function that keeps a GPU busy without touching memory.

    It queues a kernel that spins for ``cycles`` clock cycles (about a millisecond at 2 GHz,
    far longer than a launch), so the sample's first launch is queued while the GPU is busy and
    the cache keeps what the previous call read. On a CPU, where nothing is queued, it does
    nothing.
    """
    if torch.device(device).type != "cuda":
        return lambda: None
    return functools.partial(torch.cuda._sleep, cycles)  # private, but what torch's tests use


def _bandwidth(n_bytes: int, timing: Timing) -> str:
    return f"{n_bytes / timing.median / 1e9:.3g} GB/s read"
