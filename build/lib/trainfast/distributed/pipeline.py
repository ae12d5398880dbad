"""Pipeline parallelism: consecutive layers on consecutive ranks, fed with micro-batches.

A model cut into ``p`` stages is a relay: stage ``s`` can start micro-batch ``i`` only after stage
``s - 1`` has finished it, and the backward pass runs the relay in reverse. A *schedule* is the
order in which each stage does its forward (F) and backward (B) passes of ``m`` micro-batches:

* GPipe (Huang et al., 2019): all forwards, then all backwards. Each stage keeps the activations
  of all ``m`` micro-batches until their backward.
* 1F1B (PipeDream-Flush, Narayanan et al., 2021): after ``p - s - 1`` warm-up forwards, stage
  ``s`` alternates one forward and one backward, so at most ``p - s`` micro-batches are alive.

Both leave each stage idle for ``p - 1`` forward-plus-backward slots per batch (the *bubble*),
``(p - 1) / m`` of the ideal time, a fraction ``(p - 1) / (m + p - 1)`` of the step; 1F1B does
not shrink the bubble, it shrinks the memory.

* Interleaved 1F1B (Narayanan et al., 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters", Section 2.2.2): each rank holds ``v`` non-consecutive chunks of layers (virtual
  stages ``r, r + p, ..., r + (v - 1) p``), so the pipeline fills ``v`` times faster: the bubble
  is ``(p - 1) / (v m)`` of the ideal time. The price is messages: a rank in the middle sends
  ``2 v m`` a step instead of ``2 m`` (``v`` times as many, each as large), and the pipeline as a
  whole ``2 (v p - 1) m`` instead of ``2 (p - 1) m``, since a micro-batch crosses ``v p - 1``
  boundaries instead of ``p - 1``: ``(v p - 1) / (p - 1)`` times as many, a little more than
  ``v`` (the chapter counts the pipeline's).

The schedules are pure functions; :func:`simulate` times them with fixed op costs, and
:func:`pipeline_worker` runs them for real, one rank per stage (``v`` chunks per rank when
interleaved).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainfast.distributed.launch import rank_device
from trainfast.timing import timestamp
from trainfast.validation import check_int, check_number

__all__ = [
    "ChunkOp",
    "StageResult",
    "pipeline_communicate",
    "SCHEDULES",
    "PipelineConfig",
    "Slot",
    "bubble_fraction",
    "gpipe_schedule",
    "interleaved_schedule",
    "schedule_for",
    "make_pipeline_model",
    "one_f_one_b_schedule",
    "peak_activations",
    "pipeline_batch",
    "pipeline_sweep_worker",
    "pipeline_worker",
    "simulate",
]

Op = tuple[str, int]  # ("F" or "B", micro-batch index)
ChunkOp = tuple[str, int, int]  # ("F" or "B", micro-batch index, model chunk on this rank)


def _unpack(op: Op | ChunkOp) -> tuple[str, int, int]:
    """(kind, micro-batch, chunk) of an op; a plain schedule's ops are chunk 0."""
    return (op[0], op[1], op[2] if len(op) == 3 else 0)


def bubble_fraction(n_stages: int, n_micro: int) -> float:
    """Idle fraction of a GPipe or 1F1B pipeline: ``(p - 1) / (m + p - 1)``."""
    check_int("n_stages", n_stages, minimum=1)
    check_int("n_micro", n_micro, minimum=1)
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


def interleaved_schedule(n_stages: int, n_micro: int, n_chunks: int) -> list[list[ChunkOp]]:
    """Per rank, the op order of interleaved 1F1B with ``n_chunks`` model chunks per rank.

    Megatron-LM's schedule (Narayanan et al. 2021, Section 2.2.2; in Megatron-LM's code,
    ``forward_backward_pipelining_with_interleaving``): the ``m v`` forwards of a rank run in
    groups of ``p`` micro-batches, chunk by chunk (micro-batches 0..p-1 through chunk 0, then
    through chunk 1, ...), and the backwards in the same groups with the chunks reversed. Rank
    ``r`` runs ``2 (p - r - 1) + (v - 1) p`` warm-up forwards, then alternates one forward and
    one backward, then drains.
    ``n_micro`` must be a multiple of ``n_stages``.
    """
    p, m, v = n_stages, n_micro, check_int("n_chunks", n_chunks, minimum=1)
    bubble_fraction(p, m)
    if m % p:
        raise ValueError(
            f"Invalid n_micro: {m} (expected a multiple of n_stages, {p}: micro-batches run "
            "through the chunks in groups of one per stage)"
        )
    total = m * v

    def op(kind: str, k: int) -> ChunkOp:
        chunk = (k // p) % v
        return (kind, (k // (p * v)) * p + k % p, chunk if kind == "F" else v - 1 - chunk)

    orders = []
    for rank in range(p):
        warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
        ops = [op("F", k) for k in range(warmup)]
        for j in range(total - warmup):
            ops += [op("F", warmup + j), op("B", j)]
        ops += [op("B", j) for j in range(total - warmup, total)]
        orders.append(ops)
    return orders


#: Schedule name -> function of (n_stages, n_micro).
SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}


def peak_activations(schedule: list[list[Op]] | list[list[ChunkOp]]) -> list[int]:
    """Per stage, the most micro-batches whose forward is done and backward is not (with chunks:
    micro-batch chunks, each ``1 / v`` of a stage's layers)."""
    peaks = []
    for ops in schedule:
        alive = peak = 0
        for kind, *_ in ops:
            alive += 1 if kind == "F" else -1
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks


@dataclass(frozen=True)
class Slot:
    """One op of a simulated or measured pipeline: who did what, when (in time units or s)."""

    stage: int  # the rank
    kind: str  # "F" or "B"
    micro: int
    start: float
    end: float
    chunk: int = 0  # the model chunk on this rank (interleaved schedules)


def simulate(
    schedule: list[list[Op]] | list[list[ChunkOp]], forward: float = 1.0, backward: float = 2.0
) -> list[Slot]:
    """Start and end of every op when F costs ``forward`` and B ``backward`` and sends are free.

    An op starts when its rank is free and its input exists. Chunk ``c`` on rank ``s`` is virtual
    stage ``c p + s`` of ``v p``: F needs the previous virtual stage's F of the same micro-batch,
    B the next one's B (the last needs its own F). Raises ``ValueError`` on a schedule that
    deadlocks.
    """
    check_number("forward", forward, minimum=0.0)
    check_number("backward", backward, minimum=0.0)
    if not schedule or not all(isinstance(ops, list) and ops for ops in schedule):
        raise ValueError(
            f"Invalid schedule: {schedule!r:.80} (expected one list of ops per stage, as "
            "gpipe_schedule returns)"
        )
    n_stages = len(schedule)
    n_virtual = n_stages * (1 + max(_unpack(op)[2] for ops in schedule for op in ops))
    done: dict[tuple[str, int, int], float] = {}
    position, free = [0] * n_stages, [0.0] * n_stages
    slots: list[Slot] = []
    while any(position[s] < len(schedule[s]) for s in range(n_stages)):
        progressed = False
        for s in range(n_stages):
            if position[s] == len(schedule[s]):
                continue
            kind, i, chunk = _unpack(schedule[s][position[s]])
            stage = chunk * n_stages + s
            need = ("F", stage - 1, i) if kind == "F" else ("B", stage + 1, i)
            if kind == "F" and stage == 0 or kind == "B" and stage == n_virtual - 1:
                need = ("F", stage, i) if kind == "B" else None
            if need is not None and need not in done:
                continue
            start = max(free[s], done[need] if need else 0.0)
            end = start + (forward if kind == "F" else backward)
            done[(kind, stage, i)], free[s] = end, end
            slots.append(Slot(s, kind, i, start, end, chunk))
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
    n_chunks: int = 1  # model chunks per rank: > 1 with the "interleaved" schedule

    def __post_init__(self) -> None:
        if self.schedule not in (*SCHEDULES, "interleaved"):
            raise ValueError(
                f"Unknown schedule: {self.schedule!r} (expected one of "
                f"{[*SCHEDULES, 'interleaved']})"
            )
        for name in ("width", "layers_per_stage", "batch_size", "n_micro", "n_chunks"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("seed", self.seed)
        check_number("op_seconds", self.op_seconds, minimum=0.0)
        if self.n_chunks > 1 and self.schedule != "interleaved":
            raise ValueError(
                f"Invalid n_chunks: {self.n_chunks} (expected 1, or more when interleaved)"
            )
        if self.batch_size % self.n_micro:
            raise ValueError(
                f"Invalid n_micro: {self.n_micro} does not divide batch_size {self.batch_size}"
            )


def schedule_for(config: PipelineConfig, n_stages: int) -> list[list[Op]] | list[list[ChunkOp]]:
    """The op order of every rank for ``config`` on ``n_stages`` ranks."""
    if config.schedule == "interleaved":
        return interleaved_schedule(n_stages, config.n_micro, config.n_chunks)
    return SCHEDULES[config.schedule](n_stages, config.n_micro)


def make_pipeline_model(config: PipelineConfig, n_stages: int) -> nn.Sequential:
    """The whole model as a ``Sequential`` of ``n_stages`` stages (each a ``Sequential``)."""
    torch.manual_seed(config.seed)

    def block() -> nn.Module:
        return nn.Sequential(nn.Linear(config.width, config.width), nn.Tanh())

    def stage() -> nn.Sequential:
        return nn.Sequential(*[block() for _ in range(config.layers_per_stage)])

    return nn.Sequential(*[stage() for _ in range(n_stages)])


def pipeline_batch(config: PipelineConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and regression targets, both ``(batch_size, width)``."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    x = torch.randn(config.batch_size, config.width, generator=generator)
    return x, torch.randn(config.batch_size, config.width, generator=generator)


def _wait_until(moment: float) -> None:
    """Sleep until the host clock of :func:`~trainfast.timing.timestamp` reads ``moment``."""
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
    stage: int | None = None,
    n_stages: int | None = None,
    micro: int = 0,
) -> torch.Tensor | None:
    """Every message of a pipeline schedule, so the schedule reads as the algorithm (after
    picotron's helper of the same name).

    ``"recv_forward"`` returns the activations from the previous stage and ``"recv_backward"``
    the gradient from the next (both blocking: waiting here is the bubble); ``"send_forward"``
    and ``"send_backward"`` post ``tensor`` without waiting, appending the request to
    ``pending``. The first stage receives no activations and the last no gradients: those
    calls return ``None`` and send nothing. ``stage`` of ``n_stages`` is the (virtual) stage
    doing it, by default this rank of the world; virtual stage ``k`` lives on rank ``k mod N``.
    Each message is tagged with its micro-batch and stage boundary, so a rank that talks to the
    same neighbour about several chunks cannot confuse them (gloo matches tags; NCCL ignores
    them and matches in order).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    stage = rank if stage is None else stage
    n_stages = world_size if n_stages is None else n_stages
    step = {"recv_forward": -1, "send_forward": 1, "recv_backward": 1, "send_backward": -1}
    if operation not in step:
        raise ValueError(f"Unknown operation: {operation!r}")
    other = stage + step[operation]
    if not 0 <= other < n_stages:
        return None  # the first or last stage: nobody there
    boundary = min(stage, other)  # between stages boundary and boundary + 1
    tag = 2 * (micro * n_stages + boundary) + ("backward" in operation)
    peer = other % world_size
    if operation.startswith("recv"):
        received = torch.empty(shape, device=rank_device())
        dist.recv(received, src=peer, tag=tag)
        return received
    pending.append(dist.isend(tensor, dst=peer, tag=tag))
    return None


def pipeline_worker(rank: int, world_size: int, config: PipelineConfig) -> StageResult:
    """Run one training step of stage ``rank`` (of chunks ``rank, rank + N, ...`` when
    interleaved), following the schedule; time every op.

    The loss is the mean squared error over the whole batch, so the gradients equal those of the
    unsplit model on the full batch. Returns this stage's :class:`StageResult`: its gradients,
    its op :class:`Slot` list (seconds since a common start, read with
    :func:`~trainfast.timing.timestamp` once the device is idle), the busy and total time and
    the most activations it held at once. Gradients are named as in the stage's module, or, when
    interleaved, ``"{chunk}.{name}"``.
    """
    device = rank_device()  # its own GPU under NCCL, else the CPU
    n_virtual = world_size * config.n_chunks  # virtual stage c p + rank is this rank's chunk c
    model = make_pipeline_model(config, n_virtual)
    chunks = nn.ModuleList(model[c * world_size + rank] for c in range(config.n_chunks)).to(device)
    x, y = (t.to(device) for t in pipeline_batch(config))
    micro_x, micro_y = x.chunk(config.n_micro), y.chunk(config.n_micro)
    shape = micro_x[0].shape  # (batch_size / n_micro, width)
    alive: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (micro, chunk) -> ...
    sends, slots, peak = [], [], 0
    dist.barrier()
    origin = timestamp(device)
    for kind, i, c in map(_unpack, schedule_for(config, world_size)[rank]):
        where = {"stage": c * world_size + rank, "n_stages": n_virtual, "micro": i}
        if kind == "F":
            inputs = pipeline_communicate("recv_forward", shape=shape, **where)
            inputs = micro_x[i].clone() if inputs is None else inputs.requires_grad_()
            start = timestamp(device)
            outputs = chunks[c](inputs)
            if where["stage"] == n_virtual - 1:  # squared errors / all elements: micro losses add
                outputs = (outputs - micro_y[i]).pow(2).sum() / y.numel()
            _wait_until(start + config.op_seconds / config.n_chunks)
            end = timestamp(device)
            pipeline_communicate("send_forward", tensor=outputs.detach(), pending=sends, **where)
            alive[(i, c)] = (inputs, outputs)
            peak = max(peak, len(alive))
        else:
            inputs, outputs = alive.pop((i, c))
            grad = pipeline_communicate("recv_backward", shape=shape, **where)  # None: last
            start = timestamp(device)
            outputs.backward(grad)
            _wait_until(start + 2 * config.op_seconds / config.n_chunks)
            end = timestamp(device)
            pipeline_communicate("send_backward", tensor=inputs.grad, pending=sends, **where)
        slots.append(Slot(rank, kind, i, start - origin, end - origin, c))
    for request in sends:
        request.wait()
    total = timestamp(device) - origin
    return StageResult(
        grads={
            name: p.grad.cpu()
            for name, p in (chunks[0] if config.n_chunks == 1 else chunks).named_parameters()
        },
        slots=slots,
        busy_s=sum(slot.end - slot.start for slot in slots),
        total_s=total,
        peak_activations=peak,
    )
