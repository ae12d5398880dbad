"""Online softmax: the normaliser of a softmax in one pass, with a running maximum.

A numerically safe softmax, ``exp(x - max x) / sum(exp(x - max x))``, reads its input three
times: once for the maximum, once for the sum of exponentials, once to write the output. The
*online* normaliser (Milakov and Gimelshein, 2018) keeps a running maximum ``m`` and a running
sum ``l`` of ``exp(x - m)``; when a new block raises the maximum, the old sum is rescaled by
``exp(m_old - m_new)``. Maximum and sum then come out of one pass, and the output needs only a
second. Because the update only ever combines two (maximum, sum) summaries,
:func:`merge_softmax_stats` can merge summaries of *any* two parts of a row, in any order: that
is what lets flash attention process keys tile by tile, and ring attention merge the partial
results of keys that live on other GPUs (:func:`merge_attention_outputs`).

All functions are pure PyTorch and run on any device; they are the reference for the kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainfast.validation import check_int

__all__ = [
    "merge_attention_outputs",
    "merge_softmax_stats",
    "online_softmax",
    "softmax_stats",
]


def merge_softmax_stats(
    max_a: Tensor, sum_a: Tensor, max_b: Tensor, sum_b: Tensor
) -> tuple[Tensor, Tensor]:
    """Merge two softmax summaries ``(m, l)``, where ``l = sum(exp(x - m))`` over each part.

    Returns ``(m, l)`` of the union: ``m = max(m_a, m_b)`` and
    ``l = l_a·exp(m_a - m) + l_b·exp(m_b - m)``. An empty part is ``(-inf, 0)`` and leaves the
    other unchanged (no NaN). The merge is associative and commutative, so parts can be merged
    in any order or as a tree.
    """
    new_max = torch.maximum(max_a, max_b)
    safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
    new_sum = sum_a * torch.exp(max_a - safe_max) + sum_b * torch.exp(max_b - safe_max)
    return new_max, new_sum


def softmax_stats(x: Tensor, *, block_size: int = 128) -> tuple[Tensor, Tensor]:
    """The maximum ``m`` and ``l = sum(exp(x - m))`` along the last dimension, in one pass.

    Reads ``x`` one block of ``block_size`` columns at a time and folds each block into the
    running summary with :func:`merge_softmax_stats`. Shapes: ``x`` (..., n) → two (...,).
    """
    check_int("block_size", block_size, minimum=1)
    running_max = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start : start + block_size]  # (..., block)
        block_max = block.amax(dim=-1)
        block_sum = torch.exp(block - block_max.unsqueeze(-1)).sum(dim=-1)
        running_max, running_sum = merge_softmax_stats(
            running_max, running_sum, block_max, block_sum
        )
    return running_max, running_sum


def online_softmax(x: Tensor, *, block_size: int = 128) -> Tensor:
    """``softmax(x, dim=-1)`` from one pass for the statistics and one for the output.

    Equal to ``torch.softmax(x, dim=-1)`` up to rounding (the chapter's tests check it); the
    point is the memory traffic, two reads of ``x`` instead of three.
    """
    running_max, running_sum = softmax_stats(x, block_size=block_size)
    return torch.exp(x - running_max.unsqueeze(-1)) / running_sum.unsqueeze(-1)


def merge_attention_outputs(
    out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor
) -> tuple[Tensor, Tensor]:
    """Merge two attention results over disjoint sets of keys into the result over both.

    ``out_x`` (..., n_queries, head_dim) is softmax attention over one set of keys, normalised
    over that set alone, and ``lse_x`` (..., n_queries) its log-sum-exp ``log sum exp(s)`` of
    the scores. The result is exactly attention over the union, and its log-sum-exp:
    ``lse = logaddexp(lse_a, lse_b)``, ``out = out_a·exp(lse_a - lse) + out_b·exp(lse_b - lse)``.
    A query that saw no key in one part has ``lse = -inf`` there (its ``out`` is ignored). This
    is the step ring attention repeats as key blocks arrive from other devices; the result is
    computed in ``lse``'s dtype and returned in ``out_a``'s.
    """
    lse = torch.logaddexp(lse_a, lse_b)
    safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    weight_a = torch.exp(lse_a - safe_lse).unsqueeze(-1)  # (..., n_queries, 1)
    weight_b = torch.exp(lse_b - safe_lse).unsqueeze(-1)
    out = (
        torch.nan_to_num(out_a.to(lse.dtype)) * weight_a
        + torch.nan_to_num(out_b.to(lse.dtype)) * weight_b
    )
    return out.to(out_a.dtype), lse
