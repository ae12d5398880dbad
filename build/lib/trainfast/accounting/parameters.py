"""Parameter counts of the book's transformer, from its shape: every parameter, exactly, and the
matmul weights that the 6·N·D rule counts.

Written for :class:`~trainfast.transformer.Transformer` and tested against it: the count of
every preset and every combination of the shape's choices against ``numel()``
(``tests/test_accounting.py``, ``tests/test_transformer.py``). The units and symbols are the
package's (:mod:`trainfast.accounting`).
"""

from __future__ import annotations

from trainfast.transformer import TransformerShape
from trainfast.validation import check_instance

__all__ = ["matmul_parameter_count", "mlp_parameter_count", "parameter_count"]


def _norm_parameters(shape: TransformerShape) -> int:
    """One norm's parameters: LayerNorm's gain and bias, or RMSNorm's gain alone."""
    with_bias = shape.norm == "layernorm" and shape.bias
    return shape.d_model * (2 if with_bias else 1)


def _mlp_matrices(shape: TransformerShape) -> int:
    """MLP weights per layer: two ``h x f`` matrices, three for SwiGLU's gate."""
    return (3 if shape.mlp == "swiglu" else 2) * shape.d_model * shape.d_ff


def mlp_parameter_count(shape: TransformerShape) -> int:
    """One layer's MLP parameters: its matrices (:func:`_mlp_matrices`) and, with ``bias``, a bias
    per hidden unit (``2f`` for SwiGLU's gate and up-projection) and per output. A mixture of
    experts has one such MLP per expert (:func:`trainfast.distributed.step_time.estimate`)."""
    check_instance("shape", shape, TransformerShape)
    gated_f = (2 if shape.mlp == "swiglu" else 1) * shape.d_ff
    return _mlp_matrices(shape) + (gated_f + shape.d_model if shape.bias else 0)


def parameter_count(shape: TransformerShape) -> int:
    """Parameters of :class:`trainfast.transformer.Transformer` for ``shape``, exactly.

    GPT-2 (the defaults): token embedding ``V h`` (shared with the LM head), positions ``s h``,
    per layer ``4 h^2 + 4 h`` for attention (fused QKV and output projection, with biases),
    ``2 h f + f + h`` for the MLP and ``4 h`` for two LayerNorms, and ``2 h`` for the final
    LayerNorm. With ``f = 4 h`` a layer is ``12 h^2 + 13 h``: the familiar ``12 L h^2``.

    The modern choices change the terms: grouped-query attention projects to ``h + 2 k``
    (``k = kv_heads * head_dim``) instead of ``3 h``; SwiGLU has three ``h x f`` matrices;
    RMSNorm has a gain and no bias; QK-norm adds two gains of ``head_dim`` per layer; rotary
    positions have no parameters; an untied head adds its own ``V h``; ``bias=False`` drops
    every bias. Llama 3 8B comes to 8,030,261,248 (the test checks every preset).
    """
    check_instance("shape", shape, TransformerShape)
    h, k, bias = shape.d_model, shape.kv_dim, shape.bias
    attention = h * (h + 2 * k) + h * h + ((h + 2 * k) + h if bias else 0)
    attention += 2 * shape.head_dim if shape.qk_norm else 0
    layer = attention + mlp_parameter_count(shape) + 2 * _norm_parameters(shape)
    embeddings = shape.vocab_size * h * (1 if shape.tied_head else 2)
    embeddings += shape.seq_len * h if shape.positions == "learned" else 0
    return embeddings + shape.n_layers * layer + _norm_parameters(shape)


def matmul_parameter_count(shape: TransformerShape) -> int:
    """The parameters that take part in matrix products: ``L (2 h^2 + 2 h k + mlp) + V h``.

    The ``N`` of the 6·N·D rule (:func:`~trainfast.accounting.training_flops`): the QKV
    (``h x (h + 2k)``, ``k = h`` without grouped-query attention), output and MLP weights of
    every layer (``2 h f``, or ``3 h f`` for SwiGLU) and the LM head's ``V h``. Biases, norm
    gains and the embeddings are parameters too, but no matmul uses them (a lookup is an index,
    not a product); a tied embedding counts once, as the head.
    """
    check_instance("shape", shape, TransformerShape)
    h = shape.d_model
    layer = h * (h + 2 * shape.kv_dim) + h * h + _mlp_matrices(shape)
    return shape.n_layers * layer + shape.vocab_size * h
