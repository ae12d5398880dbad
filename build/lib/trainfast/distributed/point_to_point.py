"""Point-to-point messages: the one primitive every collective in this package is built from.

``dist.send(tensor, dst)`` and ``dist.recv(tensor, src)`` block until the message is through;
``dist.isend``/``dist.irecv`` return at once with a request to ``wait()`` on. The receiver must
already own a tensor of the right shape and dtype: only the bytes travel.

Blocking calls make it easy to deadlock. gloo's ``send`` waits until the receiver has posted the
matching ``recv``, so two ranks that both send first wait for each other forever
(:func:`deadlock_worker`; the process group's timeout turns that into an error).
:func:`swap_worker` shows two cures: order the calls by rank (even ranks send first), or make
the send non-blocking.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from trainfast.distributed.launch import rank_device
from trainfast.timing import benchmark

__all__ = ["deadlock_worker", "ping_pong_worker", "swap_worker"]


def ping_pong_worker(
    rank: int, world_size: int, sizes: list[int], rounds: int = 20
) -> list[dict[str, float]]:
    """Rank 0 and rank 1 bounce a float32 tensor back and forth; half a round trip per size.

    Other ranks (if any) idle. Returns, for each size in elements, the median one-way time.
    """
    device = rank_device()

    def round_trip(tensor: torch.Tensor) -> None:
        if rank == 0:
            dist.send(tensor, dst=1)
            dist.recv(tensor, src=1)
        elif rank == 1:
            dist.recv(tensor, src=0)
            dist.send(tensor, dst=0)

    rows = []
    for numel in sizes:
        tensor = torch.zeros(numel, device=device)
        # one warm-up round trip opens the connection; then `rounds` timed ones
        timing = benchmark(partial(round_trip, tensor), warmup=1, repeats=rounds, device=device)
        rows.append({"elements": numel, "bytes": 4 * numel, "seconds": timing.median / 2})
    return rows


def deadlock_worker(rank: int, world_size: int) -> torch.Tensor:
    """Both ranks send first, then receive: each send waits for a receive that never comes."""
    mine, theirs = (
        torch.full((4,), float(rank), device=rank_device()),
        torch.empty(4, device=rank_device()),
    )
    other = 1 - rank
    dist.send(mine, dst=other)  # blocks: the other rank is blocked in its own send
    dist.recv(theirs, src=other)
    return theirs


def swap_worker(rank: int, world_size: int, non_blocking: bool = True) -> torch.Tensor:
    """Ranks 0 and 1 swap tensors without deadlock; returns what this rank received."""
    mine, theirs = (
        torch.full((4,), float(rank), device=rank_device()),
        torch.empty(4, device=rank_device()),
    )
    other = 1 - rank
    if non_blocking:  # post the send, receive, then wait for the send to finish
        request = dist.isend(mine, dst=other)
        dist.recv(theirs, src=other)
        request.wait()
    elif rank % 2 == 0:  # or break the symmetry: even ranks send first, odd ranks receive first
        dist.send(mine, dst=other)
        dist.recv(theirs, src=other)
    else:
        dist.recv(theirs, src=other)
        dist.send(mine, dst=other)
    return theirs.cpu()
