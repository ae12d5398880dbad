"""Train one small model with each of our strategies and with one process, side by side.

The model is small but has every awkward case a wrapper must handle: an embedding whose weight
is tied to the output head (one parameter, used twice), a LayerNorm (1-D parameters), a frozen
layer (``requires_grad=False``) and a layer the forward pass never calls (its parameters get no
gradient). :func:`strategy_worker` trains it on this rank's slice of each batch with a
:class:`~trainfast.distributed.strategy.Strategy` (DDP, ZeRO-1, ZeRO-2 or our FSDP) through
:func:`~trainfast.distributed.strategy.train_with_strategy`; :func:`train_reference` trains it
in one process on whole batches. The tests and the chapter compare the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainfast.distributed.data_parallel import broadcast_parameters
from trainfast.distributed.launch import rank_device
from trainfast.distributed.strategy import (
    OptimizerConfig,
    Strategy,
    StrategyResult,
    Zero1Strategy,
    make_strategy,
    train_with_strategy,
)

__all__ = [
    "StrategyConfig",
    "TiedModel",
    "strategy_worker",
    "train_reference",
    "zero_owners_worker",
    "zero_resume_worker",
]


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
    seed: int = 0

    def __post_init__(self) -> None:
        if self.optimizer not in ("sgd", "adamw"):
            raise ValueError(f"Unknown optimizer: {self.optimizer!r} (expected 'sgd' or 'adamw')")

    @property
    def optimizer_config(self) -> OptimizerConfig:
        """The optimizer every run builds (through the package's one factory)."""
        return OptimizerConfig(self.optimizer, self.lr)


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


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def train_reference(config: StrategyConfig) -> StrategyResult:
    """One process, whole batches, a plain torch optimizer."""
    torch.manual_seed(config.seed)
    model = TiedModel(config)
    optimizer = config.optimizer_config.build(model.parameters())
    losses = []
    for tokens, targets in _batches(config):
        loss = _loss(model(tokens), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return StrategyResult(losses, {k: v.detach().clone() for k, v in model.named_parameters()})


def strategy_worker(
    rank: int,
    world_size: int,
    strategy: Strategy | str,
    config: StrategyConfig,
    micro_batches: int = 1,
    no_sync: bool = False,
) -> StrategyResult:
    """Train on this rank's slice of every batch with ``strategy``; return the full parameters.

    ``strategy`` is a :class:`~trainfast.distributed.strategy.Strategy` (with its options, e.g.
    ``DDPStrategy(bucket_cap_mb=1e-3)``, or torch's ``TorchDDP()``) or its name. Each rank
    initialises differently (seed + rank): the strategy's broadcast must fix that.
    ``micro_batches`` and ``no_sync``: gradient accumulation over equal micro-batches of the
    rank's slice (:func:`~trainfast.distributed.training_loop.train_with_strategy`).
    """
    strategy = make_strategy(strategy)
    if config.batch_size % world_size:
        raise ValueError(f"Invalid batch_size: {config.batch_size} for world_size {world_size}")
    torch.manual_seed(config.seed + rank)
    per_rank = config.batch_size // world_size
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    batches = [(tokens[mine], targets[mine]) for tokens, targets in _batches(config)]
    return train_with_strategy(
        TiedModel(config),
        strategy,
        config.optimizer_config,
        batches,
        _loss,
        micro_batches=micro_batches,
        no_sync=no_sync,
    )


def zero_resume_worker(
    rank: int, world_size: int, strategy: str, config: StrategyConfig, stop_after: int
) -> StrategyResult:
    """ZeRO-1 or ZeRO-2 through a checkpoint: train ``stop_after`` steps, save this rank's
    optimizer shard, build a fresh model and optimizer, load, and train the remaining steps.

    The optimizer is built from a first parameter group plus ``add_param_group`` for the rest,
    so the same run also checks that a group added later trains like one given at once.
    """
    zero = make_strategy(strategy)
    if not isinstance(zero, Zero1Strategy):  # ZeRO-2's strategy is a ZeRO-1 strategy too
        raise ValueError(f"Unknown strategy: {strategy!r} (expected 'zero1' or 'zero2')")

    device = rank_device()  # NCCL moves only CUDA tensors

    def build(seed: int) -> tuple[TiedModel, torch.optim.Optimizer]:
        torch.manual_seed(seed)
        model = TiedModel(config).to(device)
        broadcast_parameters(model, src=0)
        params = list(model.parameters())
        optimizer = zero.make_optimizer(params[:2], config.optimizer_config)
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
        loss = _loss(model(tokens[mine].to(device)), targets[mine].to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        zero.finish_gradient_synchronization(model)
        optimizer.step()
        losses.append(loss.item())
    return StrategyResult(losses, zero.full_parameters(model))


def zero_owners_worker(rank: int, world_size: int, numels: list[list[int]]) -> dict[str, list]:
    """Which rank owns each parameter under our ``ZeroOptimizer`` and under torch's
    ``ZeroRedundancyOptimizer``, for parameter groups of 1-D tensors of ``numels`` elements."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from trainfast.distributed.zero import ZeroOptimizer

    groups = [[nn.Parameter(torch.zeros(n)) for n in group] for group in numels]
    ours = ZeroOptimizer([{"params": g} for g in groups], torch.optim.SGD, lr=0.1)
    theirs = ZeroRedundancyOptimizer(groups[0], torch.optim.SGD, lr=0.1)
    for group in groups[1:]:
        theirs.add_param_group({"params": group})
    partition = theirs._partition_parameters()  # per rank, its share of every group
    torch_owner = {
        id(p): r for r, per_rank in enumerate(partition) for g in per_rank for p in g["params"]
    }
    flat = [p for g in groups for p in g]
    return {
        "ours": [ours.owner[p] for p in flat],
        "torch": [torch_owner[id(p)] for p in flat],
    }
