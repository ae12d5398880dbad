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

``D = rowsum(dO ∘ O)`` is computed before them by a fourth, small kernel
(:func:`flash_backward_preprocess_kernel`). The backward kernels split their loops as the forward
does: tiles that no mask touches run without masking, the causal diagonal and the sequence's last
partial tile with it. Grouped-query attention (``enable_gqa``): a program of query head ``i``
reads K and V head ``i // group``; dK and dV are written per query head and summed over the group
by PyTorch. Head dimensions that
are not powers of two (24, 80, 96, ...) are padded to the next power of two inside the kernel
(masked loads read zeros), so any head dimension from 16 to 128 works. Pointer arithmetic only
(no block pointers), for Triton 3.0 to 3.8. The causal mask is ``scaled_dot_product_attention``'s,
aligned at the top-left (see :mod:`trainfast.kernels.attention`).

The grid is one-dimensional: program ``pid`` handles tile ``pid % n_tiles`` of (batch · head)
``pid // n_tiles`` (:func:`attention_grid`). CUDA allows 2**31 - 1 programs on grid axis 0 but
only 65,535 on axes 1 and 2, so batch · heads on axis 1 would fail beyond 65,535 (e.g. batch 2,048
with 32 heads); folded into axis 0, the programs of one head still run next to each other.

Tiles depend on the GPU, the dtype and the head dimension, through one function per kernel
(:func:`attention_forward_tiles`, :func:`attention_dkdv_tiles`, :func:`attention_dq_tiles`): the
launchers call them with the live device's row of :data:`trainfast.gpus.GPUS`, the compile
report (:mod:`trainfast.kernels.compile_report`) with any row, so that a T4 (64 KiB of shared
memory per block, no asynchronous copies) gets tiles that fit it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from trainfast.gpus import GPUSpec
from trainfast.kernels.attention import validate_attention_inputs
from trainfast.kernels.targets import launch_target, pipelines_loads
from trainfast.kernels.triton_runtime import check_launch, is_interpreted, tl, triton

__all__ = [
    "MAX_GRID_X",
    "AttentionTiles",
    "FlashAttentionTriton",
    "attend_key_tiles",
    "attention_backward_delta",
    "attention_dkdv_launch",
    "attention_dkdv_tiles",
    "attention_dq_launch",
    "attention_dq_tiles",
    "attention_forward_launch",
    "attention_forward_tiles",
    "attention_grid",
    "dkdv_query_tiles",
    "dq_key_tiles",
    "flash_attention_triton_backward",
    "flash_attention_triton_forward",
    "flash_backward_dkdv_kernel",
    "flash_backward_dq_kernel",
    "flash_backward_preprocess_kernel",
    "flash_forward_kernel",
    "register_flash_attention_op",
]

LOG2_E = 1.4426950408889634  # exp(x) = exp2(x · log2 e)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
MAX_GRID_X = 2**31 - 1  # CUDA's limit on grid axis 0 (axes 1 and 2: 65,535)


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


def attention_forward_tiles(
    target: GPUSpec | None, dtype: torch.dtype, head_dim: int
) -> AttentionTiles:
    """Tiles of :func:`flash_forward_kernel` on ``target`` (``None``: the CPU interpreter).

    A program keeps its query tile and its accumulator in registers and streams
    ``num_stages`` key and value tiles through shared memory. 16-bit on sm_80 and sm_90:
    128 queries × 64 keys, 3 stages. float32 needs twice the bytes per tile: 64 × 32, 2 stages,
    8 warps.
    sm_75 (the T4: 64 KiB of shared memory per block, no asynchronous copies, and Triton emits no
    tensor-core instructions for it, so the dots run on CUDA cores and need more registers):
    32 × 16, one stage, the largest that compiles without spilling registers at head dimension
    128 (:mod:`trainfast.kernels.compile_report` shows the figures).
    """
    if target is None:
        return AttentionTiles(32, 32, num_warps=1, num_stages=1)
    if not pipelines_loads(target):
        return AttentionTiles(32, 16, num_warps=4, num_stages=1)
    if dtype == torch.float32:  # 4-byte tiles need twice the shared memory
        return AttentionTiles(64, 32, num_warps=8, num_stages=2)
    return AttentionTiles(128, 64, num_warps=4 if head_dim <= 64 else 8, num_stages=3)


def attention_dkdv_tiles(
    target: GPUSpec | None, dtype: torch.dtype, head_dim: int
) -> AttentionTiles:
    """Tiles of :func:`flash_backward_dkdv_kernel`: ``block_k`` keys per program, stepping over
    ``block_q`` queries (q, dO in shared memory, dK, dV accumulators in registers)."""
    return _backward_tiles(target, dtype, head_dim)


def attention_dq_tiles(target: GPUSpec | None, dtype: torch.dtype, head_dim: int) -> AttentionTiles:
    """Tiles of :func:`flash_backward_dq_kernel`: ``block_q`` queries per program, stepping over
    ``block_k`` keys (k, v in shared memory, the dQ accumulator in registers)."""
    return _backward_tiles(target, dtype, head_dim)


def _backward_tiles(target: GPUSpec | None, dtype: torch.dtype, head_dim: int) -> AttentionTiles:
    """sm_80 and later: 64 × 64, 2 stages (16-bit), 32 × 32 with 8 warps (float32). sm_75: 32 × 32
    with 8 warps (16-bit) and 32 × 16 (float32); at 32 × 32 float32 the dK/dV kernel needs 68 KiB
    of shared memory, over the T4's 64 KiB."""
    if target is None:
        return AttentionTiles(32, 32, num_warps=1, num_stages=1)
    if not pipelines_loads(target):
        if dtype == torch.float32:
            return AttentionTiles(32, 16, num_warps=4, num_stages=1)
        return AttentionTiles(32, 32, num_warps=8, num_stages=1)
    if dtype == torch.float32:  # 8 warps: 4 would spill registers at head dimension 128
        return AttentionTiles(32, 32, num_warps=8, num_stages=1)
    return AttentionTiles(64, 64, num_warps=4 if head_dim <= 64 else 8, num_stages=2)


def attention_grid(n_rows: int, block: int, batch_heads: int) -> tuple[int]:
    """The grid of an attention kernel: one program per tile of ``block`` rows per (batch · head).

    One axis, ``cdiv(n_rows, block) × batch_heads`` programs (the kernels recover the tile and
    the head from the program id), so batch · heads is not bound by the 65,535 of grid axis 1.
    Raises ``ValueError`` past CUDA's 2**31 - 1 programs on axis 0.
    """
    if n_rows < 1 or block < 1 or batch_heads < 1:
        raise ValueError(
            f"Invalid attention grid: n_rows={n_rows}, block={block}, batch_heads={batch_heads}"
        )
    programs = -(-n_rows // block) * batch_heads
    if programs > MAX_GRID_X:
        raise ValueError(
            f"{programs:,} programs (batch·heads {batch_heads:,} × {-(-n_rows // block):,} tiles) "
            "exceed "
            f"CUDA's grid limit of {MAX_GRID_X:,}; split the batch"
        )
    return (programs,)


@triton.jit
def attend_key_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    offs_q,
    offs_d,
    n_keys,
    start,
    stop,
    qk_scale,
    BLOCK_K: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
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
        k_t = tl.load(
            k_base + offs_d[:, None] * stride_kd + cols[None, :] * stride_kn,
            mask=k_t_mask,
            other=0.0,
        )
        v = tl.load(
            v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=v_mask, other=0.0
        )
        # (BLOCK_Q, BLOCK_K) scores, in log2 units
        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale
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
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    stride_qb,
    stride_qn,
    stride_qd,
    stride_kb,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_on,
    stride_od,
    n_queries,
    n_keys,
    qk_scale,
    group,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One tile of BLOCK_Q queries of one (batch, head): O and L = logsumexp of its scores.

    Query head ``batch`` reads K and V head ``batch // group`` (grouped-query attention;
    ``group`` is 1 without it)."""
    pid = tl.program_id(0)  # (batch·head) × tiles + tile, see attention_grid
    n_tiles = tl.cdiv(n_queries, BLOCK_Q)
    q_start = (pid % n_tiles) * BLOCK_Q
    batch = (pid // n_tiles).to(tl.int64)
    offs_q = q_start + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_q[:, None] < n_queries) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + batch * stride_qb + offs_q[:, None] * stride_qn + offs_d[None, :] * stride_qd,
        mask=q_mask,
        other=0.0,
    )
    m_i = tl.full((BLOCK_Q,), float("-inf"), dtype=tl.float32)  # running maximum (log2 units)
    l_i = tl.zeros((BLOCK_Q,), dtype=tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)  # unnormalised output
    if IS_CAUSAL:  # keys up to the last query of the tile; all of them visible up to q_start
        stop = tl.minimum(n_keys, q_start + BLOCK_Q)
        unmasked_stop = (tl.minimum(q_start + 1, n_keys) // BLOCK_K) * BLOCK_K
    else:
        stop = n_keys
        unmasked_stop = (n_keys // BLOCK_K) * BLOCK_K
    k_base = k_ptr + (batch // group) * stride_kb
    v_base = v_ptr + (batch // group) * stride_vb
    acc, l_i, m_i = attend_key_tiles(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_q,
        offs_d,
        n_keys,
        0,
        unmasked_stop,
        qk_scale,
        BLOCK_K,
        HEAD_DIM,
        False,
        IS_CAUSAL,
        DOT_PRECISION,
    )
    acc, l_i, m_i = attend_key_tiles(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_q,
        offs_d,
        n_keys,
        unmasked_stop,
        stop,
        qk_scale,
        BLOCK_K,
        HEAD_DIM,
        True,
        IS_CAUSAL,
        DOT_PRECISION,
    )
    out = acc / l_i[:, None]
    tl.store(
        o_ptr + batch * stride_ob + offs_q[:, None] * stride_on + offs_d[None, :] * stride_od,
        out.to(o_ptr.dtype.element_ty),
        mask=q_mask,
    )
    lse = (m_i + tl.math.log2(l_i)) / 1.4426950408889634  # back to natural log
    tl.store(lse_ptr + batch * n_queries + offs_q, lse, mask=offs_q < n_queries)


@triton.jit
def flash_backward_preprocess_kernel(
    out_ptr,
    do_ptr,
    delta_ptr,
    n_rows,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """D = rowsum(dO ∘ O) of ``BLOCK_ROWS`` rows of contiguous (rows, HEAD_DIM) tensors, in float32.

    The backward's one reduction over the head dimension, done once per query row before the
    two kernels that need it (FlashAttention-2's "preprocess" step): D_i = Σ_j P_ij dP_ij.
    """
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM)
    offsets = rows[:, None].to(tl.int64) * HEAD_DIM + offs_d[None, :]
    o = tl.load(out_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, 1), mask=rows < n_rows)


@triton.jit
def dkdv_query_tiles(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    lse_base,
    delta_base,
    cols,
    offs_d,
    n_queries,
    start,
    stop,
    stride_n,
    qk_scale,
    BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Fold query tiles ``start, start + BLOCK_Q, ... < stop`` into one key tile's (dK, dV).

    Unmasked tiles (``MASKED=False``) lie wholly inside the sequence and below the causal
    diagonal: no comparison per element. Key columns past ``n_keys`` need no mask either way:
    their k and v were loaded as zeros and their rows of dK and dV are never stored.
    """
    offs_q = tl.arange(0, BLOCK_Q)
    for q_start in range(start, stop, BLOCK_Q):
        rows = q_start + offs_q
        q_mask = offs_d[None, :] < HEAD_DIM
        if MASKED:
            q_mask = q_mask & (rows[:, None] < n_queries)
        q_offsets = rows[:, None] * stride_n + offs_d[None, :]
        q = tl.load(q_base + q_offsets, mask=q_mask, other=0.0)  # (BLOCK_Q, BLOCK_D)
        do = tl.load(do_base + q_offsets, mask=q_mask, other=0.0)
        if MASKED:
            lse = tl.load(lse_base + rows, mask=rows < n_queries, other=0.0)
            delta = tl.load(delta_base + rows, mask=rows < n_queries, other=0.0)
        else:
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        # Sᵀ (BLOCK_K, BLOCK_Q) in log2 units, Pᵀ recomputed from L
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
        p_t = tl.math.exp2(s_t - lse[None, :] * 1.4426950408889634)
        if MASKED:
            visible = rows[None, :] < n_queries
            if IS_CAUSAL:
                visible = visible & (cols[:, None] <= rows[None, :])
            p_t = tl.where(visible, p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)  # dV += Pᵀ dO
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # dPᵀ = V dOᵀ
        ds_t = p_t * (dp_t - delta[None, :])  # dSᵀ = Pᵀ ∘ (dPᵀ - D)
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)  # dK += dSᵀ Q
    return dk, dv


@triton.jit
def flash_backward_dkdv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    stride_qb,
    stride_kb,
    stride_n,
    n_queries,
    n_keys,
    scale,
    qk_scale,
    group,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dK and dV of one tile of keys. All tensors are contiguous (batch·heads, n, head_dim):
    q, dO share ``stride_qb``, k, v, dK, dV ``stride_kb``, and every row is ``stride_n`` long.
    With grouped-query attention, k and v are head ``batch // group``'s and dK, dV the query
    head's share (one per query head, summed over the group by the caller).

    Query tiles in three runs, as the forward splits its key tiles: with the causal mask, the
    tiles that straddle the diagonal (masked); then the full tiles below it (unmasked); then
    the last, partial tile of the sequence (masked)."""
    pid = tl.program_id(0)  # (batch·head) × tiles + tile, see attention_grid
    n_tiles = tl.cdiv(n_keys, BLOCK_K)
    k_start = (pid % n_tiles) * BLOCK_K
    batch = (pid // n_tiles).to(tl.int64)
    cols = k_start + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (cols[:, None] < n_keys) & (offs_d[None, :] < HEAD_DIM)
    kv_offsets = cols[:, None] * stride_n + offs_d[None, :]
    kv_head = (batch // group) * stride_kb
    k = tl.load(k_ptr + kv_head + kv_offsets, mask=kv_mask, other=0.0)  # (BLOCK_K, BLOCK_D)
    v = tl.load(v_ptr + kv_head + kv_offsets, mask=kv_mask, other=0.0)
    dk = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    full_stop = (n_queries // BLOCK_Q) * BLOCK_Q  # end of the last full query tile
    first = 0
    diagonal_stop = 0
    if IS_CAUSAL:  # queries before k_start see none of these keys; from the first tile
        first = (k_start // BLOCK_Q) * BLOCK_Q  # starting at k_start + BLOCK_K - 1, all
        diagonal_stop = tl.minimum(tl.cdiv(k_start + BLOCK_K - 1, BLOCK_Q) * BLOCK_Q, full_stop)
    q_base, do_base = q_ptr + batch * stride_qb, do_ptr + batch * stride_qb
    lse_base, delta_base = lse_ptr + batch * n_queries, delta_ptr + batch * n_queries
    dk, dv = dkdv_query_tiles(
        dk,
        dv,
        k,
        v,
        q_base,
        do_base,
        lse_base,
        delta_base,
        cols,
        offs_d,
        n_queries,
        first,
        diagonal_stop,
        stride_n,
        qk_scale,
        BLOCK_Q,
        HEAD_DIM,
        True,
        IS_CAUSAL,
        DOT_PRECISION,
    )
    dk, dv = dkdv_query_tiles(
        dk,
        dv,
        k,
        v,
        q_base,
        do_base,
        lse_base,
        delta_base,
        cols,
        offs_d,
        n_queries,
        tl.maximum(first, diagonal_stop),
        full_stop,
        stride_n,
        qk_scale,
        BLOCK_Q,
        HEAD_DIM,
        False,
        IS_CAUSAL,
        DOT_PRECISION,
    )
    dk, dv = dkdv_query_tiles(
        dk,
        dv,
        k,
        v,
        q_base,
        do_base,
        lse_base,
        delta_base,
        cols,
        offs_d,
        n_queries,
        tl.maximum(first, full_stop),
        n_queries,
        stride_n,
        qk_scale,
        BLOCK_Q,
        HEAD_DIM,
        True,
        IS_CAUSAL,
        DOT_PRECISION,
    )
    dkv_offsets = batch * stride_kb + kv_offsets  # dK, dV: one per query head
    tl.store(dk_ptr + dkv_offsets, (dk * scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + dkv_offsets, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def dq_key_tiles(
    dq,
    q,
    do,
    lse,
    delta,
    k_base,
    v_base,
    rows,
    offs_d,
    n_keys,
    start,
    stop,
    stride_n,
    BLOCK_K: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    qk_scale,
):
    """Fold key tiles ``start, start + BLOCK_K, ... < stop`` into one query tile's dQ (unscaled).

    Unmasked tiles (``MASKED=False``) lie wholly inside the sequence and below the causal
    diagonal. Query rows past ``n_queries`` need no mask: their q and dO were loaded as zeros
    and their rows of dQ are never stored.
    """
    offs_k = tl.arange(0, BLOCK_K)
    for k_start in range(start, stop, BLOCK_K):
        cols = k_start + offs_k
        kv_mask = offs_d[None, :] < HEAD_DIM
        if MASKED:
            kv_mask = kv_mask & (cols[:, None] < n_keys)
        kv_offsets = cols[:, None] * stride_n + offs_d[None, :]
        k = tl.load(k_base + kv_offsets, mask=kv_mask, other=0.0)  # (BLOCK_K, BLOCK_D)
        v = tl.load(v_base + kv_offsets, mask=kv_mask, other=0.0)
        # S (BLOCK_Q, BLOCK_K) in log2 units, P recomputed from L
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        p = tl.math.exp2(s - lse[:, None] * 1.4426950408889634)
        if MASKED:
            visible = cols[None, :] < n_keys
            if IS_CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)  # dP = dO Vᵀ
        ds = p * (dp - delta[:, None])  # dS = P ∘ (dP - D)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)  # dQ += dS K
    return dq


@triton.jit
def flash_backward_dq_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    stride_qb,
    stride_kb,
    stride_n,
    n_queries,
    n_keys,
    scale,
    qk_scale,
    group,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dQ of one tile of queries, recomputing the probabilities of every key tile it sees.

    Key tiles split as in the forward: the full tiles that no mask touches, then (masked) the
    tiles on the causal diagonal and the last, partial tile."""
    pid = tl.program_id(0)  # (batch·head) × tiles + tile, see attention_grid
    n_tiles = tl.cdiv(n_queries, BLOCK_Q)
    q_start = (pid % n_tiles) * BLOCK_Q
    batch = (pid // n_tiles).to(tl.int64)
    rows = q_start + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (rows[:, None] < n_queries) & (offs_d[None, :] < HEAD_DIM)
    q_offsets = batch * stride_qb + rows[:, None] * stride_n + offs_d[None, :]
    q = tl.load(q_ptr + q_offsets, mask=q_mask, other=0.0)  # (BLOCK_Q, BLOCK_D)
    do = tl.load(do_ptr + q_offsets, mask=q_mask, other=0.0)
    lse = tl.load(lse_ptr + batch * n_queries + rows, mask=rows < n_queries, other=0.0)
    delta = tl.load(delta_ptr + batch * n_queries + rows, mask=rows < n_queries, other=0.0)
    dq = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)
    if IS_CAUSAL:  # keys up to the last query of the tile; all of them visible up to q_start
        stop = tl.minimum(n_keys, q_start + BLOCK_Q)
        unmasked_stop = (tl.minimum(q_start + 1, n_keys) // BLOCK_K) * BLOCK_K
    else:
        stop = n_keys
        unmasked_stop = (n_keys // BLOCK_K) * BLOCK_K
    kv_head = (batch // group) * stride_kb  # grouped-query attention: the group's KV head
    k_base, v_base = k_ptr + kv_head, v_ptr + kv_head
    dq = dq_key_tiles(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        rows,
        offs_d,
        n_keys,
        0,
        unmasked_stop,
        stride_n,
        BLOCK_K,
        HEAD_DIM,
        False,
        IS_CAUSAL,
        DOT_PRECISION,
        qk_scale,
    )
    dq = dq_key_tiles(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        rows,
        offs_d,
        n_keys,
        unmasked_stop,
        stop,
        stride_n,
        BLOCK_K,
        HEAD_DIM,
        True,
        IS_CAUSAL,
        DOT_PRECISION,
        qk_scale,
    )
    tl.store(dq_ptr + q_offsets, (dq * scale).to(dq_ptr.dtype.element_ty), mask=q_mask)


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 exactly, as the references do


def _check(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool = False) -> None:
    validate_attention_inputs(q, k, v, enable_gqa)
    head_dim = q.shape[-1]
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"Unsupported head dimension {head_dim} for the Triton kernels "
            f"(need {MIN_HEAD_DIM} to {MAX_HEAD_DIM}); use implementation='tiled'"
        )
    check_launch(flash_forward_kernel, q, k, v)


def flash_attention_triton_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    is_causal: bool = False,
    tiles: AttentionTiles | None = None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor]:
    """Run :func:`flash_forward_kernel`: the output (q's shape and dtype) and L (..., n_queries).

    L is float32.

    ``tiles`` defaults to :func:`attention_forward_tiles` for the tensors' device; with
    ``enable_gqa``, k and v may have fewer heads than q (grouped-query attention, SDPA's rule).
    """
    _check(q, k, v, enable_gqa)
    *batch_shape, n_queries, head_dim = q.shape
    if tiles is None:
        tiles = attention_forward_tiles(_target(flash_forward_kernel, q), q.dtype, head_dim)
    q3, k3, v3 = (t.reshape(-1, t.shape[-2], head_dim) for t in (q, k, v))  # (batch·heads, n, d)
    out = torch.empty_like(q3)
    # (batch·heads, n_queries)
    lse = torch.empty(q3.shape[:2], dtype=torch.float32, device=q.device)
    grid, args, kwargs = attention_forward_launch(q3, k3, v3, out, lse, is_causal, tiles)
    flash_forward_kernel[grid](*args, **kwargs)
    return out.reshape(q.shape), lse.reshape(*batch_shape, n_queries)


def _target(kernel: object, t: Tensor) -> GPUSpec | None:
    return None if is_interpreted(kernel) else launch_target(t.device)


def attention_forward_launch(
    q3: Any, k3: Any, v3: Any, out: Any, lse: Any, is_causal: bool, tiles: AttentionTiles
) -> tuple[tuple[int], tuple, dict[str, Any]]:
    """Grid, arguments and keywords of :func:`flash_forward_kernel` on (batch·heads, n, d) tensors.

    Shared by :func:`flash_attention_triton_forward` and the compile report, which passes
    stand-ins with the tensors' dtype, shape and strides.
    """
    batch_heads, n_queries, head_dim = q3.shape
    n_keys = k3.shape[1]
    strides = (*q3.stride(), *k3.stride(), *v3.stride(), *out.stride())
    group = batch_heads // k3.shape[0]  # query heads per KV head (1 without GQA)
    args = (q3, k3, v3, out, lse, *strides, n_queries, n_keys, head_dim**-0.5 * LOG2_E, group)
    constants = _constants(q3.shape[-1], is_causal, q3.dtype, tiles)
    return attention_grid(n_queries, tiles.block_q, batch_heads), args, constants


def _constants(
    head_dim: int, is_causal: bool, dtype: torch.dtype, tiles: AttentionTiles
) -> dict[str, Any]:
    blocks = dict(BLOCK_Q=tiles.block_q, BLOCK_K=tiles.block_k, BLOCK_D=_padded(head_dim))
    launch = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    precision = _dot_precision(dtype)
    return dict(**blocks, HEAD_DIM=head_dim, IS_CAUSAL=is_causal, DOT_PRECISION=precision, **launch)


def _padded(head_dim: int) -> int:
    return max(16, 1 << math.ceil(math.log2(head_dim)))


def attention_backward_delta(out: Tensor, grad_out: Tensor, block_rows: int = 32) -> Tensor:
    """D = rowsum(dO ∘ O) by :func:`flash_backward_preprocess_kernel`: float32, ``out.shape[:-1]``.

    The term every backward kernel subtracts from dP (``dS = P ∘ (dP - D)``): since
    ``O_i = Σ_j P_ij V_j``, ``D_i = Σ_j P_ij dP_ij = dO_i · O_i``, one dot product of length
    head_dim per query instead of a sum over all keys. Computed once, before the two backward
    kernels, as FlashAttention-2 does; ``block_rows`` rows per program.
    """
    if out.shape != grad_out.shape:
        raise ValueError(
            f"out and grad_out must have one shape, got {tuple(out.shape)} and "
            f"{tuple(grad_out.shape)}"
        )
    if block_rows < 1 or block_rows & (block_rows - 1):
        raise ValueError(f"Invalid block_rows: {block_rows} (need a power of two)")
    head_dim = out.shape[-1]
    o2, do2 = (t.reshape(-1, head_dim).contiguous() for t in (out, grad_out))  # (rows, d)
    delta = torch.empty(o2.shape[0], dtype=torch.float32, device=out.device)
    grid = (-(-o2.shape[0] // block_rows),)
    flash_backward_preprocess_kernel[grid](
        o2,
        do2,
        delta,
        o2.shape[0],
        BLOCK_ROWS=block_rows,
        BLOCK_D=_padded(head_dim),
        HEAD_DIM=head_dim,
    )
    return delta.reshape(out.shape[:-1])


def flash_attention_triton_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    is_causal: bool = False,
    tiles: AttentionTiles | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Run the two backward kernels: ``(dq, dk, dv)`` in the inputs' dtype.

    ``tiles`` (both kernels) defaults to :func:`attention_dkdv_tiles` and
    :func:`attention_dq_tiles` for the tensors' device.
    """
    *_, n_queries, head_dim = q.shape
    n_keys = k.shape[-2]
    target = _target(flash_backward_dq_kernel, q)
    dkdv_tiles = tiles or attention_dkdv_tiles(target, q.dtype, head_dim)
    dq_tiles = tiles or attention_dq_tiles(target, q.dtype, head_dim)
    # One layout for all: contiguous (batch·heads, n, d), so q and k share their strides.
    q3, do3 = (t.reshape(-1, n_queries, head_dim).contiguous() for t in (q, grad_out.to(q.dtype)))
    delta = attention_backward_delta(out, grad_out.to(q.dtype))  # D = rowsum(dO ∘ O)
    k3, v3 = (t.reshape(-1, n_keys, head_dim).contiguous() for t in (k, v))
    lse2, delta2 = lse.reshape(-1, n_queries).contiguous(), delta.reshape(-1, n_queries)
    dq = torch.empty_like(q3)
    # one dK, dV per query head (batch·heads, n_keys, d), summed over each group below
    dk, dv = (
        torch.empty(q3.shape[0], n_keys, head_dim, dtype=q.dtype, device=q.device) for _ in "kv"
    )
    grid, args, kwargs = attention_dkdv_launch(
        q3, k3, v3, do3, lse2, delta2, dk, dv, is_causal, dkdv_tiles
    )
    flash_backward_dkdv_kernel[grid](*args, **kwargs)
    grid, args, kwargs = attention_dq_launch(q3, k3, v3, do3, lse2, delta2, dq, is_causal, dq_tiles)
    flash_backward_dq_kernel[grid](*args, **kwargs)
    if k3.shape[0] != q3.shape[0]:  # grouped-query attention: (kv heads, group, n_keys, d)
        dk, dv = (t.float().unflatten(0, (k3.shape[0], -1)).sum(1).to(q.dtype) for t in (dk, dv))
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def _backward_sizes(q3: Any, k3: Any) -> tuple[int, int, int, tuple]:
    """Batch·heads, queries, keys and the size arguments both backward kernels take."""
    batch_heads, n_queries, head_dim = q3.shape
    n_keys = k3.shape[1]
    scale = head_dim**-0.5
    group = batch_heads // k3.shape[0]  # query heads per KV head (1 without GQA)
    sizes = (q3.stride(0), k3.stride(0), head_dim, n_queries, n_keys, scale, scale * LOG2_E, group)
    return batch_heads, n_queries, n_keys, sizes


def attention_dkdv_launch(
    q3: Any,
    k3: Any,
    v3: Any,
    do3: Any,
    lse: Any,
    delta: Any,
    dk: Any,
    dv: Any,
    is_causal: bool,
    tiles: AttentionTiles,
) -> tuple[tuple[int], tuple, dict[str, Any]]:
    """Grid, arguments and keywords of :func:`flash_backward_dkdv_kernel` (contiguous tensors)."""
    batch_heads, n_queries, n_keys, sizes = _backward_sizes(q3, k3)
    args = (q3, k3, v3, do3, lse, delta, dk, dv, *sizes)
    constants = _constants(q3.shape[-1], is_causal, q3.dtype, tiles)
    return attention_grid(n_keys, tiles.block_k, batch_heads), args, constants


def attention_dq_launch(
    q3: Any,
    k3: Any,
    v3: Any,
    do3: Any,
    lse: Any,
    delta: Any,
    dq: Any,
    is_causal: bool,
    tiles: AttentionTiles,
) -> tuple[tuple[int], tuple, dict[str, Any]]:
    """Grid, arguments and keywords of :func:`flash_backward_dq_kernel` (contiguous tensors)."""
    batch_heads, n_queries, n_keys, sizes = _backward_sizes(q3, k3)
    args = (q3, k3, v3, do3, lse, delta, dq, *sizes)
    constants = _constants(q3.shape[-1], is_causal, q3.dtype, tiles)
    return attention_grid(n_queries, tiles.block_q, batch_heads), args, constants


_OPS: dict[str, Any] = {}


def register_flash_attention_op() -> Any:
    """Register the Triton forward as ``torch.ops.trainfast_kernels.flash_attention_forward``.

    ``torch.library.triton_op`` (PyTorch 2.6 and later) makes a custom operator whose body
    launches Triton kernels through ``torch.library.wrap_triton``; ``torch.compile`` then traces
    *into* the kernel launch (its output shapes come from tracing the body, no fake
    implementation needed) instead of breaking the graph, and inductor can schedule it with the
    kernels it generates. Returns the operator (``(q, k, v, is_causal) -> (out, lse)``), once
    per process; ``None`` where it cannot work: a PyTorch without ``triton_op``, or our kernels
    decorated for Triton's CPU interpreter, whose kernels ``wrap_triton`` cannot trace (it would
    call them on fake tensors, which have no data). Backward stays with
    :class:`FlashAttentionTriton`: a kernel launch has no derivative, so autograd needs the
    formula either way.
    """
    if "forward" in _OPS:
        return _OPS["forward"]
    triton_op = getattr(torch.library, "triton_op", None)
    if triton_op is None or is_interpreted(flash_forward_kernel):
        return None
    wrap_triton = torch.library.wrap_triton

    @triton_op("trainfast_kernels::flash_attention_forward", mutates_args=())
    def flash_attention_forward(
        q: Tensor, k: Tensor, v: Tensor, is_causal: bool
    ) -> tuple[Tensor, Tensor]:
        *batch_shape, n_queries, head_dim = q.shape
        tiles = attention_forward_tiles(launch_target(q.device), q.dtype, head_dim)
        q3, k3, v3 = (t.reshape(-1, t.shape[-2], head_dim) for t in (q, k, v))
        out = torch.empty_like(q3)
        lse = torch.empty(q3.shape[:2], dtype=torch.float32, device=q.device)
        grid, args, kwargs = attention_forward_launch(q3, k3, v3, out, lse, is_causal, tiles)
        wrap_triton(flash_forward_kernel)[grid](*args, **kwargs)
        return out.reshape(q.shape), lse.reshape(*batch_shape, n_queries)

    _OPS["forward"] = flash_attention_forward
    return flash_attention_forward


class FlashAttentionTriton(torch.autograd.Function):
    """Flash attention with Triton forward and backward.

    Call it as ``FlashAttentionTriton.apply(q, k, v, is_causal)``.

    Same interface (``enable_gqa`` included), saved tensors (q, k, v, O, L) and causal
    convention as :class:`~trainfast.kernels.attention.FlashAttention`. Runs on CUDA tensors
    (float16, bfloat16, float32) and, under Triton's interpreter, on CPU tensors (float16,
    float32).
    """

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, enable_gqa: bool = False
    ) -> Tensor:
        out, lse = flash_attention_triton_forward(q, k, v, is_causal, enable_gqa=enable_gqa)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_triton_backward(grad_out, q, k, v, out, lse, ctx.is_causal)
        return dq, dk, dv, None, None
