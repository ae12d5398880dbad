"""Checks for the speedrun chapter's exercises.

Each check runs the reader's function on a few cases, prints one line per case, and raises
``AssertionError`` naming the first case that fails (:func:`trainfast.checks.report`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from trainfast.checks import report
from trainfast.timing import rank_sum_test


def _case(label: str, ok: bool, got: object, expected: object) -> tuple[str, str | None]:
    return label, None if ok else f"got {got!r}, expected {expected!r}"


__all__ = [
    "check_bf16_pays",
    "check_next_change",
    "check_time_to_target",
    "check_verdict",
]


def check_time_to_target(time_to_target: Callable[[float, float, float], float]) -> None:
    """``time_to_target(tokens_needed, tokens_per_second, fixed_seconds)``: the seconds a run
    takes to reach the target, where ``fixed_seconds`` is paid once (e.g. compilation)."""
    cases = [(600_000, 3_000.0, 0.0), (300_000, 2_000.0, 0.0), (300_000, 6_000.0, 40.0)]
    results = []
    for tokens, rate, fixed in cases:
        expected = tokens / rate + fixed
        got = time_to_target(tokens, rate, fixed)
        ok = isinstance(got, (int, float)) and math.isclose(got, expected, rel_tol=1e-9)
        results.append(
            _case(f"{tokens:,} tokens at {rate:,.0f}/s + {fixed:.0f} s", ok, got, expected)
        )
    report(results)


def _best_change(
    breakdown: Mapping[str, float],
    candidates: Mapping[str, tuple[str, float, float]],
    memory_left: float,
) -> str:
    def saving(item: tuple[str, float, float]) -> float:
        part, speedup, _ = item
        return breakdown[part] * (1 - 1 / speedup)

    fitting = {n: c for n, c in candidates.items() if c[2] <= memory_left}
    return max(fitting, key=lambda n: saving(fitting[n]))


_BREAKDOWNS = [
    # (step-time breakdown in ms, memory left in GB)
    ({"attention": 40.0, "matmuls": 100.0, "optimizer": 30.0, "data": 5.0}, 10.0),
    ({"attention": 90.0, "matmuls": 60.0, "optimizer": 10.0, "data": 5.0}, 10.0),
    ({"attention": 90.0, "matmuls": 60.0, "optimizer": 10.0, "data": 5.0}, 1.0),
    ({"attention": 10.0, "matmuls": 30.0, "optimizer": 60.0, "data": 40.0}, 0.5),
    # Amdahl's t (1 - 1/s) picks bf16 matmuls (22.5 ms); t s and t (s - 1) pick the loader
    ({"attention": 10.0, "matmuls": 45.0, "optimizer": 10.0, "data": 25.0}, 10.0),
    # the winner needs exactly the memory left: it fits
    ({"attention": 10.0, "matmuls": 100.0, "optimizer": 10.0, "data": 5.0}, 0.5),
]
#: name -> (the part of the step it speeds up, by what factor, extra memory in GB)
CANDIDATES: dict[str, tuple[str, float, float]] = {
    "fused attention": ("attention", 3.0, 2.0),
    "bf16 matmuls": ("matmuls", 2.0, 0.5),
    "fused optimizer": ("optimizer", 2.0, 0.0),
    "more loader workers": ("data", 5.0, 0.0),
}


def check_next_change(
    next_change: Callable[
        [Mapping[str, float], Mapping[str, tuple[str, float, float]], float], str
    ],
) -> None:
    """``next_change(breakdown, candidates, memory_left)``: the candidate (of
    :data:`CANDIDATES`) that saves the most time per step among those that fit in
    ``memory_left`` GB. A change that speeds up a part taking ``t`` by ``s`` saves
    ``t (1 - 1/s)`` (Amdahl)."""
    results = []
    for breakdown, memory in _BREAKDOWNS:
        expected = _best_change(breakdown, CANDIDATES, memory)
        got = next_change(dict(breakdown), dict(CANDIDATES), memory)
        label = ", ".join(f"{k} {v:.0f} ms" for k, v in breakdown.items())
        results.append(_case(f"{label}; {memory} GB left", got == expected, got, expected))
    report(results)


def bf16_pays_model(
    width: int, tokens: int, fp32_flops: float, bf16_flops: float, bandwidth: float
):
    """The model the bf16 exercise asks for: one ``(tokens, width) @ (width, width)`` product,
    timed by the roofline (the larger of its FLOPs at the format's peak and its bytes at
    ``bandwidth``); bf16 under autocast also reads the fp32 weight and writes its bf16 copy."""
    flops = 2 * tokens * width * width
    fp32 = max(flops / fp32_flops, 4 * (2 * tokens * width + width * width) / bandwidth)
    cast = (4 + 2) * width * width / bandwidth
    bf16 = max(flops / bf16_flops, 2 * (2 * tokens * width + width * width) / bandwidth) + cast
    return bf16 < fp32


def check_bf16_pays(bf16_pays: Callable[[int, int, float, float, float], bool]) -> None:
    """``bf16_pays(width, tokens, fp32_flops, bf16_flops, bandwidth)``: does bf16 autocast make
    one ``(tokens, width) @ (width, width)`` product faster, by the roofline (see
    :func:`bf16_pays_model`)? Cases at an H100's datasheet figures and at a made-up CPU core
    whose bf16 products run at half its fp32 rate."""
    from trainfast.gpus import GPUS

    spec = GPUS["H100 SXM 80GB"]  # the book's datasheet figures: fp32, dense bf16, HBM bytes/s
    h100 = (spec.peak_flops["fp32"], spec.peak_flops["bf16"], spec.hbm_bytes_per_s)
    cpu = (50e9, 25e9, 20e9)  # made up: bf16 at half the fp32 rate, 20 GB/s
    # the last two are small enough for the bytes to decide: they reject bf16 moving 4 bytes,
    # the cast priced at 4 or 12 bytes a weight, activations counted once and times summed
    cases = [
        (4096, 8192, h100),
        (128, 1024, h100),
        (16, 1, h100),
        (128, 1024, cpu),
        (8, 8, h100),
        (8, 16, h100),
    ]
    results = []
    for width, tokens, machine in cases:
        expected = bf16_pays_model(width, tokens, *machine)
        got = bf16_pays(width, tokens, *machine)
        results.append(_case(f"width {width}, {tokens} tokens", got == expected, got, expected))
    report(results)


def _verdict(before: Sequence[float], after: Sequence[float], alpha: float) -> str:
    share, p_value = rank_sum_test(before, after)
    if p_value <= alpha:
        return "beats the noise" if share > 0.5 else "did not pay"
    return "within noise"


def check_verdict(verdict: Callable[[Sequence[float], Sequence[float], float], str]) -> None:
    """``judge(before_seconds, after_seconds, alpha)``: "beats the noise", "did not pay" or
    "within noise", by the rank-sum test (:func:`trainfast.timing.rank_sum_test`) at p <=
    ``alpha``."""
    cases = [
        ([60.0, 62.0, 65.0], [40.0, 41.0, 45.0], 0.1),
        ([60.0, 62.0, 65.0], [61.0, 58.0, 66.0], 0.1),
        ([40.0, 41.0, 45.0], [60.0, 62.0, 65.0], 0.1),
        ([60.0, 62.0, 65.0], [40.0, 41.0, 45.0], 0.05),
    ]
    results = []
    for before, after, alpha in cases:
        expected = _verdict(before, after, alpha)
        got = verdict(list(before), list(after), alpha)
        results.append(_case(f"{before} -> {after} at {alpha}", got == expected, got, expected))
    report(results)
