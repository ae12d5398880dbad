"""The decoder's layers: RMSNorm, rotary positions, causal self-attention and the MLP kinds.

:class:`~trainfast.transformer.Transformer` builds its blocks from these, each configured by a
:class:`~trainfast.transformer_shape.TransformerShape`; they are apart from the model so that
each can be read, and tested against its reference, on its own: :class:`RMSNorm` against
``torch.nn.RMSNorm``, :func:`apply_rope` against the rotation written with complex numbers,
:class:`CausalSelfAttention`'s grouped-query path against SDPA's ``enable_gqa``,
:class:`TransformerMLP`'s SwiGLU against its formula (``tests/test_transformer.py``).

**RoPE's pairing.** This model rotates *adjacent* pairs ``(x[2i], x[2i+1])`` of each head's
vector by the angle ``m theta^(-2i/d)`` at position ``m``, as RoFormer and Meta's Llama code do
(``torch.view_as_complex`` on pairs). Many libraries (GPT-NeoX, Hugging Face's Llama) rotate
``(x[i], x[i + d/2])`` instead, the two halves of the vector. The two are the same rotation
after a fixed permutation of each head's dimensions; folding that permutation into the rows of
``W_q`` and ``W_k`` gives the same scores, which is how checkpoints are converted between them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from trainfast.validation import check_positive

if TYPE_CHECKING:  # the layers need the shape's type only, never the model built from them
    import trainfast.transformer_shape

__all__ = [
    "CausalSelfAttention",
    "RMSNorm",
    "TransformerMLP",
    "apply_rope",
    "norm_layer",
    "rope_angles",
]


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * g``.

    No mean is subtracted and there is no bias: one gain per feature. Written out so the
    chapter can show it; ``torch.nn.RMSNorm`` computes the same (a test checks), and on a GPU
    ``torch.compile`` fuses these element-wise steps into one kernel.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        check_positive("dim", dim)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ValueError(f"Invalid eps: {eps!r} (expected 0 < eps < 1)")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inverse_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return x * inverse_rms * self.weight


def norm_layer(shape: trainfast.transformer_shape.TransformerShape, dim: int) -> nn.Module:
    """The norm ``shape`` names, over ``dim`` features: LayerNorm (with a bias if ``shape.bias``)
    or :class:`RMSNorm`, with ``shape.norm_eps``."""
    if shape.norm == "rmsnorm":
        return RMSNorm(dim, shape.norm_eps)
    return nn.LayerNorm(dim, eps=shape.norm_eps, bias=shape.bias)


def rope_angles(
    seq_len: int,
    head_dim: int,
    theta: float = 10_000.0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of RoPE's angles ``m theta^(-2i/d)``, each ``(seq_len, head_dim / 2)``.

    Computed in float64 and returned in ``dtype`` (default: the default dtype): a float32 angle
    near 8,000 radians is rounded by up to 2.4e-4 radians (half of float32's spacing there)."""
    check_positive("seq_len", seq_len)
    check_positive("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"Invalid head_dim: {head_dim} (RoPE rotates pairs: it must be even)")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise ValueError(f"Invalid theta: {theta!r} (expected a number > 1)")
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim
    frequencies = theta**-exponents  # (head_dim / 2,)
    positions = torch.arange(seq_len, device=device, dtype=torch.float64)  # (seq,)
    angles = torch.outer(positions, frequencies)  # (seq, head_dim / 2)
    dtype = dtype or torch.get_default_dtype()
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair ``(x[2i], x[2i+1])`` of ``x`` (..., head_dim) by the angles
    whose ``cos`` and ``sin`` broadcast against (..., head_dim / 2): RoFormer's and Meta
    Llama's pairing. The rotation keeps no activation: its backward needs only the angles."""
    pairs = x.unflatten(-1, (-1, 2))  # (..., head_dim / 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]  # (..., head_dim / 2) each
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)  # (..., head_dim)


class CausalSelfAttention(nn.Module):
    """Causal self-attention with one fused projection to queries, keys and values.

    ``n_heads`` query heads and ``kv_heads`` key/value heads (grouped-query attention when
    fewer); optional QK-norm and rotary positions on queries and keys.
    """

    def __init__(
        self,
        shape: trainfast.transformer_shape.TransformerShape,
        attention: trainfast.transformer_shape.Attention,
        dropout: float,
    ) -> None:
        super().__init__()
        if attention not in ("manual", "sdpa"):
            raise ValueError(f"Invalid attention: {attention!r} (expected 'manual' or 'sdpa')")
        self.n_heads, self.kv_heads, self.head_dim = shape.n_heads, shape.kv_heads, shape.head_dim
        self.attention, self.dropout = attention, dropout
        self.qkv = nn.Linear(shape.d_model, shape.d_model + 2 * shape.kv_dim, bias=shape.bias)
        self.proj = nn.Linear(shape.d_model, shape.d_model, bias=shape.bias)
        self.q_norm = RMSNorm(shape.head_dim, shape.norm_eps) if shape.qk_norm else None
        self.k_norm = RMSNorm(shape.head_dim, shape.norm_eps) if shape.qk_norm else None
        self.attn_dropout, self.resid_dropout = nn.Dropout(dropout), nn.Dropout(dropout)
        # True above the diagonal: key j > query i is in the future. A buffer, not an activation.
        future = torch.ones(shape.seq_len, shape.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("future", future, persistent=False)
        self.rotary, self.seq_len, self.rope_theta = (
            shape.positions == "rope",
            shape.seq_len,
            shape.rope_theta,
        )
        if self.rotary:
            cos, sin = rope_angles(shape.seq_len, shape.head_dim, shape.rope_theta)
            self.register_buffer("cos", cos, persistent=False)  # (seq, head_dim / 2)
            self.register_buffer("sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 (nn.Module's signature)
        """As ``nn.Module._apply`` (``.to()``, ``.half()``...), but the rotary angles stay
        float32: cast to bf16 they would be off by up to about 2e-3 (half of bf16's spacing
        just below 1), far more than their float32 rounding."""
        super()._apply(fn, recurse)
        if self.rotary:
            device = self.cos.device
            self.cos, self.sin = rope_angles(
                self.seq_len, self.head_dim, self.rope_theta, device=device, dtype=torch.float32
            )
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        kv_dim = self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((d_model, kv_dim, kv_dim), dim=2)
        q = q.view(batch, seq, self.n_heads, self.head_dim)  # (batch, seq, heads, head_dim)
        k = k.view(batch, seq, self.kv_heads, self.head_dim)  # (batch, seq, kv_heads, head_dim)
        v = v.view(batch, seq, self.kv_heads, self.head_dim)  # (batch, seq, kv_heads, head_dim)
        if self.q_norm is not None:  # over each head's vector
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:  # the angles depend on the position: (seq, 1, head_dim / 2)
            cos, sin = self.cos[:seq].unsqueeze(1), self.sin[:seq].unsqueeze(1)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (b, heads, s, d)
        if self.kv_heads != self.n_heads:  # each key/value head serves a group of query heads
            group = self.n_heads // self.kv_heads
            k = k.repeat_interleave(group, dim=1)  # (batch, heads, seq, head_dim)
            v = v.repeat_interleave(group, dim=1)  # (batch, heads, seq, head_dim)
        if self.attention == "manual":
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (b, a, s, s)
            scores = scores.masked_fill(self.future[:seq, :seq], float("-inf"))
            probs = self.attn_dropout(F.softmax(scores, dim=-1))  # (batch, heads, seq, seq)
            y = probs @ v  # (batch, heads, seq, head_dim)
        else:
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, seq, d_model)  # (batch, seq, d_model)
        return self.resid_dropout(self.proj(y))


class TransformerMLP(nn.Module):
    """``d_model -> d_ff -> d_model``: GELU, ReLU² or SwiGLU (a gate ``silu(W1 x)`` times an
    up-projection ``W3 x``, then ``W2``; ``fc`` holds ``W1`` and ``W3`` stacked)."""

    def __init__(self, shape: trainfast.transformer_shape.TransformerShape, dropout: float) -> None:
        super().__init__()
        self.kind = shape.mlp
        gated = 2 if shape.mlp == "swiglu" else 1
        self.fc = nn.Linear(shape.d_model, gated * shape.d_ff, bias=shape.bias)
        self.proj = nn.Linear(shape.d_ff, shape.d_model, bias=shape.bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc(x)  # (batch, seq, d_ff), two of them stacked for SwiGLU
        if self.kind == "swiglu":
            gate, up = hidden.chunk(2, dim=-1)  # (batch, seq, d_ff) each
            hidden = F.silu(gate) * up
        elif self.kind == "relu2":
            hidden = F.relu(hidden).square()
        else:
            hidden = F.gelu(hidden)
        return self.dropout(self.proj(hidden))
