"""Flash attention's forward pass in Triton: the tiles, the grid and the kernel.

:func:`flash_forward_kernel`: one program per tile of queries (and per batch × head) walks
over the key tiles with the online softmax, then writes the output tile and the log-sum-exp
``L``. Key tiles that no mask touches are processed by a loop without masking
(:func:`attend_key_tiles` with ``MASKED=False``); only the last tile and, with the causal mask,
the tiles that straddle the diagonal pay for the masks. Exponentials are base 2 (``exp2``, one
instruction on NVIDIA GPUs), with ``log2 e`` folded into the scale. The launcher is in
:mod:`trainfast.kernels.attention_triton`, the backward in
:mod:`trainfast.kernels.attention_triton_backward`.

The grid is one-dimensional: program ``pid`` handles tile ``pid % n_tiles`` of (batch · head)
``pid // n_tiles`` (:func:`attention_grid`). CUDA allows 2**31 - 1 programs on grid axis 0 but
only 65,535 on axes 1 and 2, so batch · heads on axis 1 would fail beyond 65,535 (e.g. batch 2,048
with 32 heads); folded into axis 0, the programs of one head still run next to each other.
"""

from dataclasses import dataclass

import torch

from trainfast.gpus import GPUSpec
from trainfast.kernels.targets import pipelines_loads
from trainfast.kernels.triton_runtime import tl, triton

__all__ = [
    "LOG2_E",
    "MAX_GRID_X",
    "AttentionTiles",
    "attend_key_tiles",
    "attention_forward_tiles",
    "attention_grid",
    "flash_forward_kernel",
]

LOG2_E = 1.4426950408889634  # exp(x) = exp2(x · log2 e)
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
    ``group`` is 1 without it). ``qk_scale`` is cast to float32 first: a direct launch passes it
    as float32, but ``torch.compile`` as float64, which would turn the scores, and the
    accumulator carried through the key loop, into float64 (a compile error)."""
    qk_scale = tl.cast(qk_scale, tl.float32)
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
