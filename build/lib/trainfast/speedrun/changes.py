"""The speedrun's log: a frozen baseline and the ordered changes that speed it up.

An *entry* is one named :class:`~trainfast.speedrun.SpeedrunConfig`. The baseline is a GPT-2
(LayerNorm, learned positions, a GELU MLP, a tied head, biases), trained in fp32 by AdamW at a
constant learning rate with softmax attention written out, with PyTorch's default thread count.
Each :class:`Change` of :data:`LOG` is applied with :func:`dataclasses.replace` to the last entry
that was *kept* and carries a one-line reason, so the log reads as the argument of the chapter,
in order; the study (:func:`~trainfast.speedrun.study.run_log`) keeps a change only by the keep
rule it declares before it runs (:class:`~trainfast.speedrun.protocol.KeepRule`), and
:func:`log` takes the names of the changes that were not kept.

The log has two kinds of change (:attr:`Change.kind`). The :data:`LEARNING` changes (the
architecture, the optimizer, the schedule, the batch) change what a token teaches the model, so
they move the tokens to the target; the :data:`SYSTEMS` changes (kernels, number formats, the
optimizer's implementation, the step's bookkeeping, compilation, processes) change what a step
costs with the same arithmetic up to its rounding, so they move the tokens per second. The
study reports both factors of every change (:mod:`trainfast.speedrun.gains`). The
leave-one-out *ablation* (:func:`ablation`) takes each kept learning change back out of the
final entry, one at a time.

**Presets** (:data:`PRESETS`) fix the corpus, the model's sizes, the target and the seeds.

* ``cpu``: a 4-layer, width-128 model, 16 sequences of 128 tokens a step, on a 16 MB slice of
  the corpus (1,024-token BPE; every validation file). Its target lies at least halfway from
  the unigram to the bigram count model's loss on the same evaluation windows
  (:mod:`trainfast.speedrun.references`; :func:`~trainfast.speedrun.study.run_log` refuses a
  target that does not). The size is set by two limits: a baseline run long enough that
  compilation and a second core can pay (probes on 2026-12-02, one thread on the shared 2-core
  build machine at a load of about 5: about 227 steps, 465 K tokens and 2 minutes to the
  target, under a minute estimated on a quiet core), and the whole study, 19 comparisons of
  5 against 5 interleaved runs plus the validation block, within 90 minutes (estimated at
  about 80 on a quiet machine; a target of 4.4 was estimated at about 90).
* ``gpu``: a larger model sized from the GPU it finds (:mod:`trainfast.speedrun.gpu`), a
  target below the bigram loss, 3 seeds, one benchmark's slot of a GPU pass.
* ``tiny``: seconds, for tests and the command line's smoke test.

How the first edition's target and log were chosen, and what the review of 2026-12-01 found in
them, is in the chapter; :mod:`trainfast.speedrun.first_edition` keeps that log to read its
record.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from trainfast.speedrun.harness import SpeedrunConfig, Target
from trainfast.transformer import TransformerShape

__all__ = [
    "LEARNING",
    "LOG",
    "NEEDS_BF16",
    "PRESETS",
    "SYSTEMS",
    "Change",
    "Entry",
    "Preset",
    "ablation",
    "baseline",
    "entries",
    "final_entry",
    "log",
    "preset",
]

_SHAPE_FIELDS = {f.name for f in fields(TransformerShape)}
_CONFIG_FIELDS = {f.name for f in fields(SpeedrunConfig)} - {"name", "shape"}


@dataclass(frozen=True)
class Change:
    """One step of the log: what it sets (config or shape fields), why, and its kind.

    A setting is a value, or a function of the entry the change is applied to that returns the
    value (the smaller batch is half the entry's)."""

    name: str
    reason: str
    settings: dict[str, Any] = field(default_factory=dict)
    kind: Literal["learning", "systems"] = "learning"

    def __post_init__(self) -> None:
        unknown = set(self.settings) - _SHAPE_FIELDS - _CONFIG_FIELDS
        if unknown:
            raise ValueError(f"Change {self.name!r}: unknown settings {sorted(unknown)}")
        if self.kind not in ("learning", "systems"):
            raise ValueError(f"Change {self.name!r}: invalid kind {self.kind!r}")

    def apply(self, config: SpeedrunConfig, name: str | None = None) -> SpeedrunConfig:
        """``config`` with this change's settings, named ``name`` (default: the change's)."""
        values = {k: v(config) if callable(v) else v for k, v in self.settings.items()}
        shape = {k: v for k, v in values.items() if k in _SHAPE_FIELDS}
        rest = {k: v for k, v in values.items() if k in _CONFIG_FIELDS}
        return replace(config, name=name or self.name, shape=replace(config.shape, **shape), **rest)


def _half_the_batch(config: SpeedrunConfig) -> int:
    return config.shape.batch_size // 2


def _twice_the_horizon(config: SpeedrunConfig) -> int:
    return config.schedule_steps * 2


def _one_thread_per_process(config: SpeedrunConfig) -> int:
    return 1


#: What the model learns from each token, then how far the optimizer moves it per step and on
#: how big a batch: each moves the tokens to the target.
LEARNING: tuple[Change, ...] = (
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
        "RMSNorm",
        "a norm without a mean or a bias: fewer FLOPs, though in eager mode more kernels than "
        "the fused LayerNorm",
        {"norm": "rmsnorm"},
    ),
    Change("ReLU²", "a squared ReLU MLP, as modded-nanogpt uses", {"mlp": "relu2"}),
    Change(
        "QK-norm",
        "queries and keys RMS-normalised per head (with gains, the 1/sqrt(d) scale kept) keep "
        "the logits tame at a high lr",
        {"qk_norm": True},
    ),
    Change(
        "Muon",
        "Muon orthogonalises the hidden matrices' updates (its Newton-Schulz iteration in "
        "float32 here; bf16 is a systems change below); AdamW keeps the rest",
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
        "a warmup of 20 steps lets AdamW take a 3x larger step",
        {"lr": 3e-3, "warmup_steps": 20},
    ),
    Change(
        "WSD decay",
        "decay the lr to zero over the last 40 % of a horizon set to the steps the entry before "
        "it needed",
        {"schedule": "wsd", "decay_fraction": 0.4},
    ),
    Change(
        "smaller batch",
        "half the sequences a step (the WSD horizon kept in tokens): below the critical batch "
        "size the same tokens reach the target, in steps that cost less",
        {"batch_size": _half_the_batch, "schedule_steps": _twice_the_horizon},
    ),
)

#: What a step costs, with the same arithmetic up to its rounding: each moves the tokens/s.
SYSTEMS: tuple[Change, ...] = (
    Change(
        "SDPA",
        "the fused attention kernel instead of the written-out softmax",
        {"attention": "sdpa"},
        "systems",
    ),
    Change(
        "bf16 autocast",
        "bf16 matrix products, in hardware where the CPU has bf16 instructions (AVX-512 BF16, AMX)",
        {"precision": "bf16"},
        "systems",
    ),
    Change(
        "Newton-Schulz in bf16",
        "Muon's iteration in bf16, as the original, on the same bf16 units",
        {"muon_ns_dtype": "bfloat16"},
        "systems",
    ),
    Change(
        "foreach optimizer",
        "the optimizers' multi-tensor path: one kernel per operation over all parameters",
        {"foreach": True},
        "systems",
    ),
    Change(
        "no host syncs",
        "the clock waits for the device once per evaluation, not twice per step",
        {"sync_each_step": False},
        "systems",
    ),
    Change(
        "batches prefetched",
        "the next batch is cut from the memmap in a background thread during the step",
        {"prefetch": True},
        "systems",
    ),
    Change(
        "torch.compile",
        "fused kernels for the step, compiled once per process (the study's untimed warm-up "
        "pays it; a reader's first run pays it on the clock)",
        {"compile": True},
        "systems",
    ),
    Change(
        "data parallel",
        "two gloo processes, one per core and one thread each, each with half of every batch, "
        "against one process with PyTorch's default threads; the book's DDP averages their "
        "gradients during the backward pass",
        {"data_parallel": 2, "threads": _one_thread_per_process},
        "systems",
    ),
)

#: The log, in the order the chapter makes it: learning changes, then systems changes.
LOG: tuple[Change, ...] = LEARNING + SYSTEMS

#: The changes a CPU without bf16 instructions skips (they would emulate bf16 in float32).
NEEDS_BF16: tuple[str, ...] = ("bf16 autocast", "Newton-Schulz in bf16")


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
    never: tuple[str, ...] = ()  # changes of LOG this preset never applies
    # the target's least distance from the unigram loss (0) towards the bigram loss (1); None:
    # unchecked (a smoke test's target, not one a model must learn to reach)
    min_fraction: float | None = 0.5


PRESETS: dict[str, Preset] = {
    "cpu": Preset(
        "cpu",
        16_000_000,
        1_024,
        TransformerShape.gpt_like(
            d_model=128, n_layers=4, n_heads=4, seq_len=128, vocab_size=1_024, batch_size=16
        ),
        # the unigram and bigram losses on these windows are 5.806 and 3.858 (2026-12-02): 4.5
        # is 0.67 of the way; probes (one thread, the machine shared) put the baseline there
        # after about 227 steps and the log's "warmup + higher lr" after about 41
        Target(loss=4.5, eval_every=10, eval_tokens=8_192, max_steps=600, dense_within=0.1),
        seeds=5,
        baseline={"lr": 1e-3},
        horizon=52,  # WSD's: about 1.25 times the steps of the entry before it
    ),
    "tiny": Preset(
        "tiny",
        600_000,
        512,
        TransformerShape.gpt_like(
            d_model=32, n_layers=2, n_heads=4, seq_len=32, vocab_size=512, batch_size=8
        ),
        Target(loss=6.0, eval_every=5, eval_tokens=1_024, max_steps=40),
        seeds=5,  # the fewest the keep rule accepts
        baseline={"lr": 3e-3},
        horizon=40,
        min_fraction=None,  # seconds, not a target a model must learn to reach
    ),
}


def preset(name: str) -> Preset:
    """The preset called ``name``; ``ValueError`` naming it if there is none. ``gpu`` is sized
    for the GPU of this machine (:func:`trainfast.speedrun.gpu.gpu_preset`)."""
    if name == "gpu":
        from trainfast.speedrun.gpu import gpu_preset

        return gpu_preset()
    if name not in PRESETS:
        raise ValueError(f"Unknown preset: {name!r} (known: {sorted([*PRESETS, 'gpu'])})")
    return PRESETS[name]


@dataclass(frozen=True)
class Entry:
    """A named configuration of a study and the entry it is compared with (None: none)."""

    part: str  # "log", "ablation", or a part of the GPU log
    config: SpeedrunConfig
    compared_to: str | None
    reason: str = ""
    kind: str = "learning"  # the kind of the change that made it (a Change's kind)

    @property
    def name(self) -> str:
        return self.config.name


def baseline(chosen: Preset) -> SpeedrunConfig:
    """The preset's frozen GPT-2 baseline."""
    return SpeedrunConfig(
        "baseline", chosen.shape, schedule_steps=chosen.horizon, **chosen.baseline
    )


def _skipped(chosen: Preset, skip: Collection[str]) -> set[str]:
    return {*chosen.never, *skip}


def log(chosen: Preset, dropped: Collection[str] = (), skip: Collection[str] = ()) -> list[Entry]:
    """The baseline, then each change of :data:`LOG` applied to the last entry that was kept
    (the changes named in ``dropped`` are measured but not kept; those in ``skip``, or the
    preset's ``never``, are left out, e.g. :data:`NEEDS_BF16` on a CPU without bf16). A change
    that would leave the last kept entry as it is (Muon's format where Muon was not kept) is
    left out too: it would measure nothing."""
    _check_names("dropped", dropped)
    _check_names("skip", skip)
    left_out = _skipped(chosen, skip)
    kept = Entry("log", baseline(chosen), None, "the GPT-2 baseline")
    chain = [kept]
    for change in LOG:
        if change.name in left_out:
            continue
        config = change.apply(kept.config)
        if replace(config, name=kept.name) == kept.config:
            continue
        entry = Entry("log", config, kept.name, change.reason, change.kind)
        chain.append(entry)
        if change.name not in dropped:
            kept = entry
    return chain


def final_entry(chosen: Preset, dropped: Collection[str] = (), skip: Collection[str] = ()) -> str:
    """The name of the last entry of the log that was kept."""
    names = {e.name for e in log(chosen, dropped, skip)}
    kept = [c.name for c in LOG if c.name in names and c.name not in dropped]
    return kept[-1] if kept else "baseline"


def ablation(
    chosen: Preset, dropped: Collection[str] = (), skip: Collection[str] = ()
) -> list[Entry]:
    """The final entry with each kept learning change of :data:`LOG` left out (the others
    applied to the baseline in order), compared with the final entry. (A kept systems change
    needs no ablation: its own row already measured it on everything before it, and it changes
    no token.)"""
    chain = log(chosen, dropped, skip)
    final = final_entry(chosen, dropped, skip)
    kept = [c for c in LOG if c.name in {e.name for e in chain} and c.name not in dropped]
    out = []
    for skipped in kept:
        if skipped.kind != "learning":
            continue
        config = baseline(chosen)
        for change in kept:
            if change is not skipped:
                config = change.apply(config)
        config = replace(config, name=f"without {skipped.name}")
        out.append(Entry("ablation", config, final, f"the final entry without {skipped.name}"))
    return out


def _check_names(what: str, names: Collection[str]) -> None:
    unknown = sorted(set(names) - {c.name for c in LOG})
    if unknown or isinstance(names, str):
        raise ValueError(f"Invalid {what}: {unknown or names!r} (expected names of LOG's changes)")


def entries(
    chosen: Preset,
    names: Sequence[str] | None = None,
    *,
    parts: Sequence[str] = ("log",),
    dropped: Collection[str] = (),
    skip: Collection[str] = (),
) -> list[Entry]:
    """The entries of ``parts`` ("log", "ablation"), or those called ``names`` (any part, in
    the order given), with the changes in ``dropped`` not kept (:func:`log`).

    An unknown name raises ``ValueError`` naming it and listing the known ones."""
    every = log(chosen, dropped, skip) + ablation(chosen, dropped, skip)
    if names is None:
        unknown = sorted(set(parts) - {"log", "ablation"})
        if unknown:
            raise ValueError(f"Unknown parts: {unknown} (expected 'log' or 'ablation')")
        return [e for e in every if e.part in parts]
    known = {e.name: e for e in every}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"Unknown entries: {unknown} (known: {list(known)})")
    return [known[n] for n in dict.fromkeys(names)]  # in the order asked for, each once
