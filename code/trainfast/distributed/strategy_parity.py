"""Train one small model with each of our strategies and with one process, side by side.

The model is small but has every awkward case a wrapper must handle: an embedding whose weight
is tied to the output head (one parameter, used twice), a LayerNorm (1-D parameters), a frozen
layer (``requires_grad=False``) and a layer the forward pass never calls (its parameters get no
gradient). :func:`strategy_worker` trains it on this rank's slice of each batch with
:class:`~trainfast.distributed.ddp.DDP`, :class:`~trainfast.distributed.fsdp.FSDP`,
:class:`~trainfast.distributed.zero.ZeroOptimizer` or
:class:`~trainfast.distributed.zero.Zero2Optimizer`; :func:`train_reference` trains it in one
process on whole batches. The tests and the chapter compare the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainfast.distributed.data_parallel import average_gradients, broadcast_parameters

__all__ = [
    "PARITY_STRATEGIES",
    "StrategyConfig",
    "StrategyResult",
    "TiedModel",
    "strategy_worker",
    "train_reference",
    "zero_resume_worker",
]

#: The strategies :func:`strategy_worker` knows.
PARITY_STRATEGIES = ("ddp", "fsdp", "zero1", "zero2")


@dataclass(frozen=True)
class StrategyConfig:
    """A few steps of next-token prediction on random tokens."""

    steps: int = 4
    batch_size: int = 24  # divisible by 1, 2, 3 and 4 ranks
    seq_len: int = 6
    vocab: int = 23
    width: int = 10
    optimizer: str = "adamw"  # or "sgd"
    lr: float = 0.02
    bucket_size_mb: float | None = None  # DDP only
    compute_dtype: torch.dtype | None = None  # FSDP only
    seed: int = 0

    def __post_init__(self) -> None:
        if self.optimizer not in ("sgd", "adamw"):
            raise ValueError(f"Unknown optimizer: {self.optimizer!r} (expected 'sgd' or 'adamw')")


class TiedModel(nn.Module):
    """Embedding -> LayerNorm -> Linear -> ReLU -> frozen Linear -> head tied to the embedding."""

    def __init__(self, config: StrategyConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(config.vocab, config.width)
        self.norm = nn.LayerNorm(config.width)
        self.hidden = nn.Linear(config.width, config.width)
        self.frozen = nn.Linear(config.width, config.width)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(config.width, config.width)  # never called: no gradient
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter, two uses

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(tokens))  # (batch, seq, width)
        x = self.frozen(torch.relu(self.hidden(x)))
        return self.head(x)  # (batch, seq, vocab)


@dataclass
class StrategyResult:
    """The loss of every step (this rank's, or the whole batch's) and the final parameters."""

    losses: list[float]
    parameters: dict[str, torch.Tensor]


def _batches(config: StrategyConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(config.seed + 1)
    shape = (config.batch_size, config.seq_len)
    return [
        (
            torch.randint(config.vocab, shape, generator=generator),
            torch.randint(config.vocab, shape, generator=generator),
        )
        for _ in range(config.steps)
    ]


def _optimizer(params, config: StrategyConfig) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01)


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def train_reference(config: StrategyConfig) -> StrategyResult:
    """One process, whole batches, a plain torch optimizer."""
    torch.manual_seed(config.seed)
    model = TiedModel(config)
    optimizer = _optimizer(model.parameters(), config)
    losses = []
    for tokens, targets in _batches(config):
        loss = _loss(model(tokens), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return StrategyResult(losses, {k: v.detach().clone() for k, v in model.named_parameters()})


def strategy_worker(
    rank: int, world_size: int, strategy: str, config: StrategyConfig
) -> StrategyResult:
    """Train on this rank's slice of every batch with ``strategy``; return the full parameters.

    Each rank initialises differently (seed + rank): the wrappers' broadcast must fix that.
    """
    from trainfast.distributed.ddp import DDP
    from trainfast.distributed.fsdp import FSDP
    from trainfast.distributed.zero import Zero2Optimizer, ZeroOptimizer

    if strategy not in PARITY_STRATEGIES:
        raise ValueError(f"Unknown strategy: {strategy!r} (expected one of {PARITY_STRATEGIES})")
    if config.batch_size % world_size:
        raise ValueError(f"Invalid batch_size: {config.batch_size} for world_size {world_size}")
    torch.manual_seed(config.seed + rank)
    model = TiedModel(config)
    cls = torch.optim.SGD if config.optimizer == "sgd" else torch.optim.AdamW
    hyper = (
        {"lr": config.lr} if config.optimizer == "sgd" else {"lr": config.lr, "weight_decay": 0.01}
    )
    if strategy == "ddp":
        model = DDP(model, bucket_size_mb=config.bucket_size_mb)
        optimizer = _optimizer(model.parameters(), config)
    elif strategy == "fsdp":
        model = FSDP(model, compute_dtype=config.compute_dtype)
        optimizer = _optimizer(model.parameters(), config)
    else:
        broadcast_parameters(model, src=0)
        zero = ZeroOptimizer if strategy == "zero1" else Zero2Optimizer
        optimizer = zero(model.parameters(), cls, **hyper)
    per_rank = config.batch_size // world_size
    losses = []
    for tokens, targets in _batches(config):
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        loss = _loss(model(tokens[mine]), targets[mine])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if strategy in ("ddp", "fsdp"):
            model.finish_gradient_synchronization()
        elif strategy == "zero1":
            average_gradients(model)
        optimizer.step()
        reported = loss.detach().reshape(1)
        dist.all_reduce(reported)
        losses.append(reported.item() / world_size)
    if strategy == "fsdp":
        parameters = model.full_state_dict()
    else:
        inner = model.module if strategy == "ddp" else model
        parameters = {k: v.detach().clone() for k, v in inner.named_parameters()}
    return StrategyResult(losses, parameters)


def zero_resume_worker(
    rank: int, world_size: int, strategy: str, config: StrategyConfig, stop_after: int
) -> StrategyResult:
    """ZeRO-1 or ZeRO-2 through a checkpoint: train ``stop_after`` steps, save this rank's
    optimizer shard, build a fresh model and optimizer, load, and train the remaining steps.

    The optimizer is built from a first parameter group plus ``add_param_group`` for the rest,
    so the same run also checks that a group added later trains like one given at once.
    """
    from trainfast.distributed.zero import Zero2Optimizer, ZeroOptimizer

    if strategy not in ("zero1", "zero2"):
        raise ValueError(f"Unknown strategy: {strategy!r} (expected 'zero1' or 'zero2')")
    zero = ZeroOptimizer if strategy == "zero1" else Zero2Optimizer
    hyper = {"lr": config.lr, "weight_decay": 0.01}

    def build(seed: int) -> tuple[TiedModel, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        model = TiedModel(config)
        broadcast_parameters(model, src=0)
        params = list(model.parameters())
        optimizer = zero(params[:2], torch.optim.AdamW, **hyper)
        optimizer.add_param_group({"params": params[2:]})
        return model, optimizer

    model, optimizer = build(config.seed + rank)
    per_rank = config.batch_size // world_size
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    losses = []
    for step, (tokens, targets) in enumerate(_batches(config)):
        if step == stop_after:
            saved_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
            saved_optimizer = optimizer.state_dict()
            model, optimizer = build(config.seed + 100 + rank)  # fresh, different parameters
            model.load_state_dict(saved_model)
            optimizer.load_state_dict(saved_optimizer)
        loss = _loss(model(tokens[mine]), targets[mine])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if strategy == "zero1":
            average_gradients(model)
        optimizer.step()
        losses.append(loss.item())
    return StrategyResult(losses, {k: v.detach().clone() for k, v in model.named_parameters()})
