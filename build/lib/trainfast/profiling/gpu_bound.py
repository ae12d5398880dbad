"""The profiling chapter's second case study: a decoder that keeps a GPU busy, fixed one step at a
time, beside what the book's models predict each fix does.

The first case study (:mod:`trainfast.profiling.case_study`) is small on purpose: its GPU run is
in the overhead regime, where the host's launches set the step time and only the fixes that
remove launches pay. This one is the other regime. The model is GPT-2 small's size
(:data:`~trainfast.transformer.PRESET_SHAPES` ``"gpt2-small"``: 12 layers of width 768, 12
heads, sequences of 1,024, GPT-2's 50,257-token vocabulary) with Llama's choices (RMSNorm, RoPE,
SwiGLU, grouped-query attention, no biases, an untied head), and the batch is as large as the
baseline fits in the GPU's memory (:func:`batch_that_fits`, from the accounting model). Each
step then does tens of TFLOPs, so the GPU, not the host, sets its time, and the fixes that make
the GPU's work cheaper are the ones that can pay:

1. ``bf16``: ``torch.autocast`` to bfloat16: tensor-core matmuls instead of float32 ones on the
   CUDA cores (TF32 is off by default), and 2-byte activations;
2. ``sdpa``: ``scaled_dot_product_attention``'s fused kernel instead of the written-out softmax
   attention, which writes and reads the ``seq x seq`` scores many times;
3. ``fused_optimizer``: ``AdamW(fused=True)`` instead of the default ``foreach`` path;
4. ``padded_vocab``: the vocabulary padded from 50,257 to a multiple of 64 (50,304, as nanoGPT
   does), so the LM head's matrices have the shapes tensor cores are fastest at; a decoder has
   no convolution for ``channels_last``, and its layout question is this one. The padded model
   starts from the same weights (:func:`padded_copy`; the new rows of the head start at zero);
5. ``compile``: ``torch.compile`` of the loss, which fuses the element-wise chains around the
   matmuls (RMSNorm, RoPE, SwiGLU, the casts, the loss).

:func:`predicted_chain` predicts each link from the book's models on a GPU's datasheet
(:mod:`trainfast.profiling.operator_roofline`: the operators of the traced step on the roofline,
the step-time model's matmul efficiency); :func:`compare_gpu_bound` measures them. The data are
windows of the first case study's text, tokenized once and kept on the device, so that no
loader takes part. Every fix but the padding changes how the same arithmetic runs; the padding
adds 47 logits that start at zero, and each run's loss must stay within the bf16 tolerance of
the baseline's (:data:`~trainfast.profiling.case_study.LOSS_TOLERANCE`).

When not to use it: for the overhead regime (small models, small batches), which the first case
study covers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import torch

from trainfast.accounting import training_flops, training_memory
from trainfast.gpus import GPUSpec
from trainfast.profiling.case_study import (
    LOSS_TOLERANCE,
    _llama_like,
    case_study_dataset,
    time_runs,
)
from trainfast.profiling.operator_roofline import (
    OperatorAssumptions,
    StepPrediction,
    predict_step,
    trace_step,
)
from trainfast.transformer import PRESET_SHAPES, Transformer, TransformerShape
from trainfast.utilization import mfu_peak_flops, model_flops_utilization
from trainfast.validation import check_int, check_number

__all__ = [
    "GPU_BOUND_FIXES",
    "GPU_TIMING",
    "VOCAB_MULTIPLE",
    "GpuBoundConfig",
    "GpuBoundFixes",
    "GpuBoundStudy",
    "batch_that_fits",
    "compare_gpu_bound",
    "gpu_bound_chain",
    "gpu_bound_shape",
    "padded_copy",
    "padded_vocab_size",
    "predicted_chain",
    "read_measurement",
    "record_shape",
    "text_batches",
]

#: The fixes in the order the study switches them on.
GPU_BOUND_FIXES = ("bf16", "sdpa", "fused_optimizer", "padded_vocab", "compile")

#: How the benchmark times each run on a GPU (:func:`compare_gpu_bound`'s arguments): after a
#: first step timed on its own (it includes compiling), one untimed sample, then five samples of
#: two steps each: 13 steps a run, 78 for the chain.
GPU_TIMING: dict[str, int] = {"steps_per_sample": 2, "rounds": 5, "warmup_samples": 1}

#: nanoGPT pads GPT-2's 50,257 tokens to 50,304, the next multiple of 64.
VOCAB_MULTIPLE = 64

#: Each fix's loss tolerance (the case study's, whose reasons
#: :func:`~trainfast.profiling.case_study.loss_tolerance` gives). The padding's is bf16's: its
#: new logits start at zero, so at the start they add ``ln(V_padded / V)`` nats to a loss of
#: about ``ln V`` (GPT-2's 47 extra columns: 8.6e-5 of it), and training pushes them down.
_TOLERANCE = {**LOSS_TOLERANCE, "padded_vocab": LOSS_TOLERANCE["bf16"]}


@dataclass(frozen=True)
class GpuBoundFixes:
    """Which of the GPU-bound study's fixes are on (all off: a plain float32 script)."""

    bf16: bool = False
    sdpa: bool = False
    fused_optimizer: bool = False
    padded_vocab: bool = False
    compile: bool = False

    @property
    def enabled(self) -> list[str]:
        return [name for name in GPU_BOUND_FIXES if getattr(self, name)]


def gpu_bound_chain() -> dict[str, GpuBoundFixes]:
    """``{"baseline": GpuBoundFixes(), "+ bf16": ...}``: each adds one fix to the one before."""
    chain, on = {"baseline": GpuBoundFixes()}, {}
    for name in GPU_BOUND_FIXES:
        on[name] = True
        chain[f"+ {name}"] = GpuBoundFixes(**on)
    return chain


def padded_vocab_size(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple`` (50,257 -> 50,304)."""
    check_int("vocab_size", vocab_size, minimum=1)
    check_int("multiple", multiple, minimum=1)
    return -(-vocab_size // multiple) * multiple


def gpu_bound_shape(batch_size: int = 1, seq_len: int | None = None) -> TransformerShape:
    """GPT-2 small's sizes (the ``"gpt2-small"`` preset: vocabulary, width, depth, heads,
    context) with Llama's choices (:func:`~trainfast.profiling.case_study._llama_like`)."""
    gpt2 = PRESET_SHAPES["gpt2-small"]
    return _llama_like(
        vocab_size=gpt2.vocab_size,
        d_model=gpt2.d_model,
        n_layers=gpt2.n_layers,
        n_heads=gpt2.n_heads,
        seq_len=seq_len or gpt2.seq_len,
        batch_size=batch_size,
    )


def _baseline_peak_bytes(shape: TransformerShape) -> float:
    """The accounting model's peak memory of the baseline (float32, written-out attention,
    AdamW): the most memory any run of the chain needs."""
    memory = training_memory(shape, recipe="fp32", optimizer="adamw", attention="manual")
    return memory.peak


def batch_that_fits(shape: TransformerShape, memory_bytes: float, *, reserve: float = 0.2) -> int:
    """The largest batch whose baseline step fits in ``(1 - reserve)`` of ``memory_bytes``, by
    the accounting model (:func:`~trainfast.accounting.training_memory`'s peak: model state,
    saved activations and the loss's buffers). ``reserve`` leaves room for what the model does
    not count: the CUDA context, the allocator's rounding, a kernel's temporary buffers (the
    softmax backward's ``seq x seq`` gradients). ``ValueError`` where not even one sequence fits."""
    check_number("memory_bytes", memory_bytes, above=0.0)
    check_number("reserve", reserve, minimum=0.0, below=1.0)
    usable = memory_bytes * (1 - reserve)
    one = _baseline_peak_bytes(replace(shape, batch_size=1))
    two = _baseline_peak_bytes(replace(shape, batch_size=2))
    fixed, per_sequence = 2 * one - two, two - one  # the peak is linear in the batch
    batch = int((usable - fixed) // per_sequence)
    if batch < 1:
        raise ValueError(
            f"Invalid memory_bytes: {memory_bytes:.3g} (one sequence of the baseline needs "
            f"{one:.3g} bytes, more than {1 - reserve:.0%} of it)"
        )
    return batch


@dataclass(frozen=True)
class GpuBoundConfig:
    """The model at its batch (unpadded), and what every run shares.

    ``batches`` distinct batches of text are cycled; ``compile_backend`` is Inductor, or
    ``"aot_eager"`` to trace without generating code (the quick mode on a CPU).
    """

    shape: TransformerShape = field(default_factory=gpu_bound_shape)
    lr: float = 3e-4
    seed: int = 0
    batches: int = 4
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        check_int("batches", self.batches, minimum=1)

    @classmethod
    def for_memory(cls, memory_bytes: float, reserve: float = 0.2) -> GpuBoundConfig:
        """GPT-2 small's size at the batch that fills ``memory_bytes``."""
        shape = gpu_bound_shape()
        return cls(
            shape=replace(shape, batch_size=batch_that_fits(shape, memory_bytes, reserve=reserve))
        )

    @classmethod
    def quick(cls) -> GpuBoundConfig:
        """A tiny model of the same kind, with a vocabulary that is not a multiple of 8 (1,021,
        padded to 1,024: as small a share of the softmax as GPT-2's padding), for a smoke test
        on a CPU; the compiled run traces without generating code."""
        shape = _llama_like(
            vocab_size=1021, d_model=32, n_layers=2, n_heads=4, seq_len=32, batch_size=4
        )
        return cls(shape=shape, batches=2, compile_backend="aot_eager")

    def shape_for(self, fixes: GpuBoundFixes) -> TransformerShape:
        """The model the run builds: with the padded vocabulary if ``fixes.padded_vocab``."""
        if not fixes.padded_vocab:
            return self.shape
        return replace(self.shape, vocab_size=padded_vocab_size(self.shape.vocab_size))


def text_batches(
    config: GpuBoundConfig, device: torch.device | str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``config.batches`` batches of the case study's text (random windows of Python's docs,
    word tokens), tokenized once here and kept on ``device``: no loader in the timed steps."""
    shape = config.shape
    windows = case_study_dataset(shape.vocab_size, shape.seq_len)
    generator = torch.Generator().manual_seed(config.seed)
    picks = torch.randint(len(windows), (config.batches, shape.batch_size), generator=generator)
    batches = []
    for row in picks:
        pairs = [windows[int(i)] for i in row]
        tokens = torch.stack([p[0] for p in pairs]).to(device)  # (batch, seq)
        targets = torch.stack([p[1] for p in pairs]).to(device)  # (batch, seq)
        batches.append((tokens, targets))
    return batches


def padded_copy(model: Transformer, vocab_size: int) -> Transformer:
    """``model`` with its vocabulary padded to ``vocab_size``: the same weights, the embedding's
    and the head's new rows zero (no token uses the embedding's; the head's give logits of 0,
    which take a share of the softmax that training pushes down)."""
    shape = replace(model.shape, vocab_size=vocab_size)
    with next(model.parameters()).device:
        padded = Transformer(shape, attention=model.blocks[0].attn.attention)
    state = model.state_dict()
    for name, tensor in padded.state_dict().items():
        source = state[name]
        with torch.no_grad():
            tensor.zero_()
            tensor[tuple(slice(0, n) for n in source.shape)].copy_(source)
    return padded.to(next(model.parameters()).device)


class GpuBoundStudy:
    """One run of the GPU-bound study, set up as ``fixes`` say, on ``batches`` that
    :func:`text_batches` made; :meth:`run` trains for some steps and may be called again."""

    def __init__(
        self,
        fixes: GpuBoundFixes,
        config: GpuBoundConfig,
        device: torch.device | str,
        batches: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        self.device, self.fixes, self.config = torch.device(device), fixes, config
        torch.manual_seed(config.seed)
        with self.device:  # initialised where it trains: the same weights in every run
            model = Transformer(config.shape, attention="sdpa" if fixes.sdpa else "manual")
            if fixes.padded_vocab:
                model = padded_copy(model, config.shape_for(fixes).vocab_size)
        self.model = model.to(self.device)  # and the rotary angles, which are made on the CPU
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = model.loss
        if fixes.compile:
            self.loss_fn = torch.compile(model.loss, backend=config.compile_backend)
        if fixes.fused_optimizer:
            self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, fused=True)
        else:  # the default: foreach on CUDA, the single-tensor loop on a CPU
            self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
        self.batches, self.step_count = batches, 0
        self.logged: list[torch.Tensor] = []

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def step(self) -> None:
        tokens, targets = self.batches[self.step_count % len(self.batches)]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.fixes.bf16):
            loss = self.loss_fn(tokens, targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.logged.append(loss.detach().float())  # on the device: no wait for the GPU
        self.step_count += 1

    def losses(self) -> list[float]:
        return torch.stack(self.logged).tolist() if self.logged else []

    def close(self) -> None:
        """Free the model, its gradients and the optimizer's state before the next run."""
        self.model = self.optimizer = self.loss_fn = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def compare_gpu_bound(
    variants: Mapping[str, GpuBoundFixes],
    config: GpuBoundConfig,
    device: torch.device | str,
    *,
    steps_per_sample: int = 2,
    rounds: int = 5,
    warmup_samples: int = 1,
) -> list[dict[str, Any]]:
    """Time one :class:`GpuBoundStudy` per variant, one after the other
    (:func:`~trainfast.profiling.case_study.time_runs`, one pass), on the same batches.

    A row is :func:`~trainfast.profiling.case_study.time_runs`' (its ``curve`` kept) with the
    variant's ``fixes``, its ``tolerance`` (the loosest of its fixes': 0 for the baseline,
    bf16's for every later link), the model's sizes (``vocab_size``, ``d_model``,
    ``n_layers``, ``n_heads``, ``batch_size``, ``seq_len``: :func:`record_shape`), the unpadded
    model's ``model_flops`` per step, and on CUDA the most memory the run allocated,
    ``peak_gb``.
    """
    device = torch.device(device)
    batches = text_batches(config, device)
    peaks: dict[str, float] = {}

    def build(name: str, fixes: GpuBoundFixes) -> GpuBoundStudy:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        study = GpuBoundStudy(fixes, config, device, batches)
        original = study.close

        def close() -> None:
            if device.type == "cuda":
                peaks[name] = torch.cuda.max_memory_allocated(device) / 1e9
            original()

        study.close = close  # type: ignore[method-assign]
        return study

    builders = {name: partial(build, name, fixes) for name, fixes in variants.items()}
    timed = time_runs(
        builders,
        device,
        steps_per_sample=steps_per_sample,
        rounds=rounds,
        warmup_samples=warmup_samples,
    )
    shape, rows = config.shape, []
    for row, (name, fixes) in zip(timed, variants.items(), strict=True):
        tolerance = max((_TOLERANCE[f] for f in fixes.enabled), default=0.0)
        rows.append(
            {"variant": name, "fixes": ", ".join(fixes.enabled) or "none", **row}
            | {
                "tolerance": tolerance,
                "vocab_size": config.shape_for(fixes).vocab_size,
                "d_model": shape.d_model,
                "n_layers": shape.n_layers,
                "n_heads": shape.n_heads,
                "batch_size": shape.batch_size,
                "seq_len": shape.seq_len,
                "model_flops": float(training_flops(shape)),
                "peak_gb": peaks.get(name),
            }
        )
    return rows


def record_shape(record: Any) -> TransformerShape:
    """The unpadded model a ``gpu-bound-case-study`` record measured, at its batch, from its
    baseline row; ``ValueError`` naming a missing size."""
    row = record.rows[0]
    missing = [
        k
        for k in ("vocab_size", "d_model", "n_layers", "n_heads", "seq_len", "batch_size")
        if k not in row
    ]
    if missing:
        raise ValueError(f"Record {record.name!r} lacks the sizes {missing}")
    return _llama_like(
        vocab_size=int(row["vocab_size"]),
        d_model=int(row["d_model"]),
        n_layers=int(row["n_layers"]),
        n_heads=int(row["n_heads"]),
        seq_len=int(row["seq_len"]),
        batch_size=int(row["batch_size"]),
    )


def predicted_chain(
    shape: TransformerShape,
    spec: GPUSpec,
    assumptions: OperatorAssumptions | None = None,
    variants: Mapping[str, GpuBoundFixes] | None = None,
) -> list[dict[str, Any]]:
    """What the book's models predict for each variant of the chain at ``shape`` (the unpadded
    model at its batch) on ``spec``: a row per variant with ``predicted_ms``, the ``link`` (the
    previous variant's predicted time over this one's), the predicted ``mfu_pct`` (the unpadded
    model's FLOPs over the dense bf16 peak), which side ``bound`` the step, and the parts.

    Each variant's step is traced once (:func:`~trainfast.profiling.operator_roofline.trace_step`,
    the default ``foreach`` optimizer traced for the fused one) and priced by
    :func:`~trainfast.profiling.operator_roofline.predict_step`.
    """
    variants = variants or gpu_bound_chain()
    config = GpuBoundConfig(shape=shape)
    traces: dict[tuple[Any, ...], Any] = {}
    rows: list[dict[str, Any]] = []
    flops = training_flops(shape)
    peak = mfu_peak_flops(spec)
    for name, fixes in variants.items():
        step_shape = config.shape_for(fixes)
        key = (step_shape, fixes.bf16, fixes.sdpa)
        if key not in traces:
            traces[key] = trace_step(step_shape, bf16=fixes.bf16, sdpa=fixes.sdpa)
        prediction: StepPrediction = predict_step(
            traces[key],
            spec,
            assumptions,
            fused_optimizer=fixes.fused_optimizer,
            compile=fixes.compile,
        )
        step_ms = prediction.step_s * 1e3
        rows.append(
            {
                "variant": name,
                "predicted_ms": step_ms,
                "link": rows[-1]["predicted_ms"] / step_ms if rows else 1.0,
                "mfu_pct": 100 * model_flops_utilization(flops, prediction.step_s, peak),
                "bound": prediction.bound,
                "matmul_ms": prediction.matmul_s * 1e3,
                "attention_ms": prediction.attention_s * 1e3,
                "memory_ms": prediction.memory_s * 1e3,
                "optimizer_ms": prediction.optimizer_s * 1e3,
                "host_ms": prediction.host_s * 1e3,
                "kernels": prediction.kernels,
            }
        )
    return rows


def read_measurement(
    record: Any,
    predicted: Sequence[Mapping[str, Any]] | None = None,
    spec: GPUSpec | None = None,
    alpha: float = 0.05,
) -> str:
    """What a ``gpu-bound-case-study`` record says, as sentences a page can show: each link (the
    run before it over the run with it) with its rank-sum verdict on the record's samples
    (:func:`~trainfast.profiling.plots.fix_verdict`), beside its prediction where ``predicted``
    (:func:`predicted_chain`'s rows for the record's own GPU and batch) has the variant; the
    whole step, and its MFU on ``spec``'s dense bf16 peak where ``spec`` (the record's GPU) is
    given; and the runs whose loss left their tolerance. With neither ``predicted`` nor ``spec``
    (a GPU the book has no datasheet of) it says that no prediction is set beside the record.
    """
    from trainfast.profiling.plots import fix_verdict

    rows = list(record.rows)
    if len(rows) < 2:
        raise ValueError(f"Record {record.name!r} has {len(rows)} rows (need a baseline and a fix)")
    expected = {str(row["variant"]): row for row in predicted or []}
    links = []
    for before, after in zip(rows, rows[1:], strict=False):
        text = f"`{after['variant']}` ×{before['step_ms'] / after['step_ms']:.2f}"
        notes = []
        if fix_verdict(before, after, alpha) == "noise":
            notes.append("within the noise")
        if after["variant"] in expected:
            notes.append(f"predicted ×{expected[after['variant']]['link']:.2f}")
        links.append(text + (f" ({', '.join(notes)})" if notes else ""))
    first, last = rows[0], rows[-1]
    text = (
        f"On the {record.device_name} the links measured {', '.join(links)}. The step went "
        f"from {first['step_ms']:.0f} ms to {last['step_ms']:.0f} ms"
    )
    if last["variant"] in expected:
        text += f" against a predicted {expected[last['variant']]['predicted_ms']:.0f} ms"
    if spec is not None:
        mfu = model_flops_utilization(
            float(last["model_flops"]), last["step_ms"] / 1e3, mfu_peak_flops(spec)
        )
        text += f", {100 * mfu:.0f}% MFU"
    text += "."
    if not expected and spec is None:
        text += " The book has no datasheet of this GPU, so it sets no prediction beside it."
    strays = [row for row in rows if row["loss_deviation"] > row["tolerance"]]
    if strays:
        worst = max(row["loss_deviation"] for row in strays)
        names = ", ".join(f"`{row['variant']}`" for row in strays)
        text += f" Beyond their loss tolerance: {names} (at most {worst:.2%} from the baseline)."
    else:
        text += " Every run kept the baseline's loss within its tolerance."
    return text
