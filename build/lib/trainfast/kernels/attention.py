"""Flash attention, tiled in plain PyTorch: the algorithm without the kernel.

Softmax attention ``O = softmax(Q Kᵀ / √d) V`` written naively materialises the
``n_queries × n_keys`` scores and probabilities, and autograd keeps the probabilities for the
backward pass: memory that grows with the square of the sequence. Flash attention (Dao et al.,
2022; the loop order of FlashAttention-2, Dao 2023) never builds them:

* **forward**: for a tile of queries, walk over tiles of keys, keeping per query the running
  maximum ``m``, the running sum ``l`` of ``exp(s - m)`` and the unnormalised output; when a
  tile raises the maximum, rescale what was accumulated (the online softmax of
  :mod:`trainfast.kernels.softmax`). Save only Q, K, V, O and the log-sum-exp
  ``L = m + log l`` of each query (shape (..., n_queries));
* **backward**: recompute each tile of probabilities from ``P = exp(Q Kᵀ/√d - L)`` instead of
  reading it from memory, and use ``D = rowsum(dO ∘ O)`` for the softmax's gradient.

:class:`FlashAttention` is this algorithm as a ``torch.autograd.Function``, in tiles, in
PyTorch: slow (a Python loop over tiles) but exact, and it runs anywhere. Its Triton twin is
:class:`~trainfast.kernels.attention_triton.FlashAttentionTriton`. Shapes follow
``torch.nn.functional.scaled_dot_product_attention``: ``q`` (..., n_queries, head_dim), ``k``
and ``v`` (..., n_keys, head_dim), the scale ``1/√head_dim``.

**Grouped-query attention** (GQA; Ainslie et al., 2023): with ``enable_gqa=True``, as in
``scaled_dot_product_attention``, ``k`` and ``v`` may have fewer heads than ``q``
((..., n_kv_heads, n_keys, head_dim) against (..., n_heads, n_queries, head_dim), ``n_kv_heads``
dividing ``n_heads``): query head ``h`` reads key and value head ``h // (n_heads / n_kv_heads)``.
The tiled version views the query heads as (n_kv_heads, group) and broadcasts each KV head
over its group (no copy); the backward sums the group's gradients into the shared head.

**Causal mask.** As in ``scaled_dot_product_attention(is_causal=True)``, query ``i`` sees key
``j`` when ``j <= i``: the lower triangle aligned at the *top-left* corner, also when
``n_queries != n_keys`` (so with more keys than queries the last keys are seen by no one).
FlashAttention-2's own library aligns the mask at the bottom-right instead; this module follows
PyTorch so that the two can be compared.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from trainfast.kernels.attention_inputs import check_tile_sizes, validate_attention_inputs
from trainfast.validation import check_flag

__all__ = [
    "FlashAttention",
    "attention_reference",
    "check_tile_sizes",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "group_query_heads",
    "validate_attention_inputs",
]

TILE_QUERIES = 64
TILE_KEYS = 64


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, attn_mask: Tensor | None = None
) -> Tensor:
    """Attention the textbook way, materialising the ``n_queries × n_keys`` probabilities.

    Autograd saves those probabilities for the backward pass: this is the unfused version whose
    memory flash attention avoids. Use ``scaled_dot_product_attention`` for real work.

    ``attn_mask`` is SDPA's boolean mask: broadcastable to ``(..., n_queries, n_keys)``, True
    where a query may attend to a key (any pattern: padding, documents, sliding windows). A
    query that may see no key gets a zero output and zero gradients, as SDPA gives in PyTorch
    2.5 and later (its "safe softmax"); the softmax of a row of ``-inf`` would be NaN. As in
    SDPA, a mask and ``is_causal`` are not given together.
    """
    check_flag("is_causal", is_causal)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # (..., n_queries, n_keys)
    n_queries, n_keys = scores.shape[-2:]
    if attn_mask is not None:
        if is_causal:
            raise ValueError("Give attn_mask or is_causal=True, not both (as in SDPA)")
        _check_mask(attn_mask, scores)
        seen = attn_mask.any(dim=-1, keepdim=True)  # rows with at least one visible key
        scores = scores.masked_fill(~attn_mask, float("-inf")).masked_fill(~seen, 0.0)
        return (torch.softmax(scores, dim=-1) * seen) @ v
    if is_causal:
        hidden = torch.ones(n_queries, n_keys, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _check_mask(attn_mask: object, scores: Tensor) -> None:
    """Raise ``ValueError`` naming the value unless ``attn_mask`` is a boolean tensor on the
    scores' device that broadcasts to their shape ``(..., n_queries, n_keys)``."""
    if not isinstance(attn_mask, Tensor) or attn_mask.dtype != torch.bool:
        kind = attn_mask.dtype if isinstance(attn_mask, Tensor) else type(attn_mask).__name__
        raise ValueError(f"attn_mask must be a boolean tensor (True: attend), got {kind}")
    if attn_mask.device != scores.device:
        raise ValueError(f"attn_mask is on {attn_mask.device}, the inputs on {scores.device}")
    try:
        shape = torch.broadcast_shapes(attn_mask.shape, scores.shape)
    except RuntimeError:
        shape = None
    if shape != scores.shape:
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the scores' "
            f"(..., n_queries, n_keys) = {tuple(scores.shape)}"
        )


def group_query_heads(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """Views for grouped-query attention: ``q`` as (..., n_kv_heads, group, n_queries, d) and
    ``k`` (or ``v``) expanded to (..., n_kv_heads, group, n_keys, d), without copying.

    Attention over these 5-D views is attention of query head ``h`` against KV head
    ``h // group``, SDPA's ``enable_gqa`` convention. Raises ``ValueError`` if ``k`` has more
    heads than ``q`` or a number that does not divide q's.
    """
    n_heads, n_kv_heads = q.shape[-3], k.shape[-3]
    if n_kv_heads > n_heads or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
    group = n_heads // n_kv_heads
    q5 = q.unflatten(-3, (n_kv_heads, group))  # (..., n_kv_heads, group, n_queries, d)
    k5 = k.unsqueeze(-3).expand(*k.shape[:-2], group, *k.shape[-2:])  # (..., n_kv, group, n, d)
    return q5, k5


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # 16-bit inputs: accumulate in float32


def flash_attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    is_causal: bool = False,
    tile_queries: int = TILE_QUERIES,
    tile_keys: int = TILE_KEYS,
) -> tuple[Tensor, Tensor]:
    """The tiled forward pass: the output ``O`` (q's shape and dtype) and the log-sum-exp ``L``.

    ``L`` has shape (..., n_queries), in float32 (float64 for float64 inputs).
    """
    check_tile_sizes(tile_queries, tile_keys)
    check_flag("is_causal", is_causal)
    n_queries, n_keys, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
    dtype = _compute_dtype(q.dtype)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=dtype, device=q.device)  # (..., n_queries)
    for q_start in range(0, n_queries, tile_queries):
        q_tile = q[..., q_start : q_start + tile_queries, :].to(dtype)  # (..., Tq, d)
        rows = torch.arange(q_start, q_start + q_tile.shape[-2], device=q.device)
        m = torch.full(q_tile.shape[:-1], float("-inf"), dtype=dtype, device=q.device)  # (..., Tq)
        row_sum = torch.zeros_like(m)  # l in the papers
        acc = torch.zeros_like(q_tile)  # (..., Tq, d), unnormalised output
        # causal: key j is seen by query i only if j <= i, so later key tiles are skipped
        key_stop = min(n_keys, q_start + q_tile.shape[-2]) if is_causal else n_keys
        for k_start in range(0, key_stop, tile_keys):
            k_tile = k[..., k_start : k_start + tile_keys, :].to(dtype)  # (..., Tk, d)
            v_tile = v[..., k_start : k_start + tile_keys, :].to(dtype)
            s = q_tile @ k_tile.transpose(-2, -1) * scale  # (..., Tq, Tk)
            if is_causal:
                cols = torch.arange(k_start, k_start + k_tile.shape[-2], device=q.device)
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new.unsqueeze(-1))  # (..., Tq, Tk)
            rescale = torch.exp(m - m_new)  # shrinks what was accumulated under the old maximum
            row_sum = row_sum * rescale + p.sum(dim=-1)
            acc = acc * rescale.unsqueeze(-1) + p @ v_tile
            m = m_new
        out[..., q_start : q_start + tile_queries, :] = (acc / row_sum.unsqueeze(-1)).to(q.dtype)
        lse[..., q_start : q_start + tile_queries] = m + torch.log(row_sum)
    return out, lse


def flash_attention_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    is_causal: bool = False,
    tile_queries: int = TILE_QUERIES,
    tile_keys: int = TILE_KEYS,
) -> tuple[Tensor, Tensor, Tensor]:
    """The tiled backward pass: ``(dq, dk, dv)``, recomputing probabilities tile by tile."""
    check_tile_sizes(tile_queries, tile_keys)
    check_flag("is_causal", is_causal)
    n_queries, n_keys, scale = q.shape[-2], k.shape[-2], q.shape[-1] ** -0.5
    dtype = lse.dtype
    delta = (grad_out.to(dtype) * out.to(dtype)).sum(dim=-1)  # D = rowsum(dO ∘ O), (..., n_queries)
    dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=dtype, device=q.device)
    dv = torch.zeros(v.shape, dtype=dtype, device=q.device)
    for k_start in range(0, n_keys, tile_keys):
        k_tile = k[..., k_start : k_start + tile_keys, :].to(dtype)  # (..., Tk, d)
        v_tile = v[..., k_start : k_start + tile_keys, :].to(dtype)
        cols = torch.arange(k_start, k_start + k_tile.shape[-2], device=q.device)
        # causal: queries before k_start see none of these keys
        first_query = (k_start // tile_queries) * tile_queries if is_causal else 0
        for q_start in range(first_query, n_queries, tile_queries):
            q_slice = slice(q_start, q_start + tile_queries)
            q_tile = q[..., q_slice, :].to(dtype)  # (..., Tq, d)
            do_tile = grad_out[..., q_slice, :].to(dtype)
            s = q_tile @ k_tile.transpose(-2, -1) * scale  # (..., Tq, Tk)
            p = torch.exp(s - lse[..., q_slice].unsqueeze(-1))  # recomputed probabilities
            if is_causal:
                rows = torch.arange(q_start, q_start + q_tile.shape[-2], device=q.device)
                p = p.masked_fill(cols[None, :] > rows[:, None], 0.0)
            dv[..., k_start : k_start + tile_keys, :] += p.transpose(-2, -1) @ do_tile
            dp = do_tile @ v_tile.transpose(-2, -1)  # (..., Tq, Tk)
            ds = p * (dp - delta[..., q_slice].unsqueeze(-1))  # gradient of the scores
            dq[..., q_slice, :] += ds @ k_tile * scale
            dk[..., k_start : k_start + tile_keys, :] += ds.transpose(-2, -1) @ q_tile * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class FlashAttention(torch.autograd.Function):
    """Flash attention as an autograd Function, tiled in PyTorch.

    Call it as ``FlashAttention.apply(q, k, v, is_causal)``.

    The forward saves q, k, v, the output and the log-sum-exp ``L`` (..., n_queries), and
    nothing of size n_queries × n_keys (``out.grad_fn.saved_tensors`` shows it); the backward
    recomputes the probabilities tile by tile. Tile sizes are the class attributes
    ``tile_queries`` and ``tile_keys``.
    """

    tile_queries = TILE_QUERIES
    tile_keys = TILE_KEYS

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, enable_gqa: bool = False
    ) -> Tensor:
        validate_attention_inputs(q, k, v, enable_gqa)
        grouped = q.shape[:-2] != k.shape[:-2]
        q_in, k_in, v_in = q, k, v
        if grouped:  # 5-D views: (..., n_kv_heads, group, n, d)
            (q_in, k_in), (_, v_in) = group_query_heads(q, k), group_query_heads(q, v)
        out, lse = flash_attention_forward(
            q_in, k_in, v_in, is_causal, FlashAttention.tile_queries, FlashAttention.tile_keys
        )
        out, lse = out.reshape(q.shape), lse.reshape(q.shape[:-1])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        ctx.grouped = grouped
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        q_in, k_in, v_in = q, k, v
        if ctx.grouped:  # 5-D views: (..., n_kv_heads, group, n, d)
            (q_in, k_in), (_, v_in) = group_query_heads(q, k), group_query_heads(q, v)
        shape = q_in.shape
        dq, dk, dv = flash_attention_backward(
            grad_out.reshape(shape),
            q_in,
            k_in,
            v_in,
            out.reshape(shape),
            lse.reshape(shape[:-1]),
            ctx.is_causal,
            FlashAttention.tile_queries,
            FlashAttention.tile_keys,
        )
        if ctx.grouped:  # each KV head served its whole group: its gradient is the group's sum
            dq, dk, dv = dq.reshape(q.shape), dk.sum(-3), dv.sum(-3)
        return dq, dk, dv, None, None


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    is_causal: bool = False,
    *,
    implementation: Literal["tiled", "triton"] = "tiled",
    enable_gqa: bool = False,
) -> Tensor:
    """Flash attention with ``scaled_dot_product_attention``'s shapes and causal convention.

    ``implementation="tiled"`` is :class:`FlashAttention` (PyTorch, any device, float16 to
    float64); ``"triton"`` is :class:`~trainfast.kernels.attention_triton.FlashAttentionTriton`
    (a CUDA device, or the CPU interpreter; float16 and float32, bfloat16 on a GPU). The result
    is the Function's output itself, so ``out.grad_fn`` shows what the forward saved.
    ``enable_gqa`` allows grouped-query attention (k and v with fewer heads), in both.
    """
    check_flag("is_causal", is_causal)  # 'no' would be truthy: a causal mask nobody asked for
    check_flag("enable_gqa", enable_gqa)
    if implementation == "tiled":
        return FlashAttention.apply(q, k, v, is_causal, enable_gqa)
    if implementation == "triton":
        from trainfast.kernels.attention_triton import FlashAttentionTriton

        return FlashAttentionTriton.apply(q, k, v, is_causal, enable_gqa)
    raise ValueError(f"Unknown implementation: {implementation!r} (expected 'tiled' or 'triton')")
