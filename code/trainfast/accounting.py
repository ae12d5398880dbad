"""Resource accounting: parameters, FLOPs and memory of a training step, from a model's shape.

The book's one home for this arithmetic. Every formula is written for the GPT-2-style decoder of
:mod:`trainfast.transformer` and tested against it: parameter counts against ``numel()``, FLOPs
against ``torch.utils.flop_counter.FlopCounterMode`` (:func:`counted_flops`), activation bytes
against the tensors autograd saves (:func:`saved_tensor_bytes`).

Conventions:

* **Units.** Bytes, FLOPs and seconds; ``GB`` means 10^9 bytes. Hardware numbers come from
  :mod:`trainfast.gpus`.
* **FLOPs** are matrix-multiply FLOPs, 2 per multiply-add (PaLM's "model FLOPs", Chowdhery et
  al. 2022, Appendix B). Element-wise work (softmax, LayerNorm, GELU, the optimizer) is not
  counted; attention's ``QK^T`` and ``PV`` are, in full, with no discount for the causal mask;
  recomputation by activation checkpointing is not (it is work the hardware does, not the model).
* **Memory** of a training step is model state (weights, gradients, fp32 master weights,
  optimizer moments) plus activations, the tensors the forward pass saves for backward. Not
  counted: the CUDA context, the caching allocator's rounding and fragmentation, temporary
  buffers of single kernels, communication buckets.
* **Shapes.** ``s`` sequence length, ``b`` (micro-)batch, ``h`` = ``d_model``, ``f`` = ``d_ff``,
  ``a`` heads, ``L`` layers, ``V`` vocabulary, ``t`` tensor-parallel size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

from trainfast.gpus import GPUSpec

__all__ = [
    "OPTIMIZER_MOMENTS",
    "PRECISION_RECIPES",
    "PRESET_SHAPES",
    "Attention",
    "MemoryBreakdown",
    "PrecisionRecipe",
    "TransformerShape",
    "activation_bytes",
    "bytes_per_parameter",
    "checkpointed_layer_bytes",
    "counted_flops",
    "linear_training_flops",
    "matmul_flops",
    "matmul_parameter_count",
    "model_activation_bytes",
    "model_flops_utilization",
    "parameter_count",
    "plot_memory",
    "saved_tensor_bytes",
    "training_flops",
    "training_memory",
    "training_run_seconds",
    "zero_memory",
]

#: ``"manual"``: softmax attention written out, which saves the ``s x s`` probabilities;
#: ``"sdpa"``: ``scaled_dot_product_attention`` running a fused kernel (FlashAttention,
#: memory-efficient, or the CPU flash kernel), which saves a log-sum-exp per query instead.
Attention = Literal["manual", "sdpa"]


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Invalid {name}: {value!r} (expected a positive integer)")


def _positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"Invalid {name}: {value!r} (expected a positive number)")


@dataclass(frozen=True)
class TransformerShape:
    """The sizes that decide a decoder's cost: vocabulary, width, depth, heads, MLP width,
    sequence length (also the context the position embedding covers) and (micro-)batch size."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    seq_len: int
    batch_size: int

    def __post_init__(self) -> None:
        for size in fields(self):
            _positive(size.name, getattr(self, size.name))
        if self.d_model % self.n_heads:
            raise ValueError(
                f"Invalid n_heads: {self.n_heads} (must divide d_model = {self.d_model})"
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


# ----------------------------------------------------------------------------- parameters


def parameter_count(shape: TransformerShape) -> int:
    """Parameters of :class:`trainfast.transformer.Transformer` for ``shape``, exactly.

    Token embedding ``V h`` (shared with the LM head), positions ``s h``, per layer ``4 h^2 +
    4 h`` for attention (fused QKV and output projection, with biases), ``2 h f + f + h`` for
    the MLP and ``4 h`` for two LayerNorms, and ``2 h`` for the final LayerNorm. With ``f = 4 h``
    a layer is ``12 h^2 + 13 h``: the familiar ``12 L h^2``.
    """
    h, f = shape.d_model, shape.d_ff
    attention = 4 * h * h + 4 * h
    mlp = 2 * h * f + f + h
    layer_norms = 2 * 2 * h
    embeddings = shape.vocab_size * h + shape.seq_len * h
    return embeddings + shape.n_layers * (attention + mlp + layer_norms) + 2 * h


def matmul_parameter_count(shape: TransformerShape) -> int:
    """The parameters that take part in matrix products: ``L (4 h^2 + 2 h f) + V h``.

    The ``N`` of the 6·N·D rule (:func:`training_flops`): the QKV, output and MLP weights of
    every layer and the (tied) embedding, which the LM head multiplies. Biases, LayerNorm gains
    and the position embedding are parameters too, but no matmul uses them.
    """
    h, f = shape.d_model, shape.d_ff
    return shape.n_layers * (4 * h * h + 2 * h * f) + shape.vocab_size * h


# ----------------------------------------------------------------------------- FLOPs


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an ``(m, k) @ (k, n)`` product: ``m n`` outputs of ``k`` multiply-adds, 2 each."""
    return 2 * m * k * n


def linear_training_flops(
    tokens: int, in_features: int, out_features: int, *, input_grad: bool = True
) -> int:
    """Forward and backward FLOPs of one linear layer applied to ``tokens`` rows.

    Forward ``Y = X W^T`` is one matmul; backward is two of the same size, ``dW = dY^T X`` and
    ``dX = dY W``. ``dX`` is skipped when the input needs no gradient, as for a first layer
    fed with data: then the layer costs 4, not 6, FLOPs per weight and token.
    """
    forward = matmul_flops(tokens, in_features, out_features)
    return forward + forward + (forward if input_grad else 0)


def training_flops(shape: TransformerShape) -> int:
    """Matmul FLOPs of one training step (forward and backward) of the :mod:`~trainfast.transformer`.

    Per layer: the four linear maps (QKV ``h -> 3h``, output ``h -> h``, MLP ``h -> f -> h``)
    and, per sequence and head, ``QK^T`` and ``PV`` (``2 s^2 d_head`` each, forward); then the
    tied LM head ``h -> V``. Every linear here needs its input gradient (even the first QKV,
    whose input depends on the embeddings), so each costs 3x its forward.

    **The 6 N D rule.** A weight in a matmul does one multiply-add per token forward (2 FLOPs)
    and two backward (one for ``dX``, one for ``dW``: 4 FLOPs), so a step over ``D`` tokens costs
    ``6 N D`` for the ``N`` matmul weights (Kaplan et al. 2020). Here ``N = L(4h^2 + 2hf) + Vh``;
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
    attention_forward = b * shape.n_heads * 2 * matmul_flops(s, shape.head_dim, s)  # QK^T, PV
    layer = (
        linear_training_flops(tokens, h, 3 * h)  # fused QKV
        + linear_training_flops(tokens, h, h)  # attention output projection
        + linear_training_flops(tokens, h, f)  # MLP up
        + linear_training_flops(tokens, f, h)  # MLP down
        + 3 * attention_forward  # backward: two matmuls per forward matmul
    )
    lm_head = linear_training_flops(tokens, h, shape.vocab_size)
    return shape.n_layers * layer + lm_head


def counted_flops(fn: Callable[[], object]) -> int:
    """FLOPs that ``torch.utils.flop_counter.FlopCounterMode`` counts while ``fn()`` runs.

    It counts matmuls, convolutions and attention kernels it has formulas for, on any device,
    from shapes alone; ``fn`` typically runs a forward and ``.backward()``.
    """
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


# ----------------------------------------------------------------------------- activations


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

    Tensor parallelism over ``t`` ranks splits the heads and the MLP, so everything but the
    LayerNorm regions is divided by ``t``; sequence parallelism divides those too.

    Not counted: LayerNorm's per-token mean and 1/std (``4 s b`` values per layer, about
    ``1 / (4h)`` of the rest), and what PyTorch's CPU kernels keep differently: on CPU, dropout
    saves a full-size scaled mask instead of a 1-byte one, and ``sdpa`` with dropout falls back
    to the manual path.
    """
    _positive("tensor", tensor)
    _check_attention(attention)
    s, b, h, f, a = shape.seq_len, shape.batch_size, shape.d_model, shape.d_ff, shape.n_heads
    token_wise = 4 * h * value_bytes + (2 * h if dropout else 0)  # LayerNorm ins/outs, masks
    split = (4 * h + 2 * f) * value_bytes  # Q, K, V, attention output, MLP hidden x 2
    if attention == "manual":
        split += a * s * (value_bytes + ((1 + value_bytes) if dropout else 0))  # probabilities
    else:
        split += a * 4  # log-sum-exp, fp32
    if sequence_parallel:
        return s * b * (token_wise + split) / tensor
    return s * b * (token_wise + split / tensor)


def checkpointed_layer_bytes(
    shape: TransformerShape,
    tensor: int = 1,
    sequence_parallel: bool = False,
    *,
    value_bytes: float = 2.0,
) -> float:
    """Bytes a layer keeps under full activation checkpointing: its input, ``s b h`` values
    (divided by ``t`` only with sequence parallelism: tensor parallelism replicates it)."""
    _positive("tensor", tensor)
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
    layer = activation_bytes(shape, value_bytes=value_bytes, dropout=dropout, attention=attention)
    if checkpointing:
        layers = shape.n_layers * checkpointed_layer_bytes(shape, value_bytes=value_bytes) + layer
    else:
        layers = shape.n_layers * layer
    per_token = (2 * shape.d_model + shape.vocab_size) * value_bytes
    per_token += shape.d_model if dropout else 0
    return layers + shape.tokens * per_token


def saved_tensor_bytes(fn: Callable[[], object], *, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn()`` runs.

    Measured with ``torch.autograd.graph.saved_tensors_hooks``: every tensor an operation saves
    passes through the pack hook. Views share a storage and count once, at the storage's full
    size (that is what stays allocated); storages of ``exclude`` (pass the model's parameters
    and buffers: they are not activations) are skipped. Run only the forward (and loss) in
    ``fn``; the saved tensors stay alive until the function returns, so no address is reused.
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    sizes: dict[int, int] = {}
    alive: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            sizes[storage.data_ptr()] = storage.nbytes()
        alive.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    alive.clear()
    return sum(sizes.values())


# ----------------------------------------------------------------------------- model state


@dataclass(frozen=True)
class PrecisionRecipe:
    """Bytes per parameter of each kind of model state, and per activation value.

    ``master_bytes`` is an fp32 copy the optimizer updates when the weights themselves are
    low-precision (0 if none); ``state_bytes_per_moment`` is the size of one optimizer moment
    (Adam has two). Values may be fractional (an FP8 recipe with per-block scales, say).
    """

    name: str
    weight_bytes: float
    gradient_bytes: float
    master_bytes: float
    state_bytes_per_moment: float
    activation_bytes_per_value: float

    def __post_init__(self) -> None:
        for part in fields(self)[1:]:
            value = getattr(self, part.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"Invalid {part.name}: {value!r} (expected a number >= 0)")
        if self.weight_bytes == 0 or self.activation_bytes_per_value == 0:
            raise ValueError(f"Invalid recipe {self.name!r}: weights and activations need bytes")


#: The common recipes (Rajbhandari et al. 2020, "ZeRO", Section 3.1, for mixed precision).
PRECISION_RECIPES: dict[str, PrecisionRecipe] = {
    r.name: r
    for r in (
        PrecisionRecipe("fp32", 4, 4, 0, 4, 4),
        # torch.autocast: fp32 weights, gradients and moments; matmuls and most activations in
        # 16 bits. The residual stream, LayerNorm, softmax (on CUDA) and the loss stay fp32,
        # and autocast keeps a 2-byte copy of each weight for backward: the 2-byte activation
        # count is a lower bound (measured in tests/test_accounting.py).
        PrecisionRecipe("amp", 4, 4, 0, 4, 2),
        # ZeRO's mixed precision: 16-bit weights and gradients, fp32 master weights and moments
        PrecisionRecipe("bf16-mixed", 2, 2, 4, 4, 2),
        PrecisionRecipe("bf16-no-master", 2, 2, 0, 4, 2),  # fp32 moments, no master copy
        PrecisionRecipe("pure-bf16", 2, 2, 0, 2, 2),  # everything in bf16
    )
}

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


def _recipe(recipe: str | PrecisionRecipe) -> PrecisionRecipe:
    if isinstance(recipe, PrecisionRecipe):
        return recipe
    if recipe not in PRECISION_RECIPES:
        raise ValueError(
            f"Unknown recipe: {recipe!r} (expected one of {sorted(PRECISION_RECIPES)})"
        )
    return PRECISION_RECIPES[recipe]


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

    @property
    def total(self) -> float:
        return sum(getattr(self, part.name) for part in fields(self))


def bytes_per_parameter(recipe: str | PrecisionRecipe, optimizer: str) -> MemoryBreakdown:
    """Model-state bytes per parameter for a precision recipe and an optimizer (no activations).

    Adam: fp32 16 (4 + 4 + 2 x 4), bf16-mixed 16 (2 + 2 + 4 + 2 x 4, ZeRO's ``2 + 2 + K`` with
    ``K = 12``), bf16-no-master 12, pure-bf16 8. The optimizer part is what
    :func:`trainfast.optim.state.state_bytes_per_param` measures on a real optimizer.
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
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"Invalid stage: {stage!r} (expected 0, 1, 2 or 3)")
    _positive("world_size", world_size)
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
    recipe: str | PrecisionRecipe,
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
    activations = model_activation_bytes(
        shape,
        value_bytes=_recipe(recipe).activation_bytes_per_value,
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
    )


# ----------------------------------------------------------------------------- utilisation


def model_flops_utilization(
    flops_per_step: float, seconds_per_step: float, peak_flops: float
) -> float:
    """Model FLOPs utilisation (Chowdhery et al. 2022, "PaLM", Appendix B): the model's FLOPs
    per second (:func:`training_flops`, no recomputation) over the hardware's peak. For a step
    on several devices, pass the peak of all of them together."""
    _positive_number("flops_per_step", flops_per_step)
    _positive_number("seconds_per_step", seconds_per_step)
    _positive_number("peak_flops", peak_flops)
    return flops_per_step / seconds_per_step / peak_flops


def training_run_seconds(
    flops_per_token: float, tokens: float, *, n_gpus: int, peak_flops: float, mfu: float
) -> float:
    """Seconds to train on ``tokens`` tokens with ``n_gpus`` devices of ``peak_flops`` each,
    running at model FLOPs utilisation ``mfu``: ``flops_per_token * tokens / (n_gpus * peak *
    mfu)``. ``flops_per_token`` is ``training_flops(shape) / shape.tokens`` (about 6 N)."""
    _positive_number("flops_per_token", flops_per_token)
    _positive_number("tokens", tokens)
    _positive("n_gpus", n_gpus)
    _positive_number("peak_flops", peak_flops)
    if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
        raise ValueError(f"Invalid mfu: {mfu!r} (expected 0 < mfu <= 1)")
    return flops_per_token * tokens / (n_gpus * peak_flops * mfu)


# ----------------------------------------------------------------------------- drawing


def plot_memory(
    breakdowns: Mapping[str, MemoryBreakdown],
    *,
    title: str = "Training memory per device, by part",
    xlabel: str = "configuration",
    device: GPUSpec | None = None,
    ax: Any = None,
) -> tuple[Any, Any]:
    """The calculator, drawn: one stacked bar per configuration, one colour per part, in GB.

    ``breakdowns`` maps a bar's label to its :class:`MemoryBreakdown` (from
    :func:`training_memory` or :func:`zero_memory`), e.g. one per recipe, ZeRO stage or
    checkpointing choice. Parts that are 0 in every bar are left out; each bar is labelled with
    its total; ``device`` draws its memory as a dashed line. Returns ``(figure, axes)``; draws
    into ``ax`` if given. Needs matplotlib (imported here, not with the module).
    """
    import matplotlib.pyplot as plt

    if not breakdowns:
        raise ValueError("Nothing to draw: breakdowns is empty")
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(breakdowns) + 3.0), 4.0))
    else:
        fig = ax.figure
    labels = list(breakdowns)
    tops = [0.0] * len(labels)
    for part in fields(MemoryBreakdown):
        values = [getattr(breakdowns[label], part.name) / 1e9 for label in labels]
        if any(values):
            ax.bar(labels, values, bottom=tops, label=part.name.replace("_", " "))
            tops = [top + value for top, value in zip(tops, values, strict=True)]
    for x, top in enumerate(tops):
        ax.annotate(f"{top:.1f}", (x, top), ha="center", va="bottom", fontsize=9)
    if device is not None:
        memory = device.memory_bytes / 1e9
        ax.axhline(memory, color="black", linestyle="--", label=f"{device.name}: {memory:.0f} GB")
    ax.set(title=title, xlabel=xlabel, ylabel="memory (GB)")
    ax.margins(y=0.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig, ax
