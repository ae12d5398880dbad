"""Run entries of the log for several seeds, write one record, and judge each change.

:func:`run_study` trains every entry for every seed with :func:`~trainfast.speedrun.run_to_target`
and returns a :class:`~trainfast.records.Record` with one row per (entry, seed): the time to the
target on the training clock, the evaluation time kept apart, tokens, steps, the last
validation loss, whether the target was reached, the machine's load average (one minute, from
``os.getloadavg``) before and after the run, and the corpus's SHA-256. ``complete`` says whether
every planned run is in the record: a study cut short by a time limit writes what finished,
after each entry, with ``complete`` false. :func:`summarize` turns the rows into the chapter's
table: per entry the median time and its spread, the tokens to the target, the ratio to the
entry it is compared with, and the rank-sum verdict (:func:`~trainfast.speedrun.compare`).

With three seeds against three, the exact two-sided rank-sum p-value cannot go below 0.1 (two
of the twenty ways of splitting six runs put all of one side first). The study therefore calls a
change *beyond the noise* at p <= 0.1, which with three seeds means that every run of it beat
every run of the entry before; "did not pay" is the same test the other way round.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainfast.records import Record, make_record, write_record
from trainfast.speedrun.changes import Entry, Preset
from trainfast.speedrun.data import PreparedData, prepare
from trainfast.speedrun.harness import RunResult, compare, run_to_target
from trainfast.timing import rank_sum_test

__all__ = [
    "ALPHA",
    "RECORD_NAME",
    "AblationReading",
    "Summary",
    "cache_folder",
    "dropped_changes",
    "merge_records",
    "prepared",
    "read_ablation",
    "results_of",
    "run_log",
    "run_study",
    "speedrun_record",
    "summarize",
    "summary_table",
]

RECORD_NAME = "speedrun"
ALPHA = 0.1  # the smallest two-sided p-value three seeds against three can reach

_UNITS = {"train_seconds": "s", "eval_seconds": "s", "target_loss": "nats/token"}


def cache_folder(chosen: Preset) -> Path:
    """Where a preset's prepared tokens live: ``$TRAINFAST_CACHE`` (default
    ``~/.cache/trainfast``) ``/speedrun/<corpus size>-<vocabulary>``."""
    root = Path(os.environ.get("TRAINFAST_CACHE", Path.home() / ".cache" / "trainfast"))
    size = "all" if chosen.corpus_bytes is None else str(chosen.corpus_bytes)
    return root / "speedrun" / f"torch-{size}-{chosen.vocab_size}"


def prepared(chosen: Preset) -> PreparedData:
    """The preset's corpus, tokenized once and cached (:func:`cache_folder`)."""
    return prepare(
        cache_folder(chosen), max_bytes=chosen.corpus_bytes, vocab_size=chosen.vocab_size
    )


def _row(entry: Entry, result: RunResult, chosen: Preset, data, before: float) -> dict[str, Any]:
    return {
        "part": entry.part,
        "entry": entry.name,
        "compared_to": entry.compared_to or "",
        "seed": result.seed,
        "reached": result.reached,
        "train_seconds": result.train_seconds,
        "eval_seconds": result.eval_seconds,
        "steps": result.steps,
        "tokens": result.tokens,
        "final_loss": result.final_loss,
        "target_loss": chosen.target.loss,
        "preset": chosen.name,
        "load_before": before,
        "load_after": os.getloadavg()[0],
        "corpus_sha256": data.corpus_sha256,
        "complete": False,
    }


def run_study(
    chosen: Preset,
    planned: Sequence[Entry],
    *,
    seeds: int | None = None,
    device: torch.device | None = None,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = print,
    description: str = "",
    command: str | None = None,
) -> Record:
    """Train every entry of ``planned`` for ``seeds`` seeds (default: the preset's).

    With ``out``, the record is written there after each entry (``complete`` false until the
    last), so a study stopped by a time limit keeps what it finished.
    """
    if not planned:
        raise ValueError("run_study needs at least one entry")
    study = _Study(chosen, seeds, device, out, progress, description, command)
    for entry in planned:
        study.measure(entry, last=entry is planned[-1])
    return study.record


def run_log(
    chosen: Preset,
    *,
    ablation: bool = True,
    seeds: int | None = None,
    device: torch.device | None = None,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = print,
    command: str | None = None,
) -> Record:
    """The log as a speedrun keeps one: each change of :data:`~trainfast.speedrun.changes.LOG` is
    measured on top of the last entry that was kept, and kept only if it beats that entry
    beyond the noise, in time, or in tokens without a time slower beyond the noise
    (:attr:`Summary.kept`); then the tried changes on the final entry and,
    with ``ablation``, the final entry without each kept change. What was dropped can be read
    back from the record (:func:`dropped_changes`)."""
    from trainfast.speedrun.changes import LOG, log
    from trainfast.speedrun.changes import ablation as ablation_entries

    text = (
        f"Time to a validation loss of {chosen.target.loss} on the '{chosen.name}' preset, "
        f"{chosen.seeds if seeds is None else seeds} seeds per entry, one run at a time; the "
        "clock counts training only. Each change of the log was measured on the last entry "
        "kept and kept only if it beat the noise, in time or in tokens."
    )
    study = _Study(chosen, seeds, device, out, progress, text, command)
    if study.seeds < 3:  # 2 against 2 cannot reach p <= 0.1: every change would be dropped
        raise ValueError(
            f"Invalid seeds: {study.seeds} (the log needs at least 3 per entry: with fewer, "
            f"no rank-sum p-value reaches {ALPHA} and no change could be kept)"
        )
    dropped: set[str] = set()
    for i in range(len(LOG) + 1):
        entry = log(chosen, dropped)[i]
        study.measure(entry, last=False)
        if i and entry.name in dropped_changes(study.record):
            dropped.add(entry.name)
    rest = log(chosen, dropped)[len(LOG) + 1 :]
    rest += ablation_entries(chosen, dropped) if ablation else []
    for entry in rest:
        study.measure(entry, last=entry is rest[-1])
    if not rest:
        study.finish()
    return study.record


def dropped_changes(record: Record, alpha: float = ALPHA) -> set[str]:
    """The changes of the log that ``record``'s study did not keep (:attr:`Summary.kept`)."""
    from trainfast.speedrun.changes import LOG

    names = {change.name for change in LOG}
    return {
        s.entry
        for s in summarize(record, alpha)
        if s.part == "log" and s.entry in names and not s.kept
    }


class _Study:
    """Rows of a study so far, written as a record after every entry."""

    def __init__(self, chosen, seeds, device, out, progress, description, command) -> None:
        seeds = chosen.seeds if seeds is None else seeds
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise ValueError(f"Invalid seeds: {seeds!r} (expected an int >= 1)")
        self.chosen, self.seeds, self.device, self.out = chosen, seeds, device, out
        self.progress, self.command = progress, command
        self.data = prepared(chosen)
        self.text = description or (
            f"Time to a validation loss of {chosen.target.loss} on the '{chosen.name}' preset, "
            f"{seeds} seeds per entry; the clock counts training only."
        )
        self.rows: list[dict[str, Any]] = []
        self.record: Record

    def measure(self, entry: Entry, last: bool) -> None:
        for seed in range(self.seeds):
            before = os.getloadavg()[0]
            result = run_to_target(
                entry.config,
                self.data,
                self.chosen.target,
                seed=seed,
                device=self.device,
                progress=self.progress,
            )
            self.rows.append(_row(entry, result, self.chosen, self.data, before))
        self.finish() if last else self._write()

    def finish(self) -> None:
        for row in self.rows:
            row["complete"] = True
        self._write()

    def _write(self) -> None:
        self.record = make_record(
            RECORD_NAME,
            self.text,
            self.rows,
            units=_UNITS,
            device=self.device,
            command=self.command,
        )
        if self.out is not None:
            write_record(self.record, self.out)


def results_of(record: Record) -> dict[str, list[RunResult]]:
    """The record's runs by entry, as :class:`RunResult` (without their loss history)."""
    runs: dict[str, list[RunResult]] = {}
    for row in record.rows:
        runs.setdefault(row["entry"], []).append(
            RunResult(
                row["entry"],
                row["seed"],
                row["reached"],
                row["train_seconds"],
                row["eval_seconds"],
                row["steps"],
                row["tokens"],
                row["final_loss"],
            )
        )
    return runs


@dataclass(frozen=True)
class Summary:
    """One entry of a study: its median time to the target and how it compares."""

    part: str
    entry: str
    compared_to: str
    seeds: int
    reached: int  # seeds that reached the target
    median_seconds: float  # inf unless most seeds reached it
    spread_seconds: float  # max - min over the seeds that reached it
    median_tokens: float
    ratio: float  # median time of compared_to / this one's (> 1: faster)
    p_value: float
    verdict: str
    fewer_tokens: bool = False  # fewer tokens to the target than compared_to, beyond the noise
    trained_alike: bool = False  # every seed: the same steps and final loss as compared_to's

    @property
    def kept(self) -> bool:
        """Whether a change of the log is kept (:func:`run_log`): its time beats the entry it
        was measured on beyond the noise; or it needed fewer tokens beyond the noise (tokens,
        unlike seconds, do not depend on the machine's load) and its time is not slower
        beyond the noise. Never when it *trained alike*: every seed took the same steps to the
        same final loss, bit for bit, as the entry it was measured on, so the change did not
        touch the arithmetic before the target (a schedule whose decay starts later, say) and a
        faster time can only be the machine's load. (A change that makes a step cheaper with
        the very same arithmetic would be refused too; the log has none: a fused kernel or a
        second process adds in another order.)"""
        if self.trained_alike:
            return False
        return self.verdict == "beats the noise" or (
            self.fewer_tokens and self.verdict != "did not pay"
        )


def summarize(record: Record, alpha: float = ALPHA) -> list[Summary]:
    """One :class:`Summary` per entry of ``record``, in the record's order.

    The verdict against ``compared_to``: "beats the noise" (faster, rank-sum p <= ``alpha``),
    "did not pay" (slower by the same test), "within noise" (neither), "–" (nothing to compare
    with, or it is not in the record)."""
    runs = results_of(record)
    first = {}
    for row in record.rows:
        first.setdefault(row["entry"], row)
    out = []
    for name, results in runs.items():
        row = first[name]
        times = [r.train_seconds if r.reached else float("inf") for r in results]
        reached = [r for r in results if r.reached]
        spread = max(t for t in times if t != float("inf")) - min(times) if reached else 0.0
        other = runs.get(row["compared_to"])
        ratio, p_value, verdict, fewer_tokens = float("nan"), float("nan"), "–", False
        alike = False
        if other:
            alike = _trained_alike(results, other)
            share, tokens_p = rank_sum_test(_tokens(other), _tokens(results))
            fewer_tokens = tokens_p <= alpha and share > 0.5
            faster = compare(other, results, alpha=alpha)
            slower = compare(results, other, alpha=alpha)
            ratio, p_value = faster.speedup, faster.p_value
            verdict = (
                "beats the noise"
                if faster.beats_noise
                else "did not pay"
                if slower.beats_noise
                else "within noise"
            )
        out.append(
            Summary(
                row["part"],
                name,
                row["compared_to"],
                len(results),
                len(reached),
                statistics.median(times),
                spread,
                statistics.median(r.tokens for r in results),
                ratio,
                p_value,
                verdict,
                fewer_tokens,
                alike,
            )
        )
    return out


def _trained_alike(results: Sequence[RunResult], other: Sequence[RunResult]) -> bool:
    """Every seed of ``results`` took the same steps to the same final loss as ``other``'s."""
    by_seed = {r.seed: r for r in other}
    return all(
        r.seed in by_seed
        and (r.reached, r.steps, r.final_loss)
        == (by_seed[r.seed].reached, by_seed[r.seed].steps, by_seed[r.seed].final_loss)
        for r in results
    )


def _tokens(results: Sequence[RunResult]) -> list[float]:
    return [r.tokens if r.reached else float("inf") for r in results]


@dataclass(frozen=True)
class AblationReading:
    """What the leave-one-out ablation says about each change of the final entry.

    An ablation entry ``"without X"`` is the final entry with ``X`` taken out, compared with the
    final entry, so its verdict reads backwards: "did not pay" (slower without ``X``) means ``X``
    still pays at the end of the log, "beats the noise" (faster without it) means ``X`` now costs
    more than it saves. ``turned`` are the changes that still pay at the end although the log's
    own verdict, where they were added, was "did not pay".
    """

    still_pays: tuple[str, ...]
    turned: tuple[str, ...]
    costs: tuple[str, ...]
    within_noise: tuple[str, ...]


def read_ablation(summaries: list[Summary]) -> AblationReading:
    """Group the changes of ``summarize(record)``'s ablation entries by what taking them out did."""
    by_verdict: dict[str, list[str]] = {}
    for s in summaries:
        if s.part == "ablation":
            by_verdict.setdefault(s.verdict, []).append(s.entry.removeprefix("without "))
    log_verdict = {s.entry: s.verdict for s in summaries if s.part == "log"}
    still_pays = tuple(by_verdict.get("did not pay", []))
    return AblationReading(
        still_pays=still_pays,
        turned=tuple(name for name in still_pays if log_verdict.get(name) == "did not pay"),
        costs=tuple(by_verdict.get("beats the noise", [])),
        within_noise=tuple(by_verdict.get("within noise", [])),
    )


def _seconds(value: float) -> str:
    return "–" if value != value or value == float("inf") else f"{value:,.1f}"


def summary_table(record: Record, book: Record | None = None, alpha: float = ALPHA) -> str:
    """The study as a Markdown table: one line per entry; with ``book`` (the book's record of
    the same preset), the book's median time and verdict beside the reader's."""
    header = ["entry", "reached", "median time to target (s)", "spread (s)"]
    header += ["tokens to target", "speed-up vs compared", "verdict"]
    theirs = {s.entry: s for s in summarize(book, alpha)} if book is not None else {}
    if book is not None:
        header += ["book's median (s)", "book's verdict"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summarize(record, alpha):
        ratio = "–" if s.ratio != s.ratio else f"{s.ratio:.2f}x vs {s.compared_to}"
        cells = [s.entry, f"{s.reached}/{s.seeds}", _seconds(s.median_seconds)]
        cells += [_seconds(s.spread_seconds), f"{s.median_tokens:,.0f}", ratio, s.verdict]
        if book is not None:
            other = theirs.get(s.entry)
            cells += [_seconds(other.median_seconds), other.verdict] if other else ["–", "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def speedrun_record(device: torch.device, quick: bool, out: str | Path | None = None) -> Record:
    """The ``speedrun`` benchmark of ``python -m trainfast.measure``.

    On a CUDA device: the ``gpu`` preset, sized for it
    (:func:`~trainfast.speedrun.changes.gpu_preset`; the baseline and one entry with every change
    of the log, the tried ones too, except those the preset never applies: data parallel and the
    batch sizes; 2 seeds). Elsewhere: the
    ``cpu`` preset's whole log (:func:`run_log`) and ablation, one thread (``python -m
    trainfast.speedrun --preset cpu --log --ablation --out DIR`` does the same and writes after
    every entry).
    ``quick``: the ``tiny`` preset's baseline and last entry of the log, one seed, for a smoke
    test. With ``out`` (``measure --out``), the record is written there after each entry, so a
    study stopped at its time limit keeps what it finished.
    """
    from trainfast.speedrun.changes import LOG, entries, gpu_preset, preset

    if device.type == "cpu":
        torch.set_num_threads(1)
    if quick:
        tiny = preset("tiny")
        chosen = entries(tiny, ["baseline", LOG[-1].name])
        return run_study(tiny, chosen, seeds=1, device=device, out=out)
    if device.type == "cuda":
        gpu = gpu_preset(device)
        return run_study(gpu, entries(gpu), device=device, out=out)
    return run_log(preset("cpu"), device=device, out=out)


def merge_records(first: Record, *others: Record) -> Record:
    """One record of studies of the same preset and corpus run as processes side by side on one
    machine: ``first``'s rows, then each of ``others``' rows of the entries no record before it
    has (the earlier record wins where two ran an entry), every command, the latest date. The
    description names the entries each later process gave, since they ran at other moments of
    the machine's load. ``ValueError`` if the presets, corpora or targets differ, or the
    environments (machine, torch, Python)."""
    rows, commands, parts = list(first.rows), [first.command], []
    for other in others:
        for key in ("preset", "corpus_sha256", "target_loss"):
            a, b = {r[key] for r in first.rows}, {r[key] for r in other.rows}
            if a != b or len(a) != 1:
                raise ValueError(f"Cannot merge records with different {key}: {a} and {b}")
        if first.environment != other.environment:
            raise ValueError("Cannot merge records measured in different environments")
        have = {r["entry"] for r in rows}
        added = [r for r in other.rows if r["entry"] not in have]
        rows += added
        commands.append(other.command)
        parts.append(", ".join(dict.fromkeys(r["entry"] for r in added)))
    parts = [p for p in parts if p]
    if len(parts) == 1:
        note = f" Taken from a second process run beside the first: {parts[0]}."
    elif parts:
        note = (
            " Taken from further processes, each run beside another: "
            + "; ".join(f"({i}) {p}" for i, p in enumerate(parts, 2))
            + "."
        )
    else:
        note = ""
    return Record(
        name=first.name,
        description=first.description + note,
        columns=first.columns,
        rows=rows,
        environment=first.environment,
        created=max(r.created for r in (first, *others)),
        command=" & ".join(commands),
        units=first.units,
        trainfast_version=first.trainfast_version,
        source_commit=first.source_commit,
    )
