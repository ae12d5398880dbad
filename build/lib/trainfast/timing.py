"""The one timer: :func:`~trainfast.timing.benchmark` times a function, keeping every sample.

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
every time is timed warm here. Pass ``before_sample`` (untimed, called before every sample) to
flush a cache, zero gradients or wait at a barrier.

Two relatives share the same clocks, so the package still has one timer:
:func:`benchmark_side_by_side` times several functions taking turns (a drift in the machine's
speed then hits all of them alike), and :func:`timestamp` reads the clock once the device is idle,
for timelines (when did each pipeline stage start?) rather than durations of a function.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trainfast.device import device_name, nvidia_smi_query, parse_device, pick_device
from trainfast.validation import check_flag, check_int, plural

__all__ = [
    "Timing",
    "benchmark",
    "benchmark_side_by_side",
    "cuda_event_samples",
    "host_clock_samples",
    "paired_sign_test",
    "rank_sum_one_sided",
    "rank_sum_test",
    "readable_seconds",
    "timestamp",
]

_CLOCK_FIELDS = ["clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw", "temperature.gpu"]


@dataclass(frozen=True)
class Timing:
    """What :func:`benchmark` measured: every sample, and the conditions it ran under.

    ``samples`` holds one value per repeat, in seconds per call of ``fn`` (a sample of ``number``
    calls is divided by ``number``). ``clocks`` is ``{"before": {...}, "after": {...}}`` with
    nvidia-smi's readings (MHz, W, °C) on an NVIDIA GPU, else None. ``synchronized`` is False
    only for the deliberate mistake of timing a device's work with the host clock alone.
    """

    samples: tuple[float, ...]
    device: str  # "cuda:0", "cpu", ...
    device_name: str
    threads: int  # torch.get_num_threads() while timing
    warmup: int
    number: int  # calls of fn per sample
    clocks: dict[str, dict[str, str]] | None = field(default=None, compare=False)
    synchronized: bool = True

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
            f"{readable_seconds(self.median)} median, IQR {readable_seconds(self.iqr)} "
            f"({plural(len(self.samples), 'sample')} of {plural(self.number, 'call')} on "
            f"{self.device}, {plural(self.threads, 'thread')})"
        )


def readable_seconds(value: float) -> str:
    """``value`` seconds in the unit that reads best, to three significant digits (whole
    numbers from 100 on): ``6.3 s``, ``752 µs``, ``12.5 ms``, ``40 ns``, ``1,234 s``, ``0 s``."""
    if value == 0:
        return "0 s"
    unit, scale = next(
        ((u, f) for u, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)) if abs(value) >= f),
        ("ns", 1e-9),
    )
    number = value / scale
    return f"{number:,.0f} {unit}" if abs(number) >= 100 else f"{number:.3g} {unit}"


def timestamp(device: torch.device | str = "cpu") -> float:
    """Seconds on the host's monotonic clock (``perf_counter``), once ``device`` is idle.

    For timelines: when each stage of a pipeline started and ended, how long training has run.
    Differences of two timestamps are durations, but to time a *function* use :func:`benchmark`,
    which warms up, repeats and keeps every sample. Waiting for a GPU costs a synchronisation
    each call, so do not put one between every kernel of a fast loop.
    """
    device = parse_device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    return time.perf_counter()


def benchmark(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeats: int = 10,
    device: torch.device | str | None = None,
    number: int = 1,
    before_sample: Callable[[], object] | None = None,
    synchronize: bool = True,
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` samples of ``number`` calls each.

    ``device`` says which clock to use: CUDA events on its stream for a CUDA device, the host's
    ``perf_counter`` otherwise (default: :func:`~trainfast.device.pick_device`, so pass
    ``device="cpu"`` to time host-only work on a GPU machine). Use ``number > 1`` when one call
    is shorter than the clock's resolution (about a microsecond for both).

    ``before_sample`` is called, untimed, before each sample (e.g. to flush a cache).
    ``synchronize=False`` times with the host clock and never waits for the device: on a GPU
    that measures how long the launches took, not the work. It is the mistake this harness
    exists to prevent, kept so that the profiling chapter can show it.

    An exception raised by ``fn`` passes through unchanged. Returns a :class:`Timing`.
    """
    return benchmark_side_by_side(
        {"fn": fn},
        warmup=warmup,
        repeats=repeats,
        device=device,
        number=number,
        before_sample=before_sample,
        synchronize=synchronize,
    )["fn"]


def benchmark_side_by_side(
    fns: Mapping[str, Callable[[], object]],
    *,
    warmup: int = 3,
    repeats: int = 10,
    device: torch.device | str | None = None,
    number: int | Mapping[str, int] = 1,
    before_sample: Callable[[], object] | None = None,
    synchronize: bool = True,
) -> dict[str, Timing]:
    """:func:`benchmark` for several functions, taking turns: one sample of each per round.

    Every function is warmed up first; then each of the ``repeats`` rounds takes one sample of
    every function in order. A machine that slows down halfway (another job, a throttled clock)
    then slows all of them alike, so their ratio stays honest. ``number`` may differ per name.
    Returns one :class:`Timing` per name, in the order given.
    """
    if not fns:
        raise ValueError("Invalid fns: nothing to time (expected at least one function)")
    numbers = dict(number) if isinstance(number, Mapping) else dict.fromkeys(fns, number)
    if set(numbers) != set(fns):
        raise ValueError(f"Invalid number: keys {sorted(numbers)} differ from fns {sorted(fns)}")
    check_int("repeats", repeats, minimum=1)
    check_int("warmup", warmup, minimum=0)
    for name, n in numbers.items():
        check_int("number" if len(numbers) == 1 else f"number[{name!r}]", n, minimum=1)
    for name, fn in fns.items():
        if not callable(fn):
            raise ValueError(f"Invalid function {name!r}: {fn!r:.80} is not callable")
    if before_sample is not None and not callable(before_sample):
        raise ValueError(f"Invalid before_sample: {before_sample!r:.80} is not callable")
    check_flag("synchronize", synchronize)
    device = pick_device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    clocks_before = nvidia_smi_query(_CLOCK_FIELDS, device) if device.type == "cuda" else None
    if device.type == "cuda" and synchronize:
        samples = cuda_event_samples(fns, numbers, device, repeats, before_sample)
    else:
        clock = device if synchronize else torch.device("cpu")  # "cpu": never wait
        samples = host_clock_samples(fns, numbers, clock, repeats, before_sample)
    clocks = None
    if clocks_before is not None:
        clocks = {"before": clocks_before, "after": nvidia_smi_query(_CLOCK_FIELDS, device) or {}}
    return {
        name: Timing(
            samples=tuple(samples[name]),
            device=str(device),
            device_name=device_name(device),
            threads=torch.get_num_threads(),
            warmup=warmup,
            number=numbers[name],
            clocks=clocks,
            synchronized=synchronize,
        )
        for name in fns
    }


def cuda_event_samples(
    fns: Mapping[str, Callable[[], object]],
    numbers: dict[str, int],
    device: torch.device,
    repeats: int,
    before_sample: Callable[[], object] | None,
) -> dict[str, list[float]]:
    """Each sample between two CUDA events on the current stream, the device idle around it.

    The clock of :func:`benchmark_side_by_side` on a GPU (call that, not this): the events
    timestamp the GPU's stream, so within a sample the host may run ahead queueing work and the
    sample still measures the GPU's time. Between samples the host waits for the device: were
    a GPU-bound function's kernels still queued when the next sample's start event is
    recorded, the GPU would reach that event only after they ran, while the host had already
    been queueing the next function's launches, and a host-bound function would be timed short
    by the backlog it was hidden behind. ``before_sample`` runs after that wait, and whatever
    device work it queues runs before the start event with no wait in between, as Triton's
    ``do_bench`` queues its cache flush: the device is busy with it while the host queues the
    sample's first launch, so a sample of one short kernel times the kernel, not its launch.
    Returns seconds per call, by name.
    """
    with torch.cuda.device(device):
        events = {
            name: [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(repeats)
            ]
            for name in fns
        }
        for i in range(repeats):
            for name, fn in fns.items():
                torch.cuda.synchronize(device)  # the queue is empty when the sample starts
                if before_sample is not None:
                    before_sample()  # queued ahead of the start event, no wait in between
                start, end = events[name][i]
                start.record()
                for _ in range(numbers[name]):
                    fn()
                end.record()
                torch.cuda.synchronize(device)  # and this sample's work is done when it ends
        return {
            name: [start.elapsed_time(end) / 1e3 / numbers[name] for start, end in pairs]
            for name, pairs in events.items()
        }


def host_clock_samples(
    fns: Mapping[str, Callable[[], object]],
    numbers: dict[str, int],
    device: torch.device,
    repeats: int,
    before_sample: Callable[[], object] | None,
) -> dict[str, list[float]]:
    """Each sample between two :func:`timestamp` readings (which wait for ``device``).

    The clock of :func:`benchmark_side_by_side` on a CPU (call that, not this). Returns seconds
    per call, by name.
    """
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if before_sample is not None:
                before_sample()
            start = timestamp(device)
            for _ in range(numbers[name]):
                fn()
            samples[name].append((timestamp(device) - start) / numbers[name])
    return samples


def paired_sign_test(before: Sequence[float], after: Sequence[float]) -> tuple[int, float]:
    """Is ``after`` faster than ``before``, sample for sample? ``(faster, p_value)``.

    For samples taken side by side (:func:`benchmark_side_by_side`: sample ``i`` of each
    function comes from the same round), compare each pair: ``faster`` counts the rounds in
    which ``after`` took less time. The two-sided sign-test p-value is the probability of a
    count at least that lopsided if neither were faster (ties count half each way). Pairing
    cancels what the rounds share, such as a busy moment of the machine, and the test assumes
    nothing about the shape of the distribution. A small p-value with ``faster`` above half the
    pairs says ``after`` is faster; below half, slower.
    """
    if len(before) != len(after) or not before:
        raise ValueError(f"Invalid samples: {len(before)} and {len(after)} (need equal, > 0)")
    n = len(before)
    wins = sum(1.0 if a < b else 0.5 if a == b else 0.0 for b, a in zip(before, after, strict=True))
    extreme = math.ceil(max(wins, n - wins))  # as or more lopsided than observed
    tail = sum(math.comb(n, k) for k in range(extreme, n + 1)) / 2**n
    return int(round(wins)), min(1.0, 2 * tail)


def rank_sum_test(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """Is after faster than before, for samples not taken in pairs? Returns (share, p_value).

    Mann and Whitney's rank-sum test, for two runs timed one after the other: share is the
    fraction of all (before, after) pairs of samples in which the after sample is shorter
    (ties count half), their U statistic over len(before) * len(after): about one half if
    neither is faster. The two-sided p-value is the probability of a share at least that far
    from one half if all the samples came from one distribution, counted exactly over every
    way of splitting them into the two groups (exact without ties, close with a few). Unlike
    paired_sign_test() it cannot cancel a change of the machine's load that hit one run
    and not the other. A small p-value with share above one half says after is faster.
    """
    m, n = len(before), len(after)
    if not m or not n:
        raise ValueError(f"Invalid samples: {m} and {n} (need at least one each)")
    u = sum(1.0 if a < b else 0.5 if a == b else 0.0 for b in before for a in after)
    counts = _rank_sum_counts(m, n)  # counts[k]: splittings with U = k, out of comb(m + n, m)
    distance = abs(u - m * n / 2)
    tail = sum(count for k, count in enumerate(counts) if abs(k - m * n / 2) >= distance - 1e-9)
    return u / (m * n), min(1.0, tail / math.comb(m + n, m))


def rank_sum_one_sided(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """Is after faster than before, tested one way? Returns (share, p_value).

    The same U statistic as :func:`rank_sum_test`, with the one-sided p-value: the probability,
    if all the samples came from one distribution, of a share of pairs with a shorter after
    sample at least as high as observed, counted exactly over every way of splitting them
    (ties count half). Use it when only one direction is a finding, as when a change is kept
    only if it is faster; it is about half the two-sided p-value for a share above one half.
    """
    m, n = len(before), len(after)
    if not m or not n:
        raise ValueError(f"Invalid samples: {m} and {n} (need at least one each)")
    u = sum(1.0 if a < b else 0.5 if a == b else 0.0 for b in before for a in after)
    counts = _rank_sum_counts(m, n)
    tail = sum(count for k, count in enumerate(counts) if k >= u - 1e-9)
    return u / (m * n), tail / math.comb(m + n, m)


@functools.cache
def _rank_sum_counts(m: int, n: int) -> tuple[int, ...]:
    """How many orderings of ``m`` and ``n`` distinct values have U = 0, 1, ..., m * n."""
    if m == 0 or n == 0:
        return (1,)
    largest_in_first = _rank_sum_counts(m - 1, n)  # it beats all n of the second: U grows by n
    largest_in_second = _rank_sum_counts(m, n - 1)
    counts = [0] * (m * n + 1)
    for k, count in enumerate(largest_in_first):
        counts[k + n] += count
    for k, count in enumerate(largest_in_second):
        counts[k] += count
    return tuple(counts)
