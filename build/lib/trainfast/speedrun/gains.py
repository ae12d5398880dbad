"""A change's gain in time, split into what it saved in tokens and what it gained in tokens/s.

The time to a target is the tokens it takes divided by the tokens trained per second, so a
change's time ratio is the product of two factors (modded-nanogpt's log reports both for every
record):

    time ratio = token ratio x throughput ratio

with each ratio "before over after" for times and tokens (> 1: fewer) and "after over before"
for throughput (> 1: faster). *Learning* changes (architecture, optimizer, schedule, batch) move
the token ratio; *systems* changes (kernels, number formats, compilation, threads, processes)
move the throughput ratio and leave the tokens alone, up to the rounding of the arithmetic.

Over several seeds the ratios are of medians: the time and token ratios are ratios of the
median times and median tokens, and the throughput factor is their quotient, which is the
ratio of the entries' *effective* throughputs, median tokens over median time. That keeps the
product exact (the waterfall's two segments add up, on a log scale, to the bar). The median of
the seeds' own tokens/s is reported beside it (:func:`median_throughput`); the two differ
where tokens and times vary together over seeds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Gain", "gain", "median_throughput"]


def _median(name: str, values: Sequence[float]) -> float:
    if not values:
        raise ValueError(f"Invalid {name}: no runs")
    return float(statistics.median(values))


@dataclass(frozen=True)
class Gain:
    """One change's factors (:func:`gain`); ``time_ratio == token_ratio * throughput_ratio``."""

    time_ratio: float
    token_ratio: float
    throughput_ratio: float

    @property
    def learning_share(self) -> float:
        """The share of the gain, on a log scale, that is tokens (1: all tokens; nan when the
        time did not change)."""
        total = math.log(self.time_ratio)
        return math.log(self.token_ratio) / total if total else math.nan


def gain(
    before_seconds: Sequence[float],
    before_tokens: Sequence[float],
    after_seconds: Sequence[float],
    after_tokens: Sequence[float],
) -> Gain:
    """``after``'s gain over ``before`` from their runs' times and tokens to the target (runs
    that reached it)."""
    tb, nb = _median("before_seconds", before_seconds), _median("before_tokens", before_tokens)
    ta, na = _median("after_seconds", after_seconds), _median("after_tokens", after_tokens)
    if min(tb, nb, ta, na) <= 0:
        raise ValueError(f"Invalid runs: medians {tb}, {nb}, {ta}, {na} (expected > 0)")
    time_ratio, token_ratio = tb / ta, nb / na
    return Gain(time_ratio, token_ratio, time_ratio / token_ratio)


def median_throughput(seconds: Sequence[float], tokens: Sequence[float]) -> float:
    """The median over runs of each run's training tokens per second."""
    if len(seconds) != len(tokens) or not seconds:
        raise ValueError(f"Invalid runs: {len(seconds)} times and {len(tokens)} token counts")
    return float(statistics.median(n / t for n, t in zip(tokens, seconds, strict=True)))
