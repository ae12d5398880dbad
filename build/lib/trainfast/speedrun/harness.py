"""Train one configuration until its held-out loss first reaches a target, and time it.

A :class:`SpeedrunConfig` is frozen and names every technique a run uses (the model's choices
live in its :class:`~trainfast.transformer.TransformerShape`; the optimizer, schedule,
precision, attention path, compilation, threads, batch order and the step's bookkeeping here).
:func:`run_to_target` trains it, evaluates the loss on windows spread over a held-out split
every ``eval_every`` steps, and stops the first time that loss is at or below the target. The
clock runs during training only, and a training step on it runs from fetching its batch to the
optimizer's update: evaluation is timed apart and reported, as the NanoGPT speedrun
(KellerJordan/modded-nanogpt) does, whose clock includes its data loader too. Unlike that
speedrun, which warms up (and compiles) before it starts the clock, compilation here is on the
clock: with ``compile=True`` a run pays whatever compiling its step still costs in this
process. The first compiled run in a process traces and generates code (minutes on a 2-core
CPU; the on-disk cache saves the code generation for a later process); later runs of the same
configuration in that process reuse the compiled graph, for a fresh model too, and pay almost
nothing (checked: one graph for twelve fresh models). A study therefore warms each compiled
entry up once, untimed (:mod:`trainfast.speedrun.study`), and says so; a data-parallel run's
ranks are fresh processes and compile again, on their clock. A configuration that has not
reached the target after ``max_steps`` stops there and says so. A run can be checkpointed and
resumed exactly (:mod:`trainfast.speedrun.checkpoint`). :func:`compare` says whether one
configuration's times beat another's by more than their spread (the book's rank-sum test).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from trainfast.device import pick_device
from trainfast.distributed.ddp import DDP
from trainfast.optim import AdamW
from trainfast.optim.muon import Muon, muon_param_groups
from trainfast.speedrun.checkpoint import Checkpointing, load_run, save_run
from trainfast.speedrun.data import BATCH_ORDERS, PreparedData, batches, evaluation_windows
from trainfast.timing import rank_sum_test, timestamp
from trainfast.training.schedules import cosine_with_warmup, wsd
from trainfast.transformer import Attention, Transformer, TransformerShape
from trainfast.validation import check_positive

__all__ = [
    "Comparison",
    "RunResult",
    "SpeedrunConfig",
    "Target",
    "compare",
    "default_threads",
    "make_optimizer",
    "run_to_target",
]

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("constant", "cosine", "wsd")
PRECISIONS = ("fp32", "bf16")
#: PyTorch's thread count when this module was first imported: its default for this machine
#: (the physical cores, or OMP_NUM_THREADS), unless the process changed it before.
_TORCH_DEFAULT_THREADS = torch.get_num_threads()


def default_threads() -> int:
    """The intra-op threads a run with ``threads=None`` uses: PyTorch's default here."""
    return _TORCH_DEFAULT_THREADS


def _check_number(name: str, value: object, low: float, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"Invalid {name}: {value!r} (expected a number)")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"Invalid {name}: {value!r} (expected {low} <= {name} <= {high})")


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"Invalid {name}: {value!r} (expected one of {allowed})")


@dataclass(frozen=True)
class SpeedrunConfig:
    """Everything one speedrun entry does. ``shape.batch_size`` sequences per step.

    ``lr`` is AdamW's (for the AdamW groups under Muon); ``embedding_lr`` AdamW's for the token
    embedding's matrix (with a tied head, the head's too; None: ``lr``); ``muon_lr`` Muon's, in
    its own units (spectral norm per update), not comparable to AdamW's; ``muon_ns_dtype`` the
    format of its Newton–Schulz iteration. ``data_parallel`` processes (gloo on a CPU, one core
    and one thread each; NCCL on GPUs, one GPU each) each take ``shape.batch_size /
    data_parallel`` of a step's sequences, and the book's
    :class:`~trainfast.distributed.ddp.DDP` averages their gradients, bucketed and overlapped
    with the backward pass: the same tokens and the same update as one process, up to the order
    of additions. The schedule is a linear warmup of ``warmup_steps``, then constant, a cosine
    to 0 over ``schedule_steps``, or WSD (constant, then a linear decay over the last
    ``decay_fraction`` of ``schedule_steps``).

    The step's systems settings, none of which changes the arithmetic beyond its rounding:
    ``threads`` the intra-op threads of each process (None: PyTorch's default,
    :func:`default_threads`, split among the data-parallel processes); ``foreach`` the
    optimizers' multi-tensor path (``torch._foreach_*``) instead of a loop over parameters;
    ``prefetch`` fetches the next batch in a background thread while the step runs, taking data
    loading off the critical path; ``sync_each_step`` times every step apart, with a wait for the
    device before and after it (False: one wait per evaluation, so a GPU's queue never drains
    between steps; on a CPU there is nothing to wait for). ``batch_order`` is where the batches
    come from: ``"stream"`` the non-repeating shuffled stream, ``"random"`` random windows of the
    memmap, as nanoGPT's ``get_batch`` (:mod:`trainfast.speedrun.data`).
    """

    name: str
    shape: TransformerShape
    optimizer: Literal["adamw", "muon"] = "adamw"
    lr: float = 1e-3
    embedding_lr: float | None = None
    muon_lr: float = 0.02
    muon_ns_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    schedule: Literal["constant", "cosine", "wsd"] = "constant"
    warmup_steps: int = 0
    schedule_steps: int = 1_000
    decay_fraction: float = 0.2
    precision: Literal["fp32", "bf16"] = "fp32"
    attention: Attention = "manual"
    compile: bool = False
    zero_init_projections: bool = False
    grad_clip: float | None = None
    data_parallel: int = 1
    threads: int | None = None
    foreach: bool = False
    prefetch: bool = False
    sync_each_step: bool = True
    batch_order: Literal["stream", "random"] = "stream"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Invalid name: {self.name!r} (expected a non-empty string)")
        if not isinstance(self.shape, TransformerShape):
            raise ValueError(f"Invalid shape: {self.shape!r} (expected a TransformerShape)")
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("muon_ns_dtype", self.muon_ns_dtype, ("bfloat16", "float32"))
        _check_choice("schedule", self.schedule, SCHEDULES)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("attention", self.attention, ("manual", "sdpa"))
        for name in ("lr", "muon_lr", "embedding_lr"):
            if name == "embedding_lr" and self.embedding_lr is None:
                continue
            _check_number(name, getattr(self, name), 0.0)
            if getattr(self, name) == 0:
                raise ValueError(f"Invalid {name}: 0 (expected > 0)")
        _check_number("weight_decay", self.weight_decay, 0.0)
        _check_number("decay_fraction", self.decay_fraction, 0.0, 1.0)
        if len(self.betas) != 2:
            raise ValueError(f"Invalid betas: {self.betas!r} (expected two numbers)")
        for beta in self.betas:
            _check_number("betas", beta, 0.0, 0.999999)
        for name in ("warmup_steps", "schedule_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Invalid {name}: {value!r} (expected an int >= 0)")
        if self.schedule != "constant" and self.warmup_steps > self.schedule_steps:
            raise ValueError(
                f"Invalid warmup_steps: {self.warmup_steps} (more than schedule_steps = "
                f"{self.schedule_steps})"
            )
        _check_choice("batch_order", self.batch_order, BATCH_ORDERS)
        for name in ("compile", "zero_init_projections", "foreach", "prefetch", "sync_each_step"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Invalid {name}: {getattr(self, name)!r} (expected a bool)")
        if self.grad_clip is not None:
            _check_number("grad_clip", self.grad_clip, 0.0)
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ValueError(f"Invalid threads: {self.threads!r} (expected None or an int >= 1)")
        ranks = self.data_parallel
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise ValueError(f"Invalid data_parallel: {ranks!r} (expected an int >= 1)")
        if self.shape.batch_size % ranks:
            raise ValueError(
                f"Invalid data_parallel: {ranks} (the batch of {self.shape.batch_size} "
                "sequences does not divide among that many processes)"
            )

    def lr_factor(self, step: int) -> float:
        """The schedule's multiplier of every group's learning rate at ``step`` (0-based)."""
        if self.schedule == "constant":
            return min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        if self.schedule == "cosine":
            return cosine_with_warmup(
                step + 1,
                max_lr=1.0,
                min_lr=0.0,
                warmup_iters=self.warmup_steps,
                cosine_cycle_iters=self.schedule_steps,
            )
        decay = round(self.decay_fraction * self.schedule_steps)
        stable = max(0, self.schedule_steps - self.warmup_steps - decay)
        return wsd(
            step + 1,
            max_lr=1.0,
            min_lr=0.0,
            warmup_iters=self.warmup_steps,
            stable_iters=stable,
            decay_iters=decay,
        )


@dataclass(frozen=True)
class Target:
    """When a run is done: the held-out loss first at or below ``loss``, evaluated every
    ``eval_every`` steps on ``eval_tokens`` tokens in windows spread over the whole split
    (:func:`~trainfast.speedrun.data.evaluation_windows`); or ``max_steps``, whichever comes
    first. Once an evaluation is within ``dense_within`` nats of the target, every step is
    evaluated, so the step at which a run reaches the target is known to one step, not to
    ``eval_every`` (0: never; the evaluations are off the clock, but not free)."""

    loss: float
    eval_every: int = 25
    eval_tokens: int = 16_384
    max_steps: int = 2_000
    dense_within: float = 0.0

    def __post_init__(self) -> None:
        _check_number("loss", self.loss, 0.0)
        _check_number("dense_within", self.dense_within, 0.0)
        for name in ("eval_every", "eval_tokens", "max_steps"):
            check_positive(name, getattr(self, name))

    def evaluates_after(self, steps_done: int, last_loss: float | None) -> bool:
        """Whether a run evaluates after ``steps_done`` steps, its last evaluation at
        ``last_loss`` (None before the first)."""
        if steps_done % self.eval_every == 0 or steps_done == self.max_steps:
            return True
        return last_loss is not None and last_loss - self.loss <= self.dense_within


@dataclass
class RunResult:
    """One run: whether and when it reached the target."""

    config: str
    seed: int
    reached: bool
    train_seconds: float  # the clock of the speedrun: training only
    eval_seconds: float
    steps: int
    tokens: int
    final_loss: float
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out loss)
    message: str = ""
    split: str = "validation"
    threads: int = 0  # intra-op threads of (each) process
    stopped: bool = False  # stopped by a checkpoint's stop_after, to be resumed

    @property
    def tokens_per_second(self) -> float:
        """Training tokens per second of the training clock."""
        return self.tokens / self.train_seconds if self.train_seconds > 0 else math.nan


def make_optimizer(config: SpeedrunConfig, model: Transformer) -> torch.optim.Optimizer:
    """The optimizer a run of ``config`` trains ``model`` with: AdamW, or Muon on the hidden
    matrices with AdamW for the rest, the token embedding in a group of its own where
    ``config.embedding_lr`` is set (the harness's, and
    :mod:`~trainfast.speedrun.step_profile`'s)."""
    embedding = model.token_embedding.weight
    if config.optimizer == "muon":  # the hidden matrices; embeddings, head, gains on AdamW
        groups = muon_param_groups(model, output_layer=model.lm_head)
    else:
        groups = [{"params": list(model.parameters())}]
    if config.embedding_lr is not None:  # the embedding in a group of its own
        for group in groups:
            group["params"] = [p for p in group["params"] if p is not embedding]
        groups.append({"params": [embedding], "lr": config.embedding_lr, "use_muon": False})
    if config.optimizer == "muon":
        return Muon(
            groups,
            lr=config.muon_lr,
            weight_decay=config.weight_decay,
            adamw_lr=config.lr,
            adamw_betas=config.betas,
            adamw_weight_decay=config.weight_decay,
            ns_dtype=getattr(torch, config.muon_ns_dtype),
            foreach=config.foreach,
        )
    for group in groups:
        group.pop("use_muon", None)
    return AdamW(
        groups,
        lr=config.lr,
        betas=config.betas,
        weight_decay=config.weight_decay,
        foreach=config.foreach,
    )


@torch.no_grad()
def _validation_loss(
    model, windows: torch.Tensor, batch: int, config: SpeedrunConfig, rank: int, ranks: int
) -> float:
    """The mean loss over ``windows``; with several ranks each takes every ``ranks``-th
    window and the sums are all-reduced, so every rank gets the same number."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=windows.device)  # (loss sum, windows)
    mine = windows[rank::ranks]
    for start in range(0, len(mine), batch):
        chunk = mine[start : start + batch]  # (batch, seq + 1)
        with _autocast(config, chunk.device):
            total[0] += float(model.loss(chunk[:, :-1], chunk[:, 1:])) * len(chunk)
        total[1] += len(chunk)
    if ranks > 1:
        torch.distributed.all_reduce(total)
    model.train()
    return float(total[0] / total[1])


def _autocast(config: SpeedrunConfig, device: torch.device):
    enabled = config.precision == "bf16"
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


class _Prefetched:
    """A batch source whose next batch is fetched in a background thread during the step.

    ``state_dict`` is the source's state after the batches handed out so far (not after the
    one being fetched), so a checkpoint resumes at the right batch; ``used`` likewise."""

    def __init__(self, source) -> None:
        self.source = source
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speedrun-batches")
        self._ahead()

    def _ahead(self) -> None:
        self.state, self.used = self.source.state_dict(), self.source.used
        self.pending = self.pool.submit(self.source.next_batch)

    def next_batch(self):
        batch = self.pending.result()  # raises here if the source ran out
        self._ahead()
        return batch

    def state_dict(self):
        return self.state

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def run_to_target(
    config: SpeedrunConfig,
    data: PreparedData,
    target: Target,
    *,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: Callable[[str], None] | None = print,
    split: str = "validation",
    checkpoint: Checkpointing | None = None,
    resume: str | Path | None = None,
) -> RunResult:
    """Train ``config`` from seed ``seed`` until the held-out loss reaches ``target``.

    The seed fixes both the initialisation (``torch.manual_seed``) and the order of the batches
    (the batch source's own generator), so two seeds differ in both; every seed is evaluated on
    the same windows of ``split``: ``"validation"``, which records are judged on, or
    ``"tune"``, for choosing a setting without looking at the validation split. ``progress``
    gets one line per evaluation: the loss against the target and the training tokens per
    second. ``checkpoint`` saves the run's whole state every ``checkpoint.every`` steps (and
    can stop it after a step, as a time limit would); ``resume`` continues a saved run exactly
    where it stopped (:mod:`trainfast.speedrun.checkpoint`).

    With ``config.data_parallel`` > 1 it starts that many processes
    (:func:`trainfast.distributed.spawn`: gloo or NCCL) and returns rank 0's result;
    the start-up is off the clock, and rank 0 prints the progress lines (to the terminal,
    not to a notebook cell). Inside a process group of that size it runs as one of the ranks.
    """
    if not isinstance(config, SpeedrunConfig):
        raise ValueError(f"Invalid config: {config!r} (expected a SpeedrunConfig)")
    if split not in ("validation", "tune"):
        raise ValueError(f"Invalid split: {split!r} (expected 'validation' or 'tune')")
    if config.shape.vocab_size < data.vocab_size:
        raise ValueError(
            f"Invalid vocab_size: {config.shape.vocab_size} (the data's tokenizer has "
            f"{data.vocab_size} tokens)"
        )
    if checkpoint is not None and not isinstance(checkpoint, Checkpointing):
        raise ValueError(f"Invalid checkpoint: {checkpoint!r} (expected a Checkpointing)")
    device = device if isinstance(device, torch.device) else pick_device(device)
    rank, ranks = _rank_of(config)
    if ranks == 0:  # not inside the process group yet: start it, one rank per process
        from trainfast.distributed.launch import spawn

        if device.type == "cuda" and torch.cuda.device_count() < config.data_parallel:
            raise ValueError(
                f"Invalid data_parallel: {config.data_parallel} (one process per GPU, and this "
                f"machine has {torch.cuda.device_count()})"
            )
        verbose, backend = progress is not None, "nccl" if device.type == "cuda" else "gloo"
        run = spawn(
            _rank_main,
            config.data_parallel,
            config,
            data,
            target,
            seed,
            split,
            verbose,
            checkpoint,
            resume,
            backend=backend,
            threads_per_rank=_threads_of(config),
            pin_cores=True,  # one core per rank: fewer migrations, steadier times
        )
        return run[0]
    if ranks > 1:
        from trainfast.distributed.launch import rank_device

        device = rank_device()  # its own GPU under NCCL, else the CPU
    threads_before = torch.get_num_threads()
    torch.set_num_threads(_threads_of(config))
    try:
        return _train(config, data, target, seed, device, progress, split, checkpoint, resume)
    finally:
        torch.set_num_threads(threads_before)


def _threads_of(config: SpeedrunConfig) -> int:
    if config.threads is not None:
        return config.threads
    return max(1, default_threads() // config.data_parallel)


@dataclass
class _Run:
    """What one rank's training loop works on (built by :func:`_train`)."""

    model: Transformer
    ddp: DDP | None
    optimizer: torch.optim.Optimizer
    base_lrs: list[float]
    step_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    stream: object  # a batch source of trainfast.speedrun.data, or _Prefetched
    windows: torch.Tensor  # the evaluation windows, (windows, seq + 1)
    device: torch.device
    rank: int
    ranks: int


def _train(config, data, target, seed, device, progress, split, checkpoint, resume) -> RunResult:
    """:func:`run_to_target` in this process (one rank of ``config``)."""
    rank, ranks = _rank_of(config)
    shape = config.shape
    windows = evaluation_windows(data.tokens_of(split), shape.seq_len, target.eval_tokens)
    torch.manual_seed(seed)  # the initialisation; the batches have a generator of their own
    model = Transformer(
        shape, attention=config.attention, zero_init_projections=config.zero_init_projections
    ).to(device)
    ddp = DDP(model, bucket_cap_mb=1.0) if ranks > 1 else None  # broadcasts rank 0's weights
    optimizer = make_optimizer(config, model)
    source = batches(
        config.batch_order, data.tokens_of("train"), shape.batch_size, shape.seq_len, seed
    )
    result = RunResult(config.name, seed, False, 0.0, 0.0, 0, 0, math.nan, split=split)
    result.threads = torch.get_num_threads()
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    first = 0
    if resume is not None:
        first = load_run(resume, config, seed, split, model, optimizer, source, result)
    stream = _Prefetched(source) if config.prefetch else source
    step_fn = torch.compile(model.loss) if config.compile else model.loss
    run = _Run(
        model, ddp, optimizer, base_lrs, step_fn, stream, windows.to(device), device, rank, ranks
    )
    try:
        _loop(run, config, target, result, first, progress, checkpoint)
    finally:
        if config.prefetch:
            stream.close()
    return result


def _step(run: _Run, config: SpeedrunConfig, step: int) -> None:
    """One training step: the batch, forward, backward, gradients averaged, update."""
    factor = config.lr_factor(step)
    for group, lr in zip(run.optimizer.param_groups, run.base_lrs, strict=True):
        group["lr"] = lr * factor
    inputs, targets = (
        t.chunk(run.ranks)[run.rank].to(run.device, non_blocking=True)
        for t in run.stream.next_batch()
    )
    with _autocast(config, run.device):
        loss = run.step_fn(inputs, targets)
    loss.backward()
    if run.ddp is not None:
        run.ddp.finish_gradient_synchronization()
    if config.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), config.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)


def _loop(run, config, target, result, first, progress, checkpoint) -> None:
    """Steps from ``first`` until the target, the budget or a checkpoint's stop."""
    device, segment_start = run.device, timestamp(run.device)
    for step in range(first, target.max_steps):
        start = timestamp(device) if config.sync_each_step else None
        _step(run, config, step)
        if start is not None:  # else one wait per evaluation or checkpoint, below
            result.train_seconds += timestamp(device) - start
        result.steps, result.tokens = step + 1, run.stream.used
        last = result.history[-1][1] if result.history else None
        evaluate = target.evaluates_after(step + 1, last)
        save = checkpoint is not None and checkpoint.due(step + 1)
        if not (evaluate or save):
            continue
        paused = timestamp(device)  # the clock stops for evaluations and checkpoints
        if start is None:
            result.train_seconds += paused - segment_start
        if evaluate:
            val = _validation_loss(
                run.model, run.windows, config.shape.batch_size, config, run.rank, run.ranks
            )
            result.eval_seconds += timestamp(device) - paused
            result.final_loss = val
            result.history.append((step + 1, val))
            if progress is not None:
                progress(
                    f"{config.name} seed {result.seed}: step {step + 1}, {result.split} loss "
                    f"{val:.4f} (target {target.loss}), {result.tokens_per_second:,.0f} "
                    "training tokens/s"
                )
            if not math.isfinite(val):
                result.message = f"{config.name} diverged: loss {val} at step {step + 1}"
                break
            if val <= target.loss:
                result.reached = True
                return
        if save:
            if run.rank == 0:
                save_run(checkpoint.path, config, run, result, step + 1)
            if checkpoint.stop_after == step + 1:
                result.stopped = True
                result.message = f"{config.name} stopped after step {step + 1} (resumable)"
                return
        segment_start = timestamp(device)
    if not result.message:
        result.message = (
            f"{config.name} did not reach the target {target.loss} in {result.steps} steps "
            f"(last {result.split} loss {result.final_loss:.4f}): raise max_steps or change it"
        )
    if progress is not None:
        progress(result.message)


def _rank_of(config: SpeedrunConfig) -> tuple[int, int]:
    """(rank, ranks) of this process for ``config``: (0, 1) for one process, (0, 0) where the
    processes are still to be started, else the rank in the process group of that size."""
    if config.data_parallel == 1:
        return 0, 1
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return 0, 0
    rank, ranks = torch.distributed.get_rank(), torch.distributed.get_world_size()
    if ranks != config.data_parallel:
        raise ValueError(
            f"Invalid data_parallel: {config.data_parallel} (this process group has {ranks} ranks)"
        )
    return rank, ranks


def _rank_main(
    rank, ranks, config, data, target, seed, split, verbose, checkpoint, resume
) -> RunResult:
    """One rank of a data-parallel run (started by :func:`run_to_target`)."""
    progress = functools.partial(print, flush=True) if verbose and rank == 0 else None
    return run_to_target(
        config,
        data,
        target,
        seed=seed,
        progress=progress,
        split=split,
        checkpoint=checkpoint,
        resume=resume,
    )


@dataclass(frozen=True)
class Comparison:
    """``after`` against ``before``: the ratio of median times and the rank-sum verdict."""

    speedup: float  # median(before) / median(after)
    share: float  # of (before, after) pairs in which after was faster
    p_value: float
    beats_noise: bool


def compare(
    before: Sequence[RunResult], after: Sequence[RunResult], *, alpha: float = 0.05
) -> Comparison:
    """Does ``after`` reach the target faster than ``before``, beyond the noise? Runs that did
    not reach it count as infinitely slow; the verdict is Mann-Whitney's rank-sum test
    (:func:`trainfast.timing.rank_sum_test`), p <= ``alpha``, and needs ``after`` faster."""
    if not before or not after:
        raise ValueError(f"compare needs runs on both sides, got {len(before)} and {len(after)}")

    def seconds(runs: Sequence[RunResult]) -> list[float]:
        return [r.train_seconds if r.reached else math.inf for r in runs]

    b, a = seconds(before), seconds(after)
    share, p_value = rank_sum_test(b, a)
    speedup = statistics.median(b) / statistics.median(a)
    return Comparison(speedup, share, p_value, p_value <= alpha and share > 0.5)
