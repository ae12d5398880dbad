"""Reading a study's record: the facts the speedrun chapter's sentences are built from.

A record of :func:`~trainfast.speedrun.study.run_log` holds one row per run. The chapter reads
it at three levels, each a pure function of the record:

* the **log** (:func:`log_readings`): each change against the entry it was measured on, on the
  tune split, with the keep rule's verdict and the gain's two factors, tokens and tokens/s
  (:class:`~trainfast.speedrun.study.BlockReading`);
* the **waterfall** (:func:`waterfall`): the kept changes one after another, each multiplying
  the time to the target by its token factor and by its tokens/s factor, so the chain shows
  what the gains are made of (learning: fewer tokens; systems: more tokens per second);
* the **validation block** (:func:`validation_reading`, :func:`seed_ratios`,
  :func:`ablation_readings`): the baseline and the final entry measured afresh, the headline's
  seed-by-seed spread, and the final entry without each kept learning change.

:func:`study_record` finds the record (:func:`find_study_record`: None where there is none):
the newest CPU record of this edition's study (its rows have blocks) in the book's records,
or in the folder named by ``$TRAINFAST_SPEEDRUN_RECORDS`` (a record measured elsewhere, e.g.
with a smaller preset while the book's is being measured).

When not to use it: on a first edition record (no blocks; :mod:`~trainfast.speedrun.first_edition`
reads those), or on a GPU log (:mod:`~trainfast.speedrun.gpu` reads it).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from trainfast.records import Record, records_for
from trainfast.speedrun.study import RECORD_NAME, BlockReading, blocks

__all__ = [
    "RECORDS_VARIABLE",
    "LoggedReferences",
    "WaterfallStep",
    "ablation_readings",
    "find_study_record",
    "first_edition_waterfall",
    "log_readings",
    "median_load",
    "references_of",
    "seed_ratios",
    "study_record",
    "validation_reading",
    "waterfall",
]

#: The environment variable that points the chapter at another folder of records.
RECORDS_VARIABLE = "TRAINFAST_SPEEDRUN_RECORDS"


def study_record(directory: str | Path | None = None) -> Record:
    """The newest CPU record of this edition's study in ``directory`` (default:
    ``$TRAINFAST_SPEEDRUN_RECORDS`` if set, else the book's ``book/records``). ``ValueError``
    naming the folder if it holds none, with the command that makes one."""
    directory = directory if directory is not None else os.environ.get(RECORDS_VARIABLE) or None
    found = [r for r in records_for(RECORD_NAME, "cpu", directory) if "block" in r.columns]
    if not found:
        where = directory if directory is not None else "the book's records"
        raise ValueError(
            f"No record of the speedrun study in {str(where)!r}: measure it with "
            "`make measure ONLY=speedrun` (or `python -m trainfast.speedrun --preset cpu --log "
            f"--ablation --out DIR` and set {RECORDS_VARIABLE}=DIR)"
        )
    return found[0]


def find_study_record(directory: str | Path | None = None) -> Record | None:
    """:func:`study_record`, or None where there is none yet: a page that reads the study says
    what the study will measure until its record is committed, instead of failing."""
    try:
        return study_record(directory)
    except ValueError:
        return None


def log_readings(record: Record) -> list[BlockReading]:
    """Each change of the log against the entry it was measured on, in the order measured."""
    return [b for b in blocks(record) if b.after.part == "log"]


def validation_reading(record: Record) -> BlockReading | None:
    """The final entry against the baseline in the validation block (None where the log kept
    nothing, so the block measured the baseline alone, or the block did not run)."""
    found = [b for b in blocks(record) if b.after.part == "validation"]
    return found[0] if found else None


def ablation_readings(record: Record) -> list[BlockReading]:
    """Each ablation row against the final entry, measured in the same validation block."""
    return [b for b in blocks(record) if b.after.part == "ablation"]


def seed_ratios(record: Record) -> list[float]:
    """Seed by seed, the baseline's time over the final entry's in the validation block (seed
    ``s`` of both ran in round ``s``, on the same data order); a missed target is ``inf`` time.
    Empty where there is no final entry to compare."""
    reading = validation_reading(record)
    if reading is None:
        return []

    def times(entry: str) -> dict[int, float]:
        return {
            r["seed"]: r["train_seconds"] if r["reached"] else math.inf
            for r in record.rows
            if r["part"] == "validation" and r["entry"] == entry
        }

    before, after = times(reading.before.entry), times(reading.after.entry)
    ratios = []
    for seed in sorted(before.keys() & after.keys()):
        b, a = before[seed], after[seed]
        ratios.append(math.nan if math.isinf(a) and math.isinf(b) else b / a)
    return ratios


@dataclass(frozen=True)
class WaterfallStep:
    """One kept change in the chain: the time before it, and the factors it divided it by."""

    name: str
    kind: str  # "learning" or "systems": the kind of change it is
    before_seconds: float  # the chain's time to the target before this change
    token_ratio: float  # > 1: fewer tokens to the target
    throughput_ratio: float  # > 1: more tokens per second

    @property
    def after_tokens_seconds(self) -> float:
        """The time after the token factor alone."""
        return self.before_seconds / self.token_ratio

    @property
    def after_seconds(self) -> float:
        """The time after both factors."""
        return self.before_seconds / (self.token_ratio * self.throughput_ratio)


def waterfall(record: Record) -> list[WaterfallStep]:
    """The kept changes of the log, in order, each applied to the chain's time so far: it
    starts at the baseline's median time in the first block (tune split) and divides it by each
    kept change's token and tokens/s ratios, measured in that change's own block. A kept change
    whose runs never reached the target on one side has no factors and is left out."""
    readings = log_readings(record)
    if not readings:
        return []
    start = readings[0].before.median_seconds
    steps, now = [], start
    for reading in readings:
        if not reading.decision.kept or reading.gain is None:
            continue
        g = reading.gain
        steps.append(
            WaterfallStep(reading.after.entry, reading.after.kind, now, g.token_ratio,
                          g.throughput_ratio)
        )  # fmt: skip
        now = steps[-1].after_seconds
    return steps


def first_edition_waterfall(record: Record) -> list[WaterfallStep]:
    """:func:`waterfall` for a first edition's record (blocked runs, every change measured on
    the last entry kept, no tune split; :mod:`~trainfast.speedrun.first_edition`): the kept
    changes of its log, in order, from the baseline's median time, each dividing it by its
    token ratio (the median tokens of the entry it was measured on over its own) and by its
    time ratio over that token ratio. The chain ends at the final entry's median time.
    ``ValueError`` for a record of this edition (it has blocks)."""
    from trainfast.speedrun.changes import LOG
    from trainfast.speedrun.first_edition import summarize

    if "block" in record.columns:
        raise ValueError(
            f"Invalid record: {record.name!r} is of this edition (read it with waterfall)"
        )
    kinds = {c.name: c.kind for c in LOG}  # the first edition's log named no kinds
    summaries = [s for s in summarize(record) if s.part == "log"]
    by_name = {s.entry: s for s in summaries}
    if not summaries:
        return []
    steps, now = [], summaries[0].median_seconds
    for s in summaries[1:]:
        before = by_name.get(s.compared_to)
        if not s.kept or before is None or not math.isfinite(s.ratio):
            continue
        token_ratio = before.median_tokens / s.median_tokens
        steps.append(
            WaterfallStep(s.entry, kinds[s.entry], now, token_ratio, s.ratio / token_ratio)
        )
        now = steps[-1].after_seconds
    return steps


@dataclass(frozen=True)
class LoggedReferences:
    """The target and the count models' losses on one split's windows, as the rows hold them."""

    split: str
    target: float
    unigram: float
    bigram: float

    @property
    def fraction(self) -> float:
        """How far the target lies from the unigram loss (0) towards the bigram loss (1)."""
        return (self.unigram - self.target) / (self.unigram - self.bigram)


def references_of(record: Record, split: str | None = None) -> LoggedReferences:
    """The target and the unigram and bigram losses of ``record``'s runs on ``split`` (default:
    the validation split, or the tune split for a study stopped before its validation block).
    ``ValueError`` if no run was on that split or the runs disagree (two corpora)."""
    if split is None:
        split = "validation" if any(r["split"] == "validation" for r in record.rows) else "tune"
    rows = [r for r in record.rows if r["split"] == split]
    values = {(r["target_loss"], r["unigram_loss"], r["bigram_loss"]) for r in rows}
    if len(values) != 1:
        raise ValueError(
            f"Invalid split: {split!r} ({len(values)} sets of reference losses in the record's "
            "runs on it; expected one)"
        )
    target, unigram, bigram = values.pop()
    return LoggedReferences(split, target, unigram, bigram)


def median_load(record: Record) -> float:
    """The median one-minute load average at the start of the record's runs."""
    return statistics.median(r["load_before"] for r in record.rows)
