"""The shape of the book's decoder: its sizes, its architectural choices, and named presets.

:class:`TransformerShape` says what a decoder is and what it costs, so that the model
(:class:`trainfast.transformer.Transformer`), its layers (:mod:`trainfast.transformer_layers`)
and the resource arithmetic (:mod:`trainfast.accounting`) all read the same configuration. It
lives apart from the model so that the layers can be configured by it without importing the
model that is built from them. The choices are described in :mod:`trainfast.transformer`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from trainfast.validation import check_positive

__all__ = [
    "MLP_KINDS",
    "NORMS",
    "POSITIONS",
    "PRESET_SHAPES",
    "Attention",
    "MLPKind",
    "Norm",
    "Positions",
    "TransformerShape",
]


#: ``"manual"``: softmax attention written out, which saves the ``s x s`` probabilities;
#: ``"sdpa"``: ``scaled_dot_product_attention`` running a fused kernel (FlashAttention,
#: memory-efficient, or the CPU flash kernel), which saves a log-sum-exp per query instead.
Attention = Literal["manual", "sdpa"]
Norm = Literal["layernorm", "rmsnorm"]
Positions = Literal["learned", "rope"]
MLPKind = Literal["gelu", "swiglu", "relu2"]
NORMS: tuple[str, ...] = ("layernorm", "rmsnorm")
POSITIONS: tuple[str, ...] = ("learned", "rope")
MLP_KINDS: tuple[str, ...] = ("gelu", "swiglu", "relu2")

_SIZES = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "seq_len", "batch_size")


@dataclass(frozen=True)
class TransformerShape:
    """What decides a decoder's cost: its sizes and its architectural choices.

    The sizes: vocabulary, width, depth, query heads, MLP width, sequence length (also the
    context the position embedding or the rotary table covers) and (micro-)batch size. The
    choices (module docstring) default to GPT-2's, so ``TransformerShape(V, h, L, a, f, s, b)``
    is a GPT-2. ``n_kv_heads=None`` means one key/value head per query head.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    seq_len: int
    batch_size: int
    n_kv_heads: int | None = None
    norm: Norm = "layernorm"
    positions: Positions = "learned"
    mlp: MLPKind = "gelu"
    qk_norm: bool = False
    bias: bool = True
    tied_head: bool = True
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in _SIZES:
            check_positive(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(
                f"Invalid n_heads: {self.n_heads} (must divide d_model = {self.d_model})"
            )
        if self.n_kv_heads is not None:
            check_positive("n_kv_heads", self.n_kv_heads)
            if self.n_heads % self.n_kv_heads:
                raise ValueError(
                    f"Invalid n_kv_heads: {self.n_kv_heads} (must divide n_heads = "
                    f"{self.n_heads}: each key/value head serves a whole group of query heads)"
                )
        for name, allowed in (("norm", NORMS), ("positions", POSITIONS), ("mlp", MLP_KINDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"Invalid {name}: {getattr(self, name)!r} (expected one of {allowed})"
                )
        for name in ("qk_norm", "bias", "tied_head"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Invalid {name}: {getattr(self, name)!r} (expected a bool)")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"Invalid {name}: {value!r} (expected a positive number)")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"Invalid {name}: {value!r} (expected a positive number)")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(
                f"Invalid head dimension for rotary positions: {self.head_dim} (d_model "
                f"{self.d_model} / n_heads {self.n_heads}; RoPE rotates pairs, so it must be even)"
            )

    @classmethod
    def gpt_like(
        cls,
        *,
        d_model: int,
        n_layers: int,
        n_heads: int,
        seq_len: int,
        vocab_size: int = 50_304,
        batch_size: int = 1,
    ) -> TransformerShape:
        """GPT-2's proportions: ``d_ff = 4 d_model``; the vocabulary defaults to GPT-2's 50,257
        tokens padded to a multiple of 64 (50,304, as nanoGPT does); one sequence per batch."""
        return cls(vocab_size, d_model, n_layers, n_heads, 4 * d_model, seq_len, batch_size)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or ``n_heads`` when that is None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def tokens(self) -> int:
        """Tokens per step: ``seq_len * batch_size``."""
        return self.seq_len * self.batch_size


def _llama(
    vocab: int, width: int, layers: int, heads: int, kv_heads: int, ffn: int, context: int, theta
) -> TransformerShape:
    return TransformerShape(
        vocab,
        width,
        layers,
        heads,
        ffn,
        context,
        1,
        n_kv_heads=kv_heads,
        norm="rmsnorm",
        positions="rope",
        mlp="swiglu",
        bias=False,
        tied_head=False,
        rope_theta=theta,
    )


#: Named shapes, one sequence per batch (change it with ``dataclasses.replace``).
PRESET_SHAPES: dict[str, TransformerShape] = {
    # small enough for a unit test on one CPU thread
    "tiny": TransformerShape(128, 32, 2, 4, 128, 16, 2),
    # the same sizes with every modern choice: RMSNorm, RoPE, SwiGLU, 2 key/value heads for 4
    # query heads, QK-norm, no biases, an untied head
    "tiny-modern": TransformerShape(
        128,
        32,
        2,
        4,
        128,
        16,
        2,
        n_kv_heads=2,
        norm="rmsnorm",
        positions="rope",
        mlp="swiglu",
        qk_norm=True,
        bias=False,
        tied_head=False,
    ),
    # Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", Table 2 (the
    # 117M row, 124M counted exactly), vocabulary 50,257, context 1,024
    "gpt2-small": TransformerShape(50_257, 768, 12, 12, 3_072, 1_024, 1),
    # ibid., the 1542M row: 48 layers, width 1,600; 25 heads of 64 in the released model
    "gpt2-xl": TransformerShape(50_257, 1_600, 48, 25, 6_400, 1_024, 1),
    # Touvron et al. 2023, "Llama 2", Table 1 and Section 2.2: 7B, context 4,096, vocabulary
    # 32,000, multi-head attention; width 4,096, 32 layers and heads and SwiGLU width 11,008
    # from the released configuration. 6,738,415,616 parameters ("6.7B"/"7B").
    "llama2-7b": _llama(32_000, 4_096, 32, 32, 32, 11_008, 4_096, 10_000.0),
    # Llama Team 2024, "The Llama 3 Herd of Models", Table 3: 8B and 405B, grouped-query
    # attention with 8 key/value heads, RoPE base 500,000; vocabulary 128,256 in the released
    # configuration (the paper's "128K": 128,000 plus 256 reserved special tokens); pre-trained
    # on 8,192-token sequences. 8,030,261,248 and 405,853,388,800 parameters.
    "llama3-8b": _llama(128_256, 4_096, 32, 32, 8, 14_336, 8_192, 500_000.0),
    "llama3-405b": _llama(128_256, 16_384, 126, 128, 8, 53_248, 8_192, 500_000.0),
}
