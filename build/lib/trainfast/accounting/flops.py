"""Matmul FLOPs of a training step: of one product, of one linear layer forward and backward,
and of the book's whole transformer.

FLOPs are matrix-multiply FLOPs, 2 per multiply-add (the conventions of
:mod:`trainfast.accounting`). :func:`training_flops` is tested against what
``torch.utils.flop_counter.FlopCounterMode`` counts on the model
(:func:`~trainfast.counters.counted_flops`).
"""

from __future__ import annotations

from trainfast.transformer import TransformerShape
from trainfast.validation import check_flag, check_instance, check_int

__all__ = ["linear_training_flops", "matmul_flops", "training_flops"]


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an ``(m, k) @ (k, n)`` product: ``m n`` outputs of ``k`` multiply-adds, 2 each."""
    for name, value in (("m", m), ("k", k), ("n", n)):
        check_int(name, value, minimum=0)
    return 2 * m * k * n


def linear_training_flops(
    tokens: int, in_features: int, out_features: int, *, input_grad: bool = True
) -> int:
    """Forward and backward FLOPs of one linear layer applied to ``tokens`` rows.

    Forward ``Y = X W^T`` is one matmul; backward is two of the same size, ``dW = dY^T X`` and
    ``dX = dY W``. ``dX`` is skipped when the input needs no gradient, as for a first layer
    fed with data: then the layer costs 4, not 6, FLOPs per weight and token.
    """
    for name, value in (
        ("tokens", tokens),
        ("in_features", in_features),
        ("out_features", out_features),
    ):
        check_int(name, value, minimum=0)  # named as the caller knows them, not m, k, n
    check_flag("input_grad", input_grad)
    forward = matmul_flops(tokens, in_features, out_features)
    return forward + forward + (forward if input_grad else 0)


def training_flops(shape: TransformerShape) -> int:
    """Matmul FLOPs of one training step (forward and backward) of :mod:`~trainfast.transformer`.

    Per layer: the four linear maps (QKV ``h -> h + 2k``, which is ``3h`` without grouped-query
    attention, output ``h -> h``, MLP ``h -> f -> h``, with SwiGLU's gate ``h -> 2f -> h``)
    and, per sequence and query head, ``QK^T`` and ``PV`` (``2 s^2 d_head`` each, forward); then
    the LM head ``h -> V``. Every linear here needs its input gradient (even the first QKV,
    whose input depends on the embeddings), so each costs 3x its forward.

    **The 6 N D rule.** A weight in a matmul does one multiply-add per token forward (2 FLOPs)
    and two backward (one for ``dX``, one for ``dW``: 4 FLOPs), so a step over ``D`` tokens costs
    ``6 N D`` for the ``N`` matmul weights (Kaplan et al. 2020). Here ``N = L(4h^2 + 2hf) + Vh``
    for GPT-2 (:func:`~trainfast.accounting.matmul_parameter_count` in general);
    the result is ``6 N D + 12 L s h D``, the second term attention (PaLM's ``12 L H Q T``),
    relatively ``s / (2h + f)`` of the first, ``s / (6h)`` for ``f = 4h``. Biases, LayerNorms and
    the position embedding are parameters but no matmul: the lookup is an index, not a product.

    ``FlopCounterMode`` on the model with ``attention="manual"`` counts exactly this. It differs
    when: ``attention="sdpa"`` runs a fused kernel (on CUDA it counts the backward as 2.5x the
    forward, since FlashAttention recomputes ``QK^T``; on CPU the fused kernel is not counted);
    activation checkpointing recomputes the blocks' forward (counted); the model is not this one
    (a network fed with data skips its first ``dX``: :func:`linear_training_flops`).
    """
    check_instance("shape", shape, TransformerShape)
    s, b, h, f = shape.seq_len, shape.batch_size, shape.d_model, shape.d_ff
    tokens = shape.tokens
    gated_f = (2 if shape.mlp == "swiglu" else 1) * f  # SwiGLU's gate and up-projection
    # per query head; grouped-query attention shares K and V, not these products
    attention_forward = b * shape.n_heads * 2 * matmul_flops(s, shape.head_dim, s)  # QK^T, PV
    layer = (
        linear_training_flops(tokens, h, h + 2 * shape.kv_dim)  # fused QKV
        + linear_training_flops(tokens, h, h)  # attention output projection
        + linear_training_flops(tokens, h, gated_f)  # MLP up (and gate)
        + linear_training_flops(tokens, f, h)  # MLP down
        + 3 * attention_forward  # backward: two matmuls per forward matmul
    )
    lm_head = linear_training_flops(tokens, h, shape.vocab_size)
    return shape.n_layers * layer + lm_head
