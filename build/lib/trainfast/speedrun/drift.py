"""How far the machine's load moved one configuration's time, and which verdicts that undoes.

A study runs its entries one after another on a shared machine, so the tried and ablation rows
run later than the final entry, at another load. Where the record holds one configuration twice
(a tried or ablation row can be an earlier entry's configuration, under another name), the
ratio of its two median times shows how far the load alone moved a time. A tried or ablation
row whose median differs from the final entry's by less than that *drift* is not decided by the
record, whatever its rank-sum verdict (:func:`~trainfast.speedrun.compare` assumes both sides
ran under the same conditions); one only a little beyond it is *at the edge*.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any

from trainfast.speedrun.first_edition import Summary
from trainfast.validation import check_number

__all__ = ["LoadDrift", "load_drift", "time_ratio"]

LATER_PARTS = ("tried", "ablation")  # the parts a study runs after its log's final entry


def time_ratio(a: Summary, b: Summary) -> float:
    """How many times slower the slower of two median times is (>= 1)."""
    return max(a.median_seconds / b.median_seconds, b.median_seconds / a.median_seconds)


@dataclass(frozen=True)
class LoadDrift:
    """What the load's drift leaves decided among a study's later rows (:func:`load_drift`)."""

    twins: list[tuple[str, str]]  # pairs of entries that ran one configuration
    drift: float  # the largest time_ratio of a pair; nan without pairs
    undecided: frozenset[str]  # later rows with a verdict on time within the drift
    at_edge: list[str]  # decided later rows less than `edge` beyond the drift
    closest: str | None  # the decided later row nearest the final entry's time

    def verdict(self, summary: Summary) -> str:
        """A row's verdict on time, or "not decided" where the drift covers its margin."""
        return "not decided" if summary.entry in self.undecided else summary.verdict


def load_drift(
    summaries: dict[str, Summary],
    configs: dict[str, Any],
    final: str | None,
    edge: float = 0.01,
) -> LoadDrift:
    """The drift of ``summaries`` (by entry name) and the later rows it leaves undecided.

    ``configs`` maps entry names to their configurations (a dataclass with a ``name`` field);
    two entries whose configurations differ only in name are twins. ``final`` names the log's
    final entry (None if the record lacks it: then nothing is undecided). Rows already
    "within noise" stay so; a row counts as decided when its margin is at least the drift.
    """
    check_number("edge", edge, minimum=0.0)
    unknown = sorted(set(summaries) - set(configs))
    if unknown:
        raise ValueError(f"Unknown entries: {unknown} (no configuration given for them)")
    twins = [
        (a, b)
        for a, b in itertools.combinations(summaries, 2)
        if dataclasses.replace(configs[a], name=b) == configs[b]
        and all(math.isfinite(summaries[n].median_seconds) for n in (a, b))
    ]
    drift = max((time_ratio(summaries[a], summaries[b]) for a, b in twins), default=math.nan)
    final_row = summaries.get(final) if final is not None else None
    later = [s for s in summaries.values() if s.part in LATER_PARTS]
    judged = [s for s in later if s.verdict != "within noise"]
    if final_row is None:
        return LoadDrift(twins, drift, frozenset(), [], None)
    undecided = frozenset(s.entry for s in judged if time_ratio(s, final_row) < drift)
    decided = [s for s in judged if s.entry not in undecided]
    at_edge = sorted(s.entry for s in decided if time_ratio(s, final_row) - drift < edge)
    closest = min(decided, key=lambda s: time_ratio(s, final_row), default=None)
    return LoadDrift(twins, drift, undecided, at_edge, closest.entry if closest else None)
