"""Collective operations written from point-to-point messages (``send``/``recv``).

Every function here has the call shape of its ``torch.distributed`` namesake and works in place
inside an initialised process group, so it can replace it in a training loop. Two all-reduces
sit side by side so the chapter can race them:

* :func:`all_reduce`, the naive one: every rank sends its tensor to rank 0, which reduces and
  sends the result back. Rank 0's link carries ``2 (N - 1)`` full tensors.
* :func:`ring_all_reduce`, the bandwidth-optimal ring (Patarasuk and Yuan, 2009; the Baidu and
  Horovod "ring all-reduce"): a reduce-scatter then an all-gather of ``1/N`` chunks, so each
  rank sends ``2 (N - 1) / N`` of the tensor, whatever ``N`` is.

``op`` is ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``. ``"mean"`` of an integer tensor is the
sum divided by the world size rounding toward zero, as C division and NCCL's ``AVG`` do. With
``check=True`` (the default) the ranks first compare shapes, dtypes and the arguments that must
agree (the collective, ``src``/``dst``, ``op``), so a mismatch is a ``ValueError`` naming the
rank and both values instead of a hang or garbage; it costs two small messages per rank.

``group`` (keyword, default: every rank) runs a collective inside a process group from
``dist.new_group``: ranks are then numbered within the group, as in ``torch.distributed``, which
is how the axes of a 2-D layout each talk among their own ranks. These are teaching
implementations: one chunk in flight per step and no pipelining, where NCCL and gloo split
messages and overlap them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from trainfast.distributed.agreement import (
    OPS,
    check_same_tensor_meta,
    global_rank,
    rank_and_world_size,
)
from trainfast.validation import check_int

__all__ = [
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "ring_all_reduce",
    "ring_chunks",
    "ring_shift",
    "scatter",
]


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"Unknown op: {op!r} (expected one of {OPS})")


def _check_rank(value: int, name: str, world_size: int) -> None:
    if not isinstance(value, int) or not 0 <= value < world_size:
        raise ValueError(f"Invalid {name}: {value!r} (expected a rank in 0..{world_size - 1})")


def _combine(accumulator: torch.Tensor, incoming: torch.Tensor, op: str) -> None:
    """``accumulator <- accumulator (op) incoming``, in place ("mean" sums; see :func:`_finish`)."""
    if op in ("sum", "mean"):
        accumulator.add_(incoming)
    elif op == "max":
        torch.maximum(accumulator, incoming, out=accumulator)
    else:
        torch.minimum(accumulator, incoming, out=accumulator)


def _finish(tensor: torch.Tensor, op: str, world_size: int) -> None:
    """Turn a sum into a mean, in place; integers round toward zero like NCCL's AVG."""
    if op != "mean" or world_size == 1:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.div_(world_size)
    else:
        tensor.copy_(torch.div(tensor, world_size, rounding_mode="trunc"))


def _exchange(
    send: torch.Tensor,
    recv: torch.Tensor,
    to: int,
    source: int,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Send ``send`` to rank ``to`` while receiving ``recv`` from rank ``source``.

    Both sides of a ring step send and receive at once. With blocking ``send`` first on every
    rank, gloo would deadlock (its send waits for the matching receive), so the send is
    non-blocking; NCCL wants the pair grouped in one call. An empty tensor is not sent (nor
    expected): chunk sizes are the same on every rank, so both ends skip it together. ``to`` and
    ``source`` are ranks within ``group``.
    """
    to, source = global_rank(group, to), global_rank(group, source)
    pairs = [(dist.isend, send, to), (dist.irecv, recv, source)]
    pairs = [(function, tensor, peer) for function, tensor, peer in pairs if tensor.numel() > 0]
    if dist.get_backend() == "nccl" and pairs:
        requests = dist.batch_isend_irecv([dist.P2POp(*pair, group=group) for pair in pairs])
    else:
        requests = [function(tensor, peer, group=group) for function, tensor, peer in pairs]
    for request in requests:
        request.wait()


# ------------------------------------------------------------------ rooted: one rank in charge
def broadcast(tensor: torch.Tensor, src: int = 0, *, check: bool = True) -> None:
    """Copy ``src``'s ``tensor`` into every rank's ``tensor``: ``src`` sends to each rank."""
    rank, world_size = rank_and_world_size()
    if check:  # before the local checks, so a rank with a bad src cannot leave others waiting
        check_same_tensor_meta(tensor, collective="broadcast", root=("src", src))
    _check_rank(src, "src", world_size)
    buffer = tensor if tensor.is_contiguous() else tensor.contiguous()
    if rank == src:
        requests = [dist.isend(buffer, dst=other) for other in range(world_size) if other != src]
        for request in requests:
            request.wait()
    else:
        dist.recv(buffer, src=src)
        if buffer is not tensor:
            tensor.copy_(buffer)


def reduce(tensor: torch.Tensor, dst: int = 0, op: str = "sum", *, check: bool = True) -> None:
    """Reduce every rank's ``tensor`` into ``dst``'s ``tensor`` (the others keep theirs).

    ``dst`` receives from all ranks at once, then combines in rank order.
    """
    _reduce(tensor, dst, op, check, "reduce")


def _reduce(tensor: torch.Tensor, dst: int, op: str, check: bool, collective: str) -> None:
    rank, world_size = rank_and_world_size()
    if check:
        check_same_tensor_meta(tensor, collective=collective, root=("dst", dst), op=op)
    _check_op(op)
    _check_rank(dst, "dst", world_size)
    if rank != dst:
        dist.send(tensor.contiguous(), dst=dst)
        return
    incoming = {
        other: torch.empty_like(tensor, memory_format=torch.contiguous_format)
        for other in range(world_size)
        if other != dst
    }
    requests = [dist.irecv(buffer, src=other) for other, buffer in incoming.items()]
    for request in requests:
        request.wait()
    result = tensor.clone() if rank == 0 else incoming[0]
    for other in range(1, world_size):
        _combine(result, tensor if other == rank else incoming[other], op)
    _finish(result, op, world_size)
    tensor.copy_(result)


def all_reduce(tensor: torch.Tensor, op: str = "sum", *, check: bool = True) -> None:
    """Naive all-reduce: :func:`reduce` to rank 0, then :func:`broadcast` from it."""
    _reduce(tensor, 0, op, check, "all_reduce")
    broadcast(tensor, src=0, check=False)


# ------------------------------------------------------------------------ the ring, in 1/N chunks
def ring_chunks(rank: int, step: int, world_size: int, phase: str) -> tuple[int, int]:
    """(chunk sent to the right neighbour, chunk received from the left) in a ring step.

    ``phase`` is ``"reduce-scatter"`` (after ``N - 1`` steps rank ``r`` holds chunk ``r`` fully
    reduced) or ``"all-gather"`` (rank ``r`` starts from chunk ``r`` and passes chunks on).
    A rank or step the ring does not have raises ``ValueError``: ``%`` would answer for it.
    """
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0, maximum=world_size - 1)
    check_int("step", step, minimum=0, maximum=world_size - 2)  # N - 1 steps per phase
    if phase == "reduce-scatter":
        return (rank - step - 1) % world_size, (rank - step - 2) % world_size
    if phase == "all-gather":
        return (rank - step) % world_size, (rank - step - 1) % world_size
    raise ValueError(f"Unknown phase: {phase!r} (expected 'reduce-scatter' or 'all-gather')")


def _ring_reduce_scatter(
    chunks: list[torch.Tensor], op: str, group: dist.ProcessGroup | None = None
) -> None:
    """Pass partial results around the ring; afterwards ``chunks[rank]`` is fully reduced."""
    rank, world_size = rank_and_world_size(group)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):
        send, recv = ring_chunks(rank, step, world_size, "reduce-scatter")
        incoming = torch.empty_like(chunks[recv])
        _exchange(chunks[send], incoming, to=right, source=left, group=group)
        _combine(chunks[recv], incoming, op)


def _ring_all_gather(chunks: list[torch.Tensor], group: dist.ProcessGroup | None = None) -> None:
    """Pass finished chunks around the ring until every rank has all of them."""
    rank, world_size = rank_and_world_size(group)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):
        send, recv = ring_chunks(rank, step, world_size, "all-gather")
        _exchange(chunks[send], chunks[recv], to=right, source=left, group=group)


def ring_all_reduce(
    tensor: torch.Tensor,
    op: str = "sum",
    *,
    check: bool = True,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Ring all-reduce: reduce-scatter, then all-gather, of ``N`` nearly equal chunks.

    Lengths that ``N`` does not divide give chunks one element apart (``tensor_split``); a
    tensor shorter than ``N`` has empty chunks, which are simply not sent.
    """
    rank, world_size = rank_and_world_size(group)
    if check:
        check_same_tensor_meta(tensor, collective="ring_all_reduce", op=op, group=group)
    _check_op(op)
    flat = tensor.contiguous().view(-1)  # a view when tensor is contiguous, else a copy
    chunks = list(flat.tensor_split(world_size))  # N views of ~numel/N elements
    _ring_reduce_scatter(chunks, op, group)
    _finish(chunks[rank], op, world_size)
    _ring_all_gather(chunks, group)
    if not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))


# -------------------------------------------------------------------- lists: one block per rank
def _check_list(
    tensors: list[torch.Tensor], tensor: torch.Tensor, name: str, world_size: int
) -> None:
    if len(tensors) != world_size:
        raise ValueError(
            f"Invalid {name}: {len(tensors)} tensors (expected one per rank, {world_size})"
        )
    for i, item in enumerate(tensors):
        if item.shape != tensor.shape or item.dtype != tensor.dtype:
            raise ValueError(
                f"Invalid {name}[{i}]: shape {tuple(item.shape)} and dtype {item.dtype} "
                f"(expected {tuple(tensor.shape)} and {tensor.dtype}, like the single tensor)"
            )


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    *,
    check: bool = True,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Fill ``tensor_list[r]`` with rank ``r``'s ``tensor`` on every rank (a ring of blocks)."""
    rank, world_size = rank_and_world_size(group)
    if check:
        check_same_tensor_meta(tensor, collective="all_gather", group=group)
    _check_list(tensor_list, tensor, "tensor_list", world_size)
    blocks = [item.contiguous().view(-1) for item in tensor_list]  # views unless non-contiguous
    blocks[rank].copy_(tensor.reshape(-1))
    _ring_all_gather(blocks, group)
    for item, block in zip(tensor_list, blocks, strict=True):
        if not item.is_contiguous():
            item.copy_(block.view_as(item))


def reduce_scatter(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: str = "sum",
    *,
    check: bool = True,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Rank ``r``'s ``output`` becomes the reduction over ranks of their ``input_list[r]``.

    The inputs are left as they were (the ring works on copies).
    """
    rank, world_size = rank_and_world_size(group)
    if check:
        check_same_tensor_meta(output, collective="reduce_scatter", op=op, group=group)
    _check_op(op)
    _check_list(input_list, output, "input_list", world_size)
    blocks = [item.reshape(-1).clone() for item in input_list]
    _ring_reduce_scatter(blocks, op, group)
    _finish(blocks[rank], op, world_size)
    output.copy_(blocks[rank].view_as(output))


# ------------------------------------------- rooted lists and the all-to-all (one block per pair)
def gather(
    tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None, dst: int = 0
) -> None:
    """Fill ``dst``'s ``gather_list[r]`` with rank ``r``'s ``tensor``; ``dst`` receives from all.

    Only ``dst`` passes ``gather_list`` (one tensor per rank, shaped like ``tensor``), as in
    ``torch.distributed.gather``. Every other rank sends one message.
    """
    rank, world_size = rank_and_world_size()
    _check_rank(dst, "dst", world_size)
    if rank != dst:
        dist.send(tensor.contiguous(), dst=dst)
        return
    if gather_list is None:
        raise ValueError("Invalid gather_list: None on the destination rank (one tensor per rank)")
    _check_list(gather_list, tensor, "gather_list", world_size)
    buffers = [
        torch.empty_like(item, memory_format=torch.contiguous_format) for item in gather_list
    ]
    requests = [
        dist.irecv(buffers[other], src=other) for other in range(world_size) if other != dst
    ]
    for request in requests:
        request.wait()
    buffers[dst] = tensor
    for item, buffer in zip(gather_list, buffers, strict=True):
        item.copy_(buffer)


def scatter(
    tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None, src: int = 0
) -> None:
    """Rank ``r``'s ``tensor`` becomes ``src``'s ``scatter_list[r]``; ``src`` sends to each."""
    rank, world_size = rank_and_world_size()
    _check_rank(src, "src", world_size)
    if rank != src:
        buffer = tensor if tensor.is_contiguous() else tensor.contiguous()
        dist.recv(buffer, src=src)
        if buffer is not tensor:
            tensor.copy_(buffer)
        return
    if scatter_list is None:
        raise ValueError("Invalid scatter_list: None on the source rank (one tensor per rank)")
    _check_list(scatter_list, tensor, "scatter_list", world_size)
    blocks = [item.contiguous() for item in scatter_list]
    requests = [dist.isend(blocks[other], dst=other) for other in range(world_size) if other != src]
    tensor.copy_(scatter_list[src])
    for request in requests:
        request.wait()


def all_to_all(output_list: list[torch.Tensor], input_list: list[torch.Tensor]) -> None:
    """Rank ``r`` sends ``input_list[s]`` to rank ``s``, which receives it in ``output_list[r]``.

    The transpose of a matrix of blocks: the exchange expert parallelism uses to send each token
    to the rank holding its expert (Lepikhin et al., 2020, "GShard"). Blocks may differ in size
    (``input_list[s]`` here must match ``output_list[r]`` on rank ``s``); the sizes are
    usually exchanged first with an all-to-all of counts. It runs as ``N - 1`` rounds of
    pairwise swaps: in round ``k`` rank ``r`` sends to ``r + k`` while receiving from ``r - k``,
    so every rank sends and receives once per round.
    """
    rank, world_size = rank_and_world_size()
    for name, tensors in (("input_list", input_list), ("output_list", output_list)):
        if len(tensors) != world_size:
            raise ValueError(
                f"Invalid {name}: {len(tensors)} tensors (expected one per rank, {world_size})"
            )
    output_list[rank].copy_(input_list[rank])
    for step in range(1, world_size):
        to, source = (rank + step) % world_size, (rank - step) % world_size
        incoming = torch.empty_like(output_list[source], memory_format=torch.contiguous_format)
        _exchange(input_list[to].contiguous(), incoming, to=to, source=source)
        output_list[source].copy_(incoming)


def ring_shift(tensor: torch.Tensor) -> torch.Tensor:
    """Send ``tensor`` to the right neighbour and return the left neighbour's (same shape).

    One step of every ring algorithm, as a function: ring attention passes key and value blocks
    around with it. With one rank it returns ``tensor`` itself.
    """
    rank, world_size = rank_and_world_size()
    if world_size == 1:
        return tensor
    send = tensor.contiguous()
    incoming = torch.empty_like(send)
    _exchange(send, incoming, to=(rank + 1) % world_size, source=(rank - 1) % world_size)
    return incoming
