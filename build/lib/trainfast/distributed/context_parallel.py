"""Context parallelism by ring attention: the sequence split over ranks, keys and values passed on.

Long sequences make attention the memory problem: the activations of every layer grow with the
sequence, and tensor parallelism does not split the sequence inside attention. *Ring attention*
(Liu, Zaharia and Abbeel, 2023) gives rank ``r`` the ``r``-th block of queries, keys and values
(Brandon et al.'s "striped" attention and Megatron's context parallelism assign the tokens
differently, to balance causal work: see below). Each rank computes
attention of its queries against the key block it holds, then passes that key/value block to its
right neighbour and receives the left one's; after ``N`` steps it has seen every key block.

The blocks' partial results are merged exactly with the online-softmax update of the kernels
chapter, :func:`~trainfast.kernels.softmax.merge_attention_outputs` (each block result is
normalised over its own keys and carries its log-sum-exp), and each block is computed by the
tiled :func:`~trainfast.kernels.attention.flash_attention_forward`. The backward pass walks the
ring again: each rank adds its queries' contribution to the gradient of the key/value block it
holds, and the block's gradient travels with it, arriving home after ``N`` steps.

**Causal attention.** Block ``j`` of keys is entirely visible to query block ``r > j``, masked
on the diagonal ``j = r``, and invisible for ``j > r``: those steps are skipped, so rank ``N-1``
computes ``N`` blocks and rank 0 one, and every step waits for the slowest rank.
``balanced=True`` is the load-balanced split of Megatron-LM's context parallelism (and the
"zigzag" ring attention of ring-flash-attention): the sequence is cut into ``2N`` chunks and
rank ``i`` holds chunks ``i`` and ``2N - 1 - i``, one from each end, so every rank computes the
same number of score entries (:func:`ring_attention_work`). Each step then computes, per pair of
a query chunk and a key chunk, a full, a diagonal (causal) or no block.

Requires the sequence to divide evenly over the ranks (``2N`` chunks when balanced), so the
diagonal blocks are square.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trainfast.distributed.agreement import rank_and_world_size
from trainfast.distributed.collectives import ring_shift
from trainfast.distributed.launch import rank_device
from trainfast.kernels.attention import (
    attention_reference,
    flash_attention_backward,
    flash_attention_forward,
)
from trainfast.kernels.softmax import merge_attention_outputs
from trainfast.validation import check_flag, check_int

__all__ = [
    "RingAttention",
    "context_chunks",
    "ring_attention",
    "ring_attention_work",
    "ring_attention_worker",
    "ring_block_kind",
]


def _check_rank(rank: int, world_size: int) -> None:
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0, maximum=world_size - 1)


def ring_block_kind(rank: int, step: int, world_size: int, is_causal: bool) -> str:
    """What rank ``rank`` does at ring step ``step``: ``"full"``, ``"diagonal"`` or ``"skip"``.

    At step ``s`` rank ``r`` holds the key/value block of rank ``(r - s) mod N``.
    """
    _check_rank(rank, world_size)
    check_int("step", step, minimum=0, maximum=world_size - 1)
    check_flag("is_causal", is_causal)
    source = (rank - step) % world_size
    if not is_causal or source < rank:
        return "full"
    return "diagonal" if source == rank else "skip"


def context_chunks(rank: int, world_size: int, balanced: bool = False) -> list[int]:
    """The sequence chunks rank ``rank`` holds, in order: ``[rank]`` of ``N`` chunks, or when
    ``balanced``, ``[rank, 2N - 1 - rank]`` of ``2N`` (one from each end)."""
    _check_rank(rank, world_size)
    check_flag("balanced", balanced)
    return [rank, 2 * world_size - 1 - rank] if balanced else [rank]


def _chunk_kind(query_chunk: int, key_chunk: int, is_causal: bool) -> str:
    """``"full"``, ``"diagonal"`` or ``"skip"``: what causal attention of one chunk on another
    needs (chunks are numbered by their place in the sequence)."""
    if not is_causal or key_chunk < query_chunk:
        return "full"
    return "diagonal" if key_chunk == query_chunk else "skip"


def ring_attention_work(
    world_size: int, seq_len: int, is_causal: bool = True, balanced: bool = False
) -> list[int]:
    """Attention score entries each rank computes over the whole ring (a diagonal block counts
    its lower triangle, diagonal included). Without balancing the causal work grows with the
    rank; with it every rank does the same."""
    check_int("world_size", world_size, minimum=1)
    check_int("seq_len", seq_len, minimum=1)
    check_flag("is_causal", is_causal)
    n_chunks = 2 * world_size if balanced else world_size
    if seq_len % n_chunks:
        raise ValueError(f"Invalid seq_len: {seq_len} (must divide into {n_chunks} chunks)")
    size = seq_len // n_chunks
    entries = {"full": size * size, "diagonal": size * (size + 1) // 2, "skip": 0}
    return [
        sum(
            entries[_chunk_kind(a, b, is_causal)]
            for step in range(world_size)
            for a in context_chunks(rank, world_size, balanced)
            for b in context_chunks((rank - step) % world_size, world_size, balanced)
        )
        for rank in range(world_size)
    ]


class RingAttention(torch.autograd.Function):
    """Attention of this rank's queries over the whole sequence's keys, passed round a ring.

    ``q``, ``k``, ``v``: this rank's chunks (:func:`context_chunks`) concatenated, (..., seq / N,
    head_dim). Saves q, k, v, the output and its log-sum-exp; the backward recomputes each
    block's probabilities (flash attention's).
    """

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, balanced: bool = False
    ) -> Tensor:
        rank, world_size = rank_and_world_size()
        n_parts = 2 if balanced else 1
        mine = context_chunks(rank, world_size, balanced)
        outs = [torch.zeros_like(part) for part in q.chunk(n_parts, dim=-2)]
        lse_dtype = torch.promote_types(q.dtype, torch.float32)
        lses = [
            torch.full(o.shape[:-1], float("-inf"), dtype=lse_dtype, device=q.device) for o in outs
        ]
        kv = torch.stack([k, v])  # (2, ..., seq / N, head_dim): one message per step
        for step in range(world_size):
            theirs = context_chunks((rank - step) % world_size, world_size, balanced)
            keys, values = kv[0].chunk(n_parts, dim=-2), kv[1].chunk(n_parts, dim=-2)
            for a, (query_chunk, q_a) in enumerate(
                zip(mine, q.chunk(n_parts, dim=-2), strict=True)
            ):
                for b, key_chunk in enumerate(theirs):
                    kind = _chunk_kind(query_chunk, key_chunk, is_causal)
                    if kind == "skip":
                        continue
                    block_out, block_lse = flash_attention_forward(
                        q_a, keys[b], values[b], kind == "diagonal"
                    )
                    outs[a], lses[a] = merge_attention_outputs(
                        outs[a], lses[a], block_out, block_lse
                    )
            if step < world_size - 1:
                kv = ring_shift(kv)  # now the chunks of rank (rank - step - 1) mod N
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.balanced = is_causal, balanced
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        rank, world_size = rank_and_world_size()
        n_parts = 2 if ctx.balanced else 1
        mine = context_chunks(rank, world_size, ctx.balanced)
        dq = torch.zeros_like(q)
        # (k, v, dk, dv) of the chunks this rank holds; the gradients travel with their chunks
        block = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
        own = [t.chunk(n_parts, dim=-2) for t in (q, dq, grad_out, out)]
        own_lse = lse.chunk(n_parts, dim=-1)
        for step in range(world_size):
            theirs = context_chunks((rank - step) % world_size, world_size, ctx.balanced)
            keys, values, dk, dv = (t.chunk(n_parts, dim=-2) for t in block)
            for a, query_chunk in enumerate(mine):
                for b, key_chunk in enumerate(theirs):
                    kind = _chunk_kind(query_chunk, key_chunk, ctx.is_causal)
                    if kind == "skip":
                        continue
                    dq_b, dk_b, dv_b = flash_attention_backward(
                        own[2][a],
                        own[0][a],
                        keys[b],
                        values[b],
                        own[3][a],
                        own_lse[a],
                        kind == "diagonal",
                    )
                    own[1][a].add_(dq_b)  # views: these add into dq and the block
                    dk[b].add_(dk_b)
                    dv[b].add_(dv_b)
            # N shifts in all: the last one brings each chunk's gradient home
            block = ring_shift(block if step < world_size - 1 else block[2:])
        return dq, block[0], block[1], None, None


def ring_attention(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, balanced: bool = False
) -> Tensor:
    """Ring attention of this rank's chunks (..., seq / N, head_dim); differentiable.
    ``balanced``: the rank holds chunks ``rank`` and ``2N - 1 - rank`` of ``2N``, concatenated."""
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(
            f"Invalid shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
            "(ring attention here needs equal blocks of queries, keys and values)"
        )
    if balanced and q.shape[-2] % 2:
        raise ValueError(f"Invalid block: {q.shape[-2]} tokens (balanced needs two equal chunks)")
    return RingAttention.apply(q, k, v, is_causal, balanced)


def ring_attention_worker(
    rank: int,
    world_size: int,
    shape: tuple[int, int, int, int] = (2, 3, 24, 8),
    seed: int = 0,
    balanced: bool = False,
) -> dict[str, tuple[Tensor, Tensor]]:
    """Ring attention on this rank's chunks against full attention on one process, float64.

    ``shape`` is (batch, heads, seq, head_dim) with ``seq`` divisible by the world size (twice it
    when ``balanced``). Returns ``"causal=... output|dq|dk|dv" -> (ring, full attention's rows
    of this rank)`` for both masks.
    """
    batch, heads, seq, head_dim = shape
    n_chunks = 2 * world_size if balanced else world_size
    if seq % n_chunks:
        raise ValueError(f"Invalid seq: {seq} (must divide evenly into {n_chunks} chunks)")
    generator = torch.Generator().manual_seed(seed)  # the same tensors on every rank
    device = rank_device()
    full = [torch.randn(shape, generator=generator, dtype=torch.float64).to(device) for _ in "qkvg"]
    size = seq // n_chunks
    mine = torch.cat(
        [torch.arange(c * size, (c + 1) * size) for c in context_chunks(rank, world_size, balanced)]
    ).to(device)
    pairs = {}
    for is_causal in (False, True):
        q, k, v = (t.clone().requires_grad_() for t in full[:3])
        reference = attention_reference(q, k, v, is_causal)
        reference.backward(full[3])
        q_r, k_r, v_r = (t[..., mine, :].detach().clone().requires_grad_() for t in full[:3])
        ours = ring_attention(q_r, k_r, v_r, is_causal, balanced)
        ours.backward(full[3][..., mine, :])
        ring = {"output": ours, "dq": q_r.grad, "dk": k_r.grad, "dv": v_r.grad}
        whole = {"output": reference, "dq": q.grad, "dk": k.grad, "dv": v.grad}
        for name in ring:
            pairs[f"causal={is_causal} {name}"] = (
                ring[name].detach().cpu(),
                whole[name][..., mine, :].detach().cpu(),
            )
    return pairs
