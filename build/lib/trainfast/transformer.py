"""The book's one decoder: GPT-2 (2019) by default, a modern Llama-style decoder by choice.

Every chapter that needs a language model uses this one (profiling, memory, accounting, the
parallelism models), so the arithmetic of :mod:`trainfast.accounting` can be checked against it
exactly. With the defaults it is Karpathy's nanoGPT ``model.py`` (itself GPT-2, Radford et al.
2019): learned token and position embeddings, ``n_layers`` pre-LayerNorm blocks of causal
self-attention (one fused QKV projection) and a GELU MLP of width ``d_ff``, a final LayerNorm,
and an LM head that shares its weight with the token embedding; every linear layer has a bias.

The choices in which today's decoders (Llama 2 and 3, Mistral, Qwen, OLMo, modded-nanogpt)
differ from it are named fields of :class:`TransformerShape`, so one configuration says what the
model is and what it costs:

* ``norm``: ``"layernorm"`` or ``"rmsnorm"`` (Zhang & Sennrich 2019: no mean, no bias);
* ``positions``: ``"learned"`` or ``"rope"``, rotary embeddings with base ``rope_theta`` (Su et
  al. 2021), applied to queries and keys in every layer instead of an embedding added once;
* ``mlp``: ``"gelu"``, ``"swiglu"`` (Shazeer 2020: ``W2 (silu(W1 x) * W3 x)``, three matrices)
  or ``"relu2"`` (So et al. 2021, "Primer": ``relu(x)^2``);
* ``n_kv_heads``: keys and values for fewer heads than the queries (grouped-query attention,
  Ainslie et al. 2023; ``1`` is multi-query attention, Shazeer 2019); query head ``i`` reads
  key/value head ``i // (n_heads // n_kv_heads)``, as SDPA's ``enable_gqa`` does;
* ``qk_norm``: an RMSNorm over each head's queries and keys before the scores (QK-norm,
  Dehghani et al. 2023, who used LayerNorm; per head as in Qwen 3 and modded-nanogpt, whose
  norm has no gain; OLMo 2 normalises the whole query and key vectors);
* ``bias``: biases in the linear layers and norms (GPT-2 has them, Llama has none);
* ``tied_head``: the LM head shares the token embedding's matrix (GPT-2) or has its own (Llama).

The initialisation is GPT-2's (normal(0, 0.02), the projections that write into the residual
stream scaled by ``1/sqrt(2 n_layers)``), or, with ``zero_init_projections=True``, those
projections start at zero so every block starts as the identity (modded-nanogpt).

``attention="manual"`` writes softmax attention out (scores, causal mask, softmax, weighted sum;
it stores the ``seq x seq`` probabilities for backward); ``attention="sdpa"`` calls
``torch.nn.functional.scaled_dot_product_attention``, which picks a fused kernel (FlashAttention
or memory-efficient attention on a GPU) that stores no ``seq x seq`` matrix. Same numbers, up to
rounding; a test proves it. ``checkpointing=True`` recomputes each block in backward
(``torch.utils.checkpoint``) instead of storing its activations.

The layers (norms, rotary positions, attention, the MLP kinds, and which RoPE pairing this
model uses) are in :mod:`trainfast.transformer_layers`.

When not to use it: it is a teaching model. No KV cache, no sliding windows, no mixture of
experts; use a library model for real work.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainfast.device import parse_device

# the layers, re-exported for the callers that import them from here; documented where they live
from trainfast.transformer_layers import CausalSelfAttention as CausalSelfAttention
from trainfast.transformer_layers import RMSNorm as RMSNorm
from trainfast.transformer_layers import TransformerMLP as TransformerMLP
from trainfast.transformer_layers import apply_rope as apply_rope
from trainfast.transformer_layers import norm_layer
from trainfast.transformer_layers import rope_angles as rope_angles

# the shape, re-exported: every caller imports it from here
from trainfast.transformer_shape import MLP_KINDS as MLP_KINDS
from trainfast.transformer_shape import NORMS as NORMS
from trainfast.transformer_shape import POSITIONS as POSITIONS
from trainfast.transformer_shape import PRESET_SHAPES as PRESET_SHAPES
from trainfast.transformer_shape import Attention as Attention
from trainfast.transformer_shape import TransformerShape as TransformerShape
from trainfast.validation import check_instance, check_int

# the shape's names are re-exported above and documented where they live (transformer_shape)
__all__ = [
    "Transformer",
    "TransformerBlock",
    "random_batch",
]


class TransformerBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, shape: TransformerShape, attention: Attention, dropout: float) -> None:
        super().__init__()
        self.ln1 = norm_layer(shape, shape.d_model)
        self.attn = CausalSelfAttention(shape, attention, dropout)
        self.ln2 = norm_layer(shape, shape.d_model)
        self.mlp = TransformerMLP(shape, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """The decoder built from a :class:`TransformerShape` (GPT-2 by default; module docstring).

    ``forward(tokens)`` maps ``(batch, seq)`` token ids, ``seq <= shape.seq_len``, to
    ``(batch, seq, vocab_size)`` logits; :meth:`loss` adds the next-token cross-entropy.
    Its parameter count is :func:`trainfast.accounting.parameter_count` exactly.
    Initialisation is GPT-2's: normal(0, 0.02), residual projections scaled by
    ``1 / sqrt(2 n_layers)``, or zero with ``zero_init_projections``; norms' gains are 1.
    """

    def __init__(
        self,
        shape: TransformerShape,
        *,
        attention: Attention = "manual",
        dropout: float = 0.0,
        checkpointing: bool = False,
        zero_init_projections: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(shape, TransformerShape):
            raise TypeError(f"Invalid shape: {shape!r} (expected a TransformerShape)")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"Invalid dropout: {dropout!r} (expected 0 <= dropout < 1)")
        self.shape, self.checkpointing = shape, checkpointing
        self.token_embedding = nn.Embedding(shape.vocab_size, shape.d_model)
        self.position_embedding = (
            nn.Embedding(shape.seq_len, shape.d_model) if shape.positions == "learned" else None
        )
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(shape, attention, dropout) for _ in range(shape.n_layers)
        )
        self.ln_f = norm_layer(shape, shape.d_model)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        if shape.tied_head:
            self.lm_head.weight = self.token_embedding.weight  # one (vocab, d_model) matrix
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # the projections that write into the residual
                if zero_init_projections:
                    nn.init.zeros_(p)
                else:
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * shape.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        _check_token_layout(tokens, self.shape.seq_len)  # metadata only: no device work
        seq = tokens.shape[1]
        try:
            x = self.token_embedding(tokens)  # (batch, seq, d_model)
        except IndexError:  # on the CPU; a GPU fails in a device-side assert instead
            raise _token_range_error(tokens, self.shape.vocab_size) from None
        if self.position_embedding is not None:  # learned positions, broadcast over the batch
            x = x + self.position_embedding(torch.arange(seq, device=tokens.device))
        x = self.dropout(x)
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)  # keep x, recompute the rest
            else:
                x = block(x)
        return self.lm_head(self.ln_f(x))  # (batch, seq, vocab_size)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of ``(batch, seq)`` ``targets`` (``tokens`` shifted)."""
        if not isinstance(targets, torch.Tensor) or targets.shape != tokens.shape:
            raise ValueError(
                f"Invalid targets: shape {tuple(getattr(targets, 'shape', ()))} (expected the "
                f"tokens' shape, {tuple(tokens.shape)}: the next token of each)"
            )
        logits = self(tokens)  # (batch, seq, vocab_size)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # (batch * seq, vocab)


def _check_token_layout(tokens: object, seq_len: int) -> None:
    """Raise ``ValueError`` naming ``tokens`` unless it is a ``(batch, seq)`` tensor of integer
    ids with ``seq <= seq_len``. It reads only the tensor's metadata, so it costs nothing per
    step; the ids' range is checked where the embedding finds one out of it."""
    if not isinstance(tokens, torch.Tensor):
        raise ValueError(f"Invalid tokens: {tokens!r:.80} (expected a tensor of token ids)")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"Invalid tokens: a {tokens.dtype} tensor (expected integer token ids, int64 or "
            "int32; a float tensor of ids needs .long())"
        )
    if tokens.ndim != 2:
        raise ValueError(
            f"Invalid tokens: shape {tuple(tokens.shape)} (expected (batch, seq); one sequence "
            "is tokens[None])"
        )
    if tokens.shape[1] > seq_len:
        raise ValueError(
            f"Invalid sequence length: {tokens.shape[1]} (expected at most the model's "
            f"seq_len, {seq_len})"
        )


def _token_range_error(tokens: torch.Tensor, vocab_size: int) -> ValueError:
    low, high = int(tokens.min()), int(tokens.max())
    bad = high if high >= vocab_size else low
    return ValueError(
        f"Invalid tokens: id {bad} (expected ids from 0 to vocab_size - 1 = {vocab_size - 1}; "
        f"these run from {low} to {high})"
    )


def random_batch(
    shape: TransformerShape, *, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, targets)`` of uniformly random ids, each ``(batch_size, seq_len)``.

    Enough to measure time, FLOPs and memory, which do not depend on the token values.
    """
    check_instance("shape", shape, TransformerShape)
    check_int("seed", seed)
    device = parse_device(device)
    generator = torch.Generator().manual_seed(seed)
    size = (shape.batch_size, shape.seq_len + 1)  # (batch, seq + 1): inputs, then one more
    ids = torch.randint(shape.vocab_size, size, generator=generator)
    return ids[:, :-1].clone().to(device), ids[:, 1:].clone().to(device)  # two separate tensors
