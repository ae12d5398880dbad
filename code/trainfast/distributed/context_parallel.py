"""Context parallelism by ring attention: the sequence split over ranks, keys and values passed on.

Long sequences make attention the memory problem: the activations of every layer grow with the
sequence, and tensor parallelism does not split the sequence inside attention. *Ring attention*
(Liu, Zaharia and Abbeel, 2023; Brandon et al.'s "striped" variant; Megatron's "context
parallelism") gives rank ``r`` the ``r``-th block of queries, keys and values. Each rank computes
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
computes ``N`` blocks and rank 0 one. Production implementations balance this by giving each
rank two blocks from opposite ends of the sequence ("zigzag"); this module keeps the plain split.

Requires the sequence to divide evenly over the ranks (the diagonal blocks must be square).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trainfast.distributed.collectives import rank_and_world_size, ring_shift
from trainfast.distributed.launch import rank_device
from trainfast.kernels.attention import (
    attention_reference,
    flash_attention_backward,
    flash_attention_forward,
)
from trainfast.kernels.softmax import merge_attention_outputs

__all__ = ["RingAttention", "ring_attention", "ring_attention_worker", "ring_block_kind"]


def ring_block_kind(rank: int, step: int, world_size: int, is_causal: bool) -> str:
    """What rank ``rank`` does at ring step ``step``: ``"full"``, ``"diagonal"`` or ``"skip"``.

    At step ``s`` rank ``r`` holds the key/value block of rank ``(r - s) mod N``.
    """
    source = (rank - step) % world_size
    if not is_causal or source < rank:
        return "full"
    return "diagonal" if source == rank else "skip"


class RingAttention(torch.autograd.Function):
    """Attention of this rank's query block over the whole sequence's keys, passed round a ring.

    ``q``, ``k``, ``v``: this rank's blocks, (..., seq / N, head_dim). Saves q, k, v, the output
    and its log-sum-exp; the backward recomputes each block's probabilities (flash attention's).
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        rank, world_size = rank_and_world_size()
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.promote_types(q.dtype, torch.float32), device=q.device)  # fmt: skip
        kv = torch.stack([k, v])  # (2, ..., seq / N, head_dim): one message per step
        for step in range(world_size):
            kind = ring_block_kind(rank, step, world_size, is_causal)
            if kind != "skip":
                block_out, block_lse = flash_attention_forward(q, kv[0], kv[1], kind == "diagonal")
                out, lse = merge_attention_outputs(out, lse, block_out, block_lse)
            if step < world_size - 1:
                kv = ring_shift(kv)  # now the block of rank (rank - step - 1) mod N
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, out, lse = ctx.saved_tensors
        rank, world_size = rank_and_world_size()
        dq = torch.zeros_like(q)
        # (k, v, dk, dv) of the block this rank holds; the gradients travel with their block
        block = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
        for step in range(world_size):
            kind = ring_block_kind(rank, step, world_size, ctx.is_causal)
            if kind != "skip":
                dq_b, dk_b, dv_b = flash_attention_backward(
                    grad_out, q, block[0], block[1], out, lse, kind == "diagonal"
                )
                dq += dq_b
                block[2] += dk_b
                block[3] += dv_b
            # N shifts in all: the last one brings each block's gradient home
            block = ring_shift(block if step < world_size - 1 else block[2:])
        return dq, block[0], block[1], None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """Ring attention of this rank's blocks (..., seq / N, head_dim); differentiable."""
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(
            f"Invalid shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
            "(ring attention here needs equal blocks of queries, keys and values)"
        )
    return RingAttention.apply(q, k, v, is_causal)


def ring_attention_worker(
    rank: int, world_size: int, shape: tuple[int, int, int, int] = (2, 3, 24, 8), seed: int = 0
) -> dict[str, tuple[Tensor, Tensor]]:
    """Ring attention on this rank's block against full attention on one process, float64.

    ``shape`` is (batch, heads, seq, head_dim) with ``seq`` divisible by the world size. Returns
    ``"causal=... output|dq|dk|dv" -> (ring, full attention's block)`` for both masks.
    """
    batch, heads, seq, head_dim = shape
    if seq % world_size:
        raise ValueError(f"Invalid seq: {seq} (must divide evenly over {world_size} ranks)")
    generator = torch.Generator().manual_seed(seed)  # the same tensors on every rank
    device = rank_device()
    full = [torch.randn(shape, generator=generator, dtype=torch.float64).to(device) for _ in "qkvg"]
    mine = slice(rank * seq // world_size, (rank + 1) * seq // world_size)
    pairs = {}
    for is_causal in (False, True):
        q, k, v = (t.clone().requires_grad_() for t in full[:3])
        reference = attention_reference(q, k, v, is_causal)
        reference.backward(full[3])
        q_r, k_r, v_r = (t[..., mine, :].detach().clone().requires_grad_() for t in full[:3])
        ours = ring_attention(q_r, k_r, v_r, is_causal)
        ours.backward(full[3][..., mine, :])
        ring = {"output": ours, "dq": q_r.grad, "dk": k_r.grad, "dv": v_r.grad}
        whole = {"output": reference, "dq": q.grad, "dk": k.grad, "dv": v.grad}
        for name in ring:
            pairs[f"causal={is_causal} {name}"] = (
                ring[name].detach().cpu(),
                whole[name][..., mine, :].detach().cpu(),
            )
    return pairs
