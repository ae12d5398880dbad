"""The package's one timer: :func:`benchmark` runs a function many times and returns every sample.

Timing GPU code with a host clock is the classic mistake: CUDA kernels run asynchronously, so
``time.perf_counter()`` around a launch measures how long it took to *queue* the work, not to do
it. :func:`benchmark` does what ``torch.utils.benchmark`` and Triton's ``do_bench`` do:

1. call ``fn`` ``warmup`` times first, so one-off costs (CUDA context, cuBLAS handles, autotuning,
   ``torch.compile``) stay out of the numbers;
2. on a GPU, wait for the device, then bracket each sample with CUDA events, which timestamp the
   GPU's own stream; on a CPU, read ``time.perf_counter`` (on Apple's MPS, after
   ``torch.mps.synchronize()``);
3. keep every sample, because one number hides the spread: :class:`Timing` gives the median
   (robust to a burst of load on a shared machine) and the interquartile range beside them.

It also records the conditions that move a measurement: the device, the thread count and, on an
NVIDIA GPU where ``nvidia-smi`` can be read, the clocks before and after.

Unlike ``triton.testing.do_bench`` it does not flush the L2 cache between samples (do_bench does,
and returns the mean unless asked for the median): a function that reads the same small buffer
every time is timed warm here. Pass a ``fn`` that touches fresh data if you want it cold.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainfast.device import device_name, nvidia_smi_query, pick_device

__all__ = ["Timing", "benchmark"]

_CLOCK_FIELDS = ["clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw", "temperature.gpu"]


@dataclass(frozen=True)
class Timing:
    """What :func:`benchmark` measured: every sample, and the conditions it ran under.

    ``samples`` holds one value per repeat, in seconds per call of ``fn`` (a sample of ``number``
    calls is divided by ``number``). ``clocks`` is ``{"before": {...}, "after": {...}}`` with
    nvidia-smi's readings (MHz, W, °C) on an NVIDIA GPU, else None.
    """

    samples: tuple[float, ...]
    device: str  # "cuda:0", "cpu", ...
    device_name: str
    threads: int  # torch.get_num_threads() while timing
    warmup: int
    number: int  # calls of fn per sample
    clocks: dict[str, dict[str, str]] | None = field(default=None, compare=False)

    @property
    def median(self) -> float:
        """Median seconds per call."""
        return statistics.median(self.samples)

    @property
    def iqr(self) -> float:
        """Interquartile range of the samples, in seconds (0 for fewer than two samples)."""
        if len(self.samples) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q3 - q1

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    def as_dict(self) -> dict[str, Any]:
        """Median, IQR, sample count and conditions, for a measurement record's row."""
        return {
            "median_s": self.median,
            "iqr_s": self.iqr,
            "repeats": len(self.samples),
            "device": self.device,
            "threads": self.threads,
        }

    def __str__(self) -> str:
        return (
            f"{_seconds(self.median)} median, IQR {_seconds(self.iqr)} "
            f"({len(self.samples)} samples of {self.number} call(s) on {self.device}, "
            f"{self.threads} thread(s))"
        )


def _seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def benchmark(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeats: int = 10,
    device: torch.device | str | None = None,
    number: int = 1,
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` samples of ``number`` calls each.

    ``device`` says which clock to use: CUDA events on its stream for a CUDA device, the host's
    ``perf_counter`` otherwise (default: :func:`~trainfast.device.pick_device`, so pass
    ``device="cpu"`` to time host-only work on a GPU machine). Use ``number > 1`` when one call
    is shorter than the clock's resolution (about a microsecond for both).

    An exception raised by ``fn`` passes through unchanged. Returns a :class:`Timing`.
    """
    if repeats < 1:
        raise ValueError(f"Invalid repeats: {repeats} (need at least 1 sample)")
    if warmup < 0:
        raise ValueError(f"Invalid warmup: {warmup} (need 0 or more)")
    if number < 1:
        raise ValueError(f"Invalid number: {number} (need at least 1 call per sample)")
    device = torch.device(device) if device is not None else pick_device()
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())

    for _ in range(warmup):
        fn()
    clocks_before = nvidia_smi_query(_CLOCK_FIELDS, device) if device.type == "cuda" else None
    if device.type == "cuda":
        samples = _cuda_samples(fn, device, repeats, number)
    else:
        samples = _host_samples(fn, device, repeats, number)
    clocks = None
    if clocks_before is not None:
        clocks = {"before": clocks_before, "after": nvidia_smi_query(_CLOCK_FIELDS, device) or {}}
    return Timing(
        samples=tuple(samples),
        device=str(device),
        device_name=device_name(device),
        threads=torch.get_num_threads(),
        warmup=warmup,
        number=number,
        clocks=clocks,
    )


def _cuda_samples(
    fn: Callable[[], object], device: torch.device, repeats: int, number: int
) -> list[float]:
    """Each sample between two CUDA events on the current stream; one synchronisation at the end."""
    with torch.cuda.device(device):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        torch.cuda.synchronize(device)  # nothing queued before us may land in the first sample
        for start, end in zip(starts, ends, strict=True):
            start.record()
            for _ in range(number):
                fn()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / 1e3 / number for start, end in zip(starts, ends, strict=True)]


def _host_samples(
    fn: Callable[[], object], device: torch.device, repeats: int, number: int
) -> list[float]:
    samples = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(number):
            fn()
        _synchronize(device)
        samples.append((time.perf_counter() - start) / number)
    return samples
