"""The mixed-precision chapter: formats against torch.finfo, our GradScaler step for step against
torch's, recipes, FP8, numerics, exercise checks, and the chapter itself."""

from __future__ import annotations

import math
import warnings

import chapters
import pytest
import torch
from torch import nn
from trainfast import optim as ours
from trainfast.precision import (
    FORMAT_NAMES,
    GradScaler,
    autocast_policy,
    constant_loss_scale,
    decompose,
    float_format,
    fp8_matmul,
    from_fp8,
    matmul_error,
    representable_values,
    round_mantissa,
    round_to_tf32,
    running_sum,
    softmax_naive,
    softmax_stable,
    to_fp8,
    train_recipe,
    updated_scale,
)
from trainfast.precision import exercises as ex

torch.set_num_threads(1)

# --- formats -----------------------------------------------------------------------------------

WITH_DTYPE = [name for name in FORMAT_NAMES if float_format(name).dtype is not None]


@pytest.mark.parametrize("name", WITH_DTYPE)
def test_every_format_property_matches_torch_finfo(name):
    fmt = float_format(name)
    info = torch.finfo(fmt.dtype)
    assert fmt.bits == info.bits
    assert fmt.max == info.max
    assert fmt.min_normal == info.smallest_normal == info.tiny
    assert fmt.eps == info.eps
    # finfo has no subnormal minimum: it is the bit pattern 0...01, and half of it rounds to 0
    one = torch.tensor([1], dtype={8: torch.uint8, 16: torch.int16, 32: torch.int32}[fmt.bits])
    assert one.view(fmt.dtype).item() == fmt.min_subnormal
    assert torch.tensor(fmt.min_subnormal / 2).to(fmt.dtype).item() == 0.0
    assert torch.tensor(fmt.min_subnormal).to(fmt.dtype).item() == fmt.min_subnormal
    # the bias is the stored exponent of 1.0
    # (built in float32 and converted: torch 2.4 has no float8 fill kernel on CPU)
    _, exponent, _ = decompose(torch.ones(1).to(fmt.dtype))
    assert exponent.item() == fmt.bias


def test_float_format_accepts_dtypes_names_and_aliases_and_rejects_others():
    assert float_format(torch.bfloat16) is float_format("bf16") is float_format("torch.bfloat16")
    assert float_format("e4m3").name == "float8_e4m3fn"
    assert float_format("tf32").dtype is None
    with pytest.raises(ValueError, match="'fp12'.*float32, tf32, float16"):
        float_format("fp12")
    with pytest.raises(ValueError, match="torch.int32"):
        float_format(torch.int32)


def test_tf32_rounding_keeps_10_mantissa_bits_with_ties_to_even_and_its_limits():
    tf32 = float_format("tf32")
    x = torch.tensor(
        [1 + 2.0**-10, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-11 + 2.0**-20, -(1 + 2.0**-11)]
    )
    expected = torch.tensor([1 + 2.0**-10, 1.0, 1 + 2.0**-9, 1 + 2.0**-10, -1.0])
    assert torch.equal(round_to_tf32(x), expected)
    assert round_to_tf32(torch.tensor(tf32.max)).item() == tf32.max
    assert (
        round_to_tf32(torch.tensor(torch.finfo(torch.float32).max)).item() == math.inf
    )  # rounds up
    assert round_to_tf32(torch.tensor(tf32.min_subnormal)).item() == tf32.min_subnormal
    assert round_to_tf32(torch.tensor(tf32.min_subnormal / 2)).item() == 0.0  # a tie: to even, 0
    assert tf32.eps == 2.0**-10 and tf32.max == (2 - 2.0**-10) * 2.0**127
    values = torch.randn(10_000) * torch.exp2(torch.randint(-120, 120, (10_000,)).float())
    values = values[values.abs() >= tf32.min_normal]  # subnormals have a fixed spacing: cases above
    bits = round_to_tf32(values).view(torch.int32)
    assert torch.all(bits & 0x1FFF == 0), "the 13 dropped mantissa bits must be zero"
    # nearest: no other TF32 value is closer than the chosen one
    error = (round_to_tf32(values).double() - values.double()).abs()
    ulp = torch.exp2(torch.floor(torch.log2(values.abs().double())) - 10)
    assert torch.all(error <= ulp / 2 * (1 + 1e-12))


def test_round_mantissa_with_7_bits_is_torch_bfloat16_rounding_bit_for_bit():
    x = torch.randn(200_000) * torch.exp2(torch.randint(-140, 128, (200_000,)).float())
    ties = torch.tensor([1 + 2.0**-8, 1 + 3 * 2.0**-8, 2.0**-130 + 2.0**-140])
    x = torch.cat([x, ties, torch.tensor([0.0, -0.0, math.inf, -math.inf, 3.39e38, 3.4e38])])
    assert torch.equal(round_mantissa(x, 7), x.bfloat16().float())
    nan = round_mantissa(torch.tensor([math.nan]), 10)
    assert torch.isnan(nan).all()
    with pytest.raises(ValueError, match="float64"):
        round_mantissa(torch.ones(2, dtype=torch.float64), 7)
    with pytest.raises(ValueError, match="mantissa_bits: 24"):
        round_mantissa(torch.ones(2), 24)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ],
)
def test_decompose_fields_rebuild_every_value(dtype):
    wide = torch.randn(500) * 4
    converted = wide.to(dtype).float()  # selected before converting: torch 2.4 cannot index float8
    x = wide[torch.isfinite(converted) & (converted != 0)].to(dtype)
    sign, exponent, mantissa = decompose(x)
    if dtype == torch.float64:
        bias, m = 1023, 52
    else:
        bias, m = float_format(dtype).bias, float_format(dtype).mantissa_bits
    normal = exponent > 0
    lead = normal.double()
    value = (
        (-1.0) ** sign.double()
        * torch.exp2(torch.clamp(exponent, min=1).double() - bias)
        * (lead + mantissa.double() / 2**m)
    )
    assert torch.equal(value, x.double())
    assert decompose(torch.tensor([-0.0]))[0].item() == 1


def test_representable_values_counts_and_matches_casting():
    assert len(representable_values("e4m3", 1, 2)) == 8
    assert len(representable_values("e5m2", 1, 2)) == 4
    assert len(representable_values(torch.float16, 1, 2)) == 1024
    assert representable_values("e4m3", 1, 500)[-1] == 448.0
    for name in ("e4m3", "e5m2"):
        values = torch.tensor(representable_values(name, 1e-4, 1e5))
        assert torch.equal(values.to(float_format(name).dtype).float(), values.float())
    with pytest.raises(ValueError, match="low=2"):
        representable_values("e4m3", 2, 1)


def test_representable_values_of_a_subnormal_binade_match_the_256_bytes_of_e4m3():
    """The comb figure's caption: e4m3's subnormal binades hold 1, 2 and 4 values, its normal
    ones 8 (the top one 7). A range entirely below the smallest normal once returned nothing."""
    every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    positive = every[torch.isfinite(every) & (every > 0)]
    counts = []
    for k in range(-10, 9):
        low, high = 2.0**k, 2.0 ** (k + 1)
        counts.append(len(representable_values("e4m3", low, high)))
        assert counts[-1] == int(((positive >= low) & (positive < high)).sum()), k
    assert counts[:5] == [0, 1, 2, 4, 8] and set(counts[5:-1]) == {8}
    assert counts[-1] == 7  # [256, 512): its eighth pattern, 0x7f, is NaN


# --- GradScaler against torch.amp.GradScaler ---------------------------------------------------


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _groups(model: nn.Module, split: bool) -> list:
    if not split:
        return list(model.parameters())
    return [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.05}]


OPTIMIZERS = {
    "trainfast SGD single": lambda p: ours.SGD(p, lr=0.1, momentum=0.9, foreach=False),
    "trainfast SGD foreach": lambda p: ours.SGD(p, lr=0.1, momentum=0.9, foreach=True),
    "trainfast AdamW single": lambda p: ours.AdamW(p, lr=1e-2, foreach=False),
    "trainfast AdamW foreach": lambda p: ours.AdamW(p, lr=1e-2, foreach=True),
    "torch SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "torch AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2),
}


def _run(
    scaler_class,
    make_optimizer,
    *,
    split: bool,
    clip: bool,
    poison: dict[int, float],
    steps: int = 24,
    **settings,
):
    model = _model()
    optimizer = make_optimizer(_groups(model, split))
    scaler = scaler_class("cpu", **settings)
    generator = torch.Generator().manual_seed(1)
    scales, stepped = [], []
    calls = {"n": 0}
    original_step = optimizer.step

    def counting_step(*args, **kwargs):
        calls["n"] += 1
        return original_step(*args, **kwargs)

    optimizer.step = counting_step
    for step in range(steps):
        x = torch.randn(32, 8, generator=generator)
        y = torch.randn(32, 4, generator=generator)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        if step in poison:  # an inf or NaN, as an overflow would produce
            model[2].weight.grad[0, 0] = poison[step]
        if clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        before = calls["n"]
        scaler.step(optimizer)
        stepped.append(calls["n"] > before)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales, stepped, [p.detach().clone() for p in model.parameters()], scaler.state_dict()


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize(("split", "clip"), [(False, False), (True, True)])
def test_our_scaler_matches_torch_step_for_step(optimizer, split, clip):
    # 2^20 overflows fp16 in the first steps and again after some growths: real skips, plus
    # injected ones; growth_interval=3 makes the scale grow several times in 24 steps
    settings = dict(init_scale=2.0**20, growth_interval=3)
    poison = {12: math.inf, 17: math.nan}
    mine = _run(
        GradScaler, OPTIMIZERS[optimizer], split=split, clip=clip, poison=poison, **settings
    )
    theirs = _run(
        torch.amp.GradScaler,
        OPTIMIZERS[optimizer],
        split=split,
        clip=clip,
        poison=poison,
        **settings,
    )
    assert mine[0] == theirs[0], "scale trajectory"
    assert mine[1] == theirs[1], "which steps were skipped"
    skips = mine[1].count(False)
    growths = sum(b > a for a, b in zip(mine[0], mine[0][1:], strict=False))
    assert skips >= 5 and growths >= 3, (
        f"the run must exercise both rules ({skips} skips, {growths} growths)"
    )
    for a, b in zip(mine[2], theirs[2], strict=True):
        assert torch.equal(a, b), "final parameters"
    assert mine[3] == theirs[3], "state_dict"


def test_updated_scale_grows_after_the_interval_and_never_to_infinity():
    assert updated_scale(4.0, 0, True, growth_factor=2, backoff_factor=0.5, growth_interval=2) == (
        2.0,
        0,
    )
    assert updated_scale(4.0, 0, False, growth_factor=2, backoff_factor=0.5, growth_interval=2) == (
        4.0,
        1,
    )
    assert updated_scale(4.0, 1, False, growth_factor=2, backoff_factor=0.5, growth_interval=2) == (
        8.0,
        0,
    )
    big = float(torch.finfo(torch.float32).max)
    assert updated_scale(big, 0, False, growth_factor=2, backoff_factor=0.5, growth_interval=1) == (
        big,
        0,
    )


def test_constant_loss_scale_is_the_largest_power_of_two_that_keeps_the_max_in_float16():
    # by hand: 65504 / 1 lies in [2^15, 2^16); a margin of 1 halves it; e4m3's 448 gives 2^8
    assert constant_loss_scale(1.0) == 2.0**15
    assert constant_loss_scale(1.0, margin=1) == 2.0**14
    assert constant_loss_scale(2.0**-10) == 2.0**25
    assert constant_loss_scale(1.0, fmt_max=448.0) == 2.0**8
    assert constant_loss_scale(1e5) == 0.5  # a gradient beyond float16's range scales down
    # the bound is inclusive: a product of exactly 65504 is float16's largest value
    assert constant_loss_scale(65504.0 / 2**20) == 2.0**20
    # one ulp above it, floor(log2(65504 / g)) computed in floating point is still 20 (the
    # quotient rounds to 2^20): the exact rule must step down to 2^19
    above = math.nextafter(65504.0 / 2**20, math.inf)
    assert math.floor(math.log2(65504.0 / above)) == 20
    assert constant_loss_scale(above) == 2.0**19
    generator = torch.Generator().manual_seed(0)
    magnitudes = torch.exp2(
        torch.empty(2000, dtype=torch.float64).uniform_(-40, 10, generator=generator)
    )
    for g in magnitudes.tolist():
        for margin in (0, 2):
            scale = constant_loss_scale(g, margin=margin)
            assert math.frexp(scale)[0] == 0.5, f"{scale} is not a power of two"
            assert g * scale * 2**margin <= 65504.0 < g * 2 * scale * 2**margin, (g, margin)
            # the scaled maximum survives the cast to float16
            assert math.isfinite(torch.tensor(g * scale, dtype=torch.float32).half().item())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"grad_abs_max": 0.0}, "grad_abs_max: 0.0"),
        ({"grad_abs_max": -1.0}, "grad_abs_max: -1.0"),
        ({"grad_abs_max": math.inf}, "grad_abs_max: inf"),
        ({"grad_abs_max": math.nan}, "grad_abs_max: nan"),
        ({"grad_abs_max": "1e-3"}, "grad_abs_max: '1e-3'"),
        ({"grad_abs_max": 1e-40}, r"grad_abs_max: 1e-40 .*needs 2\*\*148,"),  # 2^148: not float32
        ({"grad_abs_max": 1.0, "fmt_max": 0.0}, "fmt_max: 0.0"),
        ({"grad_abs_max": 1.0, "margin": -1}, "margin: -1"),
        ({"grad_abs_max": 1.0, "margin": 1.5}, "margin: 1.5"),
    ],
)
def test_constant_loss_scale_refuses_bad_input_naming_the_value(arguments, message):
    with pytest.raises(ValueError, match=message):
        constant_loss_scale(**arguments)


def test_unscaling_twice_or_after_step_and_stepping_twice_raise_runtime_error():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu")
    scaler.scale(model(torch.randn(2, 8)).sum()).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.update()
        scaler.step(optimizer, closure=lambda: None)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"init_scale": 0.0}, "init_scale: 0.0"),
        ({"init_scale": -1.0}, "init_scale: -1.0"),
        ({"growth_factor": 1.0}, "growth_factor: 1.0"),
        ({"backoff_factor": 1.0}, "backoff_factor: 1.0"),
        ({"backoff_factor": 0.0}, "backoff_factor: 0.0"),
        ({"growth_interval": 0}, "growth_interval: 0"),
    ],
)
def test_invalid_scaler_arguments_raise_value_error_naming_the_value(settings, message):
    with pytest.raises(ValueError, match=message):
        GradScaler("cpu", **settings)


def test_state_dict_round_trips_and_loads_torchs_and_disabled_scaler_passes_through():
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    scaler = GradScaler("cpu")
    scaler.load_state_dict(torch_scaler.state_dict())
    assert scaler.state_dict() == torch_scaler.state_dict()
    with pytest.raises(RuntimeError, match="empty"):
        scaler.load_state_dict({})
    off = GradScaler("cpu", enabled=False)
    loss = torch.tensor(3.0)
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and off.state_dict() == {}
    assert not off.is_enabled()
    with pytest.warns(UserWarning, match="CUDA is not available"):
        if not torch.cuda.is_available():
            assert not GradScaler("cuda").is_enabled()
        else:
            warnings.warn(
                "CUDA is not available (placeholder: a GPU is present)", UserWarning, stacklevel=1
            )


def test_scale_multiplies_by_the_python_scale_as_torch_does_and_never_synchronises():
    """The docstring's "scale() reads nothing from the device": no tensor is copied to it."""
    loss = torch.tensor(3.0, requires_grad=True)
    ours, theirs = GradScaler("cpu", init_scale=1024.0), torch.amp.GradScaler("cpu", 1024.0)
    assert torch.equal(ours.scale(loss), theirs.scale(loss))
    assert [t.item() for t in ours.scale([loss, loss])] == [3072.0, 3072.0]
    if torch.cuda.is_available():  # a host-to-device copy of the scale would synchronise
        loss = torch.ones((), device="cuda", requires_grad=True)
        torch.cuda.set_sync_debug_mode("error")
        try:
            scaled = GradScaler("cuda", init_scale=1024.0).scale(loss)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert scaled.item() == 1024.0


def test_fp16_gradients_are_refused_as_in_torch():
    weight = nn.Parameter(torch.ones(3, dtype=torch.float16))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = GradScaler("cpu")
    scaler.scale(weight.float().sum()).backward()
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.unscale_(optimizer)


# --- recipes -----------------------------------------------------------------------------------


def _digits():
    from trainfast.datasets import digits

    return digits("train").tensors


def test_fp16_without_a_scaler_loses_its_gradients_and_the_scaler_keeps_them():
    x, y = _digits()
    adam = lambda p: torch.optim.Adam(p, lr=3e-3, eps=1e-12)  # noqa: E731
    runs = {
        name: train_recipe(name, x, y, adam, steps=20, loss_divisor=2.0**16)
        for name in ("fp32", "fp16 autocast + scaler", "fp16 autocast, no scaler")
    }
    assert min(runs["fp16 autocast, no scaler"].zero_gradients[1:]) > 0.5
    assert max(runs["fp16 autocast + scaler"].zero_gradients) < 0.2
    assert runs["fp16 autocast + scaler"].losses[-1] == pytest.approx(
        runs["fp32"].losses[-1], rel=0.02
    )
    no_scaler, fp32 = runs["fp16 autocast, no scaler"].losses, runs["fp32"].losses
    assert fp32[-1] < fp32[0] - 0.5 and no_scaler[-1] > no_scaler[0] - 0.1  # it barely moves


def test_pure_bf16_rounds_away_updates_that_master_weights_keep():
    x, y = _digits()
    sgd = lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)  # noqa: E731
    master = train_recipe("bf16 autocast", x, y, sgd, steps=10)
    pure = train_recipe("pure bf16", x, y, sgd, steps=10)
    assert max(master.lost_updates) < 0.01  # float32 rounds away only the tiniest updates
    assert min(pure.lost_updates) > 0.3
    with pytest.raises(ValueError, match="Invalid steps: 0"):
        train_recipe("fp32", x, y, sgd, steps=0)


def test_training_step_refuses_recipes_it_cannot_run_as_stated():
    from trainfast.precision import FP8_RECIPES

    x, y = _digits()
    sgd = lambda p: torch.optim.SGD(p, lr=0.01)  # noqa: E731
    with pytest.raises(ValueError, match="'bf16 \\+ fp32 master' \\(master_bytes=4"):
        train_recipe("bf16 + fp32 master", x, y, sgd, steps=1)
    with pytest.raises(ValueError, match="'DeepSeek-V3'.*compute_format='fp8'"):
        train_recipe(FP8_RECIPES["DeepSeek-V3"], x, y, sgd, steps=1)
    assert len(train_recipe("bf16, fp32 moments", x, y, sgd, steps=2).losses) == 2
    assert len(train_recipe("tf32", x, y, sgd, steps=2).losses) == 2  # TF32: no effect on CPU


def test_a_tf32_step_runs_its_backward_matmuls_in_tf32_too():
    """The H100's first record timed the "tf32" recipe 1.28x fp32 against 7.6x for its matmuls:
    the step set TF32 around the forward only, and backward (two thirds of the FLOPs) ran in
    IEEE float32. The setting is a global flag, so CPU can check what backward sees."""
    from trainfast.precision.recipes import training_step
    from trainfast.precision.tf32 import has_fp32_precision_api
    from trainfast.recipes import RECIPES

    def tf32_on() -> bool:
        matmul = torch.backends.cuda.matmul
        return matmul.fp32_precision == "tf32" if has_fp32_precision_api() else matmul.allow_tf32

    seen: list[tuple[str, bool]] = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("forward", tf32_on()))
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen.append(("backward", tf32_on()))
            return grad

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, x):
            return Spy.apply(self.linear(x))

    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    for name, expected in (("tf32", True), ("fp32", False)):
        seen.clear()
        training_step(model, optimizer, inputs, targets, RECIPES[name])
        assert seen == [("forward", expected), ("backward", expected)], name
    assert not tf32_on()  # restored after the step


# --- FP8 and numerics ---------------------------------------------------------------------------


def test_fp8_per_tensor_scaling_maps_amax_to_the_largest_value_and_round_trips():
    x = torch.randn(1000) * 1e-3
    x8, scale = to_fp8(x)
    assert x8.dtype == torch.float8_e4m3fn and x8.float().abs().max().item() == 448.0
    assert torch.allclose(from_fp8(x8, scale), x, rtol=2.0**-4, atol=x.abs().max().item() * 2.0**-9)
    zeros8, zero_scale = to_fp8(torch.zeros(4))
    assert zero_scale.item() == 1.0 and not torch.isnan(zeros8.float()).any()
    with pytest.raises(ValueError, match="Unsupported FP8 dtype"):
        to_fp8(x, torch.float16)


def test_fp8_matmul_emulation_equals_torch_scaled_mm_on_this_device():
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    ours_out = fp8_matmul(a, b, out_dtype=torch.float32)
    a8, sa = to_fp8(a)
    b8, sb = to_fp8(b)
    try:
        theirs = torch._scaled_mm(
            a8,
            b8.t().contiguous().t(),
            scale_a=sa.reciprocal(),
            scale_b=sb.reciprocal(),
            out_dtype=torch.float32,
        )
    except (RuntimeError, NotImplementedError) as error:
        pytest.skip(f"torch._scaled_mm does not run on this CPU build: {error}")
    theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    assert torch.allclose(ours_out, theirs, rtol=1e-5, atol=1e-4)
    exact = a @ b
    assert (ours_out - exact).norm() / exact.norm() < 0.08  # e4m3's 3 mantissa bits
    with pytest.raises(ValueError, match="\\(M, K\\) @ \\(K, N\\)"):
        fp8_matmul(a, a)


def test_scaled_matmul_equals_the_emulated_fp8_product_with_either_accumulation_flag():
    from trainfast.precision import scaled_matmul

    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 64, generator=generator), torch.randn(64, 48, generator=generator)
    a8, sa = to_fp8(a)
    b8, sb = to_fp8(b)
    emulated = fp8_matmul(a, b, out_dtype=torch.float32)  # CPU: the emulation
    for fast in (False, True):
        try:
            out = scaled_matmul(
                a8,
                b8.t().contiguous().t(),
                sa.reciprocal(),
                sb.reciprocal(),
                out_dtype=torch.float32,
                use_fast_accum=fast,
            )
        except (RuntimeError, NotImplementedError) as error:
            pytest.skip(f"the scaled matmul does not run on this CPU build: {error}")
        torch.testing.assert_close(out, emulated, rtol=1e-5, atol=1e-4)


def test_tf32_matmuls_sets_the_installed_api_and_restores_it():
    from trainfast.precision import tf32_matmuls
    from trainfast.precision.tf32 import has_fp32_precision_api

    matmul = torch.backends.cuda.matmul
    attribute = "fp32_precision" if has_fp32_precision_api() else "allow_tf32"
    before = getattr(matmul, attribute)
    with tf32_matmuls(True):
        assert getattr(matmul, attribute) in ("tf32", True)
    with tf32_matmuls(False):
        assert getattr(matmul, attribute) in ("ieee", False)
    assert getattr(matmul, attribute) == before
    torch.get_float32_matmul_precision()  # the legacy reader still works: nothing was mixed


def test_tf32_matmuls_falls_back_to_allow_tf32_on_an_older_torch(monkeypatch):
    import trainfast.precision.tf32 as tf32

    matmul = torch.backends.cuda.matmul
    new_api_state = matmul.fp32_precision if tf32.has_fp32_precision_api() else None
    monkeypatch.setattr(tf32, "has_fp32_precision_api", lambda: False)
    try:
        before = matmul.allow_tf32
        with tf32.tf32_matmuls(True):
            assert matmul.allow_tf32 is True
        assert matmul.allow_tf32 == before
    finally:
        if new_api_state is not None:
            matmul.fp32_precision = new_api_state  # the legacy setter also set the new state
    torch.get_float32_matmul_precision()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp8_benchmark_variants_and_fast_accumulation_on_a_gpu():
    from trainfast.precision import has_fp8_tensor_cores, scaled_matmul
    from trainfast.precision.benchmarks import FP8_VARIANTS, matmul_throughput

    device = torch.device("cuda")
    if not has_fp8_tensor_cores(device):
        pytest.skip("needs FP8 tensor cores (compute capability 8.9+)")
    rows = matmul_throughput([("square 256", 256, 256, 256)], list(FP8_VARIANTS), device, repeats=2)
    assert [row["dtype"] for row in rows] == list(FP8_VARIANTS)
    a, b = torch.randn(256, 512, device="cuda"), torch.randn(512, 128, device="cuda")
    a8, sa = to_fp8(a)
    b8, sb = to_fp8(b)
    exact = a @ b
    for fast in (False, True):
        out = scaled_matmul(
            a8,
            b8.t().contiguous().t(),
            sa.reciprocal(),
            sb.reciprocal(),
            out_dtype=torch.float32,
            use_fast_accum=fast,
        )
        assert ((out - exact).norm() / exact.norm()).item() < 0.08


def test_delayed_scaling_uses_the_history_before_the_tensor_and_saturates_on_a_jump():
    from trainfast.precision import DelayedScaling, fp8_scale

    generator = torch.Generator().manual_seed(0)
    steps = [torch.randn(256, generator=generator) * size for size in (1.0, 2.0, 0.5, 0.5, 100.0)]
    delayed = DelayedScaling(history_len=2)
    scales = []
    for x in steps:
        x8, scale = delayed.quantize(x)
        scales.append(float(scale))
        assert not torch.isnan(x8.float()).any()
    amaxes = [float(x.abs().max()) for x in steps]
    assert scales[0] == 1.0  # empty history
    expected = [float(fp8_scale(torch.tensor(max(amaxes[max(0, i - 2) : i])))) for i in range(1, 5)]
    assert scales[1:] == pytest.approx(expected, rel=1e-6)  # max over the last two amaxes
    assert float(delayed.scale) == pytest.approx(448.0 / amaxes[-1], rel=1e-6)  # the jump, recorded
    stale = DelayedScaling(history_len=1)
    stale.amax_history = [amaxes[2]]  # last step's amax, 200 times smaller than this step's
    x8, _ = stale.quantize(steps[4])
    assert (x8.float().abs() == 448.0).float().mean() > 0.5  # the jump saturates most values
    current, current_scale = to_fp8(steps[4])
    same_step = DelayedScaling(history_len=1)
    same_step.amax_history = [amaxes[4]]
    late8, late_scale = same_step.quantize(steps[4])
    assert torch.equal(late8.float(), current.float()) and late_scale == current_scale
    with_margin = DelayedScaling(margin=1)
    with_margin.amax_history = [1.0]
    assert float(with_margin.scale) == 224.0
    with pytest.raises(ValueError, match="history_len: 0"):
        DelayedScaling(history_len=0)
    with pytest.raises(ValueError, match="'mean'"):
        DelayedScaling(amax_compute="mean")


def _delayed_scaling_through(steps: list[torch.Tensor], history_len: int = 1024):
    """Quantise each step with one DelayedScaling: the scale used and the relative error of the
    finite values, per step."""
    from trainfast.precision import DelayedScaling

    delayed = DelayedScaling(history_len=history_len)
    scales, errors = [], []
    for x in steps:
        x8, scale = delayed.quantize(x)
        finite = torch.isfinite(x)
        back = from_fp8(x8, scale)
        scales.append(float(scale))
        errors.append(((back - x)[finite].norm() / x[finite].norm()).item())
    return scales, errors


def test_delayed_scaling_keeps_its_scale_through_an_inf_as_transformer_engine_does():
    """The review's demonstration: activations near 1e-3 and one inf at step 2. Transformer
    Engine keeps the previous scale where the history's amax is not finite
    (``torch.where(torch.isfinite(amax), sf, scale)``); falling back to 1 flushed most of
    the activations (error 0.56 instead of 0.026) until the inf left the history."""
    generator = torch.Generator().manual_seed(0)
    steps = [torch.randn(4096, generator=generator) * 1e-3 for _ in range(8)]
    steps[2][0] = float("inf")
    scales, errors = _delayed_scaling_through(steps)
    assert scales[0] == 1.0 and errors[0] > 0.3  # empty history: no scale yet
    assert all(s == scales[2] for s in scales[3:]), scales  # frozen at the last finite scale
    assert scales[2] > 1e5
    assert max(errors[1:]) < 0.04, errors  # what e4m3's 3 bits allow, inf or not
    # with a short history the inf leaves it, and the scale follows the data again
    short_scales, short_errors = _delayed_scaling_through(steps, history_len=2)
    assert short_scales[3] == short_scales[4] == short_scales[2]  # the inf is in the window
    assert short_scales[5] != short_scales[2] and max(short_errors[1:]) < 0.04
    # a NaN and an all-zero step keep the scale too (TE: amax > 0 and isfinite)
    nan_step, zero_step = steps[5].clone(), torch.zeros(4096)
    nan_step[3] = float("nan")
    scales, errors = _delayed_scaling_through([steps[0], steps[1], nan_step, zero_step, steps[6]])
    assert scales[3] == scales[4] == scales[2] > 1e5 and errors[-1] < 0.04


def test_limited_precision_sum_is_float32_at_23_bits_and_promotion_bounds_its_error():
    from trainfast.precision import accumulation_error, limited_precision_sum

    generator = torch.Generator().manual_seed(0)
    terms = torch.randn(3, 500, generator=generator)
    sequential = torch.zeros(3)
    for i in range(terms.shape[1]):
        sequential = sequential + terms[:, i]  # float32, one rounding per addition
    assert torch.equal(limited_precision_sum(terms, 23), sequential)
    no_promotion = [accumulation_error(k, 13, rows=16) for k in (128, 1024, 4096)]
    assert no_promotion[0] < no_promotion[1] < no_promotion[2]  # grows with K
    promoted = accumulation_error(4096, 13, promote_every=128, rows=16)
    assert promoted < no_promotion[2] / 2
    assert accumulation_error(1024, 23, rows=16) < 1e-5
    with pytest.raises(ValueError, match="promote_every: 0"):
        limited_precision_sum(terms, 13, promote_every=0)
    with pytest.raises(ValueError, match="'up'"):
        limited_precision_sum(terms, 13, rounding="up")


def test_fp8_dot_products_are_exact_because_the_scales_come_after_the_sum():
    from trainfast.precision import fp8_dot_products, from_fp8, to_fp8

    products, decode = fp8_dot_products(512, rows=16)
    generator = torch.Generator().manual_seed(0)  # the same inputs, rebuilt here
    a8, scale_a = to_fp8(torch.randn(16, 512, generator=generator))
    b8, scale_b = to_fp8(torch.randn(16, 512, generator=generator))
    exact = a8.double() * b8.double()
    assert torch.equal(products.double(), exact)  # every product of raw FP8 values is exact
    assert decode.item() == pytest.approx(1 / (scale_a * scale_b).item(), rel=1e-6)
    # The scales 448 / amax are not powers of two: products of dequantised values mostly round.
    dequantised = from_fp8(a8, scale_a) * from_fp8(b8, scale_b)
    exact_dequantised = from_fp8(a8, scale_a).double() * from_fp8(b8, scale_b).double()
    assert (dequantised.double() != exact_dequantised).float().mean() > 0.9
    with pytest.raises(ValueError, match="Invalid k: 0"):
        fp8_dot_products(0)


def test_the_outliers_block_mates_carry_nvfp4s_and_mxfp8s_extra_error():
    """The chapter's data: (64, 1024) activations of 1e-3 with column 7 scaled by the ratio."""
    from trainfast.precision import error_by_position

    def split(ratio, name):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 1024, generator=generator) * 1e-3
        x[:, 7] *= ratio
        return error_by_position(x, name, column=7)

    clean = {name: split(1.0, name) for name in ("MXFP8", "NVFP4", "per-tensor e4m3")}
    for ratio in (1e2, 1e3, 1e4):
        nvfp4 = split(ratio, "NVFP4")
        # the other blocks stay where they were without an outlier ...
        assert nvfp4.other_blocks < 1.1 * clean["NVFP4"].other_blocks, ratio
    # ... while the 15 block-mates flush to zero: E2M1's smallest non-zero value is 1/12 of 6
    assert split(1e3, "NVFP4").mates_zero > 0.95 and split(1e4, "NVFP4").block_mates > 0.99
    # the two levels of scale show only near 1e5, where the other blocks' error rises too
    assert split(1e5, "NVFP4").other_blocks > 1.2 * clean["NVFP4"].other_blocks
    # MXFP8's rise at 1e5 is its block-mates' alone
    mxfp8 = split(1e5, "MXFP8")
    assert mxfp8.other_blocks < 1.1 * clean["MXFP8"].other_blocks
    assert mxfp8.block_mates > 3 * clean["MXFP8"].block_mates
    # per-tensor scaling has no blocks: one error for all the other values
    per_tensor = split(1e5, "per-tensor e4m3")
    assert (
        per_tensor.block_mates
        == per_tensor.other_blocks
        > 5 * clean["per-tensor e4m3"].other_blocks
    )
    with pytest.raises(ValueError, match="column: 1024"):
        error_by_position(torch.zeros(2, 1024), "MXFP8", column=1024)


def test_block_scaling_rounds_like_torch_and_resists_outliers_that_per_tensor_scaling_does_not():
    from trainfast.precision import BLOCK_FORMATS, fake_quantize
    from trainfast.precision.block_scaling import round_to_minifloat

    generator = torch.Generator().manual_seed(0)
    spread = torch.randn(20000, generator=generator)
    spread = spread * torch.exp2(torch.randint(-14, 10, (20000,), generator=generator).float())
    e4m3 = BLOCK_FORMATS["MXFP8"].element
    torch.testing.assert_close(
        round_to_minifloat(spread, e4m3),
        spread.clamp(-448, 448).to(torch.float8_e4m3fn).float(),
        rtol=0,
        atol=0,
    )
    fp4 = round_to_minifloat(torch.linspace(-7, 7, 1001), BLOCK_FORMATS["NVFP4"].element)
    assert sorted(set(fp4.abs().tolist())) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    x = torch.randn(64, 256, generator=generator) * 1e-3
    x[:, 7] *= 1e5  # one outlier channel
    rest = torch.ones(256, dtype=torch.bool)
    rest[7] = False

    def error(name):
        q = fake_quantize(x, name)
        return ((q - x)[:, rest].norm() / x[:, rest].norm()).item()

    assert error("MXFP8") < error("per-tensor e4m3") / 4
    assert error("NVFP4") < error("per-tensor e4m3")
    blocks = fake_quantize(x, "MXFP8").unflatten(-1, (-1, 32))
    assert torch.equal(fake_quantize(torch.zeros(2, 32), "MXFP8"), torch.zeros(2, 32))
    assert blocks.shape == (64, 8, 32)
    with pytest.raises(ValueError, match="multiple of the block size 16"):
        fake_quantize(torch.randn(3, 24), "NVFP4")


def test_mxfp8_follows_the_ocp_conversion_rule_scale_by_the_amax_binade_and_clamp():
    """OCP MX v1.0, section 6.3: X = (largest power of two <= amax) / (e4m3's largest, 2^8), and
    elements above the largest normal (448) after the division are clamped to it, sign kept."""
    from trainfast.precision import fake_quantize

    block = torch.zeros(2, 32)
    block[0, :3] = torch.tensor([7.9, -7.9, 3.0])  # X = 2^(2 - 8): 7.9 / X = 505.6 > 448
    block[1, :2] = torch.tensor([7.0, 0.02])  # 7 / X = 448 exactly; 0.02 / X = 1.28 -> 1.25
    q = fake_quantize(block, "MXFP8")
    assert q[0, :3].tolist() == [7.0, -7.0, 3.0]  # clamped to 448 X, not rounded to 512 X
    assert q[1, :2].tolist() == [7.0, 1.25 * 2.0**-6]
    assert torch.equal(q[:, 3:], block[:, 3:])


def test_round_to_minifloat_saturates_infinities_and_keeps_nan_as_its_docstring_says():
    """OFP8's saturating conversion: an overflow, infinity included, becomes the largest finite
    value of its sign, NaN stays NaN (log2(inf) once made the step infinite and inf / inf NaN)."""
    from trainfast.precision import BLOCK_FORMATS
    from trainfast.precision.block_scaling import round_to_minifloat

    inf, nan = float("inf"), float("nan")
    x = torch.tensor([inf, -inf, nan, 1e30, -465.0, 448.0, 3.0])
    e4m3 = round_to_minifloat(x, BLOCK_FORMATS["MXFP8"].element)
    assert e4m3[:2].tolist() == [448.0, -448.0] and bool(torch.isnan(e4m3[2]))
    assert e4m3[3:].tolist() == [448.0, -448.0, 448.0, 3.0]
    e2m1 = round_to_minifloat(x, BLOCK_FORMATS["NVFP4"].element)
    assert e2m1[:2].tolist() == [6.0, -6.0] and bool(torch.isnan(e2m1[2]))
    assert e2m1[3:].tolist() == [6.0, -6.0, 6.0, 3.0]


def test_the_playbooks_fp8_recipes_add_up_to_its_totals():
    from trainfast.accounting import bytes_per_parameter
    from trainfast.precision import FP8_RECIPES, FP8_STATED_BYTES
    from trainfast.recipes import Recipe

    assert len(FP8_RECIPES) == 6 and FP8_RECIPES.keys() == FP8_STATED_BYTES.keys()
    for name, recipe in FP8_RECIPES.items():
        assert isinstance(recipe, Recipe) and recipe.name == name
        assert bytes_per_parameter(recipe, "adamw").total == FP8_STATED_BYTES[name], name


def test_numerics_helpers():
    assert running_sum(0.01, 1000, torch.float32)[-1].item() == pytest.approx(10.0, abs=1e-3)
    assert running_sum(0.01, 1000, torch.bfloat16)[-1].item() < 5  # stagnates
    logits = torch.tensor([[1000.0, 999.0, 0.0]])
    assert torch.isnan(softmax_naive(logits)).any()
    assert torch.allclose(softmax_stable(logits), torch.softmax(logits, -1))
    x = torch.randn(4, 7)
    assert torch.allclose(softmax_stable(x), torch.softmax(x, -1))
    errors = {
        mode: matmul_error(64, 256, 64, mode)["relative_error"] for mode in ("fp32", "tf32", "bf16")
    }
    assert errors["fp32"] < 1e-6 < errors["tf32"] < errors["bf16"] < 1e-2
    with pytest.raises(ValueError, match="'fp64'"):
        matmul_error(2, 2, 2, "fp64")


def test_autocast_policy_on_cpu_casts_matmuls_down_and_losses_up():
    policy = {row["op"]: row["policy"] for row in autocast_policy("cpu", torch.bfloat16)}
    assert policy["matmul"] == policy["linear"] == "lower precision"
    assert policy["mse_loss"] == "float32"
    assert policy["add"] == "input dtype"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_paths_tf32_policy_and_fp8():
    tf32 = matmul_error(512, 1024, 512, "tf32", device="cuda")
    fp32 = matmul_error(512, 1024, 512, "fp32", device="cuda")
    assert not tf32["emulated"] and fp32["relative_error"] < 1e-5 < tf32["relative_error"] < 2e-3
    policy = {row["op"]: row["policy"] for row in autocast_policy("cuda", torch.float16)}
    assert policy["matmul"] == "lower precision" and policy["softmax"] == "float32"
    a, b = torch.randn(64, 128, device="cuda"), torch.randn(128, 32, device="cuda")
    out = fp8_matmul(a, b, out_dtype=torch.float32)
    assert ((out - a @ b).norm() / (a @ b).norm()).item() < 0.08


# --- exercise checks: pass the reference, catch a wrong answer ----------------------------------


def _limits(e, m, has_infinity):
    bias = 2 ** (e - 1) - 1
    top = (
        (2 - 2.0**-m) * 2.0 ** (2**e - 2 - bias)
        if has_infinity
        else (2 - 2.0 ** (1 - m)) * 2.0 ** (2**e - 1 - bias)
    )
    return top, 2.0 ** (1 - bias), 2.0 ** (1 - bias - m), 2.0**-m


def test_format_limits_check(capsys):
    ex.check_format_limits(_limits)
    assert "All 6 cases passed" in capsys.readouterr().out

    def ieee_only(e, m, has_infinity):  # forgets that e4m3fn has no infinity
        return _limits(e, m, True)

    with pytest.raises(AssertionError, match="float8_e4m3fn.*max = 240"):
        ex.check_format_limits(ieee_only)


def test_rounding_check(capsys):
    ex.check_rounding(round_mantissa)
    assert "All 3 cases passed" in capsys.readouterr().out

    def truncate(x, bits):  # round toward zero: wrong
        return (x.view(torch.int32) & ~((1 << (23 - bits)) - 1)).view(torch.float32)

    def ties_away(x, bits):  # round half away from zero: wrong only on ties
        drop = 23 - bits
        return ((x.view(torch.int32) + (1 << (drop - 1))) & ~((1 << drop) - 1)).view(torch.float32)

    with pytest.raises(AssertionError, match="7 mantissa bits"):
        ex.check_rounding(truncate)
    with pytest.raises(AssertionError, match="values differ"):
        ex.check_rounding(ties_away)

    def unguarded(x, bits):  # right on finite values, but rounds the bits of inf and NaN too
        drop = 23 - bits
        raw = x.view(torch.int32)
        odd = (raw >> drop) & 1
        return ((raw + (1 << (drop - 1)) - 1 + odd) & ~((1 << drop) - 1)).view(torch.float32)

    finite = torch.tensor([1.0, 1 + 2.0**-8, 3.0e38, -2.5e-3])
    assert torch.equal(unguarded(finite, 7), round_mantissa(finite, 7))
    with pytest.raises(AssertionError, match=r"x=nan -> (inf|-0\.0)"):
        ex.check_rounding(unguarded)


def test_scale_update_check(capsys):
    def reference(scale, tracker, found, growth, backoff, interval):
        return updated_scale(
            scale,
            tracker,
            found,
            growth_factor=growth,
            backoff_factor=backoff,
            growth_interval=interval,
        )

    ex.check_scale_update(reference)
    assert "All 3 cases passed" in capsys.readouterr().out

    def no_reset(scale, tracker, found, growth, backoff, interval):  # forgets to reset the tracker
        if found:
            return scale * backoff, tracker
        return (scale * growth, 0) if tracker + 1 >= interval else (scale, tracker + 1)

    with pytest.raises(AssertionError, match="overflow at steps 0, 1 and 7"):
        ex.check_scale_update(no_reset)


def test_fp8_quantize_check(capsys):
    ex.check_fp8_quantize(to_fp8)
    assert "All 4 cases passed" in capsys.readouterr().out

    def no_clamp_no_guard(x):  # divides by amax = 0 and does not saturate
        scale = 448.0 / x.abs().max()
        return (x * scale).to(torch.float8_e4m3fn), scale

    with pytest.raises(AssertionError, match="all zeros: x_fp8 contains NaN"):
        ex.check_fp8_quantize(no_clamp_no_guard)

    def fixed_scale(x):  # one scale for every tensor: tiny values flush to zero
        return x.clamp(-448, 448).to(torch.float8_e4m3fn), torch.tensor(1.0)

    with pytest.raises(AssertionError, match="normal values: amax maps to"):
        ex.check_fp8_quantize(fixed_scale)

    def power_of_two(rounding):  # the scale 448 / amax rounded to a power of two
        def quantize(x):
            amax = x.abs().max().float()
            if amax == 0:
                return x.to(torch.float8_e4m3fn), torch.tensor(1.0)
            scale = torch.exp2(rounding(torch.log2(448.0 / amax)))
            return (x.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale

        return quantize

    ex.check_fp8_quantize(power_of_two(torch.floor))  # amax lands in [224, 448]: valid
    assert "All 4 cases passed" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="normal values: dequantised values differ"):
        ex.check_fp8_quantize(power_of_two(torch.ceil))  # amax above 448: saturates


def _stochastic(x, generator):
    bits = x.view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, generator=generator, dtype=torch.int32)
    return ((bits + noise) & ~0xFFFF).view(torch.float32).bfloat16()


def test_stochastic_rounding_check(capsys):
    ex.check_stochastic_rounding(_stochastic)
    assert "All 5 cases passed" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="biased"):
        ex.check_stochastic_rounding(lambda x, g: x.bfloat16())  # round-to-nearest: biased

    def two_ulps(x, generator):  # noise over two ulps: not a neighbour
        noise = torch.randint(0, 1 << 17, x.shape, generator=generator, dtype=torch.int32)
        return ((x.view(torch.int32) + noise) & ~0xFFFF).view(torch.float32).bfloat16()

    with pytest.raises(AssertionError, match="not a neighbour"):
        ex.check_stochastic_rounding(two_ulps)


def _biased_stochastic(bias):
    """Stochastic rounding away from zero with probability f + bias (f: the dropped fraction)."""

    def round_stochastic(x, generator):
        bits = x.view(torch.int32)
        dropped = (bits & 0xFFFF).double() / 2**16
        away = torch.rand(x.shape, generator=generator, dtype=torch.float64) < dropped + bias
        return ((bits & ~0xFFFF) + away.int() * 0x10000).view(torch.float32).bfloat16()

    return round_stochastic


def _coarse_stochastic(random_bits):
    """Stochastic rounding that adds only ``random_bits`` random bits below bfloat16's 16."""

    def round_stochastic(x, generator):
        noise = torch.randint(0, 1 << random_bits, x.shape, generator=generator, dtype=torch.int32)
        noise = noise << (16 - random_bits)
        return ((x.view(torch.int32) + noise) & ~0xFFFF).view(torch.float32).bfloat16()

    return round_stochastic


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stochastic_rounding_check_rejects_a_bias_of_five_percent_and_four_random_bits(seed):
    """The review's wrong answers, each accepted by the check before (4000 samples, a tolerance
    of 8 standard errors, dyadic test fractions): a bias of 0.05 spacing is half of the update
    of a tenth of a spacing that the exercise is about."""
    ex.check_stochastic_rounding(_stochastic, seed=seed)
    ex.check_stochastic_rounding(_biased_stochastic(0.0), seed=seed)  # unbiased: passes
    for wrong in (_biased_stochastic(0.05), _coarse_stochastic(4), _coarse_stochastic(3)):
        with pytest.raises(AssertionError, match="biased by"):
            ex.check_stochastic_rounding(wrong, seed=seed)


# --- the chapter ---------------------------------------------------------------------------------


def test_listings_are_the_packages_own_code():
    assert chapters.listing_problems("mixed_precision") == []


#: Numbers the mixed-precision chapter may type because no cell computes them:
#: * format constants: bit widths (1, 2, 4, 5, 7, 8, 10, 11, 16, 23, 32), float16's largest value
#:   65504 and 2^16 = 65536, e4m3's 448, the binade [1, 2), E2M1's values (0, 0.5, 1, 1.5, 2, 3,
#:   4, 6), block sizes 16 and 32, TF32's rounding at 7 and 10 bits;
#: * inputs the cells are given and the prose names: 15 and 16 added to 65504, 0.01 added a
#:   thousand times, logits of 12, outliers of 100 and 1000, the MLP's widths 64 and 10, its batch
#:   of 256, SGD's learning rate 0.01 and momentum 0.9, a weight near 0.1, the last 50 steps, tiles
#:   of 128 x 256; exercise 7's 7 billion parameters on an 80 GB GPU;
#: * published figures, cited: DeepSeek-V3's tiles (1 x 128, 128 x 128), about 14 accumulator
#:   bits, "nearly 2%" at K = 4096, promotion every 128; Transformer Engine's history of 1024;
#:   ZeRO's 16 = 2 + 2 + 12 bytes; nanoGPT's 50,257 -> 50,304 (a multiple of 64); tensor-core
#:   alignment to multiples of 8, 64 or 128; torch 2.9 (the new TF32 API); DeepSpeed's defaults
#:   (initial scale power 16, a 1000-step window, hysteresis 2, minimum scale 1), torch's
#:   GradScaler's factors 2 and 0.5; exercise 5.


# --- Kahan-compensated AdamW, FP8 linear, and the decision exercises ------------------------------


def test_kahan_adamw_matches_torch_adamw_on_float32_weights():
    from trainfast.precision import KahanAdamW

    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(32, 16, generator=generator), torch.randn(16, generator=generator)]
    ours_params = [nn.Parameter(p.clone()) for p in start]
    torch_params = [nn.Parameter(p.clone()) for p in start]
    settings = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours_opt, torch_opt = (
        KahanAdamW(ours_params, **settings),
        torch.optim.AdamW(torch_params, **settings),
    )
    for _ in range(50):
        for a, b in zip(ours_params, torch_params, strict=True):
            grad = torch.randn(a.shape, generator=generator)
            a.grad, b.grad = grad.clone(), grad.clone()
        ours_opt.step()
        torch_opt.step()
    for a, b in zip(ours_params, torch_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="learning rate: -1"):
        KahanAdamW(ours_params, lr=-1)
    with pytest.raises(ValueError, match="index 1: 1.0"):
        KahanAdamW(ours_params, betas=(0.9, 1.0))


def test_kahan_adamw_without_compensation_is_the_float32_moment_control():
    """compensated=False: the same float32 moments, the update added plainly. On float32
    weights it is torch's AdamW; on bf16 weights it rounds away what the compensation keeps."""
    from trainfast.precision import KahanAdamW

    generator = torch.Generator().manual_seed(0)
    start = torch.randn(64, generator=generator)
    grads = [1 + 0.1 * torch.randn(64, generator=generator) for _ in range(1000)]  # one way

    def run(dtype, **kwargs):
        param = nn.Parameter(start.clone().to(dtype))
        optimizer = KahanAdamW([param], lr=1e-4, **kwargs)
        for grad in grads:
            param.grad = grad.to(dtype)
            optimizer.step()
        return param.detach().float()

    reference = nn.Parameter(start.clone())
    torch_adamw = torch.optim.AdamW([reference], lr=1e-4)
    for grad in grads:
        reference.grad = grad.clone()
        torch_adamw.step()
    float32_plain = run(torch.float32, compensated=False)  # 1000 steps of float32 rounding
    torch.testing.assert_close(float32_plain, reference.detach(), rtol=1e-4, atol=2e-4)
    moved = run(torch.float32) - start  # each step moves a weight by about lr
    rounded = start.bfloat16().float()
    plain = run(torch.bfloat16, compensated=False) - rounded
    kahan = run(torch.bfloat16) - rounded
    assert (plain - moved).norm() > 3 * (kahan - moved).norm()
    with pytest.raises(ValueError, match="compensated: 'no'"):
        KahanAdamW([nn.Parameter(start.clone())], compensated="no")


def test_kahan_add_keeps_the_updates_a_bf16_weight_rounds_away():
    from trainfast.precision import kahan_add_

    plain = torch.ones(4, dtype=torch.bfloat16)
    compensated, compensation = plain.clone(), torch.zeros(4, dtype=torch.bfloat16)
    for _ in range(1000):
        plain += 2.0**-10  # a quarter of bf16's spacing at 1: rounded away every time
        kahan_add_(compensated, torch.full((4,), 2.0**-10), compensation)
    assert torch.equal(plain, torch.ones(4, dtype=torch.bfloat16))
    exact = 1 + 1000 * 2.0**-10
    assert (compensated.float() + compensation.float() - exact).abs().max() < 2.0**-8


def test_a_bf16_compensation_loses_a_little_and_a_float32_one_almost_nothing():
    """The chapter's "little, not nothing": the compensation is rounded to its own dtype."""
    from trainfast.precision import kahan_add_

    generator = torch.Generator().manual_seed(0)
    start = torch.randn(512, generator=generator).bfloat16()
    updates = torch.randn(300, 512, generator=generator) * 1e-4
    exact = updates.double().sum(0)
    missing = {}
    for dtype in (torch.bfloat16, torch.float32):
        weight, compensation = start.clone(), torch.zeros(512, dtype=dtype)
        for update in updates:
            kahan_add_(weight, update, compensation)
        kept = weight.double() - start.double() + compensation.double()
        missing[dtype] = ((kept - exact).norm() / exact.norm()).item()
    assert 1e-3 < missing[torch.bfloat16] < 0.1  # a little is lost ...
    assert missing[torch.float32] < 1e-5  # ... because the compensation itself rounds


def test_kahan_adamw_rescues_pure_bf16_training():
    from trainfast.datasets import digits
    from trainfast.precision import KahanAdamW

    x, y = digits("train").tensors
    runs = {
        name: train_recipe(recipe, x, y, make, steps=150)
        for name, recipe, make in (
            ("master", "bf16 autocast", lambda p: torch.optim.AdamW(p, lr=1e-3)),
            ("pure", "pure bf16", lambda p: torch.optim.AdamW(p, lr=1e-3)),
            ("kahan", "pure bf16", lambda p: KahanAdamW(p, lr=1e-3)),
        )
    }
    last = {name: sum(run.losses[-30:]) / 30 for name, run in runs.items()}
    assert last["kahan"] < last["pure"]
    assert abs(last["kahan"] - last["master"]) < abs(last["pure"] - last["master"]) / 2


def test_fp8_linear_is_close_to_the_float32_linear_and_updates_both_histories():
    from trainfast.precision import DelayedScaling, fp8_linear

    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(2, 5, 32, generator=generator), torch.randn(8, 32, generator=generator)
    x_scaling, w_scaling = DelayedScaling(), DelayedScaling()
    fp8_linear(x, weight, x_scaling, w_scaling)  # first call: scale 1, records the amaxes
    out = fp8_linear(x, weight, x_scaling, w_scaling)
    exact = torch.nn.functional.linear(x, weight)
    assert out.shape == (2, 5, 8)
    assert ((out - exact).norm() / exact.norm()).item() < 0.08
    assert len(x_scaling.amax_history) == len(w_scaling.amax_history) == 2
    with pytest.raises(ValueError, match="\\(out, in\\)"):
        fp8_linear(x, weight.t(), x_scaling, w_scaling)


def test_kahan_add_check(capsys):
    from trainfast.precision import kahan_add_

    ex.check_kahan_add(kahan_add_)
    assert "All 3 cases passed" in capsys.readouterr().out

    def plain(param, update, compensation):  # no compensation: small updates vanish
        param.copy_(param.float() + update)

    with pytest.raises(
        AssertionError, match="one step, bf16 weights: weights match but the compensation"
    ):
        ex.check_kahan_add(plain)

    def textbook(param, update, compensation):  # Kahan's signs: c = (t - s) - y, subtracted
        y = update.float() - compensation.float()
        before = param.float().clone()
        param.copy_(before + y)
        compensation.copy_((param.float() - before) - y)

    ex.check_kahan_add(textbook)
    assert "All 3 cases passed" in capsys.readouterr().out

    def textbook_added(param, update, compensation):  # Kahan's c, but added: the sign is wrong
        y = update.float() + compensation.float()
        before = param.float().clone()
        param.copy_(before + y)
        compensation.copy_((param.float() - before) - y)

    with pytest.raises(AssertionError, match="1000 updates below half a spacing: weights differ"):
        ex.check_kahan_add(textbook_added)


def test_recipe_choice_check(capsys):
    from trainfast.accounting import bytes_per_parameter

    def choose(n_params, budget):
        for recipe in ex.RECIPE_PREFERENCE:
            if bytes_per_parameter(recipe, "adamw").total * n_params <= budget:
                return recipe
        return "does not fit"

    ex.check_recipe_choice(choose)
    assert "All 6 cases passed" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="chose 'pure bf16'"):
        ex.check_recipe_choice(lambda n, budget: "pure bf16")  # always the smallest: not the best


def test_fp8_linear_check(capsys):
    from trainfast.precision import fp8_linear, to_fp8

    ex.check_fp8_linear(fp8_linear)
    assert "All 6 cases passed" in capsys.readouterr().out

    def current_scaling(x, weight, x_scaling, w_scaling):  # ignores the history
        (x8, sx), (w8, sw) = to_fp8(x.reshape(-1, x.shape[-1])), to_fp8(weight)
        return ((x8.float() @ w8.float().t()) / (sx * sw)).reshape(*x.shape[:-1], -1)

    with pytest.raises(AssertionError, match="step 0"):
        ex.check_fp8_linear(current_scaling)

    def weight_recorded_twice(x, weight, x_scaling, w_scaling):  # right outputs, wrong history
        out = fp8_linear(x, weight, x_scaling, w_scaling)
        w_scaling.quantize(weight)  # e.g. quantising the weight again for the backward pass
        return out

    with pytest.raises(
        AssertionError, match=r"step 0 \(activations x[0-9.]+\): weight amax history"
    ):
        ex.check_fp8_linear(weight_recorded_twice)


def test_step_memory_peak_is_within_one_and_a_half_of_every_gpu_record():
    """The committed GPU records of ``precision-step-time`` against the model's peak, per recipe.

    Model state and saved activations alone (``total``) fell short by more than 1.5x on an H100;
    the loss's float32 buffers at the start of backward (``peak``) close the gap."""
    import dataclasses

    from trainfast.accounting import training_memory
    from trainfast.precision.benchmarks import gpu_step_shape
    from trainfast.recipes import RECIPES
    from trainfast.records import records_for

    shape = gpu_step_shape(quick=False)
    fields = ", ".join(f"{f.name}={getattr(shape, f.name)}" for f in dataclasses.fields(shape))
    records = [r for r in records_for("precision-step-time", "cuda") if fields in r.description]
    if not records:
        pytest.skip("no GPU record of precision-step-time at GPT-2 small's size")
    for record in records:
        for row in record.rows:
            memory = training_memory(
                shape, recipe=RECIPES[row["recipe"]], optimizer="adamw", attention="sdpa"
            )
            ratio = row["peak_memory_gb"] * 1e9 / memory.peak
            assert 1 / 1.5 < ratio < 1.5, (record.created, row["recipe"], ratio)


def test_the_step_model_splits_and_reassembles_a_step():
    from trainfast.precision.step_model import StepSplit, amdahl_step_seconds, split_step

    split = split_step(0.1, 6e12, 1e14)  # 60 ms of products, 40 ms of the rest
    assert split == StepSplit(pytest.approx(0.06), pytest.approx(0.04))
    assert split.total_seconds == pytest.approx(0.1)
    assert amdahl_step_seconds(split, 6e12, 1e14, 1.0) == pytest.approx(0.1)  # nothing changed
    assert amdahl_step_seconds(split, 6e12, 1e15, 2.0) == pytest.approx(0.006 + 0.02)
    with pytest.raises(ValueError, match="matmul_flops_per_s: 10000000000000.0 .the products"):
        split_step(0.1, 6e12, 1e13)  # the products alone would take 0.6 s
    with pytest.raises(ValueError, match="other_speedup"):
        amdahl_step_seconds(split, 6e12, 1e14, 0.0)


def test_the_step_model_brackets_the_16_bit_steps_of_every_gpu_record():
    """The chapter's Amdahl reading against the committed records: a 16-bit step lies between the
    rest twice as fast and the rest unchanged (within 5 %: autocast adds casts), and faster than
    its products alone allow no recipe to be."""
    from trainfast.accounting import training_flops
    from trainfast.precision.benchmarks import gpu_step_shape
    from trainfast.precision.step_model import amdahl_step_seconds, split_step
    from trainfast.records import section_records

    records = section_records(["precision-step-time", "matmul-throughput"])
    pairs = list(zip(records["precision-step-time"], records["matmul-throughput"], strict=False))
    if not pairs:
        pytest.skip("no GPU records of precision-step-time and matmul-throughput")
    for steps, rates in pairs[:1]:
        largest = max(r["m"] for r in rates.rows if r["shape"].startswith("square "))
        rate = {
            r["dtype"]: 1e12 * r["tflops"]
            for r in rates.rows
            if r["timing"] == "harness" and r["shape"] == f"square {largest}"
        }
        flops = training_flops(gpu_step_shape("n_layers=2," in steps.description))
        row = {r["recipe"]: r for r in steps.rows}
        split = split_step(row["fp32"]["step_ms"] / 1e3, flops, rate["fp32"])
        for recipe, dtype in (
            ("bf16 autocast", "bf16"),
            ("fp16 autocast + scaler", "fp16"),
            ("pure bf16", "bf16"),
        ):
            low = amdahl_step_seconds(split, flops, rate[dtype], 2.0)
            high = amdahl_step_seconds(split, flops, rate[dtype], 1.0)
            measured = row[recipe]["step_ms"] / 1e3
            assert low <= measured <= 1.05 * high, (recipe, low, measured, high)
