"""Activation memory: the bytes a training step saves for backward, per layer and for the whole
model, with and without activation checkpointing (of every block, or of a chain in segments, as
Chen et al. 2016 schedule it), and the loss's float32 buffers that join them at the peak.

Counted as our :class:`~trainfast.transformer.Transformer` keeps them, and tested against the
tensors autograd saves (:func:`~trainfast.counters.saved_tensor_bytes`) and the peak the
allocator measures (:func:`~trainfast.counters.peak_allocated_bytes`). What is not counted is
listed in each function and in the conventions of :mod:`trainfast.accounting`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainfast.transformer import Attention, TransformerShape
from trainfast.validation import (
    check_flag,
    check_instance,
    check_int,
    check_positive,
    check_positive_number,
)

__all__ = [
    "LOSS_BYTES_PER_LOGIT",
    "activation_bytes",
    "checkpoint_sequential_segments",
    "checkpointed_layer_bytes",
    "head_activation_values",
    "loss_buffer_bytes",
    "model_activation_bytes",
    "segmented_activation_bytes",
    "sqrt_checkpoint_segments",
]


def _norm_keeps(shape: TransformerShape) -> int:
    """Values per token a norm keeps of its own: its input, and for our RMSNorm also the
    normalised input that the gain multiplies (LayerNorm's fused kernel keeps only statistics)."""
    return (2 if shape.norm == "rmsnorm" else 1) * shape.d_model


def _attention_keeps(shape: TransformerShape, attention: Attention) -> int:
    """Values per token attention keeps for backward, besides the probabilities (``a s``).

    The output (``h``), and the operands of the scores and the weighted sum. Written out
    (``"manual"``), ``matmul`` keeps contiguous copies of Q (``h``), K and V (``k`` each, or
    ``h`` each once grouped-query attention repeats them to every query head). SDPA keeps its
    operands as given: views of the QKV projection's output keep all of it (``h + 2k``), a
    rotated or normalised Q (``h``) or K (``k``) is a new tensor, and so are the repeated K and
    V (``h`` each). QK-norm keeps its inputs, views of the projection's output (``h + 2k``),
    and the normalised Q and K (``h + k``).
    """
    h, k = shape.d_model, shape.kv_dim
    grouped = shape.kv_heads != shape.n_heads
    qk_norm = h + 2 * k + h + k if shape.qk_norm else 0
    if attention == "manual":
        return h + 2 * (h if grouped else k) + qk_norm + h
    new_q = shape.positions == "rope" or shape.qk_norm  # Q (and K) no longer views
    projection = h + 2 * k if (not new_q or not grouped) and not shape.qk_norm else 0
    operands = (h if new_q else 0) + (2 * h if grouped else (k if new_q else 0))
    return projection + operands + qk_norm + h


def _mlp_keeps(shape: TransformerShape) -> int:
    """Values per token the MLP keeps: GELU its input and output (``2f``); ReLU² the ReLU's
    output and its square (``2f``); SwiGLU the stacked gate and up-projection, the gate's SiLU
    and the product (``4f``)."""
    return (4 if shape.mlp == "swiglu" else 2) * shape.d_ff


def _check_split(shape: TransformerShape, tensor: int) -> None:
    """``shape`` is a shape and ``tensor`` a degree that gives every rank whole heads and an
    equal share of the MLP (Megatron-LM requires both), so no byte count comes out fractional."""
    check_instance("shape", shape, TransformerShape)
    check_positive("tensor", tensor)
    for size, value in (("n_heads", shape.n_heads), ("d_ff", shape.d_ff)):
        if value % tensor:
            raise ValueError(
                f"Invalid tensor: {tensor} (expected a degree that divides {size} = {value}: "
                "tensor parallelism gives each rank whole heads and an equal share of the MLP)"
            )


def _check_attention(attention: str) -> None:
    if attention not in ("manual", "sdpa"):
        raise ValueError(f"Invalid attention: {attention!r} (expected 'manual' or 'sdpa')")


def activation_bytes(
    shape: TransformerShape,
    tensor: int = 1,
    sequence_parallel: bool = False,
    *,
    value_bytes: float = 2.0,
    dropout: bool = False,
    attention: Attention = "manual",
) -> float:
    """Bytes one transformer layer saves for backward, for one (micro-)batch.

    Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer Models",
    Section 4.1), generalised to any ``d_ff`` and value size. Per token: the two LayerNorms'
    inputs and outputs (``4h`` values); Q, K, V, the attention output, the MLP's hidden layer
    before and after GELU (``4h + 2f`` values); the ``a s`` attention probabilities. With
    ``dropout``, 1-byte masks after attention and the MLP (``2h`` bytes) and on the
    probabilities (``a s`` bytes), plus the dropped probabilities (``a s`` values). With
    ``attention="sdpa"`` the fused kernel saves an fp32 log-sum-exp per head instead of the
    probabilities (and regenerates its dropout mask from the RNG seed); its output, laid out as
    ``(batch, seq, heads, head_dim)``, is the projection's input itself, counted once.
    For 2-byte values, ``f = 4h`` and dropout this is the paper's ``s b h (34 + 5 a s / h)``.

    The modern choices of :class:`~trainfast.transformer.TransformerShape` change what is kept,
    as our implementation keeps it: RMSNorm also keeps its normalised input; SwiGLU keeps
    ``4f`` values instead of ``2f``; rotation, QK-norm and grouped-query attention make new
    tensors of Q and K (and repeat K and V to every query head): see ``_attention_keeps``.
    Grouped-query attention shrinks the projection and the K/V cache; written with
    ``repeat_interleave``, as here, it does not shrink what manual attention keeps for
    backward, and with SDPA it can keep less (the repeated K and V replace the projection).

    Tensor parallelism over ``t`` ranks splits the heads and the MLP, so everything but the
    LayerNorm regions is divided by ``t``; sequence parallelism divides those too.

    Not counted: the norms' per-token statistics (LayerNorm's mean and 1/std, ``4 s b`` values
    per layer, about ``1 / (4h)`` of the rest; RMSNorm's 1/rms; QK-norm's per head), and what
    PyTorch's CPU kernels keep differently: on CPU, dropout saves a full-size scaled mask
    instead of a 1-byte one, and ``sdpa`` with dropout falls back to the manual path.
    """
    _check_split(shape, tensor)
    _check_attention(attention)
    check_positive_number("value_bytes", value_bytes)
    check_flag("sequence_parallel", sequence_parallel)
    check_flag("dropout", dropout)
    s, b, h, a = shape.seq_len, shape.batch_size, shape.d_model, shape.n_heads
    # two norms, each keeping its input (RMSNorm also its normalised input, before the gain)
    # and its output (kept by the layer that reads it), plus the dropout masks
    token_wise = 2 * (_norm_keeps(shape) + h) * value_bytes + (2 * h if dropout else 0)
    split = (_attention_keeps(shape, attention) + _mlp_keeps(shape)) * value_bytes
    if attention == "manual":
        split += a * s * (value_bytes + ((1 + value_bytes) if dropout else 0))  # probabilities
    else:
        split += a * 4  # log-sum-exp, fp32
    if sequence_parallel:
        return s * b * (token_wise + split) / tensor
    return s * b * (token_wise + split / tensor)


def head_activation_values(shape: TransformerShape, tensor: int = 1) -> float:
    """Values per token the head keeps: the final norm's input (and RMSNorm's normalised input),
    its output, and the loss's ``V / t`` log-probabilities (the head's columns split over ``t``
    tensor-parallel ranks)."""
    _check_split(shape, tensor)
    return _norm_keeps(shape) + shape.d_model + shape.vocab_size / tensor


def checkpointed_layer_bytes(
    shape: TransformerShape,
    tensor: int = 1,
    sequence_parallel: bool = False,
    *,
    value_bytes: float = 2.0,
) -> float:
    """Bytes a layer keeps under full activation checkpointing: its input, ``s b h`` values
    (divided by ``t`` only with sequence parallelism: tensor parallelism replicates it)."""
    _check_split(shape, tensor)
    check_positive_number("value_bytes", value_bytes)
    check_flag("sequence_parallel", sequence_parallel)
    kept = shape.seq_len * shape.batch_size * shape.d_model * value_bytes
    return kept / tensor if sequence_parallel else kept


def model_activation_bytes(
    shape: TransformerShape,
    *,
    value_bytes: float = 2.0,
    dropout: bool = False,
    attention: Attention = "manual",
    checkpointing: bool = False,
) -> float:
    """Activation bytes of a whole :class:`~trainfast.transformer.Transformer` training step.

    ``L`` layers of :func:`activation_bytes`, plus the head: the final LayerNorm's input and
    output and the loss's log-probabilities, ``(2h + V)`` values per token (and the embedding
    dropout's mask). With ``checkpointing``, each layer keeps only its input
    (:func:`checkpointed_layer_bytes`) and backward recomputes one layer at a time, so one
    layer's full activations are added (:func:`segmented_activation_bytes` of one-layer
    segments): an upper bound, since the head's tensors are freed before the first
    recomputation. Not counted (see the tests): LayerNorm statistics, the
    token ids and targets, and the caching allocator's rounding.
    """
    check_instance("shape", shape, TransformerShape)
    check_flag("checkpointing", checkpointing)
    layer = activation_bytes(shape, value_bytes=value_bytes, dropout=dropout, attention=attention)
    if checkpointing:  # every block a segment of one layer
        layers = segmented_activation_bytes(
            (1,) * shape.n_layers,
            layer_bytes=layer,
            input_bytes=checkpointed_layer_bytes(shape, value_bytes=value_bytes),
        )
    else:
        layers = shape.n_layers * layer
    per_token = head_activation_values(shape) * value_bytes
    per_token += shape.d_model if dropout else 0
    return layers + shape.tokens * per_token


def segmented_activation_bytes(
    segment_layers: Sequence[int], *, layer_bytes: float = 1.0, input_bytes: float = 1.0
) -> float:
    """Peak activation memory of a chain of layers checkpointed in consecutive segments of
    ``segment_layers`` layers: the largest, over segments ``j = 1, 2, ...``, of
    ``j * input_bytes + l_j * layer_bytes``.

    Chen et al. (2016, "Training Deep Nets with Sublinear Memory Cost") keep only each
    segment's input in the forward pass and recompute one segment at a time in the backward.
    While the backward runs through segment ``j``, the inputs of segments 1 to ``j`` are still
    kept and segment ``j``'s ``l_j`` layers hold their activations; the segments after it are
    done and freed. Whether the last segment is recomputed (``checkpoint``) or kept from the
    forward (``checkpoint_sequential``) does not change the peak.

    The units are the caller's. With the defaults the answer is in activations of a chain
    whose layers each keep one output-sized tensor besides their input (Linear then ReLU):
    ``n + 1`` for ``n`` layers unsegmented, ``(n,)``, and just as many with every layer its
    own segment; ``2 sqrt(n)`` for ``sqrt(n)`` segments of ``sqrt(n)`` layers
    (:func:`sqrt_checkpoint_segments`). An upper bound when ``layer_bytes`` includes the
    layer's own input (as :func:`activation_bytes` does, for
    :func:`model_activation_bytes`): each segment's input is then counted twice.

    Not counted: the gradients the backward allocates (two activations at a time in such a
    chain, measured in the tests), the weights' gradients, the loss's buffers.
    """
    check_positive_number("layer_bytes", layer_bytes)
    check_positive_number("input_bytes", input_bytes)
    if isinstance(segment_layers, (str, bytes)) or not isinstance(segment_layers, Sequence):
        raise ValueError(
            f"Invalid segment_layers: {segment_layers!r} (expected a sequence of positive "
            "integers, the layers in each segment)"
        )
    if not segment_layers:
        raise ValueError("Invalid segment_layers: () (expected at least one segment)")
    for j, layers in enumerate(segment_layers):
        check_positive(f"segment_layers[{j}]", layers)
    return max(
        (j + 1) * input_bytes + layers * layer_bytes for j, layers in enumerate(segment_layers)
    )


def checkpoint_sequential_segments(n_layers: int, segments: int) -> tuple[int, ...]:
    """The layers in each segment when ``torch.utils.checkpoint.checkpoint_sequential(
    functions, segments, input, use_reentrant=False)`` runs a chain of ``n_layers``:
    ``n_layers // segments`` in each, the remainder in the last, as its source cuts them.

    Every segment but the last is checkpointed, so the backward runs ``sum(segments[:-1])``
    layers' forward a second time: about one extra forward pass. ``segments`` may not exceed
    ``n_layers`` (torch's segment size ``n_layers // segments`` would be 0, and its loop's
    ``range`` raises).
    """
    check_positive("n_layers", n_layers)
    check_int("segments", segments, minimum=1, maximum=n_layers)
    size = n_layers // segments
    return (size,) * (segments - 1) + (n_layers - size * (segments - 1),)


def sqrt_checkpoint_segments(n_layers: int) -> tuple[int, ...]:
    """Chen et al.'s (2016) schedule for a chain of ``n_layers``: ``floor(sqrt(n))`` segments
    of about ``sqrt(n)`` layers, cut as :func:`checkpoint_sequential_segments` cuts them.

    The peak is then about ``2 sqrt(n)`` activations (:func:`segmented_activation_bytes`)
    instead of ``n``. Exactly when ``sqrt(n)`` divides ``n``; otherwise the last segment takes
    the remainder and the peak can exceed the best split by a few activations (for 28
    layers, 13 against 11 with 4 segments): when that matters, compare
    :func:`segmented_activation_bytes` over the segment counts. It assumes layers of one
    size: for layers that keep very different amounts, weigh the segments by their bytes.
    """
    check_positive("n_layers", n_layers)
    return checkpoint_sequential_segments(n_layers, math.isqrt(n_layers))


#: Bytes per logit value of the book's float32 cross-entropy at the start of backward: the
#: float32 logits the step keeps, the log-probabilities log_softmax saves, and the gradients of
#: both that backward's first two operators allocate.
LOSS_BYTES_PER_LOGIT = 4 + 4 + 4 + 4


def loss_buffer_bytes(
    shape: TransformerShape, tensor: int = 1, *, value_bytes: float = 2.0
) -> float:
    """Bytes the loss holds at the peak of a step besides the log-probabilities counted as
    activations (at ``value_bytes``): the saved activations are not the peak.

    The book's step (:func:`trainfast.precision.recipes.training_step`) computes the
    cross-entropy in float32 in every recipe. At the start of backward, while every activation
    is still alive, it holds :data:`LOSS_BYTES_PER_LOGIT` bytes per logit value: the float32
    logits it keeps, log_softmax's float32 log-probabilities, and the float32 gradients of the
    log-probabilities (nll_loss's, dense) and of the logits (log_softmax's). ``V / t`` logits per
    token with the head's columns split over ``t`` tensor-parallel ranks. Measured by
    :func:`~trainfast.counters.peak_allocated_bytes` in the tests.
    """
    _check_split(shape, tensor)
    check_positive_number("value_bytes", value_bytes)
    logits = shape.tokens * shape.vocab_size / tensor
    return logits * (LOSS_BYTES_PER_LOGIT - value_bytes)
