"""A small GPT-2-style decoder: the book's one "real transformer".

Every chapter that needs a language model uses this one (profiling, memory, accounting), so the
arithmetic of :mod:`trainfast.accounting` can be checked against it exactly. It follows
Karpathy's nanoGPT ``model.py`` (itself GPT-2, Radford et al. 2019): learned token and position
embeddings, ``n_layers`` pre-LayerNorm blocks of causal self-attention (one fused QKV
projection) and a GELU MLP of width ``d_ff``, a final LayerNorm, and an LM head that shares its
weight with the token embedding. All linear layers have biases, as in GPT-2.

``attention="manual"`` writes softmax attention out (scores, causal mask, softmax, weighted sum;
it stores the ``seq x seq`` probabilities for backward); ``attention="sdpa"`` calls
``torch.nn.functional.scaled_dot_product_attention``, which picks a fused kernel (FlashAttention
or memory-efficient attention on a GPU) that stores no ``seq x seq`` matrix. Same numbers, up to
rounding; a test proves it. ``checkpointing=True`` recomputes each block in backward
(``torch.utils.checkpoint``) instead of storing its activations.

The model's configuration lives here, beside it, as nanoGPT's ``GPTConfig`` does:
:class:`TransformerShape` (its sizes, which :mod:`trainfast.accounting` turns into parameters,
FLOPs and bytes), :data:`Attention` and the named :data:`PRESET_SHAPES`.

When not to use it: it is a teaching model. No KV cache, no rotary embeddings, no grouped-query
attention, no weight-decay groups; use a library model for real work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainfast.validation import check_positive

__all__ = [
    "PRESET_SHAPES",
    "Attention",
    "CausalSelfAttention",
    "Transformer",
    "TransformerBlock",
    "TransformerMLP",
    "TransformerShape",
    "random_batch",
]


#: ``"manual"``: softmax attention written out, which saves the ``s x s`` probabilities;
#: ``"sdpa"``: ``scaled_dot_product_attention`` running a fused kernel (FlashAttention,
#: memory-efficient, or the CPU flash kernel), which saves a log-sum-exp per query instead.
Attention = Literal["manual", "sdpa"]


@dataclass(frozen=True)
class TransformerShape:
    """The sizes that decide a decoder's cost: vocabulary, width, depth, heads, MLP width,
    sequence length (also the context the position embedding covers) and (micro-)batch size.
    ``n_kv_heads``: key/value heads (grouped-query attention when fewer than ``n_heads``;
    ``None``, the default, means ``n_heads``: :attr:`kv_heads`); the step-time model sizes
    key/value traffic by it. The book's :class:`Transformer` has as many key/value heads as
    query heads."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    seq_len: int
    batch_size: int
    n_kv_heads: int | None = None

    def __post_init__(self) -> None:
        for size in fields(self):
            if getattr(self, size.name) is not None:
                check_positive(size.name, getattr(self, size.name))
        if self.d_model % self.n_heads:
            raise ValueError(
                f"Invalid n_heads: {self.n_heads} (must divide d_model = {self.d_model})"
            )
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"Invalid n_kv_heads: {self.n_kv_heads} (must divide n_heads = {self.n_heads})"
            )

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or ``n_heads`` when it is ``None``."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

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
    def tokens(self) -> int:
        """Tokens per step: ``seq_len * batch_size``."""
        return self.seq_len * self.batch_size


#: Named shapes, one sequence per batch (change it with ``dataclasses.replace``).
PRESET_SHAPES: dict[str, TransformerShape] = {
    # small enough for a unit test on one CPU thread
    "tiny": TransformerShape(128, 32, 2, 4, 128, 16, 2),
    # Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", Table 2 (the
    # 117M row, 124M counted exactly), vocabulary 50,257, context 1,024
    "gpt2-small": TransformerShape(50_257, 768, 12, 12, 3_072, 1_024, 1),
    # ibid., the 1542M row: 48 layers, width 1,600; 25 heads of 64 in the released model
    "gpt2-xl": TransformerShape(50_257, 1_600, 48, 25, 6_400, 1_024, 1),
    # Touvron et al. 2023, "Llama 2", 7B: width 4,096, 32 layers and heads, context 4,096,
    # vocabulary 32,000. Its SwiGLU MLP (3 matrices of 4,096 x 11,008) becomes our GELU MLP of
    # the same parameter count (2 matrices of 4,096 x 16,512); with tied embeddings and learned
    # positions it has 6.62B parameters instead of 6.74B.
    "llama2-7b-like": TransformerShape(32_000, 4_096, 32, 32, 16_512, 4_096, 1),
}


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused ``d_model -> 3 d_model`` projection."""

    def __init__(self, shape: TransformerShape, attention: Attention, dropout: float) -> None:
        super().__init__()
        if attention not in ("manual", "sdpa"):
            raise ValueError(f"Invalid attention: {attention!r} (expected 'manual' or 'sdpa')")
        self.n_heads, self.attention, self.dropout = shape.n_heads, attention, dropout
        self.qkv = nn.Linear(shape.d_model, 3 * shape.d_model)
        self.proj = nn.Linear(shape.d_model, shape.d_model)
        self.attn_dropout, self.resid_dropout = nn.Dropout(dropout), nn.Dropout(dropout)
        # True above the diagonal: key j > query i is in the future. A buffer, not an activation.
        future = torch.ones(shape.seq_len, shape.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        head_dim = d_model // self.n_heads
        split_heads = (batch, seq, self.n_heads, head_dim)
        q, k, v = self.qkv(x).split(d_model, dim=2)  # 3 x (batch, seq, d_model)
        q = q.view(split_heads).transpose(1, 2)  # (batch, heads, seq, head_dim)
        k = k.view(split_heads).transpose(1, 2)  # (batch, heads, seq, head_dim)
        v = v.view(split_heads).transpose(1, 2)  # (batch, heads, seq, head_dim)
        if self.attention == "manual":
            scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (batch, heads, seq, seq)
            scores = scores.masked_fill(self.future[:seq, :seq], float("-inf"))
            probs = self.attn_dropout(F.softmax(scores, dim=-1))  # (batch, heads, seq, seq)
            y = probs @ v  # (batch, heads, seq, head_dim)
        else:
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, seq, d_model)  # (batch, seq, d_model)
        return self.resid_dropout(self.proj(y))


class TransformerMLP(nn.Module):
    """``d_model -> d_ff -> d_model`` with GELU between."""

    def __init__(self, shape: TransformerShape, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(shape.d_model, shape.d_ff)
        self.proj = nn.Linear(shape.d_ff, shape.d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class TransformerBlock(nn.Module):
    """Pre-LayerNorm residual block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, shape: TransformerShape, attention: Attention, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(shape.d_model)
        self.attn = CausalSelfAttention(shape, attention, dropout)
        self.ln2 = nn.LayerNorm(shape.d_model)
        self.mlp = TransformerMLP(shape, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """GPT-2-style decoder built from a :class:`TransformerShape`.

    ``forward(tokens)`` maps ``(batch, seq)`` token ids, ``seq <= shape.seq_len``, to
    ``(batch, seq, vocab_size)`` logits; :meth:`loss` adds the next-token cross-entropy.
    Its parameter count is :func:`trainfast.accounting.parameter_count` exactly. Initialisation
    is GPT-2's: normal(0, 0.02), residual projections scaled by ``1 / sqrt(2 n_layers)``.
    """

    def __init__(
        self,
        shape: TransformerShape,
        *,
        attention: Attention = "manual",
        dropout: float = 0.0,
        checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"Invalid dropout: {dropout!r} (expected 0 <= dropout < 1)")
        self.shape, self.checkpointing = shape, checkpointing
        self.token_embedding = nn.Embedding(shape.vocab_size, shape.d_model)
        self.position_embedding = nn.Embedding(shape.seq_len, shape.d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(shape, attention, dropout) for _ in range(shape.n_layers)
        )
        self.ln_f = nn.LayerNorm(shape.d_model)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        self.lm_head.weight = self.token_embedding.weight  # tied: one (vocab, d_model) matrix
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # the projections that write into the residual
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * shape.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, seq = tokens.shape
        if seq > self.shape.seq_len:
            raise ValueError(
                f"Invalid sequence length: {seq} (the model's is {self.shape.seq_len})"
            )
        positions = torch.arange(seq, device=tokens.device)  # (seq,)
        # (batch, seq, d_model): token embeddings plus position embeddings, broadcast over batch
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        x = self.dropout(x)
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)  # keep x, recompute the rest
            else:
                x = block(x)
        return self.lm_head(self.ln_f(x))  # (batch, seq, vocab_size)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of ``(batch, seq)`` ``targets`` (``tokens`` shifted)."""
        logits = self(tokens)  # (batch, seq, vocab_size)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # (batch * seq, vocab)


def random_batch(
    shape: TransformerShape, *, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, targets)`` of uniformly random ids, each ``(batch_size, seq_len)``.

    Enough to measure time, FLOPs and memory, which do not depend on the token values.
    """
    generator = torch.Generator().manual_seed(seed)
    size = (shape.batch_size, shape.seq_len + 1)  # (batch, seq + 1): inputs, then one more
    ids = torch.randint(shape.vocab_size, size, generator=generator)
    return ids[:, :-1].clone().to(device), ids[:, 1:].clone().to(device)  # two separate tensors
