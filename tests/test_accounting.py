"""Tests of trainfast.accounting and trainfast.transformer: every formula against the real module.

Parameter counts against ``numel()``, FLOPs against ``FlopCounterMode``, activation bytes against
the tensors autograd saves, optimizer-state bytes against real optimizers. Where formula and
measurement differ, the test names the difference and computes it. Tiny shapes, one thread.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential
from trainfast.accounting import (
    OPTIMIZER_MOMENTS,
    MemoryBreakdown,
    activation_bytes,
    bytes_per_parameter,
    checkpoint_sequential_segments,
    checkpointed_layer_bytes,
    counted_flops,
    linear_training_flops,
    loss_buffer_bytes,
    matmul_flops,
    model_activation_bytes,
    model_flops_utilization,
    parameter_count,
    peak_allocated_bytes,
    saved_tensor_bytes,
    segmented_activation_bytes,
    sqrt_checkpoint_segments,
    training_flops,
    training_memory,
    training_run_seconds,
    zero_memory,
)
from trainfast.gpus import (
    GPUS,
    UnlistedGPUWarning,
    datasheet_peak,
    gpu_for_device,
    gpu_spec,
    spec_for_record,
    with_device_properties,
)
from trainfast.kernels.plots import plot_memory
from trainfast.optim.state import state_bytes_table
from trainfast.recipes import RECIPES, Recipe
from trainfast.transformer import PRESET_SHAPES, Transformer, TransformerShape, random_batch

TINY = PRESET_SHAPES["tiny"]
# odd sizes on purpose: d_ff not 4 d_model, one head, a vocabulary that is no power of two
SHAPES = [
    TINY,
    TransformerShape(
        vocab_size=97, d_model=24, n_layers=1, n_heads=1, d_ff=40, seq_len=9, batch_size=3
    ),
    TransformerShape(
        vocab_size=50, d_model=16, n_layers=3, n_heads=2, d_ff=64, seq_len=12, batch_size=1
    ),
]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(shape: TransformerShape, seed: int = 0, **options) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(shape, **options)


def _saved(model: Transformer, shape: TransformerShape) -> int:
    tokens, targets = random_batch(shape)
    not_activations = [*model.parameters(), *model.buffers()]
    return saved_tensor_bytes(lambda: model.loss(tokens, targets), exclude=not_activations)


def _unmodelled(
    shape: TransformerShape, layer_norms: int, stat_bytes: int, scalar_bytes: int
) -> int:
    """What autograd saves that the formulas leave out, on CPU: each LayerNorm's mean and 1/std
    per token (in the activations' dtype on CPU), the token ids, position ids and targets
    (int64), and the loss's 0-dim total weight."""
    ids = 8 * (2 * shape.tokens + shape.seq_len)
    return layer_norms * 2 * shape.tokens * stat_bytes + ids + scalar_bytes


# --------------------------------------------------------------------------- shapes


def test_shape_validation_names_the_value():
    with pytest.raises(ValueError, match="d_model: 0"):
        TransformerShape(10, 0, 1, 1, 4, 4, 1)
    with pytest.raises(ValueError, match="batch_size: 1.5"):
        TransformerShape(10, 8, 1, 1, 4, 4, 1.5)
    with pytest.raises(ValueError, match="n_layers: True"):
        TransformerShape(10, 8, True, 1, 4, 4, 1)
    with pytest.raises(ValueError, match="n_heads: 3"):
        TransformerShape(10, 8, 1, 3, 4, 4, 1)
    shape = TransformerShape.gpt_like(d_model=64, n_layers=2, n_heads=4, seq_len=32)
    assert (shape.d_ff, shape.vocab_size, shape.batch_size) == (256, 50_304, 1)
    assert (shape.head_dim, shape.tokens) == (16, 32)


def test_parameter_count_is_exact():
    for shape in SHAPES:
        model = Transformer(shape)
        assert parameter_count(shape) == sum(p.numel() for p in model.parameters())
    for name, shape in PRESET_SHAPES.items():  # the big ones on the meta device: no memory
        with torch.device("meta"):
            model = Transformer(shape)
        assert parameter_count(shape) == sum(p.numel() for p in model.parameters()), name
    assert parameter_count(PRESET_SHAPES["gpt2-small"]) == 124_439_808  # GPT-2's "124M"


# --------------------------------------------------------------------------- FLOPs


def _attention_flops(shape: TransformerShape) -> int:
    """Forward FLOPs of QK^T and PV in all layers."""
    s = shape.seq_len
    per_layer = shape.batch_size * shape.n_heads * 2 * matmul_flops(s, shape.head_dim, s)
    return shape.n_layers * per_layer


def _count_step(model: nn.Module, shape: TransformerShape) -> int:
    tokens, targets = random_batch(shape)
    return counted_flops(lambda: model.loss(tokens, targets).backward())


def test_training_flops_match_the_flop_counter_exactly():
    for shape in SHAPES:
        assert _count_step(_model(shape), shape) == training_flops(shape)


def test_six_n_d_is_the_leading_term():
    for shape in [*SHAPES, *PRESET_SHAPES.values()]:
        h, f, k = shape.d_model, shape.d_ff, shape.kv_dim
        mlp = (3 if shape.mlp == "swiglu" else 2) * h * f  # SwiGLU's gate is a third matrix
        matmul_weights = shape.n_layers * (2 * h * h + 2 * h * k + mlp) + shape.vocab_size * h
        attention = 12 * shape.n_layers * shape.seq_len * h * shape.tokens
        assert training_flops(shape) == 6 * matmul_weights * shape.tokens + attention
        assert attention == 3 * _attention_flops(shape)
    # GPT-2 small: attention adds s / (6h) = 1024 / 4608 to the matmul weights' 6 N D
    gpt2 = PRESET_SHAPES["gpt2-small"]
    per_token = training_flops(gpt2) / gpt2.tokens
    assert 6.8 < per_token / parameter_count(gpt2) < 6.9


def test_flop_counter_with_fused_attention_and_checkpointing():
    shape = TINY
    # On CPU the counter has no formula for the fused flash kernel (torch 2.14): attention is
    # missing. Should one be added, it would count 2 forward + 5 backward matmuls (7/6 of ours).
    counted = _count_step(_model(shape, attention="sdpa"), shape)
    attention = 3 * _attention_flops(shape)
    assert counted in (training_flops(shape) - attention, training_flops(shape) + attention // 6)
    # Checkpointing recomputes each block's forward in backward, stopping early after the last
    # tensor backward needs: the MLP's down projection is not rerun.
    counted = _count_step(_model(shape, checkpointing=True), shape)
    h, f, tokens = shape.d_model, shape.d_ff, shape.tokens
    block_forward = (
        matmul_flops(tokens, h, 3 * h) + matmul_flops(tokens, h, h) + matmul_flops(tokens, h, f)
    ) + _attention_flops(shape) // shape.n_layers
    assert counted == training_flops(shape) + shape.n_layers * block_forward


def test_a_two_layer_mlp_does_not_pay_six_n_d():
    batch, d_in, d_hidden, d_out = 8, 64, 32, 10
    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))
    x, y = torch.randn(batch, d_in), torch.randint(0, d_out, (batch,))
    counted = counted_flops(lambda: F.cross_entropy(model(x), y).backward())
    predicted = linear_training_flops(batch, d_in, d_hidden, input_grad=False)
    predicted += linear_training_flops(batch, d_hidden, d_out)
    assert counted == predicted
    weights = d_in * d_hidden + d_hidden * d_out
    assert 6 * weights * batch - counted == 2 * d_in * d_hidden * batch  # the skipped dX


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flop_counter_with_fused_attention_on_cuda():
    shape = TINY
    model = _model(shape, attention="sdpa").cuda()
    tokens, targets = random_batch(shape, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        counted = counted_flops(lambda: model.loss(tokens, targets).backward())
    # the fused backward recomputes QK^T: 2 forward + 5 backward matmuls instead of 2 + 4
    assert counted == training_flops(shape) + 3 * _attention_flops(shape) // 6


# --------------------------------------------------------------------------- activations


def test_saved_tensor_bytes_counts_storages_once():
    x = torch.randn(4, 8, requires_grad=True)
    assert saved_tensor_bytes(lambda: x.exp()) == 4 * 8 * 4  # exp saves its result
    assert saved_tensor_bytes(lambda: x * x) == 4 * 8 * 4  # x twice, one storage
    assert saved_tensor_bytes(lambda: x * x, exclude=[x]) == 0
    y = torch.randn(4, 16, requires_grad=True)
    halves = y.split(8, dim=1)  # two views of one storage
    assert saved_tensor_bytes(lambda: halves[0] * halves[1]) == 4 * 16 * 4


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_activation_bytes_match_saved_tensors(attention):
    for shape in SHAPES:
        measured = _saved(_model(shape, attention=attention), shape)
        formula = model_activation_bytes(shape, value_bytes=4, attention=attention)
        unmodelled = _unmodelled(shape, 2 * shape.n_layers + 1, stat_bytes=4, scalar_bytes=4)
        assert measured == formula + unmodelled, shape
        assert unmodelled < 0.1 * formula  # mostly LayerNorm statistics: 1 / (4h) of a layer


def test_activation_bytes_with_checkpointing():
    for attention in ("manual", "sdpa"):
        shape = TINY
        measured = _saved(_model(shape, attention=attention, checkpointing=True), shape)
        formula = model_activation_bytes(
            shape, value_bytes=4, attention=attention, checkpointing=True
        )
        # saved in the forward: every block's input, and the head; the recomputed layer is the
        # one layer of activations the formula adds for the backward
        recomputed = activation_bytes(shape, value_bytes=4, attention=attention)
        assert measured == formula - recomputed + _unmodelled(shape, 1, 4, 4)
        assert checkpointed_layer_bytes(shape, value_bytes=4) == shape.tokens * shape.d_model * 4
        assert formula < model_activation_bytes(shape, value_bytes=4, attention=attention)


# --- a chain checkpointed in segments (Chen et al. 2016) against checkpoint_sequential ----------

# 4096 x 16 float32 activations, 256 KiB each, beside 1 KiB of weights per layer
CHAIN_BATCH, CHAIN_WIDTH = 4096, 16
# (layers, segments): unsegmented, halves, Chen's sqrt(n), every layer, an uneven cut, 25 layers
CHAIN_CASES = [(16, 1), (16, 2), (16, 4), (16, 16), (10, 3), (25, 5)]
# the backward's gradients alive at once in this chain: the layer's output's and its input's
CHAIN_GRADIENTS = 2


@functools.cache
def _chain_measurements() -> dict[tuple[int, int], tuple[float, int]]:
    """Per case, the peak bytes of one forward + backward through ``checkpoint_sequential``, in
    activations, and how many layer forwards ran.

    Each layer is Linear then an in-place ReLU: Linear keeps its input, ReLU its output (the
    Linear's own output, rectified in place), so a layer keeps one activation besides its
    input, the unit of :func:`segmented_activation_bytes`. ``preserve_rng_state=False``: the
    chain draws no random numbers, and each checkpoint would otherwise keep a 5 KB copy of the
    CPU generator's state."""
    measured = {}
    for n_layers, segments in CHAIN_CASES:
        torch.manual_seed(0)
        chain = nn.Sequential(
            *(
                nn.Sequential(nn.Linear(CHAIN_WIDTH, CHAIN_WIDTH), nn.ReLU(inplace=True))
                for _ in range(n_layers)
            )
        )
        forwards: list[nn.Module] = []
        for layer in chain:
            layer.register_forward_pre_hook(lambda module, args, seen=forwards: seen.append(module))

        def step(chain: nn.Module = chain, segments: int = segments) -> None:
            x = torch.randn(CHAIN_BATCH, CHAIN_WIDTH)
            y = checkpoint_sequential(
                chain, segments, x, use_reentrant=False, preserve_rng_state=False
            )
            y.sum().backward()

        step()  # warm-up, counting the layers' forwards
        calls = len(forwards)
        chain.zero_grad(set_to_none=True)
        peak = peak_allocated_bytes(step) / (CHAIN_BATCH * CHAIN_WIDTH * 4)
        measured[(n_layers, segments)] = (peak, calls)
    return measured


def _check_chain_peaks(predict: Callable[[Sequence[int]], float]) -> None:
    """Raise ``AssertionError`` naming the first case where ``predict(segment_layers)`` plus the
    backward's gradients misses the measured peak by more than a quarter of an activation,
    room for the weights' gradients (under a tenth here)."""
    for (n_layers, segments), (measured, _) in _chain_measurements().items():
        predicted = predict(checkpoint_sequential_segments(n_layers, segments))
        extra = measured - predicted - CHAIN_GRADIENTS
        assert 0 <= extra < 0.25, (
            f"{n_layers} layers in {segments} segments: measured {measured:.2f} activations, "
            f"predicted {predicted:g} + {CHAIN_GRADIENTS} gradients"
        )


def test_segmented_checkpointing_peak_meets_checkpoint_sequential():
    _check_chain_peaks(segmented_activation_bytes)
    for (n_layers, segments), (_, calls) in _chain_measurements().items():
        # every segment but the last runs its forward again in the backward
        assert calls == n_layers + sum(checkpoint_sequential_segments(n_layers, segments)[:-1])


@pytest.mark.parametrize(
    "wrong",
    [
        pytest.param(len, id="the checkpoints without the recomputed segment"),
        pytest.param(lambda s: sum(s) + 1, id="no saving: every activation kept"),
        pytest.param(lambda s: 2 * math.sqrt(sum(s)), id="2 sqrt(n) whatever the cut"),
        pytest.param(lambda s: len(s) - 1 + s[-1], id="the last segment's input forgotten"),
        pytest.param(lambda s: len(s) + s[-1] + 1, id="the chain's output counted too"),
    ],
)
def test_segmented_checkpointing_check_rejects_wrong_models(wrong):
    with pytest.raises(AssertionError, match="layers in"):
        _check_chain_peaks(wrong)


def test_sqrt_schedule_is_chens():
    for n_layers in (4, 9, 16, 25, 100):  # sqrt(n) segments of sqrt(n) layers: 2 sqrt(n)
        segments = sqrt_checkpoint_segments(n_layers)
        assert segments == (math.isqrt(n_layers),) * math.isqrt(n_layers)
        assert segmented_activation_bytes(segments) == 2 * math.isqrt(n_layers)
    for n_layers in range(1, 200):
        segments = sqrt_checkpoint_segments(n_layers)
        assert sum(segments) == n_layers
        unsegmented = segmented_activation_bytes((n_layers,))
        assert unsegmented == n_layers + 1 == segmented_activation_bytes((1,) * n_layers)
        # the remainder in the last segment costs at most about another sqrt(n)
        assert segmented_activation_bytes(segments) <= 3 * math.sqrt(n_layers)
    # the docstring's example of a remainder: 28 layers, 5 segments give 13, 4 give 11
    assert segmented_activation_bytes(sqrt_checkpoint_segments(28)) == 13
    assert segmented_activation_bytes(checkpoint_sequential_segments(28, 4)) == 11


def test_model_activation_bytes_checkpoints_every_block_as_one_layer_segments():
    shape = TINY
    layer = activation_bytes(shape, value_bytes=4)
    kept = checkpointed_layer_bytes(shape, value_bytes=4)
    head = model_activation_bytes(shape, value_bytes=4) - shape.n_layers * layer
    assert model_activation_bytes(shape, value_bytes=4, checkpointing=True) == (
        shape.n_layers * kept + layer + head
    )


def test_activation_bytes_scale_with_the_value_size():
    shape = TINY
    measured = _saved(_model(shape).to(torch.bfloat16), shape)
    formula = model_activation_bytes(shape, value_bytes=2)
    assert measured == formula + _unmodelled(shape, 2 * shape.n_layers + 1, 2, 2)


def test_dropout_masks_cost_a_full_value_on_cpu():
    shape = TINY
    measured = _saved(_model(shape, dropout=0.1), shape)
    formula = model_activation_bytes(shape, value_bytes=4, dropout=True)
    # the formula counts CUDA's 1-byte masks; CPU dropout keeps a 4-byte scaled mask instead
    masks = shape.n_layers * (
        2 * shape.tokens * shape.d_model + shape.n_heads * shape.seq_len * shape.tokens
    )
    masks += shape.tokens * shape.d_model  # the embedding dropout
    assert measured == formula + 3 * masks + _unmodelled(shape, 2 * shape.n_layers + 1, 4, 4)


def test_peak_allocated_bytes_follows_allocations_and_frees():
    x = torch.randn(100, 100)  # allocated before: not counted

    def step():
        y = x * 2  # 40 kB
        z = y @ y  # 40 kB more: the peak
        del y
        return z.sum()

    assert peak_allocated_bytes(step) == 2 * 100 * 100 * 4
    assert peak_allocated_bytes(lambda: None) == 0


def test_peak_allocated_bytes_does_not_depend_on_when_the_collector_runs():
    """A tensor in a reference cycle that ``fn`` dropped is freed by the garbage collector,
    whenever it happens to run; the peak is the one reference counting alone gives: the
    collector runs before ``fn``, not during it (a collection in the middle of a checkpointed
    backward lowered a test's measured peak by up to a third of an activation, 10 runs in 60)."""
    import gc

    class Cycle:
        def __init__(self) -> None:
            self.me, self.tensor = self, torch.randn(100, 100)

    def step():
        Cycle()  # 40 kB, unreachable at once: only the collector frees it
        objects = [[] for _ in range(10 * gc.get_threshold()[0])]  # enough to start a collection
        return torch.randn(100, 100), objects  # 40 kB more: the peak, the cycle not yet freed

    assert gc.isenabled()
    assert peak_allocated_bytes(step) == 2 * 100 * 100 * 4
    assert gc.isenabled()  # on again after


def _live_bytes(tensors) -> int:
    return sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values()
    )


#: A vocabulary large against the width, so the loss dominates the peak, and the CPU record's.
PEAK_SHAPES = [
    TransformerShape.gpt_like(
        d_model=32, n_layers=2, n_heads=4, seq_len=64, vocab_size=4096, batch_size=4
    ),
    TransformerShape.gpt_like(
        d_model=64, n_layers=2, n_heads=4, seq_len=64, vocab_size=256, batch_size=4
    ),
]


@pytest.mark.parametrize("shape", PEAK_SHAPES, ids=["vocab-4096", "vocab-256"])
@pytest.mark.parametrize("recipe", ["fp32", "bf16 autocast", "pure bf16"])
def test_training_memory_peak_is_the_measured_peak_of_a_step(shape, recipe):
    """The model meets the implementation: the peak of the book's training step, measured by the
    allocator's events on CPU, is ``training_memory(...).peak``. Model state live before the step
    (weights, last step's gradients, AdamW's moments) plus the most the step allocates on top."""
    from trainfast.precision.recipes import training_step

    r = RECIPES[recipe]
    torch.manual_seed(0)
    model = Transformer(shape, attention="sdpa").to(dtype=r.param_dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens, targets = random_batch(shape)
    training_step(model, optimizer, tokens, targets, r)  # creates the gradients and moments
    params = list(model.parameters())
    moments = [v for state in optimizer.state.values() for v in state.values()]
    before = _live_bytes(params + [p.grad for p in params] + moments)
    step = lambda: training_step(model, optimizer, tokens, targets, r)  # noqa: E731
    measured = before + peak_allocated_bytes(step)
    memory = training_memory(shape, recipe=r, optimizer="adamw", attention="sdpa")
    # autocast also keeps bf16 copies of the weights and fp32 LayerNorm inputs, which 2-byte
    # activations leave out (test_autocast_keeps_more_than_two_bytes_per_value): up to 10 % here
    tolerance = 0.12 if r.autocast_dtype is not None else 0.03
    assert measured == pytest.approx(memory.peak, rel=tolerance)
    assert memory.peak - memory.total == loss_buffer_bytes(
        shape, value_bytes=r.activation_bytes_per_value
    )


def test_autocast_keeps_more_than_two_bytes_per_value():
    """The 'bf16 autocast' recipe counts 2-byte activations; autocast (here on CPU) also keeps the
    residual stream in fp32 at every LayerNorm input, the log-probabilities in fp32, and a bf16 copy
    of every matmul weight for backward."""
    shape, model = TINY, _model(TINY)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        measured = _saved(model, shape)
    formula = model_activation_bytes(
        shape, value_bytes=RECIPES["bf16 autocast"].activation_bytes_per_value
    )
    h, f, layer_norms = shape.d_model, shape.d_ff, 2 * shape.n_layers + 1
    residual = layer_norms * shape.tokens * h * 2  # 4 bytes instead of 2
    log_probs = shape.tokens * shape.vocab_size * 2  # 4 bytes instead of 2
    weight_copies = 2 * (shape.n_layers * (4 * h * h + 2 * h * f) + shape.vocab_size * h)
    extra = residual + log_probs + weight_copies + _unmodelled(shape, layer_norms, 4, 4)
    assert formula < measured <= formula + extra


def test_korthikanti_formula_and_parallel_splits():
    shape = TransformerShape.gpt_like(d_model=4096, n_layers=32, n_heads=32, seq_len=4096)
    s, b, h, a = shape.seq_len, shape.batch_size, shape.d_model, shape.n_heads
    paper = s * b * h * (34 + 5 * a * s / h)
    assert activation_bytes(shape, dropout=True) == pytest.approx(paper, rel=1e-12)
    for t in (2, 8):
        tp = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
        assert activation_bytes(shape, t, dropout=True) == pytest.approx(tp, rel=1e-12)
        sp = activation_bytes(shape, t, sequence_parallel=True, dropout=True)
        assert sp == pytest.approx(paper / t, rel=1e-12)
        assert checkpointed_layer_bytes(shape, t, True) == 2 * s * b * h / t
    # fused attention: no probabilities, an fp32 log-sum-exp per head and token instead
    assert activation_bytes(shape, attention="sdpa") == s * b * (32 * h + 4 * a)
    with pytest.raises(ValueError, match="attention: 'flash'"):
        activation_bytes(shape, attention="flash")
    with pytest.raises(ValueError, match="tensor: 0"):
        activation_bytes(shape, 0)


# --------------------------------------------------------------------------- model state


def test_one_recipe_type_holds_the_dtypes_and_the_bytes():
    for name, recipe in RECIPES.items():
        assert recipe.name == name
        assert recipe.param_dtype.itemsize == recipe.weight_bytes, name
        if recipe.autocast_dtype is not None:  # autocast: fp32 weights, 16-bit matmuls
            assert recipe.param_dtype == torch.float32 and recipe.master_bytes == 0, name
            assert recipe.activation_bytes_per_value == recipe.autocast_dtype.itemsize, name
            formats = {torch.bfloat16: "bf16", torch.float16: "fp16"}
            assert recipe.compute_format == formats[recipe.autocast_dtype], name
    assert RECIPES["fp16 autocast + scaler"].loss_scaling
    assert not any(r.loss_scaling for n, r in RECIPES.items() if n != "fp16 autocast + scaler")
    with pytest.raises(
        ValueError, match="param_dtype torch.float32 takes 4 bytes, weight_bytes is 2"
    ):
        Recipe("lying", 2, 2, 0, 4, 2)
    with pytest.raises(ValueError, match="Invalid compute_format: 'int4'"):
        Recipe("odd", 4, 4, 0, 4, 4, "int4")
    with pytest.raises(ValueError, match="weights and activations need bytes"):
        Recipe("empty", 4, 4, 0, 4, 0)


def test_bytes_per_parameter_of_the_standard_recipes():
    adam = {name: bytes_per_parameter(name, "adam").total for name in RECIPES}
    assert adam == {
        "fp32": 16,
        "tf32": 16,
        "bf16 autocast": 16,
        "fp16 autocast + scaler": 16,
        "fp16 autocast, no scaler": 16,
        "bf16 + fp32 master": 16,
        "bf16 + fp32 master and gradients": 18,
        "bf16, fp32 moments": 12,
        "pure bf16": 8,
    }
    assert bytes_per_parameter("bf16 + fp32 master", "adamw") == MemoryBreakdown(2, 2, 4, 8, 0)
    assert bytes_per_parameter("fp32", "sgd").total == 8
    assert bytes_per_parameter("pure bf16", "muon").optimizer_state == 2
    fp8 = Recipe("fp8-example", 1, 2, 4, 4, 1.03125, "fp8", torch.float8_e4m3fn)  # block scales
    assert bytes_per_parameter(fp8, "adam").total == 15
    with pytest.raises(ValueError, match="Unknown optimizer: 'lamb'"):
        bytes_per_parameter("fp32", "lamb")
    with pytest.raises(ValueError, match="Unknown recipe: 'fp64'"):
        bytes_per_parameter("fp64", "adam")
    with pytest.raises(ValueError, match="gradient_bytes: -2"):
        Recipe("broken", 2, -2, 0, 4, 2)


def test_optimizer_state_agrees_with_the_measured_table():
    """The optimizers chapter measures state bytes on real optimizers; we predict them."""
    rows = {(r["optimizer"], r["configuration"]): r for r in state_bytes_table()}
    bf16_rows = {(r["optimizer"], r["configuration"]): r for r in state_bytes_table(torch.bfloat16)}
    same = {
        ("SGD", "momentum=0"): "sgd",
        ("SGD", "momentum=0.9"): "momentum",
        ("RMSprop", "default"): "rmsprop",
        ("Adam", "default"): "adam",
        ("AdamW", "default"): "adamw",
        ("Muon", "hidden weights only"): "muon",
    }
    for key, optimizer in same.items():
        for table, recipe in ((rows, "fp32"), (bf16_rows, "pure bf16")):
            predicted = bytes_per_parameter(recipe, optimizer).optimizer_state
            # measured adds Adam's and RMSprop's 4-byte step count per tensor: 0.001 B here
            assert table[key]["state_bytes_per_param"] == pytest.approx(predicted, abs=0.01), key
    assert set(same.values()) == set(OPTIMIZER_MOMENTS)


def test_zero_memory_is_the_same_arithmetic():
    n = parameter_count(TINY)
    for stage in range(4):
        zero = zero_memory(n, 8, stage)
        ours = training_memory(
            TINY, recipe="bf16 + fp32 master", optimizer="adam", zero_stage=stage, world_size=8
        )
        assert zero.total == pytest.approx(ours.total - ours.activations, rel=1e-12)
    assert zero_memory(7.5e9, 64, 0).total == 16 * 7.5e9
    with pytest.raises(ValueError, match="stage: 4"):
        zero_memory(1e9, 8, 4)
    with pytest.raises(ValueError, match="world_size: 0"):
        zero_memory(1e9, 0, 1)


def test_training_memory_by_part():
    shape = PRESET_SHAPES["llama2-7b"]
    n = parameter_count(shape)
    memory = training_memory(shape, recipe="bf16 + fp32 master", optimizer="adamw")
    assert (memory.parameters, memory.gradients, memory.master_weights) == (2 * n, 2 * n, 4 * n)
    assert memory.optimizer_state == 8 * n
    assert memory.activations == model_activation_bytes(shape, value_bytes=2)
    assert memory.total == 16 * n + memory.activations
    checkpointed = training_memory(
        shape, recipe="bf16 + fp32 master", optimizer="adamw", checkpointing=True
    )
    assert checkpointed.activations < memory.activations / 10
    sharded = training_memory(
        shape, recipe="bf16 + fp32 master", optimizer="adamw", zero_stage=3, world_size=8
    )
    assert sharded.total - sharded.activations == pytest.approx(16 * n / 8)
    custom = Recipe("fp32-by-hand", 4, 4, 0, 4, 4)
    assert training_memory(TINY, recipe=custom, optimizer="sgd") == training_memory(
        TINY, recipe="fp32", optimizer="sgd"
    )
    with pytest.raises(ValueError, match="Unknown optimizer: 'adafactor'"):
        training_memory(shape, recipe="fp32", optimizer="adafactor")
    with pytest.raises(ValueError, match="attention: 'flash'"):
        training_memory(shape, recipe="fp32", optimizer="adam", attention="flash")


# --------------------------------------------------------------------------- hardware, MFU


def test_gpu_table():
    h100 = gpu_spec("NVIDIA H100 80GB HBM3")
    assert h100 is GPUS["H100 SXM 80GB"]
    assert h100.peak_flops["bf16"] == 989.4e12 and h100.peak_flops["fp8"] == 1978.9e12
    assert (h100.sm_count, h100.hbm_bytes_per_s, h100.l2_bytes) == (132, 3.35e12, 50 * 1024**2)
    assert h100.ridge_intensity("bf16") == pytest.approx(295.3, abs=0.1)
    assert gpu_spec("NVIDIA H200") is GPUS["H200 SXM 141GB"]
    assert gpu_spec("NVIDIA A100-SXM4-80GB") is GPUS["A100 SXM 80GB"]
    assert gpu_spec("NVIDIA H200 NVL") is GPUS["H200 NVL 141GB"]  # not the SXM's row
    for other in ("NVIDIA H100 PCIe", "NVIDIA A100-SXM4-40GB", "NVIDIA B200", "cpu"):
        assert gpu_spec(other) is None, other
    assert gpu_spec("NVIDIA L4") is GPUS["L4 24GB"]
    assert gpu_spec("Tesla T4", capability=(7, 5)) is GPUS["T4 16GB"]
    assert gpu_spec("Tesla T4", capability=(8, 0)) is None  # the name and capability disagree
    for spec in GPUS.values():
        assert {"fp32", "fp16"} <= set(spec.peak_flops)
        if "bf16" in spec.peak_flops:
            # dense tensor cores; the L4 datasheet rounds (242 and 120 TFLOPS with sparsity)
            assert spec.peak_flops["bf16"] == pytest.approx(2 * spec.peak_flops["tf32"], rel=0.01)
        assert spec.shared_memory_per_block_bytes <= spec.shared_memory_per_sm_bytes
        assert spec.max_threads_per_sm // 32 * 32 == spec.max_threads_per_sm
    assert {"tf32", "bf16", "fp8"}.isdisjoint(GPUS["T4 16GB"].peak_flops)
    assert [
        GPUS[n].sm_target for n in ("H100 SXM 80GB", "A100 SXM 80GB", "L4 24GB", "T4 16GB")
    ] == [
        "sm_90",
        "sm_80",
        "sm_89",
        "sm_75",
    ]
    assert "fp8" not in GPUS["A100 SXM 80GB"].peak_flops
    with pytest.raises(ValueError, match="dtype for A100 SXM 80GB: 'fp8'"):
        GPUS["A100 SXM 80GB"].ridge_intensity("fp8")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_table_agrees_with_the_device():
    spec = gpu_for_device(torch.device("cuda"))
    if spec is None:
        pytest.skip(f"{torch.cuda.get_device_name()} is not in the table")
    properties = torch.cuda.get_device_properties(0)
    # the device's own figures replace the row's stand-ins where the datasheet is silent...
    device_figures = {"l2_bytes": getattr(properties, "L2_cache_size", None)}
    device_figures["sm_count"] = properties.multi_processor_count
    for name in spec.from_device:
        if device_figures.get(name):
            assert getattr(spec, name) == device_figures[name], name
    # ...and the table's own row (its stand-ins too, which records made without the device's
    # figures use) must agree with the device
    spec = GPUS[spec.name]
    assert (properties.major, properties.minor) == spec.compute_capability
    assert properties.shared_memory_per_block_optin == spec.shared_memory_per_block_bytes
    assert properties.regs_per_multiprocessor == spec.registers_per_sm
    assert properties.max_threads_per_multi_processor == spec.max_threads_per_sm
    assert properties.multi_processor_count == spec.sm_count
    assert 0.9 < properties.total_memory / spec.memory_bytes < 1.15
    if hasattr(properties, "L2_cache_size"):
        assert properties.L2_cache_size == spec.l2_bytes


def _cuda_record(device_name: str, gpu: dict | None = None):
    from trainfast.records import make_record

    record = make_record("demo", "A demo.", [{"a": 1}], device="cpu")
    record.environment.update(device="cuda", device_name=device_name, gpu=gpu)
    return record


def test_the_h200_rows_take_the_devices_figures_where_the_datasheet_is_silent():
    sxm, nvl = GPUS["H200 SXM 141GB"], GPUS["H200 NVL 141GB"]
    # PyTorch on the H200 SXM lent to the project: L2_cache_size=60MB (l2CacheSize // 2**20)
    assert sxm.l2_bytes == 60 * 2**20 and sxm.from_device == ("l2_bytes", "sm_count")
    assert (sxm.hbm_bytes_per_s, sxm.peak_flops["bf16"]) == (4.8e12, 989.4e12)
    assert nvl.hbm_bytes_per_s == 4.8e12 and nvl.peak_flops["bf16"] == 835.5e12  # 1,671 sparse
    assert nvl.ridge_intensity() < sxm.ridge_intensity() < GPUS["H100 SXM 80GB"].ridge_intensity()
    reported = {"l2_bytes": 61 * 2**20, "sm_count": 130, "hbm_bytes_per_s": 1.0, "name": "x"}
    spec = spec_for_record(_cuda_record("NVIDIA H200", {**reported, "compute_capability": [9, 0]}))
    assert (spec.l2_bytes, spec.sm_count) == (61 * 2**20, 130)  # the device's own figures
    assert (spec.hbm_bytes_per_s, spec.name) == (4.8e12, "H200 SXM 141GB")  # the datasheet's
    assert spec_for_record(_cuda_record("NVIDIA H200")) is sxm  # an old record: the row
    assert spec_for_record(_cuda_record("NVIDIA H200 NVL")) is nvl
    h100 = GPUS["H100 SXM 80GB"]
    assert with_device_properties(h100, reported) is h100  # the whitepaper gives all its figures
    cpu = _cuda_record("AMD EPYC")
    cpu.environment["device"] = "cpu"
    assert spec_for_record(cpu) is None


def test_a_gpu_without_a_row_gets_no_prediction_and_a_warning_naming_it(monkeypatch):
    with pytest.warns(UnlistedGPUWarning, match="NVIDIA B200 has no row in trainfast.gpus.GPUS"):
        assert spec_for_record(_cuda_record("NVIDIA B200")) is None
    with pytest.warns(UnlistedGPUWarning, match=r"NVIDIA H200 \(compute capability 8.0\)"):
        assert spec_for_record(_cuda_record("NVIDIA H200", {"compute_capability": [8, 0]})) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA B200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    with pytest.warns(UnlistedGPUWarning, match=r"NVIDIA B200 \(compute capability 10.0\)"):
        assert gpu_for_device("cuda") is None  # never another card's row


def test_each_datasheet_peak_is_cited_to_its_own_gpus_datasheet():
    from pathlib import Path

    bib = (Path(__file__).resolve().parents[1] / "book" / "references.bib").read_text()
    for spec in GPUS.values():
        if spec.citation:
            assert f"{{{spec.citation}," in bib, spec.name
    assert GPUS["H100 SXM 80GB"].citation == "nvidia2022h100"
    peak = datasheet_peak(GPUS["H200 SXM 141GB"])
    assert (peak.value, peak.unit, peak.citation) == (989.4, "TFLOP/s", "nvidia2024h200")
    assert "H200 SXM 141GB" in peak.source
    with pytest.raises(ValueError, match="'fp8'"):
        datasheet_peak(GPUS["A100 SXM 80GB"], "fp8")


def test_mfu_and_run_time():
    assert model_flops_utilization(4e14, 1.0, 1e15) == pytest.approx(0.4)
    shape = PRESET_SHAPES["llama2-7b"]
    per_token = training_flops(shape) / shape.tokens
    seconds = training_run_seconds(per_token, 2e12, n_gpus=1024, peak_flops=989.4e12, mfu=0.4)
    assert seconds == pytest.approx(per_token * 2e12 / (1024 * 989.4e12 * 0.4))
    assert 1 < seconds / 86_400 < 3  # 2T tokens of a 7B model: days on a thousand H100s
    with pytest.raises(ValueError, match="mfu: 1.5"):
        training_run_seconds(1.0, 1.0, n_gpus=1, peak_flops=1.0, mfu=1.5)
    with pytest.raises(ValueError, match="n_gpus: 0"):
        training_run_seconds(1.0, 1.0, n_gpus=0, peak_flops=1.0, mfu=0.5)
    with pytest.raises(ValueError, match="seconds_per_step: 0"):
        model_flops_utilization(1.0, 0, 1.0)
    with pytest.raises(ValueError, match="peak_flops: nan"):
        model_flops_utilization(1.0, 1.0, math.nan)


# --------------------------------------------------------------------------- the transformer


def test_manual_and_sdpa_attention_give_the_same_numbers():
    shape = SHAPES[1]
    manual, fused = _model(shape), _model(shape, attention="sdpa")
    fused.load_state_dict(manual.state_dict())
    tokens, targets = random_batch(shape, seed=3)
    losses = [model.loss(tokens, targets) for model in (manual, fused)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    for (name, a), b in zip(manual.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_checkpointing_gives_the_same_gradients():
    shape = TINY
    plain, checkpointed = _model(shape), _model(shape, checkpointing=True)
    tokens, targets = random_batch(shape)
    for model in (plain, checkpointed):
        model.loss(tokens, targets).backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


def test_transformer_basics():
    shape = TINY
    model = _model(shape, dropout=0.1)
    tokens, targets = random_batch(shape)
    assert tokens.shape == targets.shape == (shape.batch_size, shape.seq_len)
    assert torch.equal(tokens[:, 1:], targets[:, :-1])  # targets are the next tokens
    assert model(tokens).shape == (shape.batch_size, shape.seq_len, shape.vocab_size)
    assert model(tokens[:, :5]).shape == (shape.batch_size, 5, shape.vocab_size)
    assert model.lm_head.weight is model.token_embedding.weight
    model.eval()
    with torch.no_grad():  # a random model is near uniform: loss about log(vocab)
        assert abs(model.loss(tokens, targets).item() - math.log(shape.vocab_size)) < 0.1
        # causal: the logits of position i do not depend on later tokens
        changed = tokens.clone()
        changed[:, -1] = (changed[:, -1] + 1) % shape.vocab_size
        torch.testing.assert_close(model(tokens)[:, :-1], model(changed)[:, :-1])
    with pytest.raises(ValueError, match="sequence length: 17"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="attention: 'flash'"):
        Transformer(shape, attention="flash")
    with pytest.raises(ValueError, match="dropout: 1.0"):
        Transformer(shape, dropout=1.0)
    assert dataclasses.replace(shape, batch_size=4).tokens == 4 * shape.seq_len


# --------------------------------------------------------------------------- the drawing


def test_memory_calculator_drawing(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shape = PRESET_SHAPES["llama2-7b"]
    bars = {name: training_memory(shape, recipe=name, optimizer="adamw") for name in RECIPES}
    bars["bf16 + fp32 master\n+ checkpointing"] = training_memory(
        shape, recipe="bf16 + fp32 master", optimizer="adamw", checkpointing=True
    )
    bars["bf16 + fp32 master\n+ ZeRO-3 on 8"] = training_memory(
        shape,
        recipe="bf16 + fp32 master",
        optimizer="adamw",
        checkpointing=True,
        zero_stage=3,
        world_size=8,
    )
    fig, ax = plot_memory(
        bars,
        title="Llama-2-7B-like, one 4,096-token sequence, AdamW",
        xlabel="precision recipe and memory savings",
        device=GPUS["H100 SXM 80GB"],
    )
    path = tmp_path / "memory.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    assert path.stat().st_size > 10_000
    assert ax.get_title() and "GB" in ax.get_ylabel() and ax.get_xlabel()
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert legend == [
        "H100 SXM 80GB: 80 GB",
        "parameters",
        "gradients",
        "master weights",
        "optimizer state",
        "activations",
    ]
    # each bar's stacked parts reach its total
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    for x, breakdown in enumerate(bars.values()):
        assert tops[x] == pytest.approx(breakdown.total / 1e9)
    # ZeRO's model state has no master weights or activations: those parts are left out
    fig, ax = plot_memory({f"stage {k}": zero_memory(7.5e9, 64, k) for k in range(4)})
    assert len(ax.get_legend().get_texts()) == 3
    plt.close(fig)
    with pytest.raises(ValueError, match="breakdowns is empty"):
        plot_memory({})


def test_matmul_parameter_count_is_the_n_of_six_n_d():
    from trainfast.accounting import matmul_parameter_count, training_flops
    from trainfast.transformer import PRESET_SHAPES

    for shape in PRESET_SHAPES.values():
        attention = 12 * shape.n_layers * shape.seq_len * shape.d_model * shape.tokens
        assert training_flops(shape) == 6 * matmul_parameter_count(shape) * shape.tokens + attention


def test_check_positive_names_the_value():
    from trainfast.validation import check_positive, check_positive_number

    check_positive("n_gpus", 8)
    check_positive_number("tokens", 0.5)
    for bad in (0, -1, 1.0, True, "8"):
        with pytest.raises(ValueError, match=rf"Invalid n_gpus: {bad!r} \(expected a positive"):
            check_positive("n_gpus", bad)
    for bad in (0, -2.5, float("inf"), float("nan"), False):
        with pytest.raises(ValueError, match="Invalid tokens: .* positive number"):
            check_positive_number("tokens", bad)


def _mfu_computations() -> list[tuple[str, int, bool]]:
    """Every place in the package that computes an MFU: an assignment to a name, attribute or
    key that says ``mfu``, and a function or property named ``mfu``; with whether it calls
    :func:`trainfast.utilization.model_flops_utilization`."""
    import ast
    from pathlib import Path

    import trainfast

    def says_mfu(node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return "mfu" in node.id.lower()
        if isinstance(node, ast.Attribute):
            return "mfu" in node.attr.lower()
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            return "mfu" in str(node.slice.value).lower()
        return False

    def calls_the_function(node: ast.AST) -> bool:
        return any(
            isinstance(call, ast.Call)
            and getattr(call.func, "id", getattr(call.func, "attr", None))
            == "model_flops_utilization"
            for call in ast.walk(node)
        )

    found = []
    root = Path(trainfast.__file__).parent
    for path in sorted(root.rglob("*.py")):
        if path.name == "utilization.py":  # the function itself
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.lower() in ("mfu", "hfu"):
                value: ast.AST | None = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value if any(says_mfu(t) for t in targets) else None
            else:
                value = None
            if value is not None and not (
                isinstance(value, ast.Constant) or "assumed" in ast.unparse(node)
            ):
                found.append((f"{path.relative_to(root)}:{node.lineno}", calls_the_function(value)))
    return found


def test_every_mfu_in_the_package_goes_through_one_function():
    found = _mfu_computations()
    assert len(found) >= 3, found  # step_time's mfu and hfu, the precision benchmark's row
    assert [place for place, ok in found if not ok] == []


def test_mfu_peak_is_the_dense_bf16_peak():
    from trainfast.utilization import mfu_peak_flops

    for spec in GPUS.values():
        expected = spec.peak_flops.get("bf16", spec.peak_flops.get("fp16"))
        assert mfu_peak_flops(spec, 8) == 8 * expected, spec.name
    assert mfu_peak_flops(GPUS["H100 SXM 80GB"]) == GPUS["H100 SXM 80GB"].peak_flops["bf16"]
    with pytest.raises(ValueError, match="Invalid n_devices: 0"):
        mfu_peak_flops(GPUS["H100 SXM 80GB"], 0)


def test_memory_drawing_labels_never_overlap():
    """Five long labels in a 7.5-inch figure overlapped side by side (the accounting page's
    figure on a phone); plot_memory slants them when they would."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    memory = training_memory(PRESET_SHAPES["gpt2-small"], recipe="fp32", optimizer="adamw")
    labels = [
        "fp32, Adam",
        "bf16 mixed, Adam",
        "bf16 mixed, Adam, checkpointing",
        "bf16 mixed, SGD",
        "bf16 mixed, Adam, SDPA",
    ]
    fig, ax = plot_memory({label: memory for label in labels})
    boxes = [text.get_window_extent() for text in ax.get_xticklabels()]
    assert all(left.x1 <= right.x0 for left, right in zip(boxes[:-1], boxes[1:], strict=True))
    plt.close(fig)
    # two short labels need no slant
    fig, ax = plot_memory({"fp32": memory, "bf16": memory})
    assert all(text.get_rotation() == 0 for text in ax.get_xticklabels())
    plt.close(fig)
