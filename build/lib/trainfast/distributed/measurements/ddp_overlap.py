"""How much of DDP's communication hides behind the backward pass: a timeline and a benchmark.

:func:`ddp_timeline_worker` trains an MLP with :class:`~trainfast.distributed.ddp.DDP` and returns,
per step, when backward ran and when each bucket's all-reduce was launched and finished: the chapter
draws it. The buckets are timed from outside DDP, by a communication hook (:class:`BucketRecorder`)
that notes the time and then sends the bucket as DDP would. :func:`overlap_step_times_worker` times
a whole step (forward, backward, finishing the synchronisation, optimizer step) with the all-reduces
overlapped and with the same buckets sent only after backward (``overlap=False``), for several
bucket sizes, taking turns through the package's one timer. :func:`ddp_overlap_record` is the
``python -m trainfast.measure --only ddp-overlap`` entry.

On a CPU the ranks share cores with each other and with gloo's threads, so what overlap can
hide here is bounded by the idle cores; on GPUs, communication runs on its own engine and
stream, and overlap is the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainfast.distributed.ddp import DDP, all_reduce_bucket
from trainfast.distributed.launch import default_backend, rank_device, spawn
from trainfast.records import Record, make_record
from trainfast.timing import benchmark_side_by_side, timestamp
from trainfast.training.arguments import build_optimizer

__all__ = [
    "BucketRecorder",
    "BucketTiming",
    "DDPTimelineConfig",
    "StepTimeline",
    "ddp_overlap_record",
    "ddp_timeline_worker",
    "overlap_step_times_worker",
]


@dataclass(frozen=True)
class DDPTimelineConfig:
    """An MLP of ``depth`` square layers, trained with DDP on ``batch_size`` examples per rank."""

    width: int = 512
    depth: int = 6
    batch_size: int = 64
    steps: int = 3
    bucket_cap_mb: float | None = 2.0
    overlap: bool = True
    seed: int = 0


@dataclass
class StepTimeline:
    """One step, in seconds since the step began."""

    forward_end: float
    backward_end: float  # loss.backward() returned
    finish_end: float  # finish_gradient_synchronization() returned
    buckets: list[BucketTiming]


@dataclass
class BucketTiming:
    """When one bucket's all-reduce ran, in ``timestamp()`` seconds."""

    index: int
    numel: int
    launched: float
    done: float = float("nan")


@dataclass
class BucketRecorder:
    """A DDP communication hook that notes when each bucket is launched and when it arrives.

    ``ddp.register_comm_hook(recorder)``; it sends every bucket with DDP's own
    :func:`~trainfast.distributed.ddp.all_reduce_bucket`, so the algorithm is unchanged.
    """

    timings: list[BucketTiming] = field(default_factory=list)

    def __call__(self, index: int, buffer: torch.Tensor) -> Any:
        timing = BucketTiming(index, buffer.numel(), timestamp())
        self.timings.append(timing)
        work = all_reduce_bucket(index, buffer)

        def done(future: Any) -> None:
            timing.done = timestamp()  # on the backend's thread, when the all-reduce is done

        work.get_future().then(done)
        return work

    def take(self, finished: float) -> list[BucketTiming]:
        """The timings since the last call, and forget them. A bucket whose callback has not
        run yet gets ``finished`` (when the step's synchronisation returned) as its end."""
        timings, self.timings = self.timings, []
        for t in timings:
            if t.done != t.done:  # NaN
                t.done = finished
        return timings


def _model(config: DDPTimelineConfig) -> nn.Module:
    torch.manual_seed(config.seed)
    layers = []
    for _ in range(config.depth):
        layers += [nn.Linear(config.width, config.width), nn.ReLU()]
    return nn.Sequential(*layers)


def _batch(config: DDPTimelineConfig, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(config.seed + 1 + rank)
    x = torch.randn(config.batch_size, config.width, generator=generator)
    return x, torch.randn(config.batch_size, config.width, generator=generator)


def ddp_timeline_worker(
    rank: int, world_size: int, config: DDPTimelineConfig
) -> list[StepTimeline]:
    """Train ``config.steps`` steps; when backward ran and when each bucket was on the wire."""
    torch.set_num_threads(1)
    device = rank_device()
    ddp = DDP(_model(config).to(device), bucket_cap_mb=config.bucket_cap_mb, overlap=config.overlap)
    recorder = BucketRecorder()
    ddp.register_comm_hook(recorder)
    optimizer = build_optimizer("sgd", ddp.parameters(), lr=0.01)
    x, y = (t.to(device) for t in _batch(config, rank))
    steps = []
    for _ in range(config.steps):
        dist.barrier()
        start = timestamp()
        output = ddp(x)
        forward_end = timestamp()
        loss = (output - y).pow(2).mean()
        loss.backward()
        backward_end = timestamp()
        ddp.finish_gradient_synchronization()
        finish_end = timestamp()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        buckets = [
            BucketTiming(t.index, t.numel, t.launched - start, t.done - start)
            for t in recorder.take(finish_end)
        ]
        steps.append(
            StepTimeline(forward_end - start, backward_end - start, finish_end - start, buckets)
        )
    return steps


def overlap_step_times_worker(
    rank: int,
    world_size: int,
    config: DDPTimelineConfig,
    bucket_sizes: list[float | None],
    repeats: int = 5,
) -> dict[str, float]:
    """Median step seconds per ``"<bucket size>/<overlap|sync>"``, taking turns."""
    torch.set_num_threads(1)
    device = rank_device()
    x, y = (t.to(device) for t in _batch(config, rank))
    steps = {}
    for size in bucket_sizes:
        for overlap in (False, True):
            ddp = DDP(_model(config).to(device), bucket_cap_mb=size, overlap=overlap)
            optimizer = build_optimizer("sgd", ddp.parameters(), lr=0.01)

            def step(ddp: DDP = ddp, optimizer: torch.optim.Optimizer = optimizer) -> None:
                loss = (ddp(x) - y).pow(2).mean()
                loss.backward()
                ddp.finish_gradient_synchronization()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            steps[f"{size}/{'overlap' if overlap else 'sync'}"] = step
    timings = benchmark_side_by_side(steps, warmup=2, repeats=repeats, device=device)
    medians = torch.tensor([t.median for t in timings.values()], dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)  # a step is done when the slowest rank is
    return dict(zip(timings, medians.tolist(), strict=True))


def ddp_overlap_record(device: torch.device, quick: bool = False) -> Record:
    """The ``ddp-overlap`` record: step time, synchronous vs overlapped, per bucket size."""
    config = DDPTimelineConfig(width=256 if quick else 1024, depth=4 if quick else 8)
    sizes: list[float | None] = [None, 0.5, 4.0, 25.0] if not quick else [None, 25.0]
    world_size = 2
    if default_backend(world_size) == "gloo":  # the ranks run on the CPU: the record says so
        device = torch.device("cpu")
    medians = spawn(
        overlap_step_times_worker, world_size, config, sizes, 3 if quick else 10, timeout=600
    )[0]
    rows = []
    for size in sizes:
        sync, overlap = medians[f"{size}/sync"], medians[f"{size}/overlap"]
        row = {
            "world_size": world_size,
            "bucket_cap_mb": "one per parameter" if size is None else size,
            "sync_seconds": sync,
            "overlap_seconds": overlap,
            "overlap_over_sync": overlap / sync,
        }
        rows.append(row)
    for row in rows:
        row["model"] = f"MLP, {config.depth} layers of {config.width}x{config.width}"
        row["batch_size_per_rank"] = config.batch_size
    return make_record(
        "ddp-overlap",
        "Median DDP step time (slowest rank) with gradient all-reduces launched during backward "
        "(overlap) or only after it (sync), per bucket size; trainfast.distributed.DDP.",
        rows,
        units={"sync_seconds": "s", "overlap_seconds": "s"},
        device=device,
    )
