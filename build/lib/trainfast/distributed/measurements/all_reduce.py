"""Time naive, ring and ``torch.distributed`` all-reduce side by side, in one run.

:func:`all_reduce_timing_worker` runs in every rank (via :func:`~trainfast.distributed.spawn`):
for each tensor size it times the three algorithms in turn, several rounds, interleaved, so a
noisy moment on a shared machine hits all three alike, and keeps the median (through the
package's one timer, :func:`~trainfast.timing.benchmark_side_by_side`). A call's time is
the slowest rank's (an all-reduce is done when the last rank is done). Our collectives run with
``check=False``: the shape handshake is a safety net, not part of the algorithm being compared.

:func:`all_reduce_record` is the ``python -m trainfast.measure`` entry: on a machine with one
GPU per rank it measures NCCL, otherwise gloo on the CPU, and says which in every row.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist

from trainfast.distributed.collectives import all_reduce, ring_all_reduce
from trainfast.distributed.cost_model import NVLINK4, Link, all_reduce_time
from trainfast.distributed.launch import default_backend, rank_device, spawn
from trainfast.records import Prediction, Record, make_record
from trainfast.timing import benchmark, benchmark_side_by_side

__all__ = [
    "BENCHMARK_ALGORITHMS",
    "all_reduce_prediction",
    "all_reduce_record",
    "all_reduce_timing_worker",
    "measure_all_reduce",
]

#: What the benchmark races: our two all-reduces and torch's own.
BENCHMARK_ALGORITHMS = ("naive", "ring", "torch")


def _algorithms() -> dict[str, Callable[[torch.Tensor], object]]:
    return {
        "naive": lambda tensor: all_reduce(tensor, check=False),
        "ring": lambda tensor: ring_all_reduce(tensor, check=False),
        "torch": lambda tensor: dist.all_reduce(tensor),
    }


def _slowest_rank(samples: tuple[float, ...], device: torch.device) -> list[float]:
    """Each sample's largest value over all ranks: a collective is done when the last rank is."""
    slowest = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def _agreed_repeats(run: Callable[[], object], device: torch.device, budget_s: float) -> int:
    """Calls per timing so that one timing takes about ``budget_s``; the same on every rank.

    Times one warm-up call; the slowest rank's time decides, or ranks would disagree on how
    many collectives to run and wait for each other forever.
    """
    once = benchmark(run, warmup=0, repeats=1, device=device)
    (slowest,) = _slowest_rank(once.samples, device)
    return max(1, min(50, int(budget_s / max(slowest, 1e-6))))


def all_reduce_timing_worker(
    rank: int, world_size: int, sizes: list[int], rounds: int = 5, budget_s: float = 0.02
) -> list[dict[str, object]]:
    """Median seconds per float32 all-reduce, for each size (elements) and algorithm.

    Each timing repeats the call to last about ``budget_s``. The three algorithms take turns
    (:func:`~trainfast.timing.benchmark_side_by_side`), every rank starting each sample at a
    barrier; a sample counts the slowest rank's time. Every rank returns the same rows:
    world_size, elements, bytes, algorithm, backend, seconds.
    """
    device = rank_device()
    rows = []
    for numel in sizes:
        tensor = torch.zeros(numel, dtype=torch.float32, device=device)  # zeros stay finite
        n_bytes = tensor.numel() * tensor.element_size()
        calls = {name: partial(run, tensor) for name, run in _algorithms().items()}
        for call in calls.values():  # warm up connections and buffers
            call()
        repeats = {name: _agreed_repeats(call, device, budget_s) for name, call in calls.items()}
        timings = benchmark_side_by_side(
            calls,
            warmup=0,
            repeats=rounds,
            number=repeats,
            device=device,
            before_sample=dist.barrier,
        )
        for name, timing in timings.items():
            row = {
                "world_size": world_size,
                "elements": numel,
                "bytes": n_bytes,
                "algorithm": name,
                "backend": dist.get_backend(),
                "seconds": statistics.median(_slowest_rank(timing.samples, device)),
            }
            rows.append(row)
    return rows


def measure_all_reduce(
    sizes: list[int],
    world_sizes: list[int],
    rounds: int = 5,
    budget_s: float = 0.02,
    timeout: float = 600.0,
    backend: str | None = None,
) -> list[dict[str, object]]:
    """Rows of :func:`all_reduce_timing_worker` for every world size (one launch each).

    ``backend`` is :func:`~trainfast.distributed.spawn`'s (default: NCCL when there is a GPU per
    rank, else gloo).
    """
    rows: list[dict[str, object]] = []
    for world_size in world_sizes:
        rows += spawn(
            all_reduce_timing_worker,
            world_size,
            sizes,
            rounds,
            budget_s,
            timeout=timeout,
            backend=backend,
        )[0]
    return rows


def all_reduce_record(device: torch.device, quick: bool = False) -> Record:
    """The ``all-reduce-time`` measurement record for this machine (see module docstring)."""
    if device.type == "cuda" and default_backend(2) == "nccl":
        world_sizes = [n for n in (2, 4, 8) if n <= torch.cuda.device_count()]
        sizes = [2**k for k in (range(10, 27, 8) if quick else range(8, 29, 2))]
    else:  # gloo processes on the CPU, whatever GPU the machine has: the record says so
        device = torch.device("cpu")
        world_sizes = [2, 4] if quick else [2, 3, 4]
        sizes = [2**k for k in (range(4, 17, 6) if quick else range(2, 23, 4))]
    rows = measure_all_reduce(sizes, world_sizes, rounds=3 if quick else 7, budget_s=0.05)
    return make_record(
        "all-reduce-time",
        "Median time of one float32 all-reduce: trainfast's naive and ring versions and "
        "torch.distributed.all_reduce, interleaved in one run; the slowest rank's time.",
        rows,
        units={"bytes": "B", "seconds": "s"},
        device=device,
    )


def all_reduce_prediction(
    n_bytes: float, world_size: int, link: Link = NVLINK4, link_name: str = "NVLink 4 (H100 SXM)"
) -> Prediction:
    """The time of a ring all-reduce of ``n_bytes`` over ``world_size`` GPUs, from the α-β model.

    :func:`~trainfast.distributed.cost_model.all_reduce_time` with ``link`` (default: NVLink 4,
    450 GB/s each way per the H100 datasheet, and an assumed 5 µs per step). NCCL on one node
    uses NVLink through NVSwitch, which this one-link-per-rank model fits. ``all-reduce-time``
    measures it on a machine with ``world_size`` GPUs.
    """
    return Prediction(
        all_reduce_time("ring", n_bytes, world_size, link) * 1e3,
        "ms",
        f"α-β model of a ring all-reduce of {n_bytes / 2**20:,.0f} MiB over {world_size} GPUs, "
        f"{link_name}",
    )
