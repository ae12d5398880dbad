"""Run our collectives and ``torch.distributed``'s on the same inputs, side by side.

:func:`parity_worker` is a :func:`~trainfast.distributed.spawn` worker: for each
:class:`Case` it builds the same per-rank input twice, hands one copy to the collective from
:mod:`trainfast.distributed.collectives` and the other to its ``torch.distributed`` counterpart,
and returns both results. The tests assert they agree; the chapter prints the differences.

gloo has no ``AVG`` reduction, so on gloo the reference for ``op="mean"`` is torch's ``SUM``
followed by division by the world size (rounding toward zero for integers, as NCCL's ``AVG``
does); under NCCL it is ``ReduceOp.AVG`` itself.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainfast.distributed import collectives
from trainfast.distributed.launch import rank_device

__all__ = [
    "COLLECTIVES",
    "ERROR_KINDS",
    "Case",
    "error_worker",
    "parity_worker",
    "torch_reference",
    "torch_fsdp_traffic_worker",
    "traffic_worker",
    "zero_traffic_worker",
]

#: The collectives :class:`Case` can name.
COLLECTIVES = (
    "broadcast",
    "reduce",
    "all_reduce",
    "ring_all_reduce",
    "all_gather",
    "reduce_scatter",
)

# gloo's reduce_scatter: missing before torch 2.8, ignores `op` (always sums) in 2.8
_GLOO_REDUCE_SCATTER = torch.torch_version.TorchVersion(torch.__version__) >= (2, 9)

_TORCH_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


@dataclass(frozen=True)
class Case:
    """One collective call: which, on what shape and dtype, with which op and root rank.

    ``transpose=True`` hands the collective a non-contiguous (transposed) 2-D view.
    """

    collective: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    op: str = "sum"
    root: int = 0
    transpose: bool = False

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ValueError(
                f"Unknown collective: {self.collective!r} (expected one of {COLLECTIVES})"
            )


def _input(case: Case, rank: int, seed: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s input for ``case``: random, different on every rank, reproducible."""
    generator = torch.Generator().manual_seed(seed + 7919 * rank)
    if case.dtype.is_floating_point:
        values = torch.randn(case.shape, generator=generator, dtype=torch.float64)
    else:
        values = torch.randint(-50, 50, case.shape, generator=generator)
    tensor = values.to(case.dtype).to(device)
    return tensor.t() if case.transpose else tensor  # (cols, rows), not contiguous


def _mean_of_sum(tensor: torch.Tensor, world_size: int) -> None:
    if tensor.is_floating_point():
        tensor.div_(world_size)
    else:
        tensor.copy_(torch.div(tensor, world_size, rounding_mode="trunc"))


def torch_reference(case: Case, tensor: torch.Tensor) -> torch.Tensor:
    """What ``torch.distributed`` computes for ``case`` from this rank's ``tensor`` (a copy)."""
    world_size = dist.get_world_size()
    tensor = tensor.contiguous().clone()  # torch's collectives expect contiguous tensors
    use_avg = case.op == "mean" and dist.get_backend() == "nccl"
    op = dist.ReduceOp.AVG if use_avg else getattr(dist.ReduceOp, _TORCH_OPS.get(case.op, "SUM"))
    divide = case.op == "mean" and not use_avg
    if case.collective == "broadcast":
        dist.broadcast(tensor, src=case.root)
        return tensor
    if case.collective == "reduce":
        dist.reduce(tensor, dst=case.root, op=op)
        if divide and dist.get_rank() == case.root:
            _mean_of_sum(tensor, world_size)
        return tensor
    if case.collective in ("all_reduce", "ring_all_reduce"):
        dist.all_reduce(tensor, op=op)
        if divide:
            _mean_of_sum(tensor, world_size)
        return tensor
    if case.collective == "all_gather":
        gathered = [torch.empty_like(tensor) for _ in range(world_size)]
        dist.all_gather(gathered, tensor)
        return torch.stack(gathered)
    inputs = [tensor * (i + 1) for i in range(world_size)]  # reduce_scatter: one block per rank
    if dist.get_backend() == "gloo" and not _GLOO_REDUCE_SCATTER:
        stacked = torch.stack(inputs)  # (world_size, *shape): all-reduce, keep this rank's block
        dist.all_reduce(stacked, op=op)
        output = stacked[dist.get_rank()].clone()
    else:
        output = torch.empty_like(tensor)
        dist.reduce_scatter(output, inputs, op=op)
    if divide:
        _mean_of_sum(output, world_size)
    return output


def _ours(case: Case, tensor: torch.Tensor) -> torch.Tensor:
    world_size = dist.get_world_size()
    tensor = tensor.clone()  # clone keeps a transposed view's strides: still non-contiguous
    if case.collective == "broadcast":
        collectives.broadcast(tensor, src=case.root)
    elif case.collective == "reduce":
        collectives.reduce(tensor, dst=case.root, op=case.op)
    elif case.collective == "all_reduce":
        collectives.all_reduce(tensor, op=case.op)
    elif case.collective == "ring_all_reduce":
        collectives.ring_all_reduce(tensor, op=case.op)
    elif case.collective == "all_gather":
        gathered = [torch.empty_like(tensor) for _ in range(world_size)]
        collectives.all_gather(gathered, tensor)
        return torch.stack(gathered)
    else:
        output = torch.empty_like(tensor)
        collectives.reduce_scatter(output, [tensor * (i + 1) for i in range(world_size)], case.op)
        return output
    return tensor


def parity_worker(
    rank: int, world_size: int, cases: list[Case], seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each case: (our result, torch's result) on this rank, both moved to the CPU.

    For ``reduce`` only the root's result is defined; other ranks return two empty tensors.
    """
    device = rank_device()
    results = []
    for index, case in enumerate(cases):
        tensor = _input(case, rank, seed + 104729 * index, device)
        ours, theirs = _ours(case, tensor), torch_reference(case, tensor)
        if case.collective == "reduce" and rank != case.root:
            ours, theirs = ours.new_empty(0), theirs.new_empty(0)
        results.append((ours.cpu(), theirs.cpu()))
    return results


#: What :func:`error_worker` can get wrong on purpose.
ERROR_KINDS = ("shape", "dtype", "op", "raise", "exit")


def error_worker(
    rank: int, world_size: int, kind: str, collective: str = "ring_all_reduce"
) -> None:
    """Make rank ``world_size - 1`` misbehave in one of :data:`ERROR_KINDS`, then all-reduce.

    ``shape``/``dtype``: its tensor differs from the others'; ``op``: every rank passes an
    unknown op; ``raise``: it raises ``RuntimeError`` while the others wait in the collective;
    ``exit``: it dies without a word. Used by the chapter and the tests to show the failures.
    """
    if kind not in ERROR_KINDS:
        raise ValueError(f"Unknown kind: {kind!r} (expected one of {ERROR_KINDS})")
    odd = rank == world_size - 1
    tensor = torch.ones(5 if odd and kind == "shape" else 4, device=rank_device())
    if odd and kind == "dtype":
        tensor = tensor.to(torch.int64)
    if odd and kind == "raise":
        raise RuntimeError(f"rank {rank} fails on purpose")
    if odd and kind == "exit":
        os._exit(3)
    run = {"ring_all_reduce": collectives.ring_all_reduce, "all_reduce": collectives.all_reduce}
    run[collective](tensor, op="prod" if kind == "op" else "sum")


@contextmanager
def _counting_sends(counter: list[int], floating_only: bool = False) -> Iterator[None]:
    """Count the bytes this process passes to ``dist.send``/``dist.isend`` (gloo; test aid);
    ``floating_only``: leave out integer messages (the shape checks)."""
    send, isend = dist.send, dist.isend

    def count(tensor: torch.Tensor) -> None:
        if tensor.is_floating_point() or not floating_only:
            counter[0] += tensor.numel() * tensor.element_size()

    def counted_send(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        count(tensor)
        return send(tensor, *args, **kwargs)

    def counted_isend(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        count(tensor)
        return isend(tensor, *args, **kwargs)

    dist.send, dist.isend = counted_send, counted_isend
    try:
        yield
    finally:
        dist.send, dist.isend = send, isend


@contextmanager
def _counting_ring_collectives(counter: list[float], world_size: int) -> Iterator[None]:
    """Add what a ring would send for each ``torch.distributed`` all-gather, reduce-scatter and
    all-reduce this process calls: ``(N-1)/N`` of the full tensor's bytes for the halves, twice
    that for an all-reduce (gloo's own algorithms send differently; this counts the calls)."""
    share = (world_size - 1) / world_size

    def nbytes(tensor: torch.Tensor) -> int:
        return tensor.numel() * tensor.element_size()

    def counted(name: str, full_bytes: Any) -> Any:
        original = getattr(dist, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.signature(original).bind(*args, **kwargs)  # FSDP2 passes keywords
            counter[0] += full_bytes(*bound.args)
            return original(*args, **kwargs)

        return original, call

    patches = {
        "all_gather_single": lambda output, *_: share * nbytes(output),
        "all_gather_into_tensor": lambda output, *_: share * nbytes(output),
        "reduce_scatter_single": lambda output, flat, *_: share * nbytes(flat),
        "reduce_scatter_tensor": lambda output, flat, *_: share * nbytes(flat),
        "all_reduce": lambda tensor, *_: 2 * share * nbytes(tensor),
    }
    originals = {}
    for name, full_bytes in patches.items():
        if hasattr(dist, name):
            originals[name], call = counted(name, full_bytes)
            setattr(dist, name, call)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def traffic_worker(rank: int, world_size: int, numel: int) -> dict[str, int]:
    """Bytes this rank sends in one naive and one ring all-reduce of ``numel`` float32 values.

    The shape check is off (``check=False``): only the algorithm's own messages are counted.
    """
    sent = {}
    for name, run in (("naive", collectives.all_reduce), ("ring", collectives.ring_all_reduce)):
        counter = [0]
        with _counting_sends(counter):
            run(torch.ones(numel, device=rank_device()), check=False)
        sent[name] = counter[0]
    return sent


def zero_traffic_worker(
    rank: int,
    world_size: int,
    zero_stage: int,
    micro_batches: int,
    dtype: torch.dtype = torch.float32,
) -> float:
    """Bytes this rank sends in one data-parallel step of ``micro_batches`` micro-batches.

    Stage 0: gradients accumulate locally, then one ring all-reduce per parameter
    (:func:`~trainfast.distributed.data_parallel.average_gradients`). Stage 1: the same, then
    :class:`~trainfast.distributed.zero.ZeroOptimizer`'s broadcasts from each owner. Stage 2:
    :class:`~trainfast.distributed.zero.Zero2Optimizer`, whose hooks reduce-scatter every
    micro-batch's gradients, then its all-gathers. Stage 3: our
    :class:`~trainfast.distributed.fsdp.FSDP`, which calls ``torch.distributed``'s all-gathers
    and reduce-scatters (and all-reduces the 1-D parameters' gradients once per step); those
    calls are counted at a ring's bytes.
    Every parameter's size divides by ``world_size`` (no padding); the model's parameters (and so
    its gradients) are ``dtype`` (our FSDP keeps fp32 shards and computes in ``dtype``); the shape
    checks and the initial broadcast are not counted.
    """
    from trainfast.distributed.data_parallel import average_gradients
    from trainfast.distributed.fsdp import FSDP
    from trainfast.distributed.zero import Zero2Optimizer, ZeroOptimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    if zero_stage == 3:
        fsdp = FSDP(model, compute_dtype=None if dtype == torch.float32 else dtype)
        optimizer = torch.optim.SGD(fsdp.parameters(), lr=0.1)
        counted: list[float] = [0.0]
        with _counting_ring_collectives(counted, world_size):
            for micro in range(micro_batches):
                generator = torch.Generator().manual_seed(rank * 100 + micro)
                fsdp(torch.randn(2, 8, generator=generator)).square().mean().backward()
            fsdp.finish_gradient_synchronization()
            optimizer.step()
        return counted[0]
    model = model.to(dtype)
    if zero_stage == 2:
        optimizer: torch.optim.Optimizer = Zero2Optimizer(
            model.parameters(), torch.optim.SGD, lr=0.1
        )
    elif zero_stage == 1:
        optimizer = ZeroOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    counter = [0]
    with _counting_sends(counter, floating_only=True):
        for micro in range(micro_batches):
            inputs = torch.randn(2, 8, generator=torch.Generator().manual_seed(rank * 100 + micro))
            model(inputs.to(dtype)).square().mean().backward()
        if zero_stage < 2:
            average_gradients(model)
        optimizer.step()
    return counter[0]


def torch_fsdp_traffic_worker(
    rank: int, world_size: int, reshard_after_forward: bool, micro_batches: int
) -> float:
    """Bytes this rank sends in one step of PyTorch's ``fully_shard`` (FSDP2), accumulating
    gradients before one reduction, as PyTorch's pipelining does for FSDP (and Llama 3 did):
    every backward but the last with ``set_requires_gradient_sync(False)``
    (``torch/distributed/pipelining/stage.py``).

    ``reshard_after_forward=True`` is ZeRO-3 (the weights gathered for every forward and
    backward); ``False``, with ``set_reshard_after_backward(False)`` on every backward but the
    last as the pipelining stage sets it, keeps them gathered from the first forward to the last
    backward: ZeRO-2 in the step model's terms. Mixed precision as Llama 3's: weights gathered
    in bf16, gradients reduced in fp32 (``MixedPrecisionPolicy(torch.bfloat16, torch.float32)``).
    Each ``Linear`` (sizes divisible by 4) is one unit; FSDP2's calls to ``torch.distributed``
    are counted at a ring's bytes.
    """
    from trainfast.distributed.torch_apis import fully_shard_api

    fully_shard, policy = fully_shard_api()
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    mesh = init_device_mesh(rank_device().type, (world_size,))
    mixed = policy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mixed)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mixed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    counted: list[float] = [0.0]
    with _counting_ring_collectives(counted, world_size):
        for micro in range(micro_batches):
            last = micro == micro_batches - 1
            model.set_requires_gradient_sync(last)
            if not reshard_after_forward:  # ZeRO-2: gathered once, kept to the last backward
                model.set_reshard_after_backward(last)
            generator = torch.Generator().manual_seed(rank * 100 + micro)
            model(torch.randn(2, 8, generator=generator)).float().square().mean().backward()
        optimizer.step()
    return counted[0]
