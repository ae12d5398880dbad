"""The speedrun's log: a frozen baseline and the ordered changes that speed it up.

An *entry* is one named :class:`~trainfast.speedrun.SpeedrunConfig`. The baseline is a GPT-2
(LayerNorm, learned positions, a GELU MLP, a tied head, biases), trained in fp32 by AdamW at a
constant learning rate with softmax attention written out. Each :class:`Change` of :data:`LOG`
is applied to the entry before it with :func:`dataclasses.replace` and carries a one-line
reason, so the log reads as the argument of the chapter, in order. :data:`TRIED` are changes
tried on top of the final entry that are expected to pay on a GPU, not on one CPU thread; they
are measured all the same. :data:`NOT_RUN` names what the CPU log leaves out, and why. The
leave-one-out *ablation* (:func:`ablation`) takes each change of the log back out of the final
entry, one at a time.

**Presets** (:data:`PRESETS`) fix the corpus, the model's sizes, the target and the seeds.

* ``cpu``: a 3-layer, width-128 model, 16 sequences of 64 tokens per step, on a 4 MB slice of
  the corpus (1,024-token BPE). *Calibration* (done once, on 2026-11-25, on the book's 2-core
  build machine under the load of other jobs (load average about 6), one thread, with the
  training files in a fixed shuffled order): the baseline, seed 0, evaluated every 20 steps on
  8,192 validation tokens, was at 5.60 after 200 steps (about 2,600 training tokens/s alone,
  0.4 s a step); the then last entry of the log (WSD decay), seed 0, at the same time, was at
  5.49 after 80 steps.
  The target is fixed at 5.5, evaluated on 4,096 tokens to halve the evaluation time, and is
  not moved afterwards: a target chosen after seeing the later entries would flatter them. An
  earlier calibration moved Muon from the log to :data:`TRIED`: with its Newton-Schulz
  iteration in bf16 a step took several times as long on this CPU. It came back as the last
  change of the log with the iteration in float32 (on 2026-11-26, on a quiet machine, in the
  record: 3 seeds at a median of about 4,800 training tokens/s against about 1,600 with the
  iteration in bf16, and 40,960 tokens to the target against 102,400 for the entry before
  it); the bf16 iteration is tried on top.
* ``h100``: a 12-layer, width-768 model (GPT-2 small's shape) on the whole corpus, 8 sequences
  of 1,024 tokens a step; the baseline and the final entry only (with the tried changes too:
  Muon's iteration in bf16, autocast in bf16, and compilation, which a GPU is expected to
  reward), 2 seeds, sized to fit the GPU pass's limit of a benchmark (400 steps use about 3.3M
  of the corpus's training tokens). Its target (3.5) was not calibrated on a GPU (none was at
  hand); ``max_steps`` bounds a run that cannot reach it, and the record says so.
* ``tiny``: seconds, for tests and the command line's smoke test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from trainfast.speedrun.harness import SpeedrunConfig, Target
from trainfast.transformer import TransformerShape

__all__ = [
    "LOG",
    "NOT_RUN",
    "PRESETS",
    "TRIED",
    "Change",
    "Entry",
    "Preset",
    "ablation",
    "baseline",
    "entries",
    "log",
    "preset",
]

_SHAPE_FIELDS = {f.name for f in fields(TransformerShape)}
_CONFIG_FIELDS = {f.name for f in fields(SpeedrunConfig)} - {"name", "shape"}


@dataclass(frozen=True)
class Change:
    """One step of the log: what it sets (config or shape fields) and why."""

    name: str
    reason: str
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.settings) - _SHAPE_FIELDS - _CONFIG_FIELDS
        if unknown:
            raise ValueError(f"Change {self.name!r}: unknown settings {sorted(unknown)}")

    def apply(self, config: SpeedrunConfig, name: str | None = None) -> SpeedrunConfig:
        """``config`` with this change's settings, named ``name`` (default: the change's)."""
        shape = {k: v for k, v in self.settings.items() if k in _SHAPE_FIELDS}
        rest = {k: v for k, v in self.settings.items() if k in _CONFIG_FIELDS}
        return replace(config, name=name or self.name, shape=replace(config.shape, **shape), **rest)


#: The changes, in the order the chapter makes them; each applies to the entry before it.
LOG: tuple[Change, ...] = (
    Change(
        "warmup + higher lr",
        "a short warmup lets AdamW take a 3x larger step",
        {"lr": 3e-3, "warmup_steps": 20},
    ),
    Change(
        "RMSNorm", "a norm without a mean or a bias: fewer operations per step", {"norm": "rmsnorm"}
    ),
    Change(
        "RoPE", "rotary positions in attention instead of a learned table", {"positions": "rope"}
    ),
    Change("ReLU²", "a squared ReLU MLP, as modded-nanogpt uses", {"mlp": "relu2"}),
    Change(
        "QK-norm",
        "normalised queries and keys keep the logits tame at a high lr",
        {"qk_norm": True},
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
        "SDPA",
        "the fused attention kernel instead of the written-out softmax",
        {"attention": "sdpa"},
    ),
    Change(
        "WSD decay",
        "decay the lr to zero over the last steps of the horizon",
        {"schedule": "wsd", "decay_fraction": 0.4},
    ),
    Change(
        "Muon",
        "Muon orthogonalises the hidden matrices' updates, its Newton-Schulz iteration in "
        "float32, the fast format of this CPU; AdamW keeps the rest",
        {"optimizer": "muon", "muon_lr": 0.02, "muon_ns_dtype": "float32"},
    ),
)

#: Tried on the final entry of the log, expected to pay on a GPU and not on one CPU thread.
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
)

#: Not run on the CPU log, and why.
NOT_RUN: tuple[tuple[str, str], ...] = (
    (
        "data parallel (gloo)",
        "a second process needs a second core; the build machine's 2 cores are shared, so it "
        "would measure the other jobs, not the technique: a GPU-only step",
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
    full_log: bool = True  # False: baseline and final entry only


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        "cpu",
        4_000_000,
        1_024,
        TransformerShape.gpt_like(
            d_model=128, n_layers=3, n_heads=4, seq_len=64, vocab_size=1_024, batch_size=16
        ),
        Target(loss=5.5, eval_every=20, eval_tokens=4_096, max_steps=400),
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
        Target(loss=3.5, eval_every=25, eval_tokens=65_536, max_steps=400),
        seeds=2,
        baseline={"lr": 6e-4},
        horizon=300,
        full_log=False,
    ),
    "tiny": Preset(
        "tiny",
        600_000,
        512,
        TransformerShape.gpt_like(
            d_model=32, n_layers=2, n_heads=4, seq_len=32, vocab_size=512, batch_size=8
        ),
        Target(loss=6.0, eval_every=5, eval_tokens=1_024, max_steps=40),
        seeds=2,
        baseline={"lr": 3e-3},
        horizon=40,
    ),
}


def preset(name: str) -> Preset:
    """The preset called ``name``; ``ValueError`` naming it if there is none."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset: {name!r} (known: {sorted(PRESETS)})")
    return PRESETS[name]


@dataclass(frozen=True)
class Entry:
    """A named configuration of a study and the entry it is compared with (None: none)."""

    part: str  # "log", "tried" or "ablation"
    config: SpeedrunConfig
    compared_to: str | None
    reason: str = ""

    @property
    def name(self) -> str:
        return self.config.name


def baseline(chosen: Preset) -> SpeedrunConfig:
    """The preset's frozen GPT-2 baseline."""
    return SpeedrunConfig(
        "baseline", chosen.shape, schedule_steps=chosen.horizon, **chosen.baseline
    )


def log(chosen: Preset) -> list[Entry]:
    """The baseline, each change of :data:`LOG` applied to the entry before it, then each of
    :data:`TRIED` applied to the final entry; without ``full_log`` (a GPU preset), the
    baseline and the final entry with the tried changes applied too."""
    config = baseline(chosen)
    chain = [Entry("log", config, None, "the GPT-2 baseline")]
    for change in LOG:
        config = change.apply(config)
        chain.append(Entry("log", config, chain[-1].name, change.reason))
    if not chosen.full_log:  # on a GPU: the baseline against everything, the tried included
        name = "final + " + ", ".join(change.name for change in TRIED)
        for change in TRIED:
            config = change.apply(config, name=name)
        return [chain[0], Entry("log", config, "baseline", "every change, the tried ones too")]
    final = chain[-1].config
    tried = [Entry("tried", t.apply(final), final.name, t.reason) for t in TRIED]
    return chain + tried


def ablation(chosen: Preset) -> list[Entry]:
    """The final entry with each change of :data:`LOG` left out (applied to the baseline in
    order, skipping that one), compared with the final entry."""
    final = log(chosen)[len(LOG)].name if chosen.full_log else LOG[-1].name
    out = []
    for skipped in LOG:
        config = baseline(chosen)
        for change in LOG:
            if change is not skipped:
                config = change.apply(config)
        config = replace(config, name=f"without {skipped.name}")
        out.append(Entry("ablation", config, final, f"the final entry without {skipped.name}"))
    return out


def entries(chosen: Preset, names: Sequence[str] | None = None, *, parts=("log",)) -> list[Entry]:
    """The entries of ``parts`` ("log", "ablation"), or those called ``names`` (any part, in
    the order given).

    An unknown name raises ``ValueError`` naming it and listing the known ones."""
    every = log(chosen) + ablation(chosen)
    if names is None:
        wanted = {"log": ("log", "tried"), "ablation": ("ablation",)}
        kinds = {k for part in parts for k in wanted[part]}
        return [e for e in every if e.part in kinds]
    known = {e.name: e for e in every}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"Unknown entries: {unknown} (known: {list(known)})")
    return [known[n] for n in dict.fromkeys(names)]  # in the order asked for, each once
