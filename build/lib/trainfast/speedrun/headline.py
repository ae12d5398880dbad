"""The headline of a speedrun: how many times as fast, with the interval its seeds allow.

The headline is the ratio of the median times to the target, baseline over final entry, each
median over that entry's seeds. Its uncertainty is a percentile bootstrap (Efron and Tibshirani,
*An Introduction to the Bootstrap*, 1993, ch. 13): resample each entry's seeds with
replacement, independently, take the ratio of the resampled medians, and read the interval
between the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of many such ratios. With 5
seeds a side its coverage of a known ratio is close to the nominal 95 % (the tests plant one);
with 3 it falls short, one reason a study runs at least 5.

:func:`supported_decimals` then rounds the headline to what the interval supports: to the
decimal place of the first significant digit of the interval's half-width, so "5.74x" with an
interval of 4.8-8.0 reads "6x (95 % interval 5-8x)", and two decimals need an interval a few
hundredths wide.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainfast.validation import check_int, check_number

__all__ = [
    "Headline",
    "bootstrap_ratio_interval",
    "headline",
    "ratio_of_medians",
    "supported_decimals",
]


def _values(name: str, runs: Sequence[float]) -> np.ndarray:
    values = np.asarray(runs, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"Invalid {name}: {list(runs)!r:.80} (expected one time per seed)")
    if np.isnan(values).any() or (values <= 0).any():
        raise ValueError(f"Invalid {name}: {list(runs)!r:.80} (expected times > 0; inf: missed)")
    return values


def ratio_of_medians(before: Sequence[float], after: Sequence[float]) -> float:
    """``median(before) / median(after)``: how many times as fast ``after`` is."""
    b, a = _values("before", before), _values("after", after)
    return float(statistics.median(b.tolist()) / statistics.median(a.tolist()))


def bootstrap_ratio_interval(
    before: Sequence[float],
    after: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile bootstrap interval of :func:`ratio_of_medians` at ``level``: each side's
    seeds resampled with replacement, ``resamples`` times, from a generator seeded by ``seed``
    (so the interval of one record is always the same). A run that missed the target (``inf``)
    can make the upper end infinite; that is what it says."""
    b, a = _values("before", before), _values("after", after)
    check_number("level", level, above=0.0, below=1.0)
    check_int("resamples", resamples, minimum=100)
    rng = np.random.default_rng(seed)
    b_medians = np.median(b[rng.integers(0, b.size, (resamples, b.size))], axis=1)
    a_medians = np.median(a[rng.integers(0, a.size, (resamples, a.size))], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = b_medians / a_medians
    ratios = np.where(np.isnan(ratios), np.inf, ratios)  # inf / inf: both missed
    low, high = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2], method="linear")
    return float(low), float(high)


def supported_decimals(low: float, high: float) -> int:
    """The decimals a ratio with the interval ``(low, high)`` can be given to: those down to
    the first significant digit of the half-width, none for a half-width of 1 or more."""
    check_number("low", low, above=0.0)
    check_number("high", high, minimum=low, allow_inf=True)
    half = (high - low) / 2
    if not math.isfinite(half) or half >= 1:
        return 0
    if half == 0:
        return 2  # an interval of one point: no digit is in doubt, two decimals are plenty
    return max(0, -math.floor(math.log10(half)))


@dataclass(frozen=True)
class Headline:
    """How many times as fast, with its interval and the text rounded to it."""

    ratio: float
    low: float
    high: float
    level: float
    decimals: int

    def text(self) -> str:
        """E.g. ``"6x (95 % interval 5-8x)"``."""

        def rounded(value: float) -> str:
            return "∞" if math.isinf(value) else f"{value:.{self.decimals}f}"

        return (
            f"{rounded(self.ratio)}x ({100 * self.level:.0f} % interval "
            f"{rounded(self.low)}-{rounded(self.high)}x)"
        )


def headline(
    before: Sequence[float],
    after: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> Headline:
    """The ratio of medians of ``before`` over ``after``, its bootstrap interval and the
    decimals the interval supports."""
    ratio = ratio_of_medians(before, after)
    low, high = bootstrap_ratio_interval(before, after, level=level, resamples=resamples, seed=seed)
    return Headline(ratio, low, high, level, supported_decimals(low, high))
