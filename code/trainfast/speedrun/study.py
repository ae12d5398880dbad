"""Run the log's comparisons interleaved, keep changes on the tune split, measure the headline
afresh on the validation split, and write it all as one record.

:func:`run_log` follows the rules of :mod:`trainfast.speedrun.protocol`, declared in the
record's description before the first run:

1. **Keep decisions, on the tune split.** Each change of the log is measured on top of the
   last entry kept, in a *block* of its own: the two entries, every seed, interleaved round by
   round (A1 B1 A2 B2 ...). The keep rule (:class:`~trainfast.speedrun.protocol.KeepRule`,
   time, one-sided rank-sum test) decides; tokens and tokens/s are reported.
2. **The headline, on the validation split.** Once the log is decided, the baseline, the final
   entry and (with ``ablation``) the final entry without each kept learning change are
   measured again, fresh, in one interleaved block on the validation split, which no decision
   has looked at. The headline (:func:`headline_of`) is the ratio of the baseline's and the
   final entry's median times in that block, with its bootstrap interval.

Each row is one run: its part, block, entry, the entry it is compared with, seed, split, the
time on the training clock (evaluation timed apart), tokens, tokens/s, the last held-out loss,
whether it reached the target, the unigram and bigram count models' losses on the same windows
(:mod:`trainfast.speedrun.references`), the threads, the machine's load average before and
after, the corpus's SHA-256 and the CPU it ran on (:mod:`trainfast.speedrun.machine`). The
record is written after every run; ``complete`` is false until the last.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from trainfast.records import Record, make_record, write_record
from trainfast.speedrun.changes import NEEDS_BF16, Entry, Preset
from trainfast.speedrun.data import PreparedData, prepare
from trainfast.speedrun.gains import Gain, gain, median_throughput
from trainfast.speedrun.harness import RunResult, Target, run_to_target
from trainfast.speedrun.headline import Headline, headline
from trainfast.speedrun.machine import describe_cpu
from trainfast.speedrun.protocol import Decision, KeepRule, interleaved
from trainfast.speedrun.references import ReferenceLosses, reference_losses
from trainfast.timing import rank_sum_test

__all__ = [
    "ABLATION_ALPHA",
    "RECORD_NAME",
    "BlockReading",
    "Summary",
    "blocks",
    "cache_folder",
    "check_comparable",
    "dropped_changes",
    "headline_of",
    "merge_records",
    "prepared",
    "run_log",
    "run_study",
    "speedrun_record",
    "summarize",
    "summary_table",
]

RECORD_NAME = "speedrun"
ABLATION_ALPHA = 0.05  # two-sided: taking a change out can make the final entry slower or faster

_UNITS = {
    "train_seconds": "s",
    "eval_seconds": "s",
    "tokens_per_second": "tokens/s",
    "target_loss": "nats/token",
    "unigram_loss": "nats/token",
    "bigram_loss": "nats/token",
}


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


class _Study:
    """Rows of a study so far, written as a record after every run."""

    def __init__(self, chosen, seeds, device, out, progress, description, command) -> None:
        seeds = chosen.seeds if seeds is None else seeds
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise ValueError(f"Invalid seeds: {seeds!r} (expected an int >= 1)")
        self.chosen, self.seeds, self.out = chosen, seeds, out
        self.device = device if device is not None else torch.device("cpu")
        self.progress, self.command, self.text = progress, command, description
        self.data = prepared(chosen)
        seq, tokens = chosen.shape.seq_len, chosen.target.eval_tokens
        self.references: dict[str, ReferenceLosses] = {
            split: reference_losses(self.data, seq, tokens, split=split)
            for split in ("tune", "validation")
        }
        self.cpu = describe_cpu().text() if self.device.type == "cpu" else ""
        self.rows: list[dict[str, Any]] = []
        self.blocks = 0
        self.warmed: set[str] = set()
        self.extra: Callable[[Entry], dict[str, Any]] | None = None  # more columns per row
        self.record: Record | None = None

    def check_target(self) -> None:
        """Refuse a target less than ``min_fraction`` of the way to the bigram loss."""
        references = self.references["validation"]
        fraction = references.fraction_of(self.chosen.target.loss)
        if self.chosen.min_fraction is not None and fraction < self.chosen.min_fraction:
            raise ValueError(
                f"Invalid target: {self.chosen.target.loss} (on the validation windows the "
                f"unigram loss is {references.unigram:.3f} and the bigram loss "
                f"{references.bigram:.3f}: the target is {fraction:.2f} of the way, less than "
                f"the preset's {self.chosen.min_fraction})"
            )

    def warm_up(self, entry: Entry, split: str) -> None:
        """One short untimed run of a compiled entry before its timed runs: it compiles the step
        in this process, whose later runs of the entry reuse the compiled graph (a
        data-parallel entry's ranks, fresh processes, find the generated code in the on-disk
        cache and still trace, on their clock)."""
        if not entry.config.compile or entry.name in self.warmed:
            return
        target = replace(self.chosen.target, max_steps=self.chosen.target.eval_every)
        run_to_target(
            entry.config, self.data, target, seed=0, device=self.device, progress=None, split=split
        )
        self.warmed.add(entry.name)

    def block(self, planned: Sequence[Entry], split: str, kept: Callable | None = None) -> int:
        """Measure ``planned`` interleaved on ``split`` as one block; ``kept(rows)`` (for a
        comparison of the log) marks the candidate's rows with the keep rule's verdict."""
        block, self.blocks = self.blocks, self.blocks + 1
        for entry in planned:
            self.warm_up(entry, split)
        by_name = {entry.name: entry for entry in planned}
        for name, seed in interleaved(list(by_name), self.seeds):
            entry = by_name[name]
            before = os.getloadavg()[0]
            result = run_to_target(
                entry.config,
                self.data,
                self.chosen.target,
                seed=seed,
                device=self.device,
                progress=self.progress,
                split=split,
            )
            self.rows.append(self._row(entry, block, result, before))
            self.write()
        if kept is not None:
            verdict = kept([r for r in self.rows if r["block"] == block])
            for row in self.rows:
                if row["block"] == block and row["entry"] == planned[-1].name:
                    row["kept"] = verdict
            self.write()
        return block

    def _row(self, entry: Entry, block: int, result: RunResult, before: float) -> dict[str, Any]:
        references = self.references[result.split]
        return {
            "part": entry.part,
            "block": block,
            "entry": entry.name,
            "compared_to": entry.compared_to or "",
            "kind": entry.kind,
            "seed": result.seed,
            "split": result.split,
            "reached": result.reached,
            "train_seconds": result.train_seconds,
            "eval_seconds": result.eval_seconds,
            "steps": result.steps,
            "tokens": result.tokens,
            "tokens_per_second": result.tokens_per_second,
            "final_loss": result.final_loss,
            "target_loss": self.chosen.target.loss,
            "unigram_loss": references.unigram,
            "bigram_loss": references.bigram,
            "threads": result.threads,
            "preset": self.chosen.name,
            "load_before": before,
            "load_after": os.getloadavg()[0],
            "corpus_sha256": self.data.corpus_sha256,
            "cpu": self.cpu,
            "kept": None,
            **(self.extra(entry) if self.extra is not None else {}),
            "complete": False,
        }

    def write(self, complete: bool = False) -> None:
        for row in self.rows:
            row["complete"] = complete
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


def _preamble(chosen: Preset, seeds: int, target: Target) -> str:
    return (
        f"Time to a held-out loss of {target.loss} on the '{chosen.name}' preset, {seeds} seeds "
        "per entry (each seed its own initialisation and data order), the runs of each block "
        "interleaved round by round; the clock counts training only, batch loading included."
    )


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
    split: str = "validation",
) -> Record:
    """Train every entry of ``planned`` for ``seeds`` seeds (default: the preset's), the runs
    interleaved round by round, on ``split``, as one block. With ``out``, the record is written
    there after every run (``complete`` false until the last)."""
    if not planned:
        raise ValueError("run_study needs at least one entry")
    study = _Study(chosen, seeds, device, out, progress, "", command)
    study.text = description or _preamble(chosen, study.seeds, chosen.target)
    study.block(planned, split)
    study.write(complete=True)
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
    rule: KeepRule | None = None,
    skip: Sequence[str] | None = None,
) -> Record:
    """The log as the protocol runs it: each change of :data:`~trainfast.speedrun.changes.LOG`
    measured on the last entry kept, interleaved, on the tune split, and kept by ``rule``
    (default :class:`~trainfast.speedrun.protocol.KeepRule`); then the baseline, the final
    entry and (with ``ablation``) the ablation, afresh, on the validation split.

    ``skip`` names changes left out (default: :data:`~trainfast.speedrun.changes.NEEDS_BF16`
    on a CPU without bf16 instructions). ``ValueError`` if ``seeds`` is below the rule's
    ``min_seeds`` or the preset's target is not far enough below the unigram loss."""
    from trainfast.speedrun.changes import ablation as ablation_entries
    from trainfast.speedrun.changes import log

    rule = rule or KeepRule()
    study = _Study(chosen, seeds, device, out, progress, "", command)
    if study.seeds < rule.min_seeds:
        raise ValueError(
            f"Invalid seeds: {study.seeds} (the keep rule needs at least {rule.min_seeds} per "
            "entry)"
        )
    study.check_target()
    if skip is None:
        no_bf16 = study.device.type == "cpu" and not describe_cpu().has_bf16
        skip = NEEDS_BF16 if no_bf16 else ()
    references = study.references["validation"]
    study.text = (
        _preamble(chosen, study.seeds, chosen.target)
        + f" {rule.describe()} Decisions on the tune split; the baseline, the final entry"
        + (" and the ablation" if ablation else "")
        + " then measured afresh, interleaved, on the validation split, the headline from "
        f"those runs. On the validation windows a unigram count model scores "
        f"{references.unigram:.3f} and an add-{references.k} bigram model "
        f"{references.bigram:.3f} nats/token. Each compiled entry had one untimed warm-up run "
        "first, so its timed single-process runs reuse a compiled graph (data-parallel ranks "
        "compile again on their clock)."
        + (f" Left out: {', '.join(skip)} (this CPU has no bf16 instructions)." if skip else "")
        + (f" CPU: {study.cpu}." if study.cpu else "")
    )

    def keep(rows: list[dict[str, Any]]) -> bool:
        before, after = _split_block(rows)
        return _decide(rule, before, after).kept

    dropped: set[str] = set()
    while True:
        chain = log(chosen, dropped, skip)
        measured = {r["entry"] for r in study.rows if r["kept"] is not None}
        todo = [e for e in chain[1:] if e.name not in measured]
        if not todo:
            break
        entry = todo[0]
        reference = next(e for e in chain if e.name == entry.compared_to)
        study.block([reference, entry], "tune", keep)
        if not any(r["kept"] for r in study.rows if r["entry"] == entry.name):
            dropped.add(entry.name)
    chain = log(chosen, dropped, skip)
    final = chain[[e.name for e in chain].index(_final_name(chain, dropped))]
    last = [
        Entry("validation", chain[0].config, None, "the GPT-2 baseline"),
        Entry("validation", final.config, "baseline", "the final entry", final.kind),
    ]
    if ablation:
        last += ablation_entries(chosen, dropped, skip)
    if final.name == "baseline":  # nothing was kept: the baseline against itself says nothing
        last = last[:1]
    study.block(last, "validation")
    study.write(complete=True)
    return study.record


def _final_name(chain: list[Entry], dropped: set[str]) -> str:
    kept = [e.name for e in chain[1:] if e.name not in dropped]
    return kept[-1] if kept else "baseline"


@dataclass(frozen=True)
class Summary:
    """One entry's runs in one block of a study."""

    part: str
    block: int
    entry: str
    compared_to: str
    kind: str
    split: str
    seeds: int
    reached: int  # seeds that reached the target
    median_seconds: float  # inf unless most seeds reached it
    spread_seconds: float  # max - min over the seeds that reached it
    median_tokens: float
    median_tokens_per_second: float
    kept: bool | None  # the keep rule's verdict on a change of the log; None elsewhere

    def seconds(self, record: Record) -> list[float]:
        """This entry's times in this block (inf where a seed missed the target)."""
        return [t for t, _ in _runs(record, self.block, self.entry)]

    def tokens(self, record: Record) -> list[float]:
        return [n for _, n in _runs(record, self.block, self.entry)]


def _runs(record: Record, block: int, entry: str) -> list[tuple[float, float]]:
    return [
        (r["train_seconds"] if r["reached"] else float("inf"), r["tokens"])
        for r in record.rows
        if r["block"] == block and r["entry"] == entry
    ]


def summarize(record: Record) -> list[Summary]:
    """One :class:`Summary` per (block, entry) of ``record``, in the record's order."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in record.rows:
        groups.setdefault((row["block"], row["entry"]), []).append(row)
    out = []
    for (block, entry), rows in groups.items():
        times = [r["train_seconds"] if r["reached"] else float("inf") for r in rows]
        reached = [r for r in rows if r["reached"]]
        finite = [r["train_seconds"] for r in reached]
        out.append(
            Summary(
                part=rows[0]["part"],
                block=block,
                entry=entry,
                compared_to=rows[0]["compared_to"],
                kind=rows[0]["kind"],
                split=rows[0]["split"],
                seeds=len(rows),
                reached=len(reached),
                median_seconds=statistics.median(times),
                spread_seconds=max(finite) - min(finite) if finite else 0.0,
                median_tokens=statistics.median(r["tokens"] for r in rows),
                median_tokens_per_second=median_throughput(
                    [r["train_seconds"] for r in rows], [r["tokens"] for r in rows]
                ),
                kept=rows[0]["kept"],
            )
        )
    return out


@dataclass(frozen=True)
class BlockReading:
    """One comparison of a block: ``after`` against ``before``, by the keep rule's test (a
    log block) or the two-sided rank-sum test (an ablation row, which can go either way), with
    the gain's two factors."""

    block: int
    before: Summary
    after: Summary
    decision: Decision
    gain: Gain | None  # None where a side has no run that reached the target
    two_sided_p: float  # the rank-sum test's two-sided p-value, for the ablation

    @property
    def verdict(self) -> str:
        """For a log block: "kept" or "not kept"; for the validation block, the final entry's
        "headline" and an ablation row's "slower without it", "faster without it" or "within
        noise" (two-sided, at :data:`ABLATION_ALPHA`)."""
        if self.after.part == "log":
            return "kept" if self.decision.kept else "not kept"
        if self.after.part == "validation":
            return "headline"
        if self.two_sided_p > ABLATION_ALPHA:
            return "within noise"
        return "slower without it" if self.decision.share < 0.5 else "faster without it"


def _split_block(rows: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    names = list(dict.fromkeys(r["entry"] for r in rows))
    return [r for r in rows if r["entry"] == names[0]], [r for r in rows if r["entry"] == names[1]]


def _decide(rule: KeepRule, before: list[dict], after: list[dict]) -> Decision:
    def seconds(rows):
        return [r["train_seconds"] if r["reached"] else float("inf") for r in rows]

    return rule.decide(
        seconds(before),
        seconds(after),
        [r["tokens"] for r in before],
        [r["tokens"] for r in after],
    )


def blocks(record: Record, rule: KeepRule | None = None) -> list[BlockReading]:
    """Every comparison in ``record``: each log block's change against the entry it was
    measured on, and in the validation block the final entry against the baseline and each
    ablation row against the final entry."""
    rule = rule or KeepRule(min_seeds=1)
    summaries = summarize(record)
    by_key = {(s.block, s.entry): s for s in summaries}
    out = []
    for s in summaries:
        before = by_key.get((s.block, s.compared_to))
        if before is None:
            continue
        rows_b = [r for r in record.rows if r["block"] == s.block and r["entry"] == before.entry]
        rows_a = [r for r in record.rows if r["block"] == s.block and r["entry"] == s.entry]
        decision = _decide(rule, rows_b, rows_a)
        if s.part == "log" and s.kept is not None:
            decision = replace(decision, kept=bool(s.kept))
        reached_b = [r for r in rows_b if r["reached"]]
        reached_a = [r for r in rows_a if r["reached"]]
        g = None
        if reached_b and reached_a:
            g = gain(
                [r["train_seconds"] for r in reached_b],
                [r["tokens"] for r in reached_b],
                [r["train_seconds"] for r in reached_a],
                [r["tokens"] for r in reached_a],
            )
        _, two_sided = rank_sum_test(
            [t for t, _ in _runs(record, s.block, before.entry)],
            [t for t, _ in _runs(record, s.block, s.entry)],
        )
        out.append(BlockReading(s.block, before, s, decision, g, two_sided))
    return out


def dropped_changes(record: Record) -> set[str]:
    """The changes of the log that ``record``'s study measured and did not keep."""
    return {r["entry"] for r in record.rows if r["part"] == "log" and r["kept"] is False}


def headline_of(record: Record, *, level: float = 0.95) -> Headline:
    """The baseline over the final entry on the validation split, from the validation block's
    runs (:func:`~trainfast.speedrun.headline.headline`). ``ValueError`` if the record has no
    such block."""
    rows = [r for r in record.rows if r["part"] == "validation"]
    names = list(dict.fromkeys(r["entry"] for r in rows))
    if len(names) != 2:
        raise ValueError(
            f"Record {record.name!r} has no validation block of the baseline and a final entry "
            f"(has {names})"
        )

    def seconds(name):
        return [r["train_seconds"] if r["reached"] else float("inf") for r in rows
                if r["entry"] == name]  # fmt: skip

    return headline(seconds(names[0]), seconds(names[1]), level=level)


def check_comparable(record: Record, book: Record) -> None:
    """``ValueError`` naming the first difference unless ``record`` and ``book`` measured the
    same preset, on the same corpus (its SHA-256), to the same target."""
    for key in ("preset", "corpus_sha256", "target_loss"):
        mine, theirs = {r[key] for r in record.rows}, {r.get(key) for r in book.rows}
        if mine != theirs:
            raise ValueError(
                f"Cannot compare with that record: its {key} is {sorted(map(str, theirs))}, "
                f"this run's {sorted(map(str, mine))} (two records compare only when they "
                "measured the same text to the same target)"
            )


def _seconds(value: float) -> str:
    return "–" if value != value or value == float("inf") else f"{value:,.1f}"


def summary_table(
    record: Record, book: Record | None = None, columns: Sequence[str] | None = None
) -> str:
    """The study as a Markdown table: one line per entry of each block, with its time,
    tokens, tokens/s and, against the entry it is compared with, the time ratio and its two
    factors and the verdict; with ``book`` (a record of the same preset, corpus and target,
    :func:`check_comparable`), the book's median time for the same entry on the same split.
    ``columns``: the headers to show, in the table's order (all by default; a page's column
    is narrower than a terminal)."""
    if book is not None:
        check_comparable(record, book)
    readings = {(b.block, b.after.entry): b for b in blocks(record)}
    theirs: dict[tuple[str, str], Summary] = {}
    if book is not None:
        for s in summarize(book):
            theirs.setdefault((s.entry, s.split), s)
    header = ["block", "entry", "split", "reached", "median time (s)", "tokens", "tokens/s"]
    header += ["vs", "time ratio", "token ratio", "tokens/s ratio", "verdict"]
    if book is not None:
        header += ["book's median (s)"]
    unknown = [c for c in columns or () if c not in header]
    if unknown:
        raise ValueError(f"summary_table: no column {unknown[0]!r} (columns: {header})")
    shown = [i for i, c in enumerate(header) if columns is None or c in columns]
    lines = ["| " + " | ".join(header[i] for i in shown) + " |", "|" + "---|" * len(shown)]
    for s in summarize(record):
        reading = readings.get((s.block, s.entry))
        cells = [str(s.block), s.entry, s.split, f"{s.reached}/{s.seeds}"]
        cells += [_seconds(s.median_seconds), f"{s.median_tokens:,.0f}"]
        cells += [f"{s.median_tokens_per_second:,.0f}"]
        if reading is None or reading.gain is None:
            cells += [s.compared_to or "–", "–", "–", "–", reading.verdict if reading else "–"]
        else:
            g = reading.gain
            cells += [s.compared_to, f"{g.time_ratio:.2f}x", f"{g.token_ratio:.2f}x"]
            cells += [f"{g.throughput_ratio:.2f}x", reading.verdict]
        if book is not None:
            other = theirs.get((s.entry, s.split))
            cells += [_seconds(other.median_seconds) if other else "–"]
        lines.append("| " + " | ".join(cells[i] for i in shown) + " |")
    return "\n".join(lines)


def speedrun_record(device: torch.device, quick: bool, out: str | Path | None = None) -> Record:
    """The ``speedrun`` benchmark of ``python -m trainfast.measure``.

    On a CUDA device: the GPU log (:func:`trainfast.speedrun.gpu.run_gpu_log`), sized for this
    GPU and one benchmark's slot. Elsewhere: the ``cpu`` preset's whole log and ablation
    (:func:`run_log`), with PyTorch's default threads (``python -m trainfast.speedrun --preset
    cpu --log --ablation --out DIR`` does the same). ``quick``: the ``tiny`` preset's baseline
    and last learning change, one seed, for a smoke test. With ``out`` (``measure --out``), the
    record is written there after every run, so a study stopped at its time limit keeps what
    it finished.
    """
    from trainfast.speedrun.changes import LEARNING, entries, preset

    if quick:
        tiny = preset("tiny")
        chosen = entries(tiny, ["baseline", LEARNING[-1].name])
        return run_study(tiny, chosen, seeds=1, device=device, out=out)
    if device.type == "cuda":
        from trainfast.speedrun.gpu import run_gpu_log

        return run_gpu_log(device=device, out=out)
    return run_log(preset("cpu"), device=device, out=out)


def merge_records(first: Record, *others: Record) -> Record:
    """One record of studies of the same preset and corpus run one after another: ``first``'s
    rows, then each of ``others``' rows, their blocks renumbered after ``first``'s, every
    command, the latest date. The blocks stay apart (a comparison is only ever made inside one
    block, whose runs were interleaved). ``ValueError`` if the presets, corpora or targets
    differ, or the environments (machine, torch, Python)."""
    rows, commands = [dict(r) for r in first.rows], [first.command]
    for other in others:
        check_comparable(first, other)
        if first.environment != other.environment:
            raise ValueError("Cannot merge records measured in different environments")
        offset = 1 + max(r["block"] for r in rows)
        rows += [{**r, "block": r["block"] + offset} for r in other.rows]
        commands.append(other.command)
    return Record(
        name=first.name,
        description=first.description,
        columns=first.columns,
        rows=rows,
        environment=first.environment,
        created=max(r.created for r in (first, *others)),
        command=" & ".join(commands),
        units=first.units,
        trainfast_version=first.trainfast_version,
        source_commit=first.source_commit,
    )
