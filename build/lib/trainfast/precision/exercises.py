"""Checks for the mixed-precision chapter's exercises.

Each runs the reader's function against the package's reference on several cases, prints one
line per case and raises ``AssertionError`` naming the first failure
(:func:`trainfast.checks.report`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from trainfast.checks import Case, report
from trainfast.precision.compensated import kahan_add_
from trainfast.precision.formats import FORMAT_NAMES, float_format, round_mantissa
from trainfast.precision.fp8 import DelayedScaling, fp8_linear
from trainfast.precision.loss_scaling import updated_scale

__all__ = [
    "RECIPE_PREFERENCE",
    "check_format_limits",
    "check_fp8_linear",
    "check_fp8_quantize",
    "check_kahan_add",
    "check_recipe_choice",
    "check_rounding",
    "check_scale_update",
    "check_stochastic_rounding",
]


def check_format_limits(
    limits: Callable[[int, int, bool], tuple[float, float, float, float]],
) -> None:
    """Check ``limits(exponent_bits, mantissa_bits, has_infinity) -> (max, min_normal,
    min_subnormal, eps)`` for every format of the chapter, against their bit-layout formulas
    (which the tests check against ``torch.finfo``)."""
    results: list[Case] = []
    for name in FORMAT_NAMES:
        fmt = float_format(name)
        expected = (fmt.max, fmt.min_normal, fmt.min_subnormal, fmt.eps)
        got = limits(fmt.exponent_bits, fmt.mantissa_bits, fmt.has_infinity)
        case = f"{name} (e={fmt.exponent_bits}, m={fmt.mantissa_bits})"
        labels = ("max", "min_normal", "min_subnormal", "eps")
        wrong = [
            f"{label} = {value!r}, expected {want!r}"
            for label, value, want in zip(labels, got, expected, strict=True)
            if not math.isclose(value, want, rel_tol=1e-12)
        ]
        results.append((case, wrong[0] if wrong else None))
    report(results)


def _rounding_inputs(seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    spread = torch.randn(2000, generator=generator) * torch.exp2(
        torch.randint(-60, 60, (2000,), generator=generator).float()
    )
    ties = torch.tensor(
        [1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 1 + 2.0**-11, 1 + 3 * 2.0**-11]
    )
    special = torch.tensor([0.0, -0.0, 1.0, 3.0e38, float("inf"), -float("inf"), 1e-40, -1e-45])
    # NaNs whose payload the rounding must not touch: a low payload that rounds to infinity, a
    # high one whose carry would flip the sign, and the same negated
    nans = torch.tensor([0x7F800001, 0x7FFFFFFF, -0x7FFFFFFF, -0x00800001], dtype=torch.int32)
    return torch.cat([spread, ties, special, nans.view(torch.float32)])


def check_rounding(round_to_bits: Callable[[Tensor, int], Tensor], *, seed: int = 0) -> None:
    """Check ``round_to_bits(x, mantissa_bits)``: float32 in, float32 out, round-to-nearest-even.

    Cases: 7 bits (bfloat16's), 10 (TF32's) and 3 (e4m3's mantissa, in float32's exponent
    range), on values spread over 2^±60 plus exact ties, which must go to the even neighbour,
    subnormals, a value that rounds past float32's maximum (to infinity), and infinities and
    NaNs, which must come back unchanged (a NaN as a NaN).
    """
    x = _rounding_inputs(seed)
    results: list[Case] = []
    for bits in (7, 10, 3):
        expected = round_mantissa(x, bits)
        got = round_to_bits(x.clone(), bits)
        case = f"{bits} mantissa bits on {x.numel()} values (ties, inf and NaN included)"
        if got.dtype != torch.float32 or got.shape != x.shape:
            results.append(
                (
                    case,
                    f"returned {got.dtype} {tuple(got.shape)}, expected float32 {tuple(x.shape)}",
                )
            )
            continue
        same = (got == expected) | (got.isnan() & expected.isnan())
        wrong = (~same).nonzero().flatten()
        problem = None
        if wrong.numel():
            i = int(wrong[0])
            problem = (
                f"{wrong.numel()} values differ, e.g. x={x[i].item()!r} -> {got[i].item()!r}, "
                f"expected {expected[i].item()!r}"
            )
        results.append((case, problem))
    report(results)


def check_scale_update(
    update: Callable[[float, int, bool, float, float, int], tuple[float, int]],
) -> None:
    """Check ``update(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
    growth_interval) -> (scale, growth_tracker)`` over whole trajectories of the loss scale."""
    trajectories = [
        ("growth every 3 clean steps", 2.0**10, 2.0, 0.5, 3, set()),
        ("overflow at steps 0, 1 and 7", 2.0**16, 2.0, 0.5, 4, {0, 1, 7}),
        ("backoff 0.25, growth 4, overflow at step 5", 1024.0, 4.0, 0.25, 2, {5}),
    ]
    results: list[Case] = []
    for label, scale, growth, backoff, interval, overflows in trajectories:
        ours, tracker, theirs, their_tracker = scale, 0, scale, 0
        problem = None
        for step in range(12):
            found = step in overflows
            theirs, their_tracker = updated_scale(
                theirs,
                their_tracker,
                found,
                growth_factor=growth,
                backoff_factor=backoff,
                growth_interval=interval,
            )
            ours, tracker = update(ours, tracker, found, growth, backoff, interval)
            if (ours, tracker) != (theirs, their_tracker):
                problem = (
                    f"after step {step}: (scale, tracker) = {(ours, tracker)}, "
                    f"expected {(theirs, their_tracker)}"
                )
                break
        results.append((f"{label}, 12 steps", problem))
    report(results)


def check_fp8_quantize(
    quantize: Callable[[Tensor], tuple[Tensor, Tensor]], *, seed: int = 0
) -> None:
    """Check ``quantize(x) -> (x_fp8, scale)``: e4m3fn with one per-tensor scale.

    The dequantised ``x_fp8 / scale`` must match ``x`` within e4m3's rounding, the largest
    magnitude must land in e4m3's top binade, [224, 448] (``448 / amax`` puts it on 448; a
    power-of-two scale, as MX and Transformer Engine's power-of-two option use, anywhere in
    it), an all-zero tensor must not produce NaN, and an outlier must not overflow (e4m3fn has
    no infinity).
    """
    generator = torch.Generator().manual_seed(seed)
    cases = {
        "normal values": torch.randn(256, generator=generator),
        "tiny values (1e-6)": torch.randn(256, generator=generator) * 1e-6,
        "one outlier of 1e4": torch.cat(
            [torch.randn(255, generator=generator), torch.tensor([1e4])]
        ),
        "all zeros": torch.zeros(16),
    }
    largest = torch.finfo(torch.float8_e4m3fn).max
    results: list[Case] = []
    for label, x in cases.items():
        x_fp8, scale = quantize(x.clone())
        problem = None
        if x_fp8.dtype != torch.float8_e4m3fn:
            problem = f"x_fp8 is {x_fp8.dtype}, expected torch.float8_e4m3fn"
        elif torch.isnan(x_fp8.float()).any():
            problem = "x_fp8 contains NaN"
        else:
            back = x_fp8.float() / torch.as_tensor(scale, dtype=torch.float32)
            amax, top = x.abs().max(), x_fp8.float().abs().max().item()
            if amax > 0 and not largest / 2 <= top <= largest:
                problem = (
                    f"amax maps to {top}, expected a value in [{largest / 2:g}, {largest:g}] "
                    "(e4m3's top binade)"
                )
            elif not torch.allclose(back, x, rtol=2.0**-4, atol=float(amax) * 2.0**-9 + 1e-30):
                problem = f"dequantised values differ by up to {(back - x).abs().max().item():.3g}"
        results.append((label, problem))
    report(results)


def _bfloat16_neighbours(x: Tensor) -> tuple[Tensor, Tensor]:
    """The two bfloat16 values around float32 ``x``: truncated toward zero, and one step further."""
    bits = x.contiguous().view(torch.int32) & ~0xFFFF  # keep sign, exponent, 7 mantissa bits
    return bits.view(torch.float32), (bits + 0x10000).view(torch.float32)


def check_stochastic_rounding(
    round_stochastic: Callable[[Tensor, torch.Generator], Tensor],
    *,
    samples: int = 100_000,
    seed: int = 0,
) -> None:
    """Check ``round_stochastic(x, generator) -> bfloat16``: each value rounds to one of its two
    bfloat16 neighbours, away from zero with probability ``f``, its distance from the neighbour
    toward zero in spacings, so that the rounding is unbiased on average.

    The test values drop fractions ``f`` of about 0.1, 0.3, 0.55 and 0.7 of a spacing, not
    short binary fractions such as 1/4 that coarse random bits reproduce exactly; the mean of
    ``samples`` roundings must lie within 5 standard errors, ``5 spacing sqrt(f (1 - f) /
    samples)``, of ``x``: under 0.01 of a spacing at the default, so a rounding biased by 5 % of a
    spacing, or one drawing only 4 random bits, fails.
    """
    values = torch.tensor(
        [1.0 + 0.1 * 2.0**-7, 1.0 + 0.55 * 2.0**-7, 256.0 + 0.7 * 2.0, -3.0 - 0.3 * 2.0**-6, 1e-3]
    )
    generator = torch.Generator().manual_seed(seed)
    x = values.repeat(samples, 1)  # (samples, values)
    out = round_stochastic(x.clone(), generator)
    results: list[Case] = []
    if out.dtype != torch.bfloat16 or out.shape != x.shape:
        report(
            [
                (
                    "output",
                    f"returned {out.dtype} {tuple(out.shape)}, expected bfloat16 {tuple(x.shape)}",
                )
            ]
        )
        return
    toward_zero, away = _bfloat16_neighbours(values)
    for j, value in enumerate(values.tolist()):
        column = out[:, j].float()
        problem = None
        spacing = abs(float(away[j]) - float(toward_zero[j]))
        f = abs(value - float(toward_zero[j])) / spacing  # exact: values are float32
        neighbours = (column == toward_zero[j]) | (column == away[j])
        if not bool(neighbours.all()):
            problem = f"produced {column[~neighbours][0].item()!r}, not a neighbour of {value!r}"
        else:
            standard_error = spacing * math.sqrt(f * (1 - f) / samples)
            mean = column.double().mean().item()
            if abs(mean - value) > 5 * standard_error:
                problem = (
                    f"mean of {samples} roundings is {mean!r}, expected {value!r}: biased by "
                    f"{(mean - value) / spacing:+.3f} of a spacing"
                )
        results.append((f"x = {value!r} (drops {f:.3f} of a spacing)", problem))
    report(results)


def check_kahan_add(kahan_add: Callable[[Tensor, Tensor, Tensor], None], *, seed: int = 0) -> None:
    """Check ``kahan_add(param, update, compensation)`` (in place) against :func:`kahan_add_`.

    Cases: one step on random bf16 weights; 1000 updates each below half a weight's spacing,
    whose total the compensated weights must keep where a plain addition keeps none; and
    float32 weights, where the result is a float32 sum. The weights must equal the reference's
    bit for bit; the compensation must equal it or its negative, so both sign conventions pass:
    the package keeps what the rounding dropped and adds it, Kahan's textbook form keeps
    ``c = (t - s) - y``, its negative, and subtracts it.
    """
    generator = torch.Generator().manual_seed(seed)
    cases: list[tuple[str, Tensor, list[Tensor]]] = [
        (
            "one step, bf16 weights",
            torch.randn(64, generator=generator).bfloat16(),
            [torch.randn(64, generator=generator) * 1e-2],
        ),
        (
            "1000 updates below half a spacing",
            torch.full((8,), 1.0, dtype=torch.bfloat16),
            [torch.full((8,), 2.0**-10) for _ in range(1000)],
        ),
        (
            "float32 weights",
            torch.randn(64, generator=generator),
            [torch.randn(64, generator=generator) * 1e-3 for _ in range(10)],
        ),
    ]
    results: list[Case] = []
    for label, start, updates in cases:
        ours, theirs = start.clone(), start.clone()
        ours_comp, theirs_comp = torch.zeros_like(start), torch.zeros_like(start)
        for update in updates:
            kahan_add(ours, update.clone(), ours_comp)
            kahan_add_(theirs, update, theirs_comp)
        problem = None
        if ours.dtype != start.dtype or ours_comp.dtype != start.dtype:
            problem = f"dtypes changed to {ours.dtype} / {ours_comp.dtype}, expected {start.dtype}"
        elif not torch.equal(ours, theirs):
            worst = (ours.float() - theirs.float()).abs().max().item()
            problem = f"weights differ from the reference by up to {worst:.3g}"
        elif not (torch.equal(ours_comp, theirs_comp) or torch.equal(ours_comp, -theirs_comp)):
            problem = "weights match but the compensation differs from the reference (either sign)"
        results.append((label, problem))
    report(results)


#: Recipes (keys of :data:`trainfast.recipes.RECIPES`) for :func:`check_recipe_choice`, most
#: precise first (memory of AdamW model state in
#: :func:`trainfast.accounting.bytes_per_parameter`).
RECIPE_PREFERENCE = ("bf16 autocast", "bf16, fp32 moments", "pure bf16")


def _fitting_recipe(n_params: int, budget_bytes: float) -> str:
    from trainfast.accounting import bytes_per_parameter

    for recipe in RECIPE_PREFERENCE:
        if bytes_per_parameter(recipe, "adamw").total * n_params <= budget_bytes:
            return recipe
    return "does not fit"


def check_recipe_choice(choose: Callable[[int, float], str]) -> None:
    """Check ``choose(n_params, budget_bytes) -> recipe``: the first of
    :data:`RECIPE_PREFERENCE` whose AdamW model state fits the budget, or ``"does not fit"``."""
    cases = [
        ("7B parameters in 80 GB", 7e9, 80e9),
        ("7B parameters in 120 GB", 7e9, 120e9),
        ("7B parameters in 60 GB", 7e9, 60e9),
        ("1B parameters in 12 GB", 1e9, 12e9),
        ("1B parameters in 16 GB", 1e9, 16e9),
        ("70B parameters in 80 GB", 70e9, 80e9),
    ]
    results: list[Case] = []
    for label, n_params, budget in cases:
        expected, got = _fitting_recipe(int(n_params), budget), choose(int(n_params), budget)
        results.append(
            (label, None if got == expected else f"chose {got!r}, expected {expected!r}")
        )
    report(results)


def check_fp8_linear(
    linear: Callable[[Tensor, Tensor, DelayedScaling, DelayedScaling], Tensor], *, seed: int = 0
) -> None:
    """Check ``linear(x, weight, x_scaling, weight_scaling)`` against :func:`fp8_linear` over six
    steps with a jump in the activations: same outputs, and the same amax histories of the
    activations and of the weight afterwards (the function must use each scaling's delayed
    scale, then record the amax, once per step)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(16, 32, generator=generator) * 0.1  # (out, in)
    steps = [torch.randn(4, 8, 32, generator=generator) * s for s in (1, 1.2, 1.1, 20, 1, 1)]
    ours_x, ours_w = DelayedScaling(history_len=4), DelayedScaling(history_len=4)
    ref_x, ref_w = DelayedScaling(history_len=4), DelayedScaling(history_len=4)
    results: list[Case] = []
    for step, x in enumerate(steps):
        got = linear(x.clone(), weight.clone(), ours_x, ours_w)
        expected = fp8_linear(x, weight, ref_x, ref_w)
        problem = None
        if got.shape != expected.shape:
            problem = f"output shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        elif not torch.allclose(got.float(), expected, rtol=1e-5, atol=1e-6):
            problem = f"outputs differ by up to {(got.float() - expected).abs().max().item():.3g}"
        elif ours_x.amax_history != ref_x.amax_history:
            problem = f"x amax history {ours_x.amax_history}, expected {ref_x.amax_history}"
        elif ours_w.amax_history != ref_w.amax_history:
            problem = f"weight amax history {ours_w.amax_history}, expected {ref_w.amax_history}"
        results.append((f"step {step} (activations x{x.abs().max().item():.3g})", problem))
        if problem:
            break
    report(results)
