"""``gather``, ``scatter`` and ``all_to_all`` beside ``torch.distributed``'s, on the same inputs.

The companion of :mod:`trainfast.distributed.parity.collectives` for the three collectives that move
different blocks to different ranks. :func:`exchange_parity_worker` runs ours and torch's on
the same per-rank inputs (odd lengths, and uneven block sizes for the all-to-all) and returns
both results; the tests assert they are equal.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from trainfast.distributed import collectives
from trainfast.distributed.launch import rank_device

__all__ = ["all_to_all_sizes", "exchange_error_worker", "exchange_parity_worker"]


def all_to_all_sizes(sender: int, receiver: int, base: int) -> int:
    """Rows ``sender`` sends ``receiver`` in the uneven test: 0 to ``base + 2``, never all equal."""
    return (base + 3 * sender + 2 * receiver) % (base + 3)


def exchange_parity_worker(
    rank: int, world_size: int, lengths: list[int], seed: int = 0
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``name -> (ours, torch's)`` for gather, scatter and all-to-all on this rank (CPU tensors).

    For each length ``n``: gather and scatter of ``n`` float64 values to/from every root, and
    an all-to-all whose block from rank ``s`` to rank ``r`` has ``all_to_all_sizes(s, r, n)``
    rows of 3 values, so blocks differ in size and some are empty.
    """
    device = rank_device()
    generator = torch.Generator().manual_seed(seed + 7919 * rank)
    results = {}
    for n in lengths:
        for root in range(world_size):
            mine = torch.randn(n, generator=generator, dtype=torch.float64).to(device)
            ours = [torch.empty_like(mine) for _ in range(world_size)] if rank == root else None
            theirs = [torch.empty_like(mine) for _ in range(world_size)] if rank == root else None
            collectives.gather(mine, ours, dst=root)
            dist.gather(mine, theirs, dst=root)
            if rank == root:
                results[f"gather n={n} root={root}"] = (torch.stack(ours), torch.stack(theirs))

            blocks = None
            if rank == root:
                blocks = [
                    torch.randn(n, generator=generator, dtype=torch.float64).to(device)
                    for _ in range(world_size)
                ]
            ours_out, theirs_out = (
                torch.empty(n, dtype=torch.float64, device=device),
                torch.empty(n, dtype=torch.float64, device=device),
            )
            collectives.scatter(ours_out, blocks, src=root)
            dist.scatter(theirs_out, blocks, src=root)
            results[f"scatter n={n} root={root}"] = (ours_out, theirs_out)

        inputs = [
            torch.randn(all_to_all_sizes(rank, to, n), 3, generator=generator).to(device)
            for to in range(world_size)
        ]
        ours_out = [
            torch.empty(all_to_all_sizes(src, rank, n), 3, device=device)
            for src in range(world_size)
        ]
        collectives.all_to_all(ours_out, inputs)
        # gloo's list all_to_all wants equal blocks; its single-tensor form takes split sizes
        theirs_out = torch.empty(sum(len(block) for block in ours_out), 3, device=device)
        dist.all_to_all_single(
            theirs_out,
            torch.cat(inputs),
            output_split_sizes=[len(block) for block in ours_out],
            input_split_sizes=[len(block) for block in inputs],
        )
        results[f"all_to_all n={n}"] = (torch.cat(ours_out), theirs_out)
    return {name: (a.cpu(), b.cpu()) for name, (a, b) in results.items()}


def exchange_error_worker(rank: int, world_size: int, kind: str) -> None:
    """Call gather, scatter or all_to_all wrongly on purpose (``kind``), so that it raises.

    ``"gather"``: the destination passes no list; ``"scatter"``: the source's list is one short;
    ``"all_to_all"``: every rank passes one input block too many.
    """
    tensor = torch.zeros(3, device=rank_device())
    if kind == "gather":
        collectives.gather(tensor, None, dst=0)
    elif kind == "scatter":
        blocks = [torch.zeros(3, device=rank_device()) for _ in range(world_size - 1)]
        collectives.scatter(tensor, blocks if rank == 0 else None, src=0)
    elif kind == "all_to_all":
        blocks = [torch.zeros(3, device=rank_device()) for _ in range(world_size + 1)]
        collectives.all_to_all(blocks[:world_size], blocks)
    else:
        raise ValueError(f"Unknown kind: {kind!r} (expected 'gather', 'scatter' or 'all_to_all')")
