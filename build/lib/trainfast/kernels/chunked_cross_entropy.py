"""Cross-entropy over the LM head in chunks of tokens: the float32 logits are never whole.

A language model's loss, ``cross_entropy(hidden @ weightᵀ, targets)``, makes a
``tokens × vocabulary`` matrix of logits and, in float32 as the book's step computes it, holds
several copies of it at the start of the backward pass: the logits, log-softmax's
log-probabilities and the gradients of both (:func:`trainfast.accounting.loss_buffer_bytes`
counts them: 16 bytes per logit). For GPT-2's 50,257 tokens of vocabulary that is the largest
single buffer of a step. The loss needs none of it at once. Per token it is
``logsumexp(logits) - logits[target]``, and the gradient of the logits is
``softmax(logits) - onehot(target)``, both computable one chunk of tokens at a time:

* **forward**: for each chunk of ``chunk_size`` tokens, compute its logits in float32, keep
  only each token's log-sum-exp ``L`` and the loss; save the hidden states, the weight, the
  targets and ``L`` (one float per token);
* **backward**: for each chunk, recompute the logits, turn them into ``P = exp(logits - L)``
  in place, subtract 1 at each target, scale by the upstream gradient over the tokens counted,
  and accumulate ``dhidden = P W`` and ``dweight += Pᵀ hidden``.

The same idea as flash attention's (a row-wise softmax recomputed from a saved log-sum-exp
instead of kept) and as the fused linear cross-entropy kernels (Liger-Kernel's
``LigerFusedLinearCrossEntropyLoss``, Apple's Cut Cross-Entropy), in plain PyTorch: the
products are the same, and the logits are computed twice (forward and backward), two more
``2 · tokens · vocab · width`` FLOPs. :func:`chunked_loss_buffer_bytes` predicts what it holds;
:func:`trainfast.counters.peak_allocated_bytes` measures it (the tests compare the two).

``ignore_index`` and the mean over the counted tokens follow ``F.cross_entropy``; no label
smoothing, no class weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trainfast.validation import check_positive

__all__ = [
    "CHUNK_BYTES_PER_LOGIT",
    "ChunkedCrossEntropy",
    "chunked_cross_entropy",
    "chunked_loss_buffer_bytes",
    "cross_entropy_reference",
]

#: Bytes per logit of one chunk at its peak: the float32 logits and one float32 temporary the
#: size of them (log-sum-exp's exponentials in the forward; in the backward the probabilities
#: are computed in place, and ``P W`` reads a 16-bit copy of them when the weight is 16-bit).
CHUNK_BYTES_PER_LOGIT = 4 + 4


def cross_entropy_reference(
    hidden: Tensor, weight: Tensor, targets: Tensor, ignore_index: int = -100
) -> Tensor:
    """``F.cross_entropy((hidden @ weightᵀ).float(), targets)``: the logits whole, as the book's
    training step computes them (:meth:`trainfast.transformer.Transformer.loss` in float32)."""
    logits = (hidden @ weight.T).float()  # (tokens, vocab)
    return torch.nn.functional.cross_entropy(logits, targets, ignore_index=ignore_index)


def _check(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int) -> None:
    check_positive("chunk_size", chunk_size)
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be (tokens, width) and weight (vocab, width) with one width, got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1] or targets.dtype != torch.long:
        raise ValueError(
            f"targets must be int64 of shape ({hidden.shape[0]},), got {targets.dtype} "
            f"{tuple(targets.shape)}"
        )
    if hidden.dtype != weight.dtype or not (hidden.device == weight.device == targets.device):
        raise ValueError(
            f"hidden and weight must share a dtype and a device with targets, got "
            f"{hidden.dtype} on {hidden.device}, {weight.dtype} on {weight.device}, targets on "
            f"{targets.device}"
        )


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weightᵀ`` against ``targets``, ``chunk_size`` tokens of
    logits at a time, forward and backward (see the module). Call it as
    ``ChunkedCrossEntropy.apply(hidden, weight, targets, chunk_size, ignore_index)``."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        targets: Tensor,
        chunk_size: int,
        ignore_index: int = -100,
    ) -> Tensor:
        counted = targets != ignore_index  # (tokens,)
        lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            logits = (hidden[rows] @ weight.T).float()  # (chunk, vocab): the only big tensor
            lse[rows] = torch.logsumexp(logits, dim=-1)
            picked = targets[rows].clamp(min=0)  # ignored rows pick any logit, then count 0
            target_logits = logits.gather(1, picked[:, None])[:, 0]
            total += ((lse[rows] - target_logits) * counted[rows]).sum()
            del logits
        n_counted = counted.sum()
        ctx.save_for_backward(hidden, weight, targets, lse, n_counted)
        ctx.chunk_size = chunk_size
        ctx.ignore_index = ignore_index
        return total / n_counted  # NaN when no token counts, as F.cross_entropy

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, Tensor, None, None, None]:
        hidden, weight, targets, lse, n_counted = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden)
        # the weight's gradient summed over chunks in float32 (16-bit sums would lose bits)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        scale = grad_loss.float() / n_counted
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            chunk_targets = targets[rows]
            counted = chunk_targets != ctx.ignore_index
            p = (hidden[rows] @ weight.T).float()  # the chunk's logits again, (chunk, vocab)
            p.sub_(lse[rows, None]).exp_()  # softmax, in place: P = exp(logits - L)
            index = torch.arange(p.shape[0], device=p.device)
            p[index[counted], chunk_targets[counted]] -= 1.0  # dloss/dlogits = P - onehot
            p.mul_((scale * counted)[:, None])
            grad_hidden[rows] = p.to(weight.dtype) @ weight  # (chunk, width)
            grad_weight.addmm_(p.T, hidden[rows].float())  # (vocab, width)
            del p
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


def chunked_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    chunk_size: int = 1024,
    ignore_index: int = -100,
) -> Tensor:
    """``F.cross_entropy((hidden @ weightᵀ).float(), targets)`` with ``chunk_size`` tokens of
    logits at a time: ``hidden`` (tokens, width), the LM head's ``weight`` (vocab, width),
    ``targets`` (tokens,) int64. Same value and gradients as :func:`cross_entropy_reference`
    (to float32 rounding), without the ``tokens × vocab`` float32 buffers; costs one more
    product of the head's size (the logits recomputed in the backward). Raises ``ValueError``
    naming the value for shapes, dtypes or devices that do not fit together."""
    _check(hidden, weight, targets, chunk_size)
    return ChunkedCrossEntropy.apply(hidden, weight, targets, chunk_size, ignore_index)


def chunked_loss_buffer_bytes(
    tokens: int, vocab: int, width: int, chunk_size: int, *, value_bytes: int = 2
) -> int:
    """Bytes :func:`chunked_cross_entropy` allocates at its peak, forward and backward, beyond
    its inputs: the saved log-sum-exp (4 bytes a token) and the larger of

    * the forward's chunk: its float32 logits and log-sum-exp's float32 exponentials,
      :data:`CHUNK_BYTES_PER_LOGIT` bytes per logit;
    * the backward's chunk: the float32 probabilities, made in place from the logits, beside
      the gradients being written (the hidden states' and the weight's, summed in float32);
      with a 16-bit weight, also the chunk's 16-bit logits before their cast and the 16-bit
      copy of the probabilities that ``P W`` reads (``value_bytes`` a logit more).

    Compare :func:`trainfast.accounting.loss_buffer_bytes`, the buffers of the whole logits
    (the difference is what chunking saves); the tests measure both paths with
    :func:`trainfast.counters.peak_allocated_bytes`.
    """
    for name, value in (("tokens", tokens), ("vocab", vocab), ("width", width)):
        check_positive(name, value)
    check_positive("chunk_size", chunk_size)
    check_positive("value_bytes", value_bytes)
    logits = min(chunk_size, tokens) * vocab
    forward = logits * CHUNK_BYTES_PER_LOGIT
    sixteen_bit = value_bytes < 4
    gradients = tokens * width * value_bytes + 4 * vocab * width
    backward = logits * (4 + (value_bytes if sixteen_bit else 0)) + gradients
    return 4 * tokens + max(forward, backward)
