"""Resource accounting: parameters, FLOPs and memory of a training step, from a model's shape.

The book's one home for this arithmetic. Every formula is written for the decoder of
:mod:`trainfast.transformer` and tested against it: parameter counts against ``numel()``,
FLOPs against ``torch.utils.flop_counter.FlopCounterMode``
(:func:`~trainfast.counters.counted_flops`), activation bytes against the tensors autograd
saves (:func:`~trainfast.counters.saved_tensor_bytes`).

Conventions:

* **Units.** Bytes, FLOPs and seconds; ``GB`` means 10^9 bytes. Hardware numbers come from
  :mod:`trainfast.gpus`.
* **FLOPs** are matrix-multiply FLOPs, 2 per multiply-add (PaLM's "model FLOPs", Chowdhery et
  al. 2022, Appendix B). Element-wise work (softmax, LayerNorm, GELU, the optimizer) is not
  counted; attention's ``QK^T`` and ``PV`` are, in full, with no discount for the causal mask;
  recomputation by activation checkpointing is not (it is work the hardware does, not the model).
* **Memory** of a training step is model state (weights, gradients, fp32 master weights,
  optimizer moments) plus activations, the tensors the forward pass saves for backward; its
  peak adds the loss's float32 buffers alive with them at the start of backward. Not counted:
  the CUDA context, the caching allocator's rounding and fragmentation, temporary buffers of
  single kernels, communication buckets.
* **Utilisation** (MFU, with the book's one denominator) and the length of a run are in
  :mod:`trainfast.utilization`, the measuring side
  (:func:`~trainfast.counters.counted_flops`, :func:`~trainfast.counters.saved_tensor_bytes`)
  in :mod:`trainfast.counters`; both are re-exported here, documented where they live.
* **Inputs.** A model's sizes are a :class:`~trainfast.transformer.TransformerShape` (the
  model's own configuration); a precision recipe's bytes come from :mod:`trainfast.recipes`.
* **Shapes.** ``s`` sequence length, ``b`` (micro-)batch, ``h`` = ``d_model``, ``f`` = ``d_ff``,
  ``a`` heads, ``L`` layers, ``V`` vocabulary, ``t`` tensor-parallel size.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# re-exported for callers of the older names; documented where they live
from trainfast.counters import counted_flops as counted_flops
from trainfast.counters import peak_allocated_bytes as peak_allocated_bytes
from trainfast.counters import saved_tensor_bytes as saved_tensor_bytes
from trainfast.recipes import RECIPES, Recipe
from trainfast.transformer import Attention, TransformerShape
from trainfast.utilization import model_flops_utilization as model_flops_utilization
from trainfast.utilization import training_run_seconds as training_run_seconds
from trainfast.validation import (
    check_flag,
    check_int,
    check_non_negative,
    check_positive,
    check_positive_number,
)

__all__ = [
    "LOSS_BYTES_PER_LOGIT",
    "OPTIMIZER_MOMENTS",
    "MemoryBreakdown",
    "activation_bytes",
    "bytes_per_parameter",
    "checkpointed_layer_bytes",
    "linear_training_flops",
    "loss_buffer_bytes",
    "matmul_flops",
    "matmul_parameter_count",
    "mlp_parameter_count",
    "head_activation_values",
    "model_activation_bytes",
    "parameter_count",
    "training_flops",
    "training_memory",
    "zero_memory",
]

# ----------------------------------------------------------------------------- parameters


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
    h, k, bias = shape.d_model, shape.kv_dim, shape.bias
    attention = h * (h + 2 * k) + h * h + ((h + 2 * k) + h if bias else 0)
    attention += 2 * shape.head_dim if shape.qk_norm else 0
    layer = attention + mlp_parameter_count(shape) + 2 * _norm_parameters(shape)
    embeddings = shape.vocab_size * h * (1 if shape.tied_head else 2)
    embeddings += shape.seq_len * h if shape.positions == "learned" else 0
    return embeddings + shape.n_layers * layer + _norm_parameters(shape)


def matmul_parameter_count(shape: TransformerShape) -> int:
    """The parameters that take part in matrix products: ``L (2 h^2 + 2 h k + mlp) + V h``.

    The ``N`` of the 6·N·D rule (:func:`training_flops`): the QKV (``h x (h + 2k)``, ``k = h``
    without grouped-query attention), output and MLP weights of every layer (``2 h f``, or
    ``3 h f`` for SwiGLU) and the LM head's ``V h``. Biases, norm gains and the embeddings are
    parameters too, but no matmul uses them (a lookup is an index, not a product); a tied
    embedding counts once, as the head.
    """
    h = shape.d_model
    layer = h * (h + 2 * shape.kv_dim) + h * h + _mlp_matrices(shape)
    return shape.n_layers * layer + shape.vocab_size * h


# ----------------------------------------------------------------------------- FLOPs


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
    for GPT-2 (:func:`matmul_parameter_count` in general);
    the result is ``6 N D + 12 L s h D``, the second term attention (PaLM's ``12 L H Q T``),
    relatively ``s / (2h + f)`` of the first, ``s / (6h)`` for ``f = 4h``. Biases, LayerNorms and
    the position embedding are parameters but no matmul: the lookup is an index, not a product.

    ``FlopCounterMode`` on the model with ``attention="manual"`` counts exactly this. It differs
    when: ``attention="sdpa"`` runs a fused kernel (on CUDA it counts the backward as 2.5x the
    forward, since FlashAttention recomputes ``QK^T``; on CPU the fused kernel is not counted);
    activation checkpointing recomputes the blocks' forward (counted); the model is not this one
    (a network fed with data skips its first ``dX``: :func:`linear_training_flops`).
    """
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


# ----------------------------------------------------------------------------- activations


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
    check_positive("tensor", tensor)
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
    check_positive("tensor", tensor)
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
    check_positive("tensor", tensor)
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
    layer's full activations are added: an upper bound, since the head's tensors are freed
    before the first recomputation. Not counted (see the tests): LayerNorm statistics, the
    token ids and targets, and the caching allocator's rounding.
    """
    check_flag("checkpointing", checkpointing)
    layer = activation_bytes(shape, value_bytes=value_bytes, dropout=dropout, attention=attention)
    if checkpointing:
        layers = shape.n_layers * checkpointed_layer_bytes(shape, value_bytes=value_bytes) + layer
    else:
        layers = shape.n_layers * layer
    per_token = head_activation_values(shape) * value_bytes
    per_token += shape.d_model if dropout else 0
    return layers + shape.tokens * per_token


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
    check_positive("tensor", tensor)
    check_positive_number("value_bytes", value_bytes)
    logits = shape.tokens * shape.vocab_size / tensor
    return logits * (LOSS_BYTES_PER_LOGIT - value_bytes)


# ----------------------------------------------------------------------------- model state


#: Optimizer moments (copies of the weights' size) kept per parameter. Muon's single momentum
#: buffer is for the hidden matrices it orthogonalises; the embeddings, head and vectors usually
#: get AdamW's two, so a whole model lands in between.
OPTIMIZER_MOMENTS: dict[str, int] = {
    "sgd": 0,
    "momentum": 1,
    "rmsprop": 1,
    "adam": 2,
    "adamw": 2,
    "muon": 1,
}


def _recipe(recipe: str | Recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if recipe not in RECIPES:
        raise ValueError(f"Unknown recipe: {recipe!r} (expected one of {sorted(RECIPES)})")
    return RECIPES[recipe]


def _moments(optimizer: str) -> int:
    if optimizer not in OPTIMIZER_MOMENTS:
        raise ValueError(
            f"Unknown optimizer: {optimizer!r} (expected one of {sorted(OPTIMIZER_MOMENTS)})"
        )
    return OPTIMIZER_MOMENTS[optimizer]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of training memory by part (per device, or per parameter from
    :func:`bytes_per_parameter`). A part that was not counted is 0."""

    parameters: float
    gradients: float
    master_weights: float
    optimizer_state: float
    activations: float = 0.0
    loss_buffers: float = 0.0  # not in total: alive only at the start of backward

    @property
    def total(self) -> float:
        """Model state and saved activations: what stays allocated through the forward."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "loss_buffers")

    @property
    def peak(self) -> float:
        """The peak of a step: :attr:`total` and the loss's float32 buffers at the start of
        backward (:func:`loss_buffer_bytes`), what ``torch.cuda.max_memory_allocated`` measures."""
        return self.total + self.loss_buffers


def bytes_per_parameter(recipe: str | Recipe, optimizer: str) -> MemoryBreakdown:
    """Model-state bytes per parameter for a precision recipe and an optimizer (no activations).

    Adam: "fp32" 16 (4 + 4 + 2 x 4), "bf16 + fp32 master" 16 (2 + 2 + 4 + 2 x 4, ZeRO's
    ``2 + 2 + K`` with ``K = 12``), "bf16, fp32 moments" 12, "pure bf16" 8. The optimizer part is
    what :func:`trainfast.optim.state.state_bytes_per_param` measures on a real optimizer.
    """
    r = _recipe(recipe)
    return MemoryBreakdown(
        parameters=r.weight_bytes,
        gradients=r.gradient_bytes,
        master_weights=r.master_bytes,
        optimizer_state=_moments(optimizer) * r.state_bytes_per_moment,
    )


def _zero_shards(stage: int, world_size: int) -> tuple[float, float, float]:
    """Fractions of (weights, gradients, optimizer state and master weights) a rank keeps."""
    check_int("stage", stage, minimum=0, maximum=3)  # True is not stage 1
    check_positive("world_size", world_size)
    shard = 1.0 / world_size
    return (
        shard if stage >= 3 else 1.0,
        shard if stage >= 2 else 1.0,
        shard if stage >= 1 else 1.0,
    )


def zero_memory(
    n_params: float,
    world_size: int,
    stage: int,
    param_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> MemoryBreakdown:
    """Per-rank model-state memory for ZeRO ``stage`` 0 (plain data parallel) to 3.

    Defaults are the paper's mixed-precision Adam: fp16 parameters and gradients (2 + 2 bytes)
    and ``K = 12`` bytes of fp32 master weights, momentum and variance per parameter, all in
    ``optimizer_state``. Activations, buffers and fragmentation are not model state: 0 here.
    """
    check_non_negative("n_params", n_params)
    for name, value in (
        ("param_bytes", param_bytes),
        ("grad_bytes", grad_bytes),
        ("optimizer_bytes", optimizer_bytes),
    ):
        check_non_negative(name, value)
    weights, grads, state = _zero_shards(stage, world_size)
    return MemoryBreakdown(
        parameters=n_params * param_bytes * weights,
        gradients=n_params * grad_bytes * grads,
        master_weights=0.0,
        optimizer_state=n_params * optimizer_bytes * state,
    )


def training_memory(
    shape: TransformerShape,
    *,
    recipe: str | Recipe,
    optimizer: str,
    checkpointing: bool = False,
    dropout: bool = False,
    attention: Attention = "manual",
    zero_stage: int = 0,
    world_size: int = 1,
) -> MemoryBreakdown:
    """Memory of one device training the :class:`~trainfast.transformer.Transformer`.

    Model state from :func:`bytes_per_parameter` times :func:`parameter_count`, sharded by ZeRO
    ``zero_stage`` over ``world_size`` data-parallel ranks (master weights go with the optimizer
    state); activations from :func:`model_activation_bytes` at the recipe's bytes per value.
    Add headroom: real runs also hold the CUDA context, allocator slack, temporary buffers.
    """
    per_param = bytes_per_parameter(recipe, optimizer)
    weights, grads, state = _zero_shards(zero_stage, world_size)
    n = parameter_count(shape)
    value_bytes = _recipe(recipe).activation_bytes_per_value
    activations = model_activation_bytes(
        shape,
        value_bytes=value_bytes,
        dropout=dropout,
        attention=attention,
        checkpointing=checkpointing,
    )
    return MemoryBreakdown(
        parameters=n * per_param.parameters * weights,
        gradients=n * per_param.gradients * grads,
        master_weights=n * per_param.master_weights * state,
        optimizer_state=n * per_param.optimizer_state * state,
        activations=activations,
        loss_buffers=loss_buffer_bytes(shape, value_bytes=value_bytes),
    )
