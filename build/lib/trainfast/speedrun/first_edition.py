"""The reader of the first edition's CPU record (2026-11-26), kept so the chapter still builds.

The chapter's current text reads ``book/records/speedrun--cpu--amd-epyc.json``, measured with
the first edition's log (13 changes and 5 tried ones, 3 seeds, one thread, blocked run order,
the validation split for both the keep decisions and the headline) and its keep rule (time, or
fewer tokens with a time not slower, and never for a change that trained alike). The second
edition (:mod:`trainfast.speedrun.changes`, :mod:`trainfast.speedrun.study`) changed the log,
the presets, the keep rule and the record's columns, so it cannot read that record; this module
is a frozen copy of what the chapter needs to: the first edition's log and presets
(:data:`LOG`, :data:`TRIED`, :data:`NOT_RUN`, :data:`PRESETS`, with its ``h100`` preset) and
its summaries (:func:`summarize`, :func:`dropped_changes`, :func:`read_ablation`).

It goes when the chapter renders the second edition's record. Do not build on it.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trainfast.records import Record
from trainfast.speedrun.changes import Change, Entry
from trainfast.speedrun.harness import RunResult, SpeedrunConfig, Target, compare
from trainfast.timing import rank_sum_test
from trainfast.transformer import TransformerShape

__all__ = [
    "ALPHA",
    "LOG",
    "NOT_RUN",
    "PRESETS",
    "TRIED",
    "AblationReading",
    "Preset",
    "Summary",
    "ablation",
    "baseline",
    "dropped_changes",
    "entries",
    "final_entry",
    "log",
    "preset",
    "read_ablation",
    "results_of",
    "summarize",
]

ALPHA = 0.1  # the smallest two-sided p-value three seeds against three can reach
_ONE_THREAD = {"threads": 1}  # the first edition ran one thread per process


def _half_the_batch(config: SpeedrunConfig) -> int:
    return config.shape.batch_size // 2


def _double_the_batch(config: SpeedrunConfig) -> int:
    return config.shape.batch_size * 2


#: The changes, in the order the chapter makes them: the model, then the optimizer for that
#: model and the batch it steps on, then the cost of a step with the arithmetic unchanged.
#: Each is measured on the last entry kept (:func:`log`); the study keeps it only if it beats
#: the noise.
LOG: tuple[Change, ...] = (
    Change(
        "RoPE", "rotary positions in attention instead of a learned table", {"positions": "rope"}
    ),
    Change(
        "untied head",
        "the output layer gets its own matrix, free of the embedding's",
        {"tied_head": False},
    ),
    Change(
        "zero-init projections",
        "each block starts as the identity",
        {"zero_init_projections": True},
    ),
    Change(
        "RMSNorm", "a norm without a mean or a bias: fewer operations per step", {"norm": "rmsnorm"}
    ),
    Change("ReLU²", "a squared ReLU MLP, as modded-nanogpt uses", {"mlp": "relu2"}),
    Change(
        "QK-norm",
        "normalised queries and keys keep the logits tame at a high lr",
        {"qk_norm": True},
    ),
    Change(
        "Muon",
        "Muon orthogonalises the hidden matrices' updates, its Newton-Schulz iteration in "
        "float32, the fast format of this CPU; AdamW keeps the rest",
        {"optimizer": "muon", "muon_lr": 0.02, "muon_ns_dtype": "float32"},
    ),
    Change(
        "embedding lr",
        "the token table gets its own AdamW lr, 30 times AdamW's then: a row's gradient is "
        "nonzero only in the steps whose batch holds its token",
        {"embedding_lr": 3e-2},
    ),
    Change(
        "warmup + higher lr",
        "a short warmup lets AdamW take a 3x larger step",
        {"lr": 3e-3, "warmup_steps": 20},
    ),
    Change(
        "WSD decay",
        "decay the lr to zero over the last steps of the horizon",
        {"schedule": "wsd", "decay_fraction": 0.4},
    ),
    Change(
        "smaller batch",
        "half the sequences a step: if the batch is at or above the critical batch size, the "
        "target takes fewer tokens (the tried rows halve and double the batch again)",
        {"batch_size": _half_the_batch},
    ),
    Change(
        "SDPA",
        "the fused attention kernel instead of the written-out softmax",
        {"attention": "sdpa"},
    ),
    Change(
        "data parallel",
        "two gloo processes, one per core, each with half of every batch; the book's DDP "
        "averages their gradients during the backward pass",
        {"data_parallel": 2},
    ),
)

#: Tried on the final entry of the log: changes expected to pay on a GPU and not on a CPU, and
#: the batch size halved and doubled, which places it against the critical batch size.
TRIED: tuple[Change, ...] = (
    Change(
        "Newton-Schulz in bf16",
        "Muon's iteration in bf16, as the original: fast on a GPU's tensor cores, slow on a CPU "
        "without bf16 units",
        {"muon_ns_dtype": "bfloat16"},
    ),
    Change(
        "bf16 autocast",
        "bf16 matrix products, which a GPU's tensor cores run many times faster than fp32",
        {"precision": "bf16"},
    ),
    Change(
        "torch.compile",
        "fused kernels, and fewer launches, for the compile time",
        {"compile": True},
    ),
    Change(
        "half the batch",
        "half the final entry's sequences a step: below the critical batch size, the same "
        "tokens in twice the steps; above it, fewer tokens",
        {"batch_size": _half_the_batch},
    ),
    Change(
        "double the batch",
        "twice the final entry's sequences a step: below the critical batch size, the same "
        "tokens in half the steps; above it, more tokens",
        {"batch_size": _double_the_batch},
    ),
)

#: Not run on the CPU log, and why.
NOT_RUN: tuple[tuple[str, str], ...] = (
    (
        "data parallel on several GPUs",
        "the harness starts one NCCL process per GPU for `data_parallel` > 1, but the GPU pass "
        "has one GPU, so the `h100` preset leaves it out",
    ),
)


@dataclass(frozen=True)
class Preset:
    """A speedrun's scale: corpus slice, tokenizer, baseline shape and settings, target."""

    name: str
    corpus_bytes: int | None  # None: the whole corpus
    vocab_size: int
    shape: TransformerShape
    target: Target
    seeds: int
    baseline: dict[str, Any] = field(default_factory=dict)  # SpeedrunConfig settings
    horizon: int = 1_000  # schedule_steps: the steps a WSD schedule plans for
    full_log: bool = True  # False: the baseline and one entry with every change only
    never: tuple[str, ...] = ()  # changes of LOG or TRIED this preset never applies


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        "cpu",
        4_000_000,
        1_024,
        TransformerShape.gpt_like(
            d_model=128, n_layers=3, n_heads=4, seq_len=64, vocab_size=1_024, batch_size=16
        ),
        Target(loss=5.5, eval_every=5, eval_tokens=4_096, max_steps=400),
        seeds=3,
        baseline={"lr": 1e-3},
        horizon=160,
    ),
    "h100": Preset(
        "h100",
        None,
        8_192,
        TransformerShape.gpt_like(
            d_model=768, n_layers=12, n_heads=12, seq_len=1_024, vocab_size=8_192, batch_size=8
        ),
        # a loss the baseline reaches within max_steps: on an H100 (2026-11-26) neither seed
        # of the baseline reached 3.5 in 400 steps, so that study measured no time to target
        Target(loss=5.0, eval_every=25, eval_tokens=65_536, max_steps=800),
        seeds=2,
        baseline={"lr": 6e-4},
        horizon=300,
        full_log=False,
        # one GPU; no batch study
        never=("data parallel", "smaller batch", "half the batch", "double the batch"),
    ),
    "tiny": Preset(
        "tiny",
        600_000,
        512,
        TransformerShape.gpt_like(
            d_model=32, n_layers=2, n_heads=4, seq_len=32, vocab_size=512, batch_size=8
        ),
        Target(loss=6.0, eval_every=5, eval_tokens=1_024, max_steps=40),
        seeds=3,  # the fewest with which a change can be kept
        baseline={"lr": 3e-3},
        horizon=40,
    ),
}


def preset(name: str) -> Preset:
    """The preset called ``name``; ``ValueError`` naming it if there is none."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset: {name!r} (known: {sorted(PRESETS)})")
    return PRESETS[name]


def baseline(chosen: Preset) -> SpeedrunConfig:
    """The preset's frozen GPT-2 baseline."""
    return SpeedrunConfig(
        "baseline", chosen.shape, schedule_steps=chosen.horizon, **_ONE_THREAD, **chosen.baseline
    )


def log(chosen: Preset, dropped: Collection[str] = ()) -> list[Entry]:
    """The baseline, then each change of :data:`LOG` applied to the last entry that was kept
    (the changes named in ``dropped`` are measured but not kept), then each of :data:`TRIED`
    applied to the final entry; without ``full_log`` (a GPU preset), the baseline and the
    entry with every change, the tried ones too."""
    _check_dropped(dropped)
    dropped = {*dropped, *chosen.never}
    config = baseline(chosen)
    kept = Entry("log", config, None, "the GPT-2 baseline")
    chain = [kept]
    for change in LOG:
        entry = Entry("log", change.apply(kept.config), kept.name, change.reason)
        chain.append(entry)
        if change.name not in dropped:
            kept = entry
    tried = [change for change in TRIED if change.name not in chosen.never]
    if not chosen.full_log:  # on a GPU: the baseline against everything, the tried included
        name = "every change + " + ", ".join(change.name for change in tried)
        config = kept.config
        for change in tried:
            config = change.apply(config, name=name)
        return [chain[0], Entry("log", config, "baseline", "every change, the tried ones too")]
    # a tried change that leaves the final entry as it is (Muon's format, where Muon was not
    # kept) would measure nothing: it is left out
    tried = [
        Entry("tried", t.apply(kept.config), kept.name, t.reason)
        for t in tried
        if t.apply(kept.config, name=kept.name) != kept.config
    ]
    return chain + tried


def final_entry(chosen: Preset, dropped: Collection[str] = ()) -> str:
    """The name of the last entry of the log that was kept."""
    kept = [c.name for c in LOG if c.name not in {*dropped, *chosen.never}]
    return kept[-1] if kept else "baseline"


def ablation(chosen: Preset, dropped: Collection[str] = ()) -> list[Entry]:
    """The final entry with each kept change of :data:`LOG` left out (the others applied to the
    baseline in order), compared with the final entry."""
    _check_dropped(dropped)
    dropped = {*dropped, *chosen.never}
    final = final_entry(chosen, dropped)
    kept = [change for change in LOG if change.name not in dropped]
    out = []
    for skipped in kept:
        config = baseline(chosen)
        for change in kept:
            if change is not skipped:
                config = change.apply(config)
        config = replace(config, name=f"without {skipped.name}")
        out.append(Entry("ablation", config, final, f"the final entry without {skipped.name}"))
    return out


def _check_dropped(dropped: Collection[str]) -> None:
    unknown = sorted(set(dropped) - {c.name for c in LOG})
    if unknown or isinstance(dropped, str):
        raise ValueError(
            f"Invalid dropped: {unknown or dropped!r} (expected names of LOG's changes)"
        )


def entries(
    chosen: Preset,
    names: Sequence[str] | None = None,
    *,
    parts=("log",),
    dropped: Collection[str] = (),
) -> list[Entry]:
    """The entries of ``parts`` ("log", "ablation"), or those called ``names`` (any part, in
    the order given), with the changes in ``dropped`` not kept (:func:`log`).

    An unknown name raises ``ValueError`` naming it and listing the known ones."""
    every = log(chosen, dropped) + ablation(chosen, dropped)
    if names is None:
        wanted = {"log": ("log", "tried"), "ablation": ("ablation",)}
        kinds = {k for part in parts for k in wanted[part]}
        return [e for e in every if e.part in kinds]
    known = {e.name: e for e in every}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"Unknown entries: {unknown} (known: {list(known)})")
    return [known[n] for n in dict.fromkeys(names)]  # in the order asked for, each once


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
        """Whether a change of the log was kept by the first edition's study: its time beat the
        entry it was measured on beyond the noise; or it needed fewer tokens beyond the noise
        (tokens, unlike seconds, do not depend on the machine's load) and its time is not
        slower beyond the noise. Never when it *trained alike*: every seed took the same steps
        to the same final loss, bit for bit, as the entry it was measured on, so the change did not
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


def dropped_changes(record: Record, alpha: float = ALPHA) -> set[str]:
    """The changes of the first edition's log that ``record``'s study did not keep."""
    names = {change.name for change in LOG}
    return {
        s.entry
        for s in summarize(record, alpha)
        if s.part == "log" and s.entry in names and not s.kept
    }
