r"""Keeping training stable: gradient clipping, z-loss, QK-norm and logit soft-capping.

Large-model training fails in a few recurring ways: a single batch produces a huge gradient
and one step throws the weights far away (a loss spike); the softmax normaliser of the output
logits drifts until float16/bfloat16 rounding hurts; attention logits grow until the softmax
saturates to one-hot and its gradient vanishes. Each tool here answers one of them, and each is
a few lines:

* :func:`clip_grad_norm_`: rescale all gradients together when their global norm exceeds a
  threshold (Pascanu et al., 2013); ``torch.nn.utils.clip_grad_norm_``'s algorithm and results.
* :func:`z_loss`: an auxiliary loss :math:`10^{-4} \log^2 Z` that keeps the log-partition
  function of the output softmax near zero (PaLM; Wortsman et al., 2024).
* :func:`softcap`: :math:`c \tanh(x / c)`, a smooth bound on logits (Gemma 2 caps attention
  logits at 50 and final logits at 30).
* :class:`QKNormAttention`: causal self-attention that normalises queries and keys per head
  before their dot product (Dehghani et al., 2023; Wortsman et al., 2024), so attention logits
  cannot grow without bound, with optional soft-capping of the logits.

When not to use them: they cost little, but each changes the model or the update; add one when
you see the failure it prevents, and compare against a run without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from trainfast.validation import check_counts, check_flag, check_number

__all__ = ["QKNormAttention", "clip_grad_norm_", "softcap", "z_loss"]


def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool = False,
) -> Tensor:
    r"""Scale ``parameters``' gradients in place so that their global norm is at most ``max_norm``.

    The global norm is the ``norm_type``-norm of all gradients together (the norm of the
    per-tensor norms), :math:`\lVert g \rVert`. If it exceeds ``max_norm`` every gradient is
    multiplied by :math:`\text{max\_norm} / (\lVert g \rVert + 10^{-6})`, which keeps the
    update's direction and bounds its size. Returns the norm *before* clipping (worth logging:
    its spikes are the events clipping hides). Parameters without a gradient are skipped.

    A non-finite norm raises ``RuntimeError`` if ``error_if_nonfinite``; otherwise, as in
    torch, the gradients are scaled by the non-finite factor (NaN in, NaN out), so a skipped
    step must be decided by the caller from the returned norm. ``foreach=True`` computes the
    same with ``torch._foreach_*`` ops. Same results as ``torch.nn.utils.clip_grad_norm_``.
    """
    check_number("max_norm", max_norm, minimum=0.0, allow_inf=True)  # inf: no clipping
    check_number("norm_type", norm_type, above=0.0, allow_inf=True)  # inf: the largest entry
    check_flag("error_if_nonfinite", error_if_nonfinite)
    check_flag("foreach", foreach)
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    if foreach:
        norms = torch._foreach_norm(grads, norm_type)
    else:
        norms = [torch.linalg.vector_norm(g, norm_type) for g in grads]  # one per tensor
    total_norm = torch.linalg.vector_norm(torch.stack(norms), norm_type)  # norm of the norms
    if error_if_nonfinite and not torch.isfinite(total_norm):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            f"non-finite ({total_norm.item()}), so it cannot be clipped. Set "
            "error_if_nonfinite=False to scale the gradients by it anyway."
        )
    clip_coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)  # 1: no clipping
    if foreach:
        torch._foreach_mul_(grads, clip_coef)
    else:
        for g in grads:
            g.mul_(clip_coef)
    return total_norm


def z_loss(logits: Tensor, weight: float = 1e-4) -> Tensor:
    r"""Auxiliary loss :math:`\text{weight} \cdot \overline{\log^2 Z}`, ``logits`` (..., classes).

    :math:`\log Z = \operatorname{logsumexp}` of each row of logits. Softmax is unchanged by
    adding a constant to a row, so nothing in cross-entropy stops :math:`\log Z` from drifting;
    PaLM adds this term (weight :math:`10^{-4}`) to keep it near 0, where low-precision
    arithmetic on the logits is accurate. Add it to the cross-entropy: ``loss + z_loss(logits)``.
    """
    check_number("weight", weight, minimum=0.0)
    return weight * torch.logsumexp(logits.float(), dim=-1).square().mean()


def softcap(logits: Tensor, cap: float) -> Tensor:
    r""":math:`\text{cap} \cdot \tanh(\text{logits} / \text{cap})`: logits kept within (-cap, cap).

    Close to the identity for :math:`|x| \ll \text{cap}`, smoothly saturating beyond, so the
    gradient never becomes exactly zero. Gemma 2 uses cap 50 on attention logits and 30 on the
    final logits.
    """
    check_number("cap", cap, above=0.0)  # inf would give inf * tanh(0) = NaN
    return cap * torch.tanh(logits / cap)


class QKNormAttention(nn.Module):
    """Causal multi-head self-attention, optionally with QK-norm and soft-capped logits.

    With ``qk_norm=True`` queries and keys are normalised per head by a LayerNorm (with a
    learnable gain) before the dot product, so a logit is bounded by the gains and the head
    dimension rather than by the size of the weights; this removes the attention-logit growth
    that makes large transformers diverge at high learning rates. ``logit_cap`` soft-caps the
    logits with :func:`softcap`. With neither it is plain causal attention, equal to
    ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``.
    """

    def __init__(
        self, d_model: int, n_heads: int, *, qk_norm: bool = True, logit_cap: float | None = None
    ) -> None:
        super().__init__()
        check_counts(d_model=d_model, n_heads=n_heads)
        check_flag("qk_norm", qk_norm)
        if d_model % n_heads != 0:
            raise ValueError(f"Invalid n_heads: {n_heads} does not divide d_model={d_model}")
        if logit_cap is not None:
            check_number("logit_cap", logit_cap, above=0.0)
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.logit_cap = logit_cap

    def _heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        batch, seq, d_model = x.shape
        qkv = self.qkv(x).view(batch, seq, 3, self.n_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, seq, head_dim)
        return self.q_norm(q), self.k_norm(k), v

    def _logits(self, q: Tensor, k: Tensor) -> Tensor:
        logits = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (batch, heads, seq, seq)
        return softcap(logits, self.logit_cap) if self.logit_cap is not None else logits

    def scores(self, x: Tensor) -> Tensor:
        """The attention logits, (batch, heads, seq, seq), scaled and capped, before the mask."""
        q, k, _ = self._heads(x)
        return self._logits(q, k)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (batch, seq, d_model) -> (batch, seq, d_model)."""
        batch, seq, d_model = x.shape
        q, k, v = self._heads(x)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        logits = self._logits(q, k).masked_fill(~causal, float("-inf"))
        y = logits.softmax(dim=-1) @ v  # (batch, heads, seq, head_dim)
        return self.out(y.transpose(1, 2).reshape(batch, seq, d_model))
