"""Train one configuration until its validation loss first reaches a target, and time it.

A :class:`SpeedrunConfig` is frozen and names every technique a run uses (the model's choices
live in its :class:`~trainfast.transformer.TransformerShape`; the optimizer, schedule,
precision, attention path and compilation here). :func:`run_to_target` trains it on the
training stream, evaluates the loss on a fixed slice of the held-out validation split every
``eval_every`` steps, and stops the first time that loss is at or below the target. The clock
runs during training only: evaluation is timed apart and reported, as the NanoGPT speedrun
(KellerJordan/modded-nanogpt) does. Unlike that speedrun, which warms up (and compiles) before
it starts the clock, compilation here is on the clock: with ``compile=True`` the first steps'
compile time is part of the time to target, which is what a reader's own run would pay. A
configuration that has not reached the target after ``max_steps`` stops there and says so.
:func:`compare` says whether one configuration's times beat another's by more than their
spread (the book's rank-sum test).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from trainfast.device import pick_device
from trainfast.distributed.ddp import DDP
from trainfast.optim import AdamW
from trainfast.optim.muon import Muon, muon_param_groups
from trainfast.speedrun.data import PreparedData, TokenStream
from trainfast.timing import rank_sum_test, timestamp
from trainfast.training.schedules import cosine_with_warmup, wsd
from trainfast.transformer import Attention, Transformer, TransformerShape
from trainfast.validation import check_positive

__all__ = ["Comparison", "RunResult", "SpeedrunConfig", "Target", "compare", "run_to_target"]

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("constant", "cosine", "wsd")
PRECISIONS = ("fp32", "bf16")


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
        for name in ("compile", "zero_init_projections"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Invalid {name}: {getattr(self, name)!r} (expected a bool)")
        if self.grad_clip is not None:
            _check_number("grad_clip", self.grad_clip, 0.0)
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
    """When a run is done: the validation loss first at or below ``loss``, evaluated every
    ``eval_every`` steps on the first ``eval_tokens`` tokens of the validation split; or
    ``max_steps``, whichever comes first."""

    loss: float
    eval_every: int = 25
    eval_tokens: int = 16_384
    max_steps: int = 2_000

    def __post_init__(self) -> None:
        _check_number("loss", self.loss, 0.0)
        for name in ("eval_every", "eval_tokens", "max_steps"):
            check_positive(name, getattr(self, name))


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
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss)
    message: str = ""


def _optimizer(config: SpeedrunConfig, model: Transformer) -> torch.optim.Optimizer:
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
        )
    for group in groups:
        group.pop("use_muon", None)
    return AdamW(groups, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)


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


def run_to_target(
    config: SpeedrunConfig,
    data: PreparedData,
    target: Target,
    *,
    seed: int = 0,
    device: torch.device | str | None = None,
    progress: Callable[[str], None] | None = print,
    split: str = "validation",
) -> RunResult:
    """Train ``config`` from seed ``seed`` until the validation loss reaches ``target``.

    Every seed trains on the same token stream from its start (so seeds differ in their
    initialisation only) and is evaluated on the same validation windows. ``progress`` gets
    one line per evaluation: the loss against the target and the training tokens per second.
    ``split="tune"`` evaluates on the tuning split instead, for choosing a setting without
    looking at the validation split that records are judged on.

    With ``config.data_parallel`` > 1 it starts that many processes
    (:func:`trainfast.distributed.spawn`: gloo or NCCL, one thread each) and returns rank 0's
    result;
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
            backend=backend,
            pin_cores=True,  # one core per rank: fewer migrations, steadier times
        )
        return run[0]
    if ranks > 1:
        from trainfast.distributed.launch import rank_device

        device = rank_device()  # its own GPU under NCCL, else the CPU
    shape = config.shape
    seq = shape.seq_len
    validation = np.asarray(data.tokens_of(split)[: target.eval_tokens + 1], np.int64)
    n_windows = (len(validation) - 1) // seq
    if n_windows < 1:
        raise ValueError(
            f"Invalid eval_tokens: {target.eval_tokens} (fewer than one window of {seq} tokens "
            f"in the {split} split of {len(data.tokens_of(split))} tokens)"
        )
    starts = torch.arange(n_windows) * seq
    windows = torch.from_numpy(validation)[starts[:, None] + torch.arange(seq + 1)].to(device)
    torch.manual_seed(seed)
    model = Transformer(
        shape, attention=config.attention, zero_init_projections=config.zero_init_projections
    ).to(device)
    ddp = DDP(model, bucket_cap_mb=1.0) if ranks > 1 else None  # broadcasts rank 0's weights
    optimizer = _optimizer(config, model)
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    step_fn = model.loss
    if config.compile:
        step_fn = torch.compile(model.loss)
    stream = TokenStream(data.tokens_of("train"), shape.batch_size, seq)
    result = RunResult(config.name, seed, False, 0.0, 0.0, 0, 0, math.nan)
    for step in range(target.max_steps):
        factor = config.lr_factor(step)
        for group, lr in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = lr * factor
        inputs, targets = (
            t.chunk(ranks)[rank].to(device, non_blocking=True) for t in stream.next_batch()
        )
        start = timestamp(device)
        with _autocast(config, device):
            loss = step_fn(inputs, targets)
        loss.backward()
        if ddp is not None:
            ddp.finish_gradient_synchronization()
        if config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        result.train_seconds += timestamp(device) - start
        result.steps, result.tokens = step + 1, stream.used
        if (step + 1) % target.eval_every and step + 1 != target.max_steps:
            continue
        start = timestamp(device)
        val = _validation_loss(model, windows, shape.batch_size, config, rank, ranks)
        result.eval_seconds += timestamp(device) - start
        result.final_loss = val
        result.history.append((step + 1, val))
        if progress is not None:
            rate = result.tokens / result.train_seconds
            progress(
                f"{config.name} seed {seed}: step {step + 1}, validation loss {val:.4f} "
                f"(target {target.loss}), {rate:,.0f} training tokens/s"
            )
        if not math.isfinite(val):
            result.message = f"{config.name} diverged: validation loss {val} at step {step + 1}"
            break
        if val <= target.loss:
            result.reached = True
            return result
    if not result.message:
        result.message = (
            f"{config.name} did not reach the target {target.loss} in {result.steps} steps "
            f"(last validation loss {result.final_loss:.4f}): raise max_steps or change it"
        )
    if progress is not None:
        progress(result.message)
    return result


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


def _rank_main(rank, ranks, config, data, target, seed, split, verbose) -> RunResult:
    """One rank of a data-parallel run (started by :func:`run_to_target`)."""
    progress = functools.partial(print, flush=True) if verbose and rank == 0 else None
    return run_to_target(config, data, target, seed=seed, progress=progress, split=split)


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
