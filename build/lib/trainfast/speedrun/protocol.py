"""The rules of a speedrun study, fixed before it runs: the run order and the keep rule.

**Seeds.** A seed fixes a run's initialisation *and* its data order
(:func:`~trainfast.speedrun.run_to_target` seeds the model's generator and the batches' with it),
so the spread over seeds holds both sources of run-to-run variance, not the initialisation's
alone. The evaluation windows are the same for every seed: they are the held-out set.

**Run order.** A shared machine's load drifts, so runs measured one after another are not
exchangeable: with all seeds of A before all seeds of B, a drift of the load reads as a
difference between A and B. :func:`interleaved` runs the compared entries round by round (A1 B1
A2 B2 ...), so a drift slower than a round hits both alike; modded-nanogpt's records likewise
re-measure their baseline on the same hardware, at the same time.

**Keep rule.** One rule, declared before the study (:class:`KeepRule`): a change is kept when its
time to the target beats the entry it was measured on by the exact one-sided rank-sum test at
``alpha`` (a change is tried because it is expected to be faster, so the test is one-sided);
its tokens to the target are reported beside, never decide. At 5 seeds against 5 the smallest
one-sided p-value is 1/252 = 0.004, and p <= 0.05 needs at most 4 of the 25 (before, after)
pairs to go the wrong way. Under the null (a change that does nothing) a change is kept with
probability at most ``alpha``; over a log of ``n`` changes about ``n * alpha`` such changes may
be kept by chance, which the ablation (each kept change taken back out) can catch.

When not to use it: the rank-sum test assumes the runs of both sides are exchangeable under the
null, which only an interleaved order gives on a shared machine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from trainfast.timing import rank_sum_one_sided
from trainfast.validation import check_int, check_number

__all__ = ["Decision", "KeepRule", "blocked", "interleaved", "planted_false_keeps"]


def _check_order(names: Sequence[str], seeds: int) -> None:
    if not names or len(set(names)) != len(names):
        raise ValueError(f"Invalid names: {list(names)!r} (expected distinct entry names)")
    check_int("seeds", seeds, minimum=1)


def interleaved(names: Sequence[str], seeds: int) -> list[tuple[str, int]]:
    """The runs of ``names`` for ``seeds`` seeds, round by round: ``[(A, 0), (B, 0), (A, 1),
    (B, 1), ...]``; every entry's seed ``s`` runs in round ``s``."""
    _check_order(names, seeds)
    return [(name, seed) for seed in range(seeds) for name in names]


def blocked(names: Sequence[str], seeds: int) -> list[tuple[str, int]]:
    """The order :func:`interleaved` replaces, for comparison: all seeds of the first entry,
    then all of the next (``[(A, 0), (A, 1), ..., (B, 0), ...]``)."""
    _check_order(names, seeds)
    return [(name, seed) for name in names for seed in range(seeds)]


@dataclass(frozen=True)
class Decision:
    """A keep rule's verdict on one change (:meth:`KeepRule.decide`)."""

    kept: bool
    p_value: float  # one-sided: the chance of a share this high if the change did nothing
    share: float  # of (before, after) pairs of runs in which after was faster
    time_ratio: float  # median time before / after (> 1: faster)
    token_ratio: float  # median tokens before / after (> 1: fewer); reported, not decisive


@dataclass(frozen=True)
class KeepRule:
    """Keep a change when its time to the target beats the entry it was measured on.

    ``alpha`` is the one-sided level of the exact rank-sum test
    (:func:`trainfast.timing.rank_sum_one_sided`); ``min_seeds`` the fewest runs per side the
    rule accepts (at 3 against 3 the smallest one-sided p-value is 0.05, so nothing could be
    kept at a lower level). Runs that did not reach the target count as infinitely slow.
    """

    alpha: float = 0.05
    min_seeds: int = 5
    metric: Literal["time"] = "time"

    def __post_init__(self) -> None:
        check_number("alpha", self.alpha, above=0.0, maximum=0.5)
        check_int("min_seeds", self.min_seeds, minimum=1)
        if self.metric != "time":
            raise ValueError(f"Invalid metric: {self.metric!r} (the keep rule decides on 'time')")

    def describe(self) -> str:
        """The rule in one sentence, for a record's description."""
        return (
            f"A change is kept when its time to the target beats the entry it was measured on "
            f"by the exact one-sided rank-sum test at p <= {self.alpha} over at least "
            f"{self.min_seeds} seeds each, the runs interleaved; tokens are reported, not used."
        )

    def decide(
        self,
        before_seconds: Sequence[float],
        after_seconds: Sequence[float],
        before_tokens: Sequence[float] | None = None,
        after_tokens: Sequence[float] | None = None,
    ) -> Decision:
        """The verdict on ``after`` (the change) against ``before`` (the entry it was measured
        on), from their times to the target (``inf`` for a run that never reached it)."""
        for name, runs in (("before_seconds", before_seconds), ("after_seconds", after_seconds)):
            if len(runs) < self.min_seeds:
                raise ValueError(
                    f"Invalid {name}: {len(runs)} runs (the keep rule needs at least "
                    f"{self.min_seeds} per side)"
                )
        share, p_value = rank_sum_one_sided(before_seconds, after_seconds)
        time_ratio = _ratio(statistics.median(before_seconds), statistics.median(after_seconds))
        token_ratio = math.nan
        if before_tokens is not None and after_tokens is not None:
            token_ratio = _ratio(statistics.median(before_tokens), statistics.median(after_tokens))
        kept = p_value <= self.alpha and time_ratio > 1
        return Decision(kept, p_value, share, time_ratio, token_ratio)


def _ratio(before: float, after: float) -> float:
    if math.isinf(before) and math.isinf(after):
        return math.nan
    return before / after if after else math.inf


def planted_false_keeps(
    order: Callable[[Sequence[str], int], list[tuple[str, int]]],
    *,
    drift: float,
    noise: float = 0.03,
    seeds: int = 5,
    studies: int = 1_000,
    rule: KeepRule | None = None,
    seed: int = 0,
) -> float:
    """The share of planted studies in which ``rule`` keeps a change that does nothing.

    Each study compares a change with the entry it is measured on, as a block of the log does
    (the entry first, then the change, in ``order``: :func:`interleaved` or :func:`blocked`).
    Both take the same time but for noise (each run's time multiplied by ``exp(N(0,
    noise))``), and the machine's load moves through the study: the ``i``-th run (from 0) is
    slowed by a factor ``1 + drift * i`` (``drift`` < 0: the machine grows quieter, so the
    later runs look faster). Under no drift the share is at most the rule's ``alpha``; a
    blocked order turns a steady drift into false keeps (or, rising, into false drops)."""
    rule = rule or KeepRule(min_seeds=seeds)
    check_number("drift", drift, above=-1.0 / (2 * seeds), below=1.0)
    check_number("noise", noise, minimum=0.0)
    check_int("studies", studies, minimum=1)
    runs = order(["entry", "change"], seeds)
    rng = np.random.default_rng(seed)
    load = 1 + drift * np.arange(len(runs))
    is_change = np.array([name == "change" for name, _ in runs])
    kept = 0
    for _ in range(studies):
        times = load * np.exp(rng.normal(0.0, noise, len(runs)))
        kept += rule.decide(list(times[~is_change]), list(times[is_change])).kept
    return kept / studies
