"""The profiling chapter's case study: one slow training loop and eight fixes, each behind a flag.

The loop trains the book's :class:`~trainfast.transformer.Transformer` with Llama's choices
(RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases, an untied head) on Python's
documentation (:mod:`trainfast.profiling.text`), and starts with every habit that makes real
training scripts slow. :class:`Fixes` switches the cures on, one flag each:

1. ``data_workers``: tokenize in ``DataLoader`` worker processes, not between two steps;
2. ``pinned_memory``: page-locked host batches and ``non_blocking`` copies (CUDA only);
3. ``no_item``: keep the losses on the device instead of ``loss.item()`` every step, which
   makes the CPU wait for the GPU;
4. ``bf16``: ``torch.autocast`` to bfloat16 (tensor-core matmuls, half the bytes);
5. ``fused_optimizer``: ``AdamW(fused=True)``, one kernel launch per group of parameter tensors
   (as many as fit in one launch's arguments) instead of a handful of kernels per tensor;
6. ``sdpa``: the model's ``attention="sdpa"`` (a fused attention kernel) instead of the
   hand-written softmax attention;
7. ``compile``: ``torch.compile`` of the loss (forward, and through AOTAutograd the backward);
8. ``cuda_graphs``: ``torch.compile(mode="reduce-overhead")``, which records the compiled
   forward and backward kernels into CUDA graphs and replays each with one launch (CUDA only;
   needs ``compile``; the optimizer step stays outside the graphs).

One more flag is not in the chain but measured on its own: ``foreach_optimizer``,
``AdamW(foreach=True)``, which is what ``AdamW(params)`` picks by itself when every parameter is
on a CUDA device (the baseline asks for the single-tensor loop, ``foreach=False``, which is the
default on a CPU).

:func:`compare_fixes` builds one run per set of fixes and times them one after the other; the
chapter plots the result as a waterfall. Every fix changes how the same arithmetic is executed, not
what is computed, so each run's loss curve must equal the baseline's within
:func:`loss_tolerance` (a test checks every fix this machine can run).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, RandomSampler

from trainfast.profiling.text import TokenWindows, WordTokenizer, python_docs_text
from trainfast.profiling.traces import annotate
from trainfast.timing import Timing, benchmark
from trainfast.transformer import Transformer, TransformerShape

__all__ = [
    "ALTERNATIVES",
    "CUDA_ONLY",
    "FIXES",
    "LOSS_HORIZON",
    "LOSS_TOLERANCE",
    "CaseStudy",
    "CaseStudyConfig",
    "Fixes",
    "Run",
    "compare_fixes",
    "case_study_dataset",
    "case_study_loader",
    "case_study_loss",
    "case_study_optimizer",
    "cumulative_fixes",
    "loss_deviation",
    "loss_tolerance",
    "time_runs",
    "train_with_fixes",
]

#: The fixes in the order the case study switches them on.
FIXES = (
    "data_workers",
    "pinned_memory",
    "no_item",
    "bf16",
    "fused_optimizer",
    "sdpa",
    "compile",
    "cuda_graphs",
)

#: Alternatives measured on their own, not switched on in the chain.
ALTERNATIVES = ("foreach_optimizer",)

#: Fixes that only mean something with a CUDA device; :class:`CaseStudy` refuses them elsewhere.
CUDA_ONLY = ("pinned_memory", "cuda_graphs")

#: Largest allowed ``|loss - baseline loss| / baseline loss`` at any of the first
#: ``LOSS_HORIZON`` steps, per fix; the reasons are in :func:`loss_tolerance`.
LOSS_TOLERANCE: dict[str, float] = {
    "data_workers": 0.0,
    "pinned_memory": 0.0,
    "no_item": 0.0,
    "bf16": 5e-3,
    "fused_optimizer": 1e-4,
    "sdpa": 1e-4,
    "compile": 1e-4,
    "cuda_graphs": 1e-4,
    "foreach_optimizer": 1e-4,
}


#: Steps over which the tolerances hold. Training amplifies any difference, even one rounding
#: error, step after step (the trajectories of two runs drift apart), so "the same loss curve" is
#: a statement about a horizon; past it, two correct runs agree only statistically.
LOSS_HORIZON = 20


def loss_tolerance(fixes: Fixes) -> float:
    """How far a run with fixes may stray from the baseline's loss over the first
    LOSS_HORIZON steps: the loosest tolerance of its fixes.

    - Exact (0) for data_workers, pinned_memory, no_item: they move work between
      processes or change when the host reads the loss; the same kernels run on the same
      numbers, so the losses are the same bit for bit.
    - 1e-4 for fused_optimizer, foreach_optimizer, sdpa, compile,
      cuda_graphs: they change the order of float32 additions (one fused kernel, another
      attention algorithm, Inductor's fused loops). One step differs by float32 rounding, about
      1e-7 relative, and over the horizon training carries that forward without much growth. A
      real bug (a missing mask, a wrong scale) is off by far more, and even a 1 % change of
      the learning rate exceeds 1e-4 within the horizon (a test checks that).
    - 5e-3 for bf16: bfloat16 keeps 8 significant bits, a rounding error of up to
      2**-8 = 0.39 % per value (half a unit in the last place). Autocast rounds the inputs of
      the matmuls (their sums stay float32) and keeps the loss in float32, and on CUDA softmax
      and normalisation too (on a CPU it leaves them in their inputs' dtype, so the attention
      softmax of bf16 scores runs in bf16); the errors average out over each dot product and
      over the tokens of the loss:
      the loss moves far less than one value's rounding. About one rounding is a bound that a
      correct bf16 step stays within and a step in the wrong precision, or on the wrong data,
      does not.
    """
    return max((LOSS_TOLERANCE[name] for name in fixes.enabled), default=0.0)


@dataclass(frozen=True)
class Fixes:
    """Which of the case study's fixes are on (all off: the slow baseline). See the module doc."""

    data_workers: bool = False
    pinned_memory: bool = False
    no_item: bool = False
    bf16: bool = False
    fused_optimizer: bool = False
    sdpa: bool = False
    compile: bool = False
    cuda_graphs: bool = False
    foreach_optimizer: bool = False  # not in the chain: see ALTERNATIVES

    def __post_init__(self) -> None:
        if self.cuda_graphs and not self.compile:
            raise ValueError(
                "Invalid Fixes: cuda_graphs=True needs compile=True (the graphs are recorded by "
                'torch.compile(mode="reduce-overhead"))'
            )

    @property
    def enabled(self) -> list[str]:
        """The names of the fixes that are on, in FIXES order, then the alternatives."""
        return [name for name in FIXES + ALTERNATIVES if getattr(self, name)]

    def check_device(self, device: torch.device) -> None:
        """Raise ValueError naming a CUDA-only fix asked for on another device."""
        if device.type != "cuda":
            for name in CUDA_ONLY:
                if getattr(self, name):
                    raise ValueError(
                        f"Fix {name!r} needs a CUDA device (this run is on {device.type}): "
                        "pinned memory speeds up host-to-GPU copies and CUDA graphs replay GPU "
                        "kernels, so on this device there is nothing for them to do"
                    )


def cumulative_fixes(device: torch.device, skip: Sequence[str] = ()) -> dict[str, Fixes]:
    """``{"baseline": Fixes(), "+ data_workers": ..., ...}``: each adds one fix to the one before.

    Fixes in ``skip`` and the CUDA-only ones on another device are left out of the chain.
    """
    unknown = [name for name in skip if name not in FIXES]
    if unknown:
        raise ValueError(f"Unknown fixes: {unknown} (known: {list(FIXES)})")
    chain, on = {"baseline": Fixes()}, {}
    for name in FIXES:
        if name in skip or (device.type != "cuda" and name in CUDA_ONLY):
            continue
        on[name] = True
        chain[f"+ {name}"] = Fixes(**on)
    return chain


def _llama_like(
    *, vocab_size: int, d_model: int, n_layers: int, n_heads: int, seq_len: int, batch_size: int
) -> TransformerShape:
    """Llama's choices at a small size (Touvron et al. 2023, section 2.2: RMSNorm, rotary
    positions, a SwiGLU MLP of width 2/3 x 4 d_model, here rounded up to a multiple of 32; Meta's
    released model.py: no biases, an untied head), with grouped-query attention of two query
    heads per key/value head."""
    d_ff = -(-8 * d_model // 3 // 32) * 32
    return TransformerShape(
        vocab_size,
        d_model,
        n_layers,
        n_heads,
        d_ff,
        seq_len,
        batch_size,
        n_kv_heads=n_heads // 2,
        norm="rmsnorm",
        positions="rope",
        mlp="swiglu",
        bias=False,
        tied_head=False,
    )


@dataclass(frozen=True)
class CaseStudyConfig:
    """The model, data and optimizer every run of the case study shares: a small decoder with
    Llama's choices (:func:`_llama_like`)."""

    shape: TransformerShape = field(
        default_factory=lambda: _llama_like(
            vocab_size=512, d_model=32, n_layers=2, n_heads=4, seq_len=32, batch_size=8
        )
    )
    lr: float = 3e-3  # at 1e-3 this untied, bias-free model barely learns in 20 steps
    seed: int = 0
    workers: int = 1  # DataLoader worker processes when the data_workers fix is on
    compile_backend: str = "inductor"  # "aot_eager": trace without generating code (tests)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"Invalid workers: {self.workers} (need at least 1)")

    @classmethod
    def for_device(cls, device: torch.device | str) -> CaseStudyConfig:
        """The default (tiny: a CPU step is a few milliseconds) or, on a GPU, a model large
        enough to keep the GPU busy for a while each step, fed by four worker processes."""
        if torch.device(device).type == "cuda":
            shape = _llama_like(
                vocab_size=4096, d_model=256, n_layers=4, n_heads=8, seq_len=256, batch_size=32
            )
            return cls(shape=shape, workers=4)
        return cls()


@cache
def case_study_dataset(vocab_size: int, seq_len: int) -> TokenWindows:
    """Python's docs as windows of ``seq_len + 1`` word tokens (built once per process)."""
    text = python_docs_text()
    return TokenWindows(text, WordTokenizer(text, vocab_size), seq_len)


def case_study_loss(
    model: Transformer, fixes: Fixes, backend: str = "inductor"
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The model's loss, compiled with ``fixes.compile``; ``mode="reduce-overhead"`` records
    CUDA graphs (``fixes.cuda_graphs``). Another ``backend`` traces without generating code."""
    if not fixes.compile:
        return model.loss
    if backend != "inductor":
        return torch.compile(model.loss, backend=backend)
    return torch.compile(model.loss, mode="reduce-overhead" if fixes.cuda_graphs else "default")


def case_study_optimizer(
    parameters: Iterable[torch.nn.Parameter], fixes: Fixes, lr: float
) -> torch.optim.AdamW:
    """AdamW as the fixes ask: fused (one kernel per group of tensors), foreach (a few kernels
    per group) or the single-tensor loop (a few kernels per tensor, the baseline)."""
    if fixes.fused_optimizer:
        return torch.optim.AdamW(parameters, lr=lr, fused=True)
    return torch.optim.AdamW(parameters, lr=lr, foreach=fixes.foreach_optimizer)


def case_study_loader(config: CaseStudyConfig, fixes: Fixes) -> DataLoader:
    """Shuffled batches of :func:`case_study_dataset`, tokenized in ``config.workers`` worker
    processes with ``fixes.data_workers`` (else between two steps), pinned with
    ``fixes.pinned_memory``; the same batches in the same order either way, epoch after epoch.

    The sampler shuffles with a generator of its own. The loader's generator also seeds the
    workers, once per iterator: a loader without workers makes an iterator each epoch, persistent
    workers keep theirs, so a shared generator would shuffle the second epoch differently.
    """
    workers = config.workers if fixes.data_workers else 0
    dataset = case_study_dataset(config.shape.vocab_size, config.shape.seq_len)
    return DataLoader(
        dataset,
        batch_size=config.shape.batch_size,
        sampler=RandomSampler(dataset, generator=torch.Generator().manual_seed(config.seed)),
        drop_last=True,
        generator=torch.Generator().manual_seed(config.seed),  # worker seeds only
        num_workers=workers,
        persistent_workers=workers > 0,  # keep the workers between epochs
        pin_memory=fixes.pinned_memory,
    )


class CaseStudy:
    """One training run of the case study: the model, optimizer and data loader, set up as
    ``fixes`` say; :meth:`run` trains for some steps and may be called again to continue."""

    def __init__(
        self,
        fixes: Fixes,
        config: CaseStudyConfig | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.fixes, self.config = fixes, config or CaseStudyConfig()
        fixes.check_device(self.device)
        torch.manual_seed(self.config.seed)
        model = Transformer(self.config.shape, attention="sdpa" if fixes.sdpa else "manual")
        self.model = model.to(self.device)
        self.loss_fn = case_study_loss(model, fixes, self.config.compile_backend)
        self.optimizer = case_study_optimizer(model.parameters(), fixes, self.config.lr)
        self.loader = case_study_loader(self.config, fixes)
        # epoch after epoch (the sampler reshuffles each time); no reference back to self, so the
        # workers stop as soon as the run is dropped, not whenever the garbage collector runs
        self.batches = itertools.chain.from_iterable(itertools.repeat(self.loader))
        self.logged: list[float | torch.Tensor] = []  # one loss per step

    def run(self, steps: int) -> None:
        """Train for the given number of optimizer steps, logging each step's loss."""
        for _ in range(steps):
            self.step()

    def step(self) -> None:
        """One optimizer step, its four parts annotated for the profilers; logs the loss."""
        fixes = self.fixes
        with annotate("data"):
            tokens, targets = next(self.batches)  # (batch, seq) each
            tokens = tokens.to(self.device, non_blocking=fixes.pinned_memory)
            targets = targets.to(self.device, non_blocking=fixes.pinned_memory)
        if fixes.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new step: replay, don't re-record
        with annotate("forward"):
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=fixes.bf16):
                loss = self.loss_fn(tokens, targets)
        with annotate("backward"):
            loss.backward()
        with annotate("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if fixes.no_item:  # a copy: CUDA graphs reuse the loss's memory on the next replay
            self.logged.append(loss.detach().clone())
        else:  # the host waits here until the GPU has computed the loss
            self.logged.append(loss.item())

    def close(self) -> None:
        """Stop the loader's worker processes now (a run that is dropped stops them too)."""
        self.batches = iter(())
        self.loader = None  # type: ignore[assignment]  # its iterator's workers exit with it

    def losses(self) -> list[float]:
        """Every step's loss so far, as Python floats (one device sync if they are tensors)."""
        if self.fixes.no_item and self.logged:
            return torch.stack(self.logged).float().tolist()  # type: ignore[arg-type]
        return [float(value) for value in self.logged]


def train_with_fixes(
    fixes: Fixes,
    steps: int,
    config: CaseStudyConfig | None = None,
    device: torch.device | str = "cpu",
) -> list[float]:
    """The loss curve of ``steps`` steps of the case study with ``fixes`` on."""
    study = CaseStudy(fixes, config, device)
    study.run(steps)
    return study.losses()


def loss_deviation(losses: Sequence[float], baseline: Sequence[float]) -> float:
    """Largest ``|loss - baseline| / |baseline|`` over the steps of two equally long curves."""
    if len(losses) != len(baseline) or not losses:
        raise ValueError(f"Invalid curves: {len(losses)} and {len(baseline)} steps")
    return max(abs(a - b) / abs(b) for a, b in zip(losses, baseline, strict=True))


class Run(Protocol):
    """A training run that :func:`time_runs` can time: :class:`CaseStudy`, or the GPU-bound
    study's run (:class:`~trainfast.profiling.gpu_bound.GpuBoundStudy`)."""

    def run(self, steps: int) -> None: ...

    def losses(self) -> list[float]: ...

    def close(self) -> None: ...


def time_runs(
    builders: Mapping[str, Callable[[], Run]],
    device: torch.device | str = "cpu",
    *,
    steps_per_sample: int = 5,
    rounds: int = 5,
    warmup_samples: int = 1,
    passes: int = 1,
) -> list[dict[str, Any]]:
    """Time one run per builder, one after the other; a row per run, the first the baseline.

    Each run is built, takes one first step (timed: it includes compilation and starting the
    workers), then ``warmup_samples`` untimed samples, then ``rounds // passes`` samples of
    ``steps_per_sample`` steps, and is torn down (``close()``) before the next is built;
    ``passes`` times over, so that a burst of load on the machine lands on a part of each run's
    samples rather than on all of one run's. The runs do not take turns sample by sample (as
    :func:`~trainfast.timing.benchmark_side_by_side` would have them) because a run's loader
    workers keep working while they are alive: between two of its samples they would tokenize
    its next batches for free, on cores the run being timed needs. Compare the samples of two
    runs with a test that does not pair them (:func:`~trainfast.timing.rank_sum_test`). Every
    pass starts from the same weights and batches, so the loss curves (of the first pass) can
    be compared step by step.

    A row has the run's ``variant`` name, ``step_ms`` (median), ``iqr_ms``, ``samples`` and
    ``samples_ms`` (every sample, per step, pass after pass), ``speedup`` (the first run's step
    time over this one's), ``first_step_s`` (first pass), ``loss_deviation`` from the first
    run's curve over its first ``LOSS_HORIZON`` steps (or all of them, if fewer), and
    ``curve``, the run's whole loss curve.
    """
    if not builders:
        raise ValueError("Invalid variants: nothing to compare")
    if passes < 1 or rounds % passes:
        raise ValueError(f"Invalid passes: {passes} (need a divisor of rounds={rounds})")
    device = torch.device(device)
    first_step: dict[str, float] = {}
    curves: dict[str, list[float]] = {}
    samples: dict[str, list[float]] = {name: [] for name in builders}
    timings: dict[str, Timing] = {}
    for _ in range(passes):
        for name, build in builders.items():
            study = build()
            first = benchmark(partial(study.run, 1), warmup=0, repeats=1, device=device).median
            first_step.setdefault(name, first)
            timing = benchmark(
                partial(study.run, steps_per_sample),
                warmup=warmup_samples,
                repeats=rounds // passes,
                device=device,
            )
            samples[name] += timing.samples
            timings[name] = dataclasses.replace(timing, samples=tuple(samples[name]))
            curves.setdefault(name, study.losses())
            study.close()  # its workers must not run while the next variant is timed
    baseline = next(iter(builders))
    horizon = min(LOSS_HORIZON, *(len(curve) for curve in curves.values()))
    rows = []
    for name in builders:
        step = timings[name].median / steps_per_sample
        rows.append(
            {
                "variant": name,
                "step_ms": step * 1e3,
                "iqr_ms": timings[name].iqr / steps_per_sample * 1e3,
                "samples": len(timings[name].samples),
                "samples_ms": [t / steps_per_sample * 1e3 for t in timings[name].samples],
                "speedup": timings[baseline].median / steps_per_sample / step,
                "first_step_s": first_step[name],
                "loss_deviation": loss_deviation(
                    curves[name][:horizon], curves[baseline][:horizon]
                ),
                "curve": curves[name],
            }
        )
    return rows


def compare_fixes(
    variants: Mapping[str, Fixes],
    config: CaseStudyConfig | None = None,
    device: torch.device | str = "cpu",
    *,
    steps_per_sample: int = 5,
    rounds: int = 5,
    warmup_samples: int = 1,
    passes: int = 1,
) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """Time one :class:`CaseStudy` per variant with :func:`time_runs`; return a row per variant
    and each curve.

    A row is :func:`time_runs`' (without its ``curve``) with the variant's ``fixes`` and its
    :func:`loss_tolerance`. The curves returned are whole.
    """
    if not variants:
        raise ValueError("Invalid variants: nothing to compare")
    device = torch.device(device)
    config = config or CaseStudyConfig()
    builders = {name: partial(CaseStudy, fixes, config, device) for name, fixes in variants.items()}
    timed = time_runs(
        builders,
        device,
        steps_per_sample=steps_per_sample,
        rounds=rounds,
        warmup_samples=warmup_samples,
        passes=passes,
    )
    rows, curves = [], {}
    for row, (name, fixes) in zip(timed, variants.items(), strict=True):
        curves[name] = row.pop("curve")
        rows.append(
            {"variant": name, "fixes": ", ".join(fixes.enabled) or "none", **row}
            | {"tolerance": loss_tolerance(fixes)}
        )
    return rows, curves


if __name__ == "__main__":  # the slow training script, for profilers: python -m ... --steps 30
    import argparse

    parser = argparse.ArgumentParser(description="Train the profiling case study's slow loop.")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--fix", nargs="*", default=[], choices=FIXES + ALTERNATIVES, help="fixes to switch on"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    losses = train_with_fixes(
        Fixes(**dict.fromkeys(args.fix, True)),
        args.steps,
        CaseStudyConfig.for_device(args.device),
        args.device,
    )
    print(f"{args.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
