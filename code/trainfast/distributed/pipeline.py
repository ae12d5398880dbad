"""Pipeline parallelism: consecutive layers on consecutive ranks, fed with micro-batches.

A model cut into ``p`` stages is a relay: stage ``s`` can start micro-batch ``i`` only after stage
``s - 1`` has finished it, and the backward pass runs the relay in reverse. A *schedule* is the
order in which each stage does its forward (F) and backward (B) passes of ``m`` micro-batches:

* GPipe (Huang et al., 2019): all forwards, then all backwards. Each stage keeps the activations
  of all ``m`` micro-batches until their backward.
* 1F1B (PipeDream-Flush, Narayanan et al., 2021): after ``p - s - 1`` warm-up forwards, stage
  ``s`` alternates one forward and one backward, so at most ``p - s`` micro-batches are alive.

Both leave each stage idle for ``p - 1`` forward-plus-backward slots per batch (the *bubble*),
a fraction ``(p - 1) / (m + p - 1)`` of the time; 1F1B does not shrink the bubble, it shrinks
the memory. The schedules are pure functions; :func:`simulate` times them with fixed op costs,
and :func:`pipeline_worker` runs them for real, one stage per rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainfast.distributed.launch import rank_device
from trainfast.profiling.timing import timestamp

__all__ = [
    "StageResult",
    "pipeline_communicate",
    "SCHEDULES",
    "PipelineConfig",
    "Slot",
    "bubble_fraction",
    "gpipe_schedule",
    "make_pipeline_model",
    "one_f_one_b_schedule",
    "peak_activations",
    "pipeline_batch",
    "pipeline_sweep_worker",
    "pipeline_worker",
    "simulate",
]

Op = tuple[str, int]  # ("F" or "B", micro-batch index)


def bubble_fraction(n_stages: int, n_micro: int) -> float:
    """Idle fraction of a GPipe or 1F1B pipeline: ``(p - 1) / (m + p - 1)``."""
    if n_stages < 1 or n_micro < 1:
        raise ValueError(
            f"Invalid pipeline: {n_stages} stages, {n_micro} micro-batches (need >= 1)"
        )
    return (n_stages - 1) / (n_micro + n_stages - 1)


def gpipe_schedule(n_stages: int, n_micro: int) -> list[list[Op]]:
    """Per stage, the op order of GPipe: ``F0 .. F(m-1)`` then ``B0 .. B(m-1)``."""
    bubble_fraction(n_stages, n_micro)  # validates
    ops = [("F", i) for i in range(n_micro)] + [("B", i) for i in range(n_micro)]
    return [list(ops) for _ in range(n_stages)]


def one_f_one_b_schedule(n_stages: int, n_micro: int) -> list[list[Op]]:
    """Per stage, the op order of 1F1B: warm-up forwards, then one forward, one backward."""
    bubble_fraction(n_stages, n_micro)
    orders = []
    for stage in range(n_stages):
        warmup = min(n_stages - stage - 1, n_micro)
        ops: list[Op] = [("F", i) for i in range(warmup)]
        for i in range(n_micro - warmup):
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", i) for i in range(n_micro - warmup, n_micro)]
        orders.append(ops)
    return orders


#: Schedule name -> function of (n_stages, n_micro).
SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}


def peak_activations(schedule: list[list[Op]]) -> list[int]:
    """Per stage, the most micro-batches whose forward is done and backward is not."""
    peaks = []
    for ops in schedule:
        alive = peak = 0
        for kind, _ in ops:
            alive += 1 if kind == "F" else -1
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks


@dataclass(frozen=True)
class Slot:
    """One op of a simulated or measured pipeline: who did what, when (in time units or s)."""

    stage: int
    kind: str  # "F" or "B"
    micro: int
    start: float
    end: float


def simulate(schedule: list[list[Op]], forward: float = 1.0, backward: float = 2.0) -> list[Slot]:
    """Start and end of every op when F costs ``forward`` and B ``backward`` and sends are free.

    An op starts when its stage is free and its input exists: F(s, i) needs F(s - 1, i); B(s, i)
    needs B(s + 1, i) (the last stage needs its own F). Raises ``ValueError`` on a schedule
    that deadlocks.
    """
    n_stages = len(schedule)
    done: dict[tuple[str, int, int], float] = {}
    position, free = [0] * n_stages, [0.0] * n_stages
    slots: list[Slot] = []
    while any(position[s] < len(schedule[s]) for s in range(n_stages)):
        progressed = False
        for s in range(n_stages):
            if position[s] == len(schedule[s]):
                continue
            kind, i = schedule[s][position[s]]
            need = ("F", s - 1, i) if kind == "F" else ("B", s + 1, i)
            if kind == "F" and s == 0 or kind == "B" and s == n_stages - 1:
                need = ("F", s, i) if kind == "B" else None
            if need is not None and need not in done:
                continue
            start = max(free[s], done[need] if need else 0.0)
            end = start + (forward if kind == "F" else backward)
            done[(kind, s, i)], free[s] = end, end
            slots.append(Slot(s, kind, i, start, end))
            position[s] += 1
            progressed = True
        if not progressed:
            raise ValueError("Schedule deadlocks: every stage waits for an op that never runs")
    return slots


@dataclass(frozen=True)
class PipelineConfig:
    """A stack of ``Linear + tanh`` blocks cut into equal stages, and one batch to train on."""

    width: int = 256
    layers_per_stage: int = 4
    batch_size: int = 256
    n_micro: int = 8
    schedule: str = "gpipe"
    seed: int = 0
    # > 0: a forward also waits this long, a backward twice as long, as if each stage had a device
    # of its own; measures the schedule on a machine with fewer cores than stages.
    op_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"Unknown schedule: {self.schedule!r} (expected one of {list(SCHEDULES)})"
            )
        if self.batch_size % self.n_micro:
            raise ValueError(
                f"Invalid n_micro: {self.n_micro} does not divide batch_size {self.batch_size}"
            )


def make_pipeline_model(config: PipelineConfig, n_stages: int) -> nn.Sequential:
    """The whole model as a ``Sequential`` of ``n_stages`` stages (each a ``Sequential``)."""
    torch.manual_seed(config.seed)

    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(config.width, config.width), nn.Tanh())

    return nn.Sequential(*[nn.Sequential(*[block() for _ in range(config.layers_per_stage)])
                           for _ in range(n_stages)])  # fmt: skip


def pipeline_batch(config: PipelineConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and regression targets, both ``(batch_size, width)``."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    x = torch.randn(config.batch_size, config.width, generator=generator)
    return x, torch.randn(config.batch_size, config.width, generator=generator)


def _wait_until(moment: float) -> None:
    """Sleep until the host clock of :func:`~trainfast.profiling.timestamp` reads ``moment``."""
    while (left := moment - timestamp()) > 0:
        time.sleep(left)


def pipeline_sweep_worker(
    rank: int, world_size: int, configs: list[PipelineConfig]
) -> list[StageResult]:
    """:func:`pipeline_worker` for each config in turn, in one launch."""
    return [pipeline_worker(rank, world_size, config) for config in configs]


@dataclass
class StageResult:
    """What one pipeline stage reports after a step."""

    grads: dict[str, torch.Tensor]  # this stage's parameter gradients
    slots: list[Slot]  # its operations, seconds since a common start
    busy_s: float  # time spent computing
    total_s: float  # the step, start to end
    peak_activations: int  # the most micro-batches whose activations it held at once


def pipeline_communicate(
    operation: str,
    *,
    tensor: torch.Tensor | None = None,
    shape: tuple[int, ...] | None = None,
    pending: list | None = None,
) -> torch.Tensor | None:
    """Every message of a pipeline schedule, so the schedule reads as the algorithm (after
    picotron's helper of the same name).

    ``"recv_forward"`` returns the activations from the previous stage and ``"recv_backward"``
    the gradient from the next (both blocking: waiting here is the bubble); ``"send_forward"``
    and ``"send_backward"`` post ``tensor`` without waiting, appending the request to
    ``pending``. The first stage receives no activations and the last no gradients: those
    calls return ``None`` and send nothing.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    peer = {"recv_forward": rank - 1, "send_forward": rank + 1,
            "recv_backward": rank + 1, "send_backward": rank - 1}.get(operation)  # fmt: skip
    if peer is None:
        raise ValueError(f"Unknown operation: {operation!r}")
    if not 0 <= peer < world_size:
        return None  # the first or last stage: nobody there
    if operation.startswith("recv"):
        received = torch.empty(shape, device=rank_device())
        dist.recv(received, src=peer)
        return received
    pending.append(dist.isend(tensor, dst=peer))
    return None


def pipeline_worker(rank: int, world_size: int, config: PipelineConfig) -> StageResult:
    """Run one training step of stage ``rank``, following the schedule; time every op.

    The loss is the mean squared error over the whole batch, so the gradients equal those of the
    unsplit model on the full batch. Returns this stage's :class:`StageResult`: its gradients,
    its op :class:`Slot` list (seconds since a common start, read with
    :func:`~trainfast.profiling.timestamp` once the device is idle), the busy and total time and
    the most activations it held at once.
    """
    device = rank_device()  # its own GPU under NCCL, else the CPU
    stage = make_pipeline_model(config, world_size)[rank].to(device)
    x, y = (t.to(device) for t in pipeline_batch(config))
    micro_x, micro_y = x.chunk(config.n_micro), y.chunk(config.n_micro)
    shape = micro_x[0].shape  # (batch_size / n_micro, width)
    last = rank == world_size - 1
    alive: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # micro -> (stage input, output)
    sends, slots, peak = [], [], 0
    dist.barrier()
    origin = timestamp(device)
    for kind, i in SCHEDULES[config.schedule](world_size, config.n_micro)[rank]:
        if kind == "F":
            inputs = pipeline_communicate("recv_forward", shape=shape)
            inputs = micro_x[i].clone() if inputs is None else inputs.requires_grad_()
            start = timestamp(device)
            outputs = stage(inputs)
            if last:  # sum of squared errors / all elements: micro losses add up to the mean
                outputs = (outputs - micro_y[i]).pow(2).sum() / y.numel()
            _wait_until(start + config.op_seconds)
            end = timestamp(device)
            pipeline_communicate("send_forward", tensor=outputs.detach(), pending=sends)
            alive[i] = (inputs, outputs)
            peak = max(peak, len(alive))
        else:
            inputs, outputs = alive.pop(i)
            grad = pipeline_communicate("recv_backward", shape=shape)  # None on the last stage
            start = timestamp(device)
            outputs.backward(grad)
            _wait_until(start + 2 * config.op_seconds)
            end = timestamp(device)
            pipeline_communicate("send_backward", tensor=inputs.grad, pending=sends)
        slots.append(Slot(rank, kind, i, start - origin, end - origin))
    for request in sends:
        request.wait()
    total = timestamp(device) - origin
    return StageResult(
        grads={name: p.grad.cpu() for name, p in stage.named_parameters()},
        slots=slots,
        busy_s=sum(slot.end - slot.start for slot in slots),
        total_s=total,
        peak_activations=peak,
    )
