"""The checks every attention implementation makes on its inputs before it runs.

Below both :mod:`trainfast.kernels.attention` (the PyTorch references) and the Triton kernels
(:mod:`trainfast.kernels.attention_triton`), so that neither imports the other for it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainfast.validation import check_positive

__all__ = ["ATTENTION_DTYPES", "check_tile_sizes", "validate_attention_inputs"]

#: the dtypes the attention implementations accept
ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def validate_attention_inputs(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool = False) -> None:
    """Raise ``ValueError`` naming the problem if ``q``, ``k``, ``v`` cannot be attended.

    Same device and dtype (float16, bfloat16, float32 or float64), at least 2-D, one head
    dimension for all three, the same leading (batch, head) dimensions (no broadcasting), as
    many values as keys, and at least one query and one key. With ``enable_gqa``, k and v may
    have fewer heads (dimension -3) than q, a number that divides q's.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(
                f"{name} must be (..., sequence, head_dim), got shape {tuple(t.shape)}"
            )
        if t.dtype not in ATTENTION_DTYPES:
            raise ValueError(
                f"Unsupported dtype for {name}: {t.dtype} (expected one of {ATTENTION_DTYPES})"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]):
        raise ValueError(
            f"Mismatched head dimensions: q {q.shape[-1]}, k {k.shape[-1]}, v {v.shape[-1]} "
            "(all three must be equal)"
        )
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            f"k and v must have the same leading dimensions, got {tuple(k.shape[:-2])}, "
            f"{tuple(v.shape[:-2])}"
        )
    grouped = (
        enable_gqa
        and q.ndim == k.ndim >= 3
        and q.shape[:-3] == k.shape[:-3]
        and q.shape[-3] % k.shape[-3] == 0
    )
    if q.shape[:-2] != k.shape[:-2] and not grouped:
        raise ValueError(
            f"q, k, v must have the same leading dimensions, got {tuple(q.shape[:-2])}, "
            f"{tuple(k.shape[:-2])}, {tuple(v.shape[:-2])}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has {k.shape[-2]} keys but v has {v.shape[-2]} values")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError(
            f"Need at least one query and one key, got {q.shape[-2]} and {k.shape[-2]}"
        )


def check_tile_sizes(tile_queries: object, tile_keys: object) -> None:
    """Raise ``ValueError`` naming the value unless both tile sizes are positive ints.

    A size of 0 or less would leave the output uninitialised (no query tile is visited) or
    all NaN (no key tile is), and a float would fail deep inside ``range``.
    """
    check_positive("tile_queries", tile_queries)
    check_positive("tile_keys", tile_keys)
