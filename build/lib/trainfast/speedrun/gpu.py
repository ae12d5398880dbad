"""The speedrun's GPU log: sized from the GPU it finds, planned to fit one benchmark's slot, every
row beside the book's prediction for it.

**The rows.** The baseline; the CPU log's learning changes
(:data:`~trainfast.speedrun.changes.LEARNING`, without Muon and the smaller batch: Muon is a
row of its own below and the batch is the preset's); then each systems change alone on top of
that entry (bf16 autocast, SDPA, the foreach optimizer, ``torch.compile``, Muon with its
Newton-Schulz iteration in bf16); and all of them together. Each is compared with the entry it
was built on, over :data:`GPU_SEEDS` seeds, the runs of all rows interleaved round by round, on
the validation split.

**The size.** :func:`gpu_preset` takes the largest shape of :data:`LADDER` whose planned study
(every run to ``max_steps`` at the step time the book's model predicts, plus the compiled rows'
warm-ups) fits :data:`GPU_SLOT_SECONDS`, about 6 minutes of the GPU pass's 7-minute limit of a
benchmark, and sets ``max_steps`` to what the slot leaves. The target lies below the bigram
count model's loss on the whole corpus (:mod:`trainfast.speedrun.references`).

**The prediction** of each row (:func:`predict`), labelled as the book's model: the step time of
:func:`trainfast.distributed.step_time.estimate` (matmul FLOPs at half the datasheet peak of the
row's format), plus, for Muon, the Newton-Schulz iteration's FLOPs (:func:`newton_schulz_flops`:
at the GPT-2-small shape of 8 x 1,024 tokens about 28 % of the model's own), at the same
efficiency in the iteration's format. The model knows neither compilation nor kernels' launch
and memory costs; the chapter shows, beside it, the calibration of its own bf16 line against a
measured GPT-2-small step (about 0.40x on the H100), which a prediction may be multiplied by
(``bf16_calibration``), labelled so.

When not to use it: the time to the target has no prediction (the tokens needed depend on the
optimizer, which no FLOP count knows); only the tokens/s do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from trainfast.distributed.step_time import TrainingSetup, estimate
from trainfast.gpus import GPUS, GPUSpec, gpu_for_device
from trainfast.records import Record
from trainfast.speedrun.changes import LEARNING, Change, Entry, Preset, baseline
from trainfast.speedrun.harness import SpeedrunConfig, Target
from trainfast.transformer import TransformerShape
from trainfast.validation import check_int, check_number

__all__ = [
    "GPU_SEEDS",
    "GPU_SLOT_SECONDS",
    "GPU_SYSTEMS",
    "GPU_TARGET",
    "LADDER",
    "GpuRowReading",
    "RowPrediction",
    "bf16_calibration",
    "gpu_preset",
    "gpu_rows",
    "newton_schulz_flops",
    "planned_seconds",
    "predict",
    "read_gpu_log",
    "run_gpu_log",
]

GPU_SLOT_SECONDS = 360.0  # about 6 minutes, inside the GPU pass's 420 s for a benchmark
GPU_SEEDS = 3
#: A first compile of a model of this size on a GPU, generated code not yet cached: an
#: assumption (the compile-time record's GPT-2-sized entries take tens of seconds), paid by each
#: compiled row's untimed warm-up; each timed run then reuses the compiled graph in the same
#: process (TRACE_SECONDS is a margin for guard checks and a possible recompile).
COMPILE_SECONDS = 45.0
TRACE_SECONDS = 5.0
#: held-out loss the GPU runs train to: below the add-0.1 bigram model's loss on the gpu
#: preset's validation windows (the whole corpus, 8,192-token BPE; see the module docstring)
GPU_TARGET = 4.5
#: (d_model, n_layers, n_heads), smallest to largest: the sizes :func:`gpu_preset` tries
LADDER: tuple[tuple[int, int, int], ...] = (
    (256, 4, 4),
    (384, 6, 6),
    (512, 8, 8),
    (768, 12, 12),
)
_SEQ, _BATCH, _VOCAB = 512, 16, 8_192
_LEARNING_ON_GPU = tuple(c for c in LEARNING if c.name not in ("Muon", "smaller batch"))
_LEARNED = "learning changes"

#: The systems changes the GPU log tries one at a time on the learning entry, then together.
GPU_SYSTEMS: tuple[Change, ...] = (
    Change(
        "bf16 autocast",
        "bf16 matrix products on the tensor cores",
        {"precision": "bf16"},
        "systems",
    ),  # fmt: skip
    Change(
        "SDPA",
        "the fused attention kernel (PyTorch's default backend)",
        {"attention": "sdpa"},
        "systems",
    ),  # fmt: skip
    Change(
        "foreach optimizer",
        "one multi-tensor kernel per optimizer operation",
        {"foreach": True},
        "systems",
    ),  # fmt: skip
    Change("torch.compile", "fused kernels for the step", {"compile": True}, "systems"),
    Change(
        "Muon",
        "Muon on the hidden matrices, its Newton-Schulz iteration in bf16",
        {"optimizer": "muon", "muon_lr": 0.02, "muon_ns_dtype": "bfloat16"},
        "systems",
    ),
)


def _check_spec(spec: GPUSpec | str) -> GPUSpec:
    if isinstance(spec, str):
        if spec not in GPUS:
            raise ValueError(f"Unknown GPU: {spec!r} (known: {sorted(GPUS)})")
        return GPUS[spec]
    if not isinstance(spec, GPUSpec):
        raise ValueError(f"Invalid spec: {spec!r} (expected a GPUSpec or a name in GPUS)")
    return spec


def _shape(d_model: int, n_layers: int, n_heads: int) -> TransformerShape:
    return TransformerShape.gpt_like(
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        seq_len=_SEQ,
        vocab_size=_VOCAB,
        batch_size=_BATCH,
    )


def newton_schulz_flops(shape: TransformerShape, ns_steps: int = 5) -> float:
    """Matmul FLOPs of Muon's Newton-Schulz iteration in one step, over the hidden matrices of
    :class:`~trainfast.transformer.Transformer` (the fused QKV, the attention output, the MLP's
    two or three; the embedding and head are AdamW's).

    Per iteration on an ``m x n`` matrix (``m <= n``, the iteration works on the wide side):
    ``A = X X^T`` (``2 m^2 n``), ``B = b A + c A^2`` (``2 m^3``), ``X = a X + B X`` (``2 m^2
    n``): ``4 m^2 n + 2 m^3``, times ``ns_steps`` (Keller Jordan's ``zeropower_via_newtonschulz5``
    and :func:`trainfast.optim.muon.zeropower_via_newtonschulz5`)."""
    check_int("ns_steps", ns_steps, minimum=0)
    h, f = shape.d_model, shape.d_ff
    matrices = [(h + 2 * shape.kv_dim, h), (h, h)]
    matrices += [(f, h), (h, f)] if shape.mlp != "swiglu" else [(f, h), (f, h), (h, f)]
    per_layer = 0.0
    for rows, cols in matrices:
        m, n = min(rows, cols), max(rows, cols)
        per_layer += 4 * m * m * n + 2 * m**3
    return float(shape.n_layers * per_layer * ns_steps)


@dataclass(frozen=True)
class RowPrediction:
    """The book's model's step time and tokens/s for one row on one GPU."""

    step_seconds: float
    tokens_per_second: float
    label: str  # what it counts, e.g. "step-time model, bf16 autocast, + Newton-Schulz"


def predict(
    config: SpeedrunConfig, spec: GPUSpec | str, *, bf16_calibration: float | None = None
) -> RowPrediction:
    """The book's prediction for ``config``'s training step on ``spec``: the step-time model in
    the row's format, plus Muon's Newton-Schulz FLOPs at the same efficiency in its own format;
    with ``bf16_calibration`` (measured over predicted tokens/s of a bf16 step), a bf16 row's
    throughput multiplied by it, and labelled so."""
    spec = _check_spec(spec)
    recipe = "bf16 autocast" if config.precision == "bf16" else "fp32"
    setup = TrainingSetup(
        shape=config.shape, recipe=recipe, global_batch=config.shape.batch_size, gpu=spec.name
    )
    step = estimate(setup)
    seconds, label = step.step_s, f"step-time model, {recipe}"
    if config.optimizer == "muon":
        fmt = "bf16" if config.muon_ns_dtype == "bfloat16" else "fp32"
        efficiency = setup.assumptions.matmul_efficiency
        seconds += newton_schulz_flops(config.shape) / (efficiency * spec.peak_flops[fmt])
        label += f", + Newton-Schulz in {fmt}"
    rate = config.shape.tokens / seconds
    if bf16_calibration is not None and config.precision == "bf16":
        check_number("bf16_calibration", bf16_calibration, above=0.0)
        rate *= bf16_calibration
        label += f", x {bf16_calibration:.2f} (the model's bf16 calibration)"
    return RowPrediction(config.shape.tokens / rate, rate, label)


def gpu_rows(chosen: Preset) -> list[Entry]:
    """The GPU log's entries: baseline, learning changes, each systems change alone on them,
    and all together (see the module docstring)."""
    base = baseline(chosen)
    learned = base
    for change in _LEARNING_ON_GPU:
        learned = change.apply(learned, name=_LEARNED)
    rows = [
        Entry("gpu", base, None, "the GPT-2 baseline"),
        Entry("gpu", learned, "baseline", "the CPU log's learning changes (but Muon, the batch)"),
    ]
    together = learned
    for change in GPU_SYSTEMS:
        rows.append(Entry("gpu", change.apply(learned), _LEARNED, change.reason, "systems"))
        together = change.apply(together, name="all together")
    rows.append(Entry("gpu", together, _LEARNED, "every systems change at once", "systems"))
    return rows


def planned_seconds(chosen: Preset, spec: GPUSpec | str, seeds: int = GPU_SEEDS) -> float:
    """The longest the GPU log of ``chosen`` can take on ``spec`` by the book's model: every
    run to ``max_steps`` (with an evaluation every ``eval_every`` steps at a third of a step's
    cost per token), each compiled row's warm-up and each compiled run's tracing."""
    spec = _check_spec(spec)
    target = chosen.target
    evals = math.ceil(target.max_steps / target.eval_every)
    total = 0.0
    for entry in gpu_rows(chosen):
        step = predict(entry.config, spec).step_seconds
        eval_seconds = evals * step * target.eval_tokens / chosen.shape.tokens / 3
        run = target.max_steps * step + eval_seconds
        if entry.config.compile:
            total += COMPILE_SECONDS + seeds * TRACE_SECONDS
        total += seeds * run
    return total


def gpu_preset(
    spec: GPUSpec | str | None = None,
    *,
    slot: float = GPU_SLOT_SECONDS,
    seeds: int = GPU_SEEDS,
    min_steps: int = 200,
) -> Preset:
    """The ``gpu`` preset for ``spec`` (default: this machine's GPU; the H100 where it has none
    the book knows): the largest :data:`LADDER` shape whose study fits ``slot`` with at least
    ``min_steps`` steps a run, and the most steps (in tens) that fit. ``ValueError`` if not even
    the smallest fits."""
    if spec is None:
        spec = gpu_for_device("cuda") if torch.cuda.is_available() else None
        spec = spec or GPUS["H100 SXM 80GB"]
    spec = _check_spec(spec)
    check_number("slot", slot, above=0.0)
    check_int("seeds", seeds, minimum=1)
    best = None
    for d_model, n_layers, n_heads in LADDER:
        preset = Preset(
            "gpu",
            None,
            _VOCAB,
            _shape(d_model, n_layers, n_heads),
            Target(loss=GPU_TARGET, eval_every=25, eval_tokens=65_536, max_steps=min_steps),
            seeds=seeds,
            baseline={"lr": 1e-3},  # the CPU baseline's; GPT-2's 6e-4 reached 5.0 only after
            # about 400 steps of 8 x 1,024 tokens on an H100 (2026-11-26)
            horizon=min_steps,
            min_fraction=1.0,  # at or below the bigram loss
        )
        setup = TrainingSetup(shape=preset.shape, recipe="fp32", global_batch=_BATCH, gpu=spec.name)
        if not estimate(setup).fits or planned_seconds(preset, spec, seeds) > slot:
            break
        steps = min_steps
        while planned_seconds(_with_steps(preset, steps + 10), spec, seeds) <= slot:
            steps += 10
        best = _with_steps(preset, steps)
    if best is None:
        raise ValueError(
            f"Invalid slot: {slot} s (the smallest GPU log, {min_steps} steps a run, does not "
            f"fit on the {spec.name} by the book's model)"
        )
    return best


def _with_steps(chosen: Preset, steps: int) -> Preset:
    return replace(chosen, target=replace(chosen.target, max_steps=steps), horizon=steps)


def run_gpu_log(
    *,
    device: torch.device | None = None,
    chosen: Preset | None = None,
    seeds: int | None = None,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = print,
    spec: GPUSpec | str | None = None,
    compile: bool = True,
) -> Record:
    """Run the GPU log (:func:`gpu_rows`) of ``chosen`` (default: :func:`gpu_preset` for this
    GPU) as one interleaved block on the validation split, each row's prediction for ``spec``
    (default: this GPU's, else the H100's) in its rows. On a CPU this is the dry run: give a
    small ``chosen`` (the tests use the ``tiny`` preset's sizes :func:`dry_run_preset`), and
    ``compile=False`` to run the compiled rows uncompiled (a first compile on a CPU takes
    minutes; the record's description says so)."""
    from trainfast.speedrun.study import _Study

    chosen = chosen or gpu_preset(spec)
    spec = _check_spec(spec or gpu_for_device(device or "cuda") or GPUS["H100 SXM 80GB"])
    study = _Study(chosen, seeds if seeds is not None else chosen.seeds, device, out, progress,
                   "", None)  # fmt: skip
    study.check_target()
    references = study.references["validation"]
    study.text = (
        f"The GPU log: time to a held-out loss of {chosen.target.loss} on the validation split "
        f"(a unigram count model scores {references.unigram:.3f}, an add-{references.k} bigram "
        f"model {references.bigram:.3f} there), {study.seeds} seeds per row, every row's runs "
        "interleaved round by round; the clock counts training only. Rows: the baseline, the "
        "CPU log's learning changes, each systems change alone on them, all together. Each "
        f"row's prediction is the book's step-time model for the {spec.name} "
        "(+ Newton-Schulz FLOPs for Muon), uncalibrated. Compiled rows had one untimed warm-up."
    )
    rows = gpu_rows(chosen)
    predictions = {e.name: predict(e.config, spec) for e in rows}
    if not compile:
        rows = [replace(e, config=replace(e.config, compile=False)) for e in rows]
        study.text += " Dry run: the compiled rows ran uncompiled."

    def prediction(entry: Entry) -> dict[str, object]:
        p = predictions[entry.name]
        return {"predicted_tokens_per_second": p.tokens_per_second, "prediction": p.label}

    study.extra = prediction
    study.block(rows, "validation")
    study.write(complete=True)
    return study.record


def dry_run_preset(shape: TransformerShape, corpus_bytes: int, vocab_size: int) -> Preset:
    """The GPU log's plan at a size a CPU runs in seconds: ``shape``, a ``corpus_bytes`` slice,
    a target no run reaches in its 2 steps (so every row runs to the budget) and one seed."""
    return Preset(
        "gpu-dry-run",
        corpus_bytes,
        vocab_size,
        shape,
        Target(loss=0.01, eval_every=2, eval_tokens=4 * shape.seq_len, max_steps=2),
        seeds=1,
        baseline={"lr": 1e-3},
        horizon=40,  # at least the log's warmup of 20 steps
        min_fraction=None,
    )


def bf16_calibration(record: Record) -> float:
    """Measured over predicted tokens/s of a bf16-autocast GPT-2-small step on the record's GPU,
    from a ``precision-step-time`` record (:mod:`trainfast.precision.benchmarks`): how far the
    step-time model's bf16 line is from that GPU's. ``ValueError`` if the record has no bf16
    row or its GPU has no datasheet in :data:`~trainfast.gpus.GPUS`."""
    from trainfast.gpus import spec_for_record
    from trainfast.precision.benchmarks import gpu_step_shape

    spec = spec_for_record(record)
    if spec is None:
        raise ValueError(f"Invalid record: {record.device_name!r} has no datasheet to predict for")
    rows = [r for r in record.rows if r.get("recipe") == "bf16 autocast"]
    if not rows:
        raise ValueError(f"Invalid record: {record.name!r} has no 'bf16 autocast' row")
    shape = gpu_step_shape(False)
    setup = TrainingSetup(
        shape=shape, recipe="bf16 autocast", global_batch=shape.batch_size, gpu=spec.name
    )
    return rows[0]["tokens_per_s"] / (shape.tokens / estimate(setup).step_s)


@dataclass(frozen=True)
class GpuRowReading:
    """One row of a GPU log as measured, beside the book's prediction for it."""

    entry: str
    kind: str
    compared_to: str
    reached: int  # seeds that reached the target
    seeds: int
    median_seconds: float  # inf unless most seeds reached the target
    measured_tokens_per_second: float  # median over seeds
    predicted: RowPrediction
    time_ratio: float  # the entry it was built on over this one (nan for the baseline)
    p_value: float  # one-sided rank-sum test of the time (nan for the baseline)

    @property
    def measured_over_predicted(self) -> float:
        return self.measured_tokens_per_second / self.predicted.tokens_per_second


def read_gpu_log(record: Record, spec: GPUSpec | str) -> list[GpuRowReading]:
    """Each row of a GPU log's ``record`` (:func:`run_gpu_log`) with its measured median tokens/s,
    its time ratio to the entry it was built on (one-sided rank-sum p-value), and the book's
    prediction for ``spec`` (the record's own GPU) from the row's configuration in
    :func:`gpu_rows` of the preset the record's GPU would be given."""
    from trainfast.speedrun.protocol import KeepRule
    from trainfast.speedrun.study import summarize

    spec = _check_spec(spec)
    seeds_run = 1 + max(r["seed"] for r in record.rows)
    configs = {e.name: e.config for e in gpu_rows(gpu_preset(spec, seeds=seeds_run))}
    rule = KeepRule(min_seeds=1)
    summaries = {s.entry: s for s in summarize(record)}
    out = []
    for s in summaries.values():
        if s.entry not in configs:
            raise ValueError(f"Invalid record: its row {s.entry!r} is not a row of the GPU log")
        before = summaries.get(s.compared_to)
        ratio, p_value = math.nan, math.nan
        if before is not None:
            decision = rule.decide(before.seconds(record), s.seconds(record))
            ratio, p_value = decision.time_ratio, decision.p_value
        out.append(
            GpuRowReading(
                s.entry, s.kind, s.compared_to, s.reached, s.seeds, s.median_seconds,
                s.median_tokens_per_second, predict(configs[s.entry], spec), ratio, p_value,
            )
        )  # fmt: skip
    return out
