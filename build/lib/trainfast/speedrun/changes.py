"""The speedrun's log: a frozen baseline and the ordered changes that speed it up.

An *entry* is one named :class:`~trainfast.speedrun.SpeedrunConfig`. The baseline is a GPT-2
(LayerNorm, learned positions, a GELU MLP, a tied head, biases), trained in fp32 by AdamW at a
constant learning rate with softmax attention written out. Each :class:`Change` of :data:`LOG`
is applied with :func:`dataclasses.replace` to the last entry that was *kept* and carries a
one-line reason, so the log reads as the argument of the chapter, in order; the study
(:func:`~trainfast.speedrun.study.run_log`) keeps a change only if it beat that entry beyond
the noise, and :func:`log` takes the names of the changes that were not kept. :data:`TRIED`
are changes tried on top of the final entry: those expected to pay on a GPU, not on a CPU
(measured all the same), and the final entry's batch halved and doubled. :data:`NOT_RUN`
names what the CPU log leaves out, and why. The leave-one-out *ablation* (:func:`ablation`)
takes each kept change back out of the final entry, one at a time.

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
  it); the bf16 iteration is tried on top. On 2026-11-26 three things changed before the
  record was measured again, the target staying at 5.5: the token stream hands out its windows
  in a fixed shuffled order (read file by file, every run's loss rose for a while at the same
  point of the stream, which decided many crossings of the target); the log was reordered
  (the model, then its optimizer, then the step's cost), each change kept only if it beats the
  noise; and the evaluation runs every 5 steps instead of 20, so that a gain of a few steps
  can show. With both, the baseline's median tokens to the target fell from 184,320 to
  102,400. On 2026-11-26 that record's tried rows placed 16 sequences at or above the critical
  batch size (half the batch needed 33,280 tokens against 46,080 and beat the final entry
  beyond the noise), so the batch was halved in the log, after the optimizer's changes, and
  the tried rows halve and double the final entry's batch (a probe on the tuning split at 4
  sequences needed fewer tokens than at 8 but took longer: a step of few tokens costs about
  as much on this CPU). Later that day a probe on the tuning split (3 seeds, the machine
  shared with other jobs) gave the token embedding its own learning rate, 3e-2 (at 8
  sequences 28,160 tokens to the target, against 30,720 with 1e-2 and with 1e-1): at 16
  sequences the tokens to the target fell from 56,320 to 40,960, and with it warmup + a 3x
  higher lr, not kept before, fell further to 30,720 on every seed. It joined the log before
  that change.
* ``gpu`` (called ``h100`` until 2026-12-01; it runs on any GPU): a 12-layer, width-768 model
  (GPT-2 small's shape) on the whole corpus, 8 sequences of 1,024 tokens a step; the baseline
  and one entry with every change of the log, kept on the CPU or not (but data parallel and the
  smaller batch, which it never applies), with the tried changes on top (Muon's iteration in
  bf16, autocast in bf16, and compilation, which a GPU is expected to reward; the learning
  rates, the embedding's too, are the CPU log's, not tuned at this width), 2 seeds, sized to fit
  the GPU pass's limit of a benchmark (800 steps use about 6.6M of the corpus's training
  tokens). Its first target, 3.5, was set before any GPU run; on an H100 neither seed of the
  baseline reached it in 400 steps, so it is now 5.0, which the baseline's validation loss was
  still falling towards at step 400, within 800 steps; ``max_steps`` bounds a run that cannot
  reach it, and the record says so. On another GPU :func:`gpu_preset` sizes it from the device
  it finds.
* ``tiny``: seconds, for tests and the command line's smoke test.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from trainfast.speedrun.harness import SpeedrunConfig, Target
from trainfast.transformer import TransformerShape

__all__ = [
    "BASELINE_SHARE",
    "GPU_STUDY_SECONDS",
    "LOG",
    "NOT_RUN",
    "PRESETS",
    "PRESET_ALIASES",
    "TRIED",
    "Change",
    "Entry",
    "Preset",
    "ablation",
    "baseline",
    "entries",
    "final_entry",
    "gpu_preset",
    "log",
    "preset",
]

_SHAPE_FIELDS = {f.name for f in fields(TransformerShape)}
_CONFIG_FIELDS = {f.name for f in fields(SpeedrunConfig)} - {"name", "shape"}


@dataclass(frozen=True)
class Change:
    """One step of the log: what it sets (config or shape fields) and why.

    A setting is a value, or a function of the entry the change is applied to that returns the
    value (the tried batch sizes are half and double the final entry's)."""

    name: str
    reason: str
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.settings) - _SHAPE_FIELDS - _CONFIG_FIELDS
        if unknown:
            raise ValueError(f"Change {self.name!r}: unknown settings {sorted(unknown)}")

    def apply(self, config: SpeedrunConfig, name: str | None = None) -> SpeedrunConfig:
        """``config`` with this change's settings, named ``name`` (default: the change's)."""
        values = {k: v(config) if callable(v) else v for k, v in self.settings.items()}
        shape = {k: v for k, v in values.items() if k in _SHAPE_FIELDS}
        rest = {k: v for k, v in values.items() if k in _CONFIG_FIELDS}
        return replace(config, name=name or self.name, shape=replace(config.shape, **shape), **rest)


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
        "has one GPU, so the `gpu` preset leaves it out",
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
    "gpu": Preset(
        "gpu",
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


#: Old names of presets, kept while pages written before the rename still use them (deprecated:
#: ``h100`` ran on whichever GPU the pass had, and its records say ``gpu``).
PRESET_ALIASES = {"h100": "gpu"}


def preset(name: str) -> Preset:
    """The preset called ``name`` (or its old name, :data:`PRESET_ALIASES`); ``ValueError`` naming
    it if there is none."""
    name = PRESET_ALIASES.get(name, name)
    if name not in PRESETS:
        raise ValueError(f"Unknown preset: {name!r} (known: {sorted(PRESETS)})")
    return PRESETS[name]


#: Seconds the ``gpu`` preset's study is sized to on the device it finds: the speedrun's step of
#: the GPU pass (about 6 minutes, :data:`trainfast.gpu_pass.estimates.ESTIMATES`).
GPU_STUDY_SECONDS = 360.0
#: The share of them the float32 baseline's seeds may take; the every-change entry (bf16 and
#: compiled, its compilation about 40 to 60 s on an H100) has the rest.
BASELINE_SHARE = 0.75


def gpu_preset(device: Any = "cuda", seconds: float = GPU_STUDY_SECONDS) -> Preset:
    """The ``gpu`` preset sized for the CUDA ``device`` it runs on.

    Its ``max_steps`` is cut, where needed, so that the baseline's seeds would end within
    :data:`BASELINE_SHARE` of ``seconds`` at the step time the book's step model predicts for
    that GPU (:func:`trainfast.accounting.training_flops` at the model's matmul efficiency of
    the datasheet's float32 peak, :class:`~trainfast.distributed.training_setup.StepAssumptions`):
    on an H100 or an H200 (0.16 s a step) the preset is unchanged; on an A100 (0.56 s) it runs
    about 240 steps, which may not reach the target, and the record says so. A GPU without a
    row in :data:`trainfast.gpus.GPUS` gets the preset unchanged (with the warning
    :func:`~trainfast.gpus.gpu_for_device` gives).
    """
    from trainfast.accounting import training_flops
    from trainfast.distributed.training_setup import StepAssumptions
    from trainfast.gpus import gpu_for_device

    chosen = preset("gpu")
    spec = gpu_for_device(device)
    if spec is None:
        return chosen
    step_s = training_flops(chosen.shape) / (
        StepAssumptions().matmul_efficiency * spec.peak_flops["fp32"]
    )
    fits = int(BASELINE_SHARE * seconds / (chosen.seeds * step_s))
    if fits >= chosen.target.max_steps:
        return chosen
    steps = max(chosen.target.eval_every, fits - fits % chosen.target.eval_every)
    return replace(chosen, target=replace(chosen.target, max_steps=steps))


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
