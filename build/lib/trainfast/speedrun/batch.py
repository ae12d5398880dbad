"""Where a batch sits against the critical batch size, read from tokens counted at evaluations.

Doubling a batch well below the critical batch size (McCandlish et al., 2018,
https://arxiv.org/abs/1812.06162) halves the steps for the same tokens; well above it the steps
hardly fall and the tokens nearly double. A study counts a run's tokens to the target only at
its evaluations, so each count is known to within one evaluation's tokens below it, and the
ratio of two counts to within an interval: :func:`doubling_band` names a band only when the
whole interval lies in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainfast.validation import check_number, check_positive

__all__ = ["ABOVE", "BELOW", "BatchBand", "doubling_band"]

BELOW, ABOVE = 1.2, 1.5  # token ratios of a doubled batch: at most BELOW is below, ABOVE at/above


@dataclass(frozen=True)
class BatchBand:
    """The token ratio of a doubled batch, as an interval, and the band it decides."""

    low: float
    high: float
    band: str  # "below", "near", "at or above", or "undecided"


def doubling_band(
    tokens: float, larger_tokens: float, batch: int, larger_batch: int, eval_tokens: int
) -> BatchBand:
    """The band of ``batch`` from the tokens to the target at ``batch`` and at ``larger_batch``
    (twice it), counted at evaluations ``eval_tokens`` tokens per sequence apart
    (``eval_every x seq_len``): each count is up to one evaluation's tokens above the tokens at
    which the run crossed the target.
    """
    for name, value in (("tokens", tokens), ("larger_tokens", larger_tokens)):
        check_number(name, value, above=0.0)
    for name, value in (
        ("batch", batch),
        ("larger_batch", larger_batch),
        ("eval_tokens", eval_tokens),
    ):
        check_positive(name, value)
    low = (larger_tokens - eval_tokens * larger_batch) / tokens
    crossed = tokens - eval_tokens * batch  # the fewest tokens the smaller batch may have needed
    high = larger_tokens / crossed if crossed > 0 else math.inf
    if low >= ABOVE:
        band = "at or above"
    elif high <= BELOW:
        band = "below"
    elif BELOW < low and high < ABOVE:
        band = "near"
    else:
        band = "undecided"
    return BatchBand(low, high, band)
