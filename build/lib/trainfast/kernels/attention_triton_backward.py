"""Flash attention's backward pass in Triton: two kernels and the step before them.

* :func:`flash_backward_preprocess_kernel`: ``D = rowsum(dO ∘ O)``, once per query row;
* :func:`flash_backward_dkdv_kernel`: one program per tile of keys walks over the query tiles,
  recomputes the probabilities from ``L`` and accumulates ``dK`` and ``dV``;
* :func:`flash_backward_dq_kernel`: one program per tile of queries walks over the key tiles
  and accumulates ``dQ``. Two kernels instead of one with atomic additions: each output is
  written by exactly one program, so the result is deterministic.

The loops split as the forward's do (:mod:`trainfast.kernels.attention_triton_forward`): tiles
that no mask touches run without masking, the causal diagonal and the sequence's last partial
tile with it. Grouped-query attention: a program of query head ``i`` reads K and V head
``i // group``; dK and dV are written per query head and summed over the group by the launcher
(:func:`trainfast.kernels.attention_triton.flash_attention_triton_backward`), after the kernels.
"""

import torch

from trainfast.gpus import GPUSpec
from trainfast.kernels.attention_triton_forward import AttentionTiles
from trainfast.kernels.targets import pipelines_loads
from trainfast.kernels.triton_runtime import tl, triton

__all__ = [
    "attention_dkdv_tiles",
    "attention_dq_tiles",
    "dkdv_query_tiles",
    "dq_key_tiles",
    "flash_backward_dkdv_kernel",
    "flash_backward_dq_kernel",
    "flash_backward_preprocess_kernel",
]


def attention_dkdv_tiles(
    target: GPUSpec | None, dtype: torch.dtype, head_dim: int
) -> AttentionTiles:
    """Tiles of :func:`flash_backward_dkdv_kernel`: ``block_k`` keys per program, stepping over
    ``block_q`` queries (q, dO in shared memory, dK, dV accumulators in registers).

    On sm_90 at head dimensions above 64 in 16-bit: 128 keys a program, 32 queries a step, 8
    warps, 3 stages (FlashAttention-2's backward also owns 128 keys a program at head dimension
    128; Triton's fused-attention tutorial steps 32 queries over 128 keys). The 64 × 64 tiles
    it replaces held 209 registers a thread at 8 warps, so one block of 8 warps per SM, and read
    a query tile of 64 rows for every 64 keys: 128 FLOPs per byte loaded a step, against 256
    with 128 keys. The new tiles hold 230 registers, still one block of 8 warps (the compile
    report), and spill nothing; 4 warps would spill 2 KiB and on sm_80 (``mma.sync``, more
    registers) 8 warps spill 52 bytes, so other GPUs keep ``_backward_tiles``.
    """
    if _hopper_16_bit_wide(target, dtype, head_dim):
        return AttentionTiles(32, 128, num_warps=8, num_stages=3)
    return _backward_tiles(target, dtype, head_dim)


def attention_dq_tiles(target: GPUSpec | None, dtype: torch.dtype, head_dim: int) -> AttentionTiles:
    """Tiles of :func:`flash_backward_dq_kernel`: ``block_q`` queries per program, stepping over
    ``block_k`` keys (k, v in shared memory, the dQ accumulator in registers).

    On sm_90 at head dimensions above 64 in 16-bit: 128 queries a program, 32 keys a step, 8
    warps, 3 stages (the tutorial's dQ tiles, with 8 warps: at 4 it spills 280 bytes), 143
    registers and one block per SM; it reads K and V once per 128 queries instead of 64.
    """
    if _hopper_16_bit_wide(target, dtype, head_dim):
        return AttentionTiles(128, 32, num_warps=8, num_stages=3)
    return _backward_tiles(target, dtype, head_dim)


def _hopper_16_bit_wide(target: GPUSpec | None, dtype: torch.dtype, head_dim: int) -> bool:
    """sm_90 (warpgroup MMAs), 16-bit inputs and a head dimension above 64."""
    return (
        target is not None
        and target.compute_capability >= (9, 0)
        and dtype in (torch.float16, torch.bfloat16)
        and head_dim > 64
    )


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
    the last, partial tile of the sequence (masked). The scales are cast to float32 first, as
    in :func:`~trainfast.kernels.attention_triton_forward.flash_forward_kernel` (``torch.compile``
    passes them as float64)."""
    scale, qk_scale = tl.cast(scale, tl.float32), tl.cast(qk_scale, tl.float32)
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
    tiles on the causal diagonal and the last, partial tile. The scales are cast to float32
    first, as in the forward (``torch.compile`` passes them as float64)."""
    scale, qk_scale = tl.cast(scale, tl.float32), tl.cast(qk_scale, tl.float32)
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
