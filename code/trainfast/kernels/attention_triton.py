"""Flash attention in Triton: the algorithm of :mod:`trainfast.kernels.attention` as kernels.

Three kernels, each a loop over tiles that lives in on-chip memory (registers and shared
memory), never writing an ``n_queries × n_keys`` matrix to main memory:

* :func:`flash_forward_kernel`: one program per tile of queries (and per batch × head) walks
  over the key tiles with the online softmax, then writes the output tile and the
  log-sum-exp ``L``. Key tiles that no mask touches are processed by a loop without masking
  (:func:`attend_key_tiles` with ``MASKED=False``); only the last tile and, with the causal
  mask, the tiles that straddle the diagonal pay for the masks. Exponentials are base 2
  (``exp2``, one instruction on NVIDIA GPUs), with ``log2 e`` folded into the scale.
* :func:`flash_backward_dkdv_kernel`: one program per tile of keys walks over the query tiles,
  recomputes the probabilities from ``L`` and accumulates ``dK`` and ``dV``;
* :func:`flash_backward_dq_kernel`: one program per tile of queries walks over the key tiles
  and accumulates ``dQ``. Two kernels instead of one with atomic additions: each output is
  written by exactly one program, so the result is deterministic.

``D = rowsum(dO ∘ O)`` is computed by PyTorch before the backward kernels. Head dimensions that
are not powers of two (24, 80, 96, ...) are padded to the next power of two inside the kernel
(masked loads read zeros), so any head dimension from 16 to 128 works. Pointer arithmetic only
(no block pointers), for Triton 3.0 to 3.8. The causal mask is ``scaled_dot_product_attention``'s,
aligned at the top-left (see :mod:`trainfast.kernels.attention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from trainfast.kernels.attention import validate_attention_inputs
from trainfast.kernels.triton_runtime import check_launch, is_interpreted, tl, triton

__all__ = [
    "AttentionTiles",
    "FlashAttentionTriton",
    "attend_key_tiles",
    "default_attention_tiles",
    "flash_attention_triton_backward",
    "flash_attention_triton_forward",
    "flash_backward_dkdv_kernel",
    "flash_backward_dq_kernel",
    "flash_forward_kernel",
]

LOG2_E = 1.4426950408889634  # exp(x) = exp2(x · log2 e)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128


@dataclass(frozen=True)
class AttentionTiles:
    """Tile sizes of the attention kernels: ``block_q`` queries × ``block_k`` keys per step."""

    block_q: int = 128
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"Invalid {name}: {value} (need a power of two, at least 16)")


def default_attention_tiles(head_dim: int, dtype: torch.dtype, interpreted: bool) -> AttentionTiles:
    """Forward tiles: small under the interpreter, larger with more warps for big heads."""
    if interpreted:
        return AttentionTiles(32, 32, num_warps=1, num_stages=1)
    if dtype == torch.float32:  # 4-byte tiles need twice the shared memory
        return AttentionTiles(64, 32, num_warps=4, num_stages=2)
    return AttentionTiles(128, 64, num_warps=4 if head_dim <= 64 else 8, num_stages=3)


def _backward_tiles(head_dim: int, dtype: torch.dtype, interpreted: bool) -> AttentionTiles:
    if interpreted:
        return AttentionTiles(32, 32, num_warps=1, num_stages=1)
    if dtype == torch.float32:
        return AttentionTiles(32, 32, num_warps=4, num_stages=1)
    return AttentionTiles(64, 64, num_warps=4 if head_dim <= 64 else 8, num_stages=2)


@triton.jit
def attend_key_tiles(
    acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_q, offs_d, n_keys, start, stop, qk_scale,
    BLOCK_K: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Fold key tiles ``start, start + BLOCK_K, ... < stop`` into the running (acc, l, m)."""
    offs_k = tl.arange(0, BLOCK_K)
    for k_start in range(start, stop, BLOCK_K):
        cols = k_start + offs_k  # (BLOCK_K,)
        # Kᵀ tile (BLOCK_D, BLOCK_K) and V tile (BLOCK_K, BLOCK_D); masked entries read 0.
        # Unmasked tiles still mask the padding of the head dimension (free if BLOCK_D == HEAD_DIM).
        k_t_mask = offs_d[:, None] < HEAD_DIM
        v_mask = offs_d[None, :] < HEAD_DIM
        if MASKED:
            k_t_mask = k_t_mask & (cols[None, :] < n_keys)
            v_mask = v_mask & (cols[:, None] < n_keys)
        k_t = tl.load(k_base + offs_d[:, None] * stride_kd + cols[None, :] * stride_kn,
                      mask=k_t_mask, other=0.0)  # fmt: skip
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=v_mask, other=0.0)  # fmt: skip
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_Q, BLOCK_K), log2 units
        if MASKED:
            visible = cols[None, :] < n_keys
            if IS_CAUSAL:
                visible = visible & (cols[None, :] <= offs_q[:, None])
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        rescale = tl.math.exp2(m_i - m_new)
        l_i = l_i * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def flash_forward_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qn, stride_qd, stride_kb, stride_kn, stride_kd,
    stride_vb, stride_vn, stride_vd, stride_ob, stride_on, stride_od,
    n_queries, n_keys, qk_scale,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """One tile of BLOCK_Q queries of one (batch, head): O and L = logsumexp of its scores."""
    q_start = tl.program_id(0) * BLOCK_Q
    batch = tl.program_id(1).to(tl.int64)
    offs_q = q_start + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_q[:, None] < n_queries) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + batch * stride_qb + offs_q[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                mask=q_mask, other=0.0)  # fmt: skip
    m_i = tl.full((BLOCK_Q,), float("-inf"), dtype=tl.float32)  # running maximum (log2 units)
    l_i = tl.zeros((BLOCK_Q,), dtype=tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)  # unnormalised output
    if IS_CAUSAL:  # keys up to the last query of the tile; all of them visible up to q_start
        stop = tl.minimum(n_keys, q_start + BLOCK_Q)
        unmasked_stop = (tl.minimum(q_start + 1, n_keys) // BLOCK_K) * BLOCK_K
    else:
        stop = n_keys
        unmasked_stop = (n_keys // BLOCK_K) * BLOCK_K
    k_base = k_ptr + batch * stride_kb
    v_base = v_ptr + batch * stride_vb
    acc, l_i, m_i = attend_key_tiles(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_q, offs_d, n_keys, 0, unmasked_stop, qk_scale,
        BLOCK_K, HEAD_DIM, False, IS_CAUSAL, DOT_PRECISION,
    )  # fmt: skip
    acc, l_i, m_i = attend_key_tiles(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_q, offs_d, n_keys, unmasked_stop, stop, qk_scale,
        BLOCK_K, HEAD_DIM, True, IS_CAUSAL, DOT_PRECISION,
    )  # fmt: skip
    out = acc / l_i[:, None]
    tl.store(o_ptr + batch * stride_ob + offs_q[:, None] * stride_on + offs_d[None, :] * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=q_mask)  # fmt: skip
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634  # back to natural log
    tl.store(lse_ptr + batch * n_queries + offs_q, lse, mask=offs_q < n_queries)


@triton.jit
def flash_backward_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    stride_qb, stride_kb, stride_n, n_queries, n_keys, scale, qk_scale,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """dK and dV of one tile of keys. All tensors are contiguous (batch·heads, n, head_dim):
    q, dO share ``stride_qb``, k, v, dK, dV ``stride_kb``, and every row is ``stride_n`` long."""
    k_start = tl.program_id(0) * BLOCK_K
    batch = tl.program_id(1).to(tl.int64)
    cols = k_start + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (cols[:, None] < n_keys) & (offs_d[None, :] < HEAD_DIM)
    kv_offsets = batch * stride_kb + cols[:, None] * stride_n + offs_d[None, :]
    k = tl.load(k_ptr + kv_offsets, mask=kv_mask, other=0.0)  # (BLOCK_K, BLOCK_D)
    v = tl.load(v_ptr + kv_offsets, mask=kv_mask, other=0.0)
    dk = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    first = 0
    if IS_CAUSAL:  # queries before k_start see none of these keys
        first = (k_start // BLOCK_Q) * BLOCK_Q
    for q_start in range(first, n_queries, BLOCK_Q):
        rows = q_start + tl.arange(0, BLOCK_Q)
        q_mask = (rows[:, None] < n_queries) & (offs_d[None, :] < HEAD_DIM)
        q_offsets = batch * stride_qb + rows[:, None] * stride_n + offs_d[None, :]
        q = tl.load(q_ptr + q_offsets, mask=q_mask, other=0.0)  # (BLOCK_Q, BLOCK_D)
        do = tl.load(do_ptr + q_offsets, mask=q_mask, other=0.0)
        lse = tl.load(lse_ptr + batch * n_queries + rows, mask=rows < n_queries, other=0.0)
        delta = tl.load(delta_ptr + batch * n_queries + rows, mask=rows < n_queries, other=0.0)
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_K, BLOCK_Q)
        visible = (cols[:, None] < n_keys) & (rows[None, :] < n_queries)
        if IS_CAUSAL:
            visible = visible & (cols[:, None] <= rows[None, :])
        p_t = tl.where(visible, tl.math.exp2(s_t - lse[None, :] * 1.4426950408889634), 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (BLOCK_K, BLOCK_Q)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)
    tl.store(dk_ptr + kv_offsets, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + kv_offsets, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def flash_backward_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    stride_qb, stride_kb, stride_n, n_queries, n_keys, scale, qk_scale,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """dQ of one tile of queries, recomputing the probabilities of every key tile it sees."""
    q_start = tl.program_id(0) * BLOCK_Q
    batch = tl.program_id(1).to(tl.int64)
    rows = q_start + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (rows[:, None] < n_queries) & (offs_d[None, :] < HEAD_DIM)
    q_offsets = batch * stride_qb + rows[:, None] * stride_n + offs_d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=q_mask, other=0.0)  # (BLOCK_Q, BLOCK_D)
    do = tl.load(do_ptr + q_offsets, mask=q_mask, other=0.0)
    lse = tl.load(lse_ptr + batch * n_queries + rows, mask=rows < n_queries, other=0.0)
    delta = tl.load(delta_ptr + batch * n_queries + rows, mask=rows < n_queries, other=0.0)
    dq = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)
    stop = n_keys
    if IS_CAUSAL:  # later keys are seen by none of these queries
        stop = tl.minimum(n_keys, q_start + BLOCK_Q)
    for k_start in range(0, stop, BLOCK_K):
        cols = k_start + tl.arange(0, BLOCK_K)
        kv_mask = (cols[:, None] < n_keys) & (offs_d[None, :] < HEAD_DIM)
        kv_offsets = batch * stride_kb + cols[:, None] * stride_n + offs_d[None, :]
        k = tl.load(k_ptr + kv_offsets, mask=kv_mask, other=0.0)  # (BLOCK_K, BLOCK_D)
        v = tl.load(v_ptr + kv_offsets, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_Q, BLOCK_K)
        visible = (rows[:, None] < n_queries) & (cols[None, :] < n_keys)
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        p = tl.where(visible, tl.math.exp2(s - lse[:, None] * 1.4426950408889634), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    tl.store(dq_ptr + q_offsets, (dq * scale).to(dq_ptr.dtype.element_ty), mask=q_mask)


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 exactly, as the references do


def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    validate_attention_inputs(q, k, v)
    head_dim = q.shape[-1]
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"Unsupported head dimension {head_dim} for the Triton kernels "
            f"(need {MIN_HEAD_DIM} to {MAX_HEAD_DIM}); use implementation='tiled'"
        )
    check_launch(flash_forward_kernel, q, k, v)


def flash_attention_triton_forward(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, tiles: AttentionTiles | None = None
) -> tuple[Tensor, Tensor]:
    """Run :func:`flash_forward_kernel`: the output (q's shape, dtype) and L (..., n_queries), float32."""
    _check(q, k, v)
    *batch_shape, n_queries, head_dim = q.shape
    n_keys = k.shape[-2]
    tiles = tiles or default_attention_tiles(head_dim, q.dtype, is_interpreted(flash_forward_kernel))
    q3, k3, v3 = (t.reshape(-1, t.shape[-2], head_dim) for t in (q, k, v))  # (batch·heads, n, d)
    out = torch.empty_like(q3)
    lse = torch.empty(q3.shape[:2], dtype=torch.float32, device=q.device)  # (batch·heads, n_queries)
    grid = (triton.cdiv(n_queries, tiles.block_q), q3.shape[0])
    flash_forward_kernel[grid](
        q3, k3, v3, out, lse,
        *q3.stride(), *k3.stride(), *v3.stride(), *out.stride(),
        n_queries, n_keys, head_dim**-0.5 * LOG2_E,
        BLOCK_Q=tiles.block_q, BLOCK_K=tiles.block_k, BLOCK_D=_padded(head_dim), HEAD_DIM=head_dim,
        IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out.reshape(q.shape), lse.reshape(*batch_shape, n_queries)


def _padded(head_dim: int) -> int:
    return max(16, 1 << math.ceil(math.log2(head_dim)))


def flash_attention_triton_backward(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    is_causal: bool = False, tiles: AttentionTiles | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Run the two backward kernels: ``(dq, dk, dv)`` in the inputs' dtype."""
    *_, n_queries, head_dim = q.shape
    n_keys = k.shape[-2]
    tiles = tiles or _backward_tiles(head_dim, q.dtype, is_interpreted(flash_backward_dq_kernel))
    delta = (grad_out.float() * out.float()).sum(dim=-1)  # D = rowsum(dO ∘ O), (..., n_queries)
    # One layout for all: contiguous (batch·heads, n, d), so q and k share their strides.
    q3, do3 = (t.reshape(-1, n_queries, head_dim).contiguous() for t in (q, grad_out.to(q.dtype)))
    k3, v3 = (t.reshape(-1, n_keys, head_dim).contiguous() for t in (k, v))
    lse2, delta2 = (t.reshape(-1, n_queries).contiguous() for t in (lse, delta))
    dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
    common = dict(
        BLOCK_Q=tiles.block_q, BLOCK_K=tiles.block_k, BLOCK_D=_padded(head_dim), HEAD_DIM=head_dim,
        IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    scale = head_dim**-0.5
    batch = q3.shape[0]
    flash_backward_dkdv_kernel[(triton.cdiv(n_keys, tiles.block_k), batch)](
        q3, k3, v3, do3, lse2, delta2, dk, dv, q3.stride(0), k3.stride(0), head_dim, n_queries, n_keys, scale, scale * LOG2_E,
        **common,
    )  # fmt: skip
    flash_backward_dq_kernel[(triton.cdiv(n_queries, tiles.block_q), batch)](
        q3, k3, v3, do3, lse2, delta2, dq, q3.stride(0), k3.stride(0), head_dim, n_queries, n_keys, scale, scale * LOG2_E,
        **common,
    )  # fmt: skip
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


class FlashAttentionTriton(torch.autograd.Function):
    """Flash attention with Triton forward and backward: ``FlashAttentionTriton.apply(q, k, v, is_causal)``.

    Same interface, saved tensors (q, k, v, O, L) and causal convention as
    :class:`~trainfast.kernels.attention.FlashAttention`. Runs on CUDA tensors (float16,
    bfloat16, float32) and, under Triton's interpreter, on CPU tensors (float16, float32).
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        out, lse = flash_attention_triton_forward(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_triton_backward(grad_out, q, k, v, out, lse, ctx.is_causal)
        return dq, dk, dv, None
