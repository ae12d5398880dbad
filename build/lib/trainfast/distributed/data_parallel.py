"""Data-parallel training, by hand and with ``DistributedDataParallel``, against one process.

Every rank holds the whole model and a different slice of each global batch. Three things make
``N`` ranks train exactly like one process on the global batch:

1. identical starting parameters (:func:`broadcast_parameters` from rank 0);
2. disjoint slices of the same shuffled batches (``DistributedSampler``: rank ``r`` takes every
   ``N``-th example of one shared permutation);
3. the same update everywhere: each rank's gradient of its mean loss, averaged over ranks
   (:func:`average_gradients`), is the gradient of the mean loss over the global batch.

:func:`train_data_parallel` is a :func:`~trainfast.distributed.spawn` worker with a ``wrapper``
flag: ``"manual"`` (:class:`ManualDataParallel`) does the three steps above with our ring
all-reduce, one tensor at a time; ``"ddp"`` (:class:`TorchDDP`) lets
``torch.nn.parallel.DistributedDataParallel`` do them, with gradient buckets all-reduced while
backward is still running. :func:`train_single_process` (:class:`SingleProcess`) is the
reference. All three are strategies of the one loop,
:func:`~trainfast.distributed.training_loop.train_with_strategy`.
Run it under torchrun with ``torchrun --standalone --nproc-per-node 4 -m
trainfast.distributed.data_parallel``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainfast.distributed.collectives import all_reduce, broadcast, ring_all_reduce
from trainfast.distributed.training_loop import OptimizerConfig, Strategy, train_with_strategy

__all__ = [
    "DataParallelConfig",
    "EvalCounts",
    "ManualDataParallel",
    "SingleProcess",
    "TorchDDP",
    "TrainResult",
    "average_gradients",
    "broadcast_parameters",
    "evaluate_distributed",
    "main",
    "make_model",
    "shard_batches",
    "train_data_parallel",
    "train_single_process",
]


@dataclass(frozen=True)
class DataParallelConfig:
    """A small, real training run: an MLP on scikit-learn's digits (64 pixels, 10 classes)."""

    global_batch_size: int = 96  # divisible by 1, 2, 3 and 4 ranks
    steps: int = 20
    lr: float = 0.1
    hidden: int = 64
    optimizer: str = "sgd"  # or "adamw"
    seed: int = 0
    bucket_cap_mb: float = 25.0  # DDP only: gradient bucket size

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise ValueError(f"Invalid global_batch_size: {self.global_batch_size}")
        if self.optimizer not in ("sgd", "adamw"):
            raise ValueError(f"Unknown optimizer: {self.optimizer!r} (expected 'sgd' or 'adamw')")


@dataclass
class TrainResult:
    """What a rank reports: the loss over the global batch per step, and its final parameters."""

    losses: list[float]
    parameters: dict[str, torch.Tensor]
    buckets: list[tuple[int, int]] = field(default_factory=list)  # DDP: (bucket index, numel)
    evaluation: EvalCounts | None = None  # on the test split, summed over ranks


@dataclass(frozen=True)
class EvalCounts:
    """Correct predictions and examples scored, over all ranks."""

    correct: int
    total: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.total


def make_model(config: DataParallelConfig, seed: int) -> nn.Module:
    """The MLP every strategy trains; ``seed`` fixes its initial parameters."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, config.hidden), nn.ReLU(), nn.Linear(config.hidden, 10))


def shard_batches(
    dataset: Dataset, config: DataParallelConfig, rank: int, world_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's ``global_batch_size / world_size`` examples of each of ``config.steps`` batches.

    Only whole global batches are used (the sampler pads the last one with repeats, which one
    process would not see), so the union over ranks of step ``k``'s slices is exactly the
    ``k``-th global batch of one process with the same seed.
    """
    if config.global_batch_size % world_size:
        raise ValueError(
            f"Invalid global_batch_size: {config.global_batch_size} is not divisible by "
            f"world_size {world_size}"
        )
    sampler = DistributedSampler(dataset, world_size, rank, shuffle=True, seed=config.seed)
    loader = DataLoader(dataset, batch_size=config.global_batch_size // world_size, sampler=sampler)
    per_epoch = len(dataset) // config.global_batch_size
    step, epoch = 0, 0
    while step < config.steps:
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for index, batch in enumerate(loader):
            if index == per_epoch or step == config.steps:
                break
            yield batch
            step += 1
        epoch += 1


@torch.no_grad()
def evaluate_distributed(
    model: nn.Module, dataset: Dataset, rank: int, world_size: int, batch_size: int = 256
) -> EvalCounts:
    """Accuracy over ``dataset``, each rank scoring every ``N``-th example.

    Counts, not accuracies, are summed across ranks: the mean of per-rank accuracies is wrong
    when ranks score different numbers of examples. No example is scored twice (a
    ``DistributedSampler`` would pad the last ranks with repeats).
    """
    device = next(model.parameters()).device
    loader = DataLoader(
        torch.utils.data.Subset(dataset, range(rank, len(dataset), world_size)),
        batch_size=batch_size,
    )
    correct, total = 0, 0
    for inputs, labels in loader:
        predictions = model(inputs.to(device)).argmax(dim=-1)
        correct += int((predictions == labels.to(device)).sum())
        total += labels.numel()
    counts = torch.tensor([correct, total], device=device)
    if world_size > 1:
        all_reduce(counts, op="sum")
    return EvalCounts(int(counts[0]), int(counts[1]))


def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Give every rank ``src``'s parameters (and buffers), in place."""
    for tensor in [*model.parameters(), *model.buffers()]:
        broadcast(tensor.data, src=src)


def average_gradients(model: nn.Module) -> None:
    """Replace each gradient by its mean over ranks: one ring all-reduce per parameter."""
    for parameter in model.parameters():
        if parameter.grad is not None:
            ring_all_reduce(parameter.grad, op="mean")


@dataclass(frozen=True)
class SingleProcess(Strategy):
    """One process, no communication: the reference the others must match."""

    name: ClassVar[str] = "single-process"

    def wrap(
        self, model: nn.Module, optimizer: OptimizerConfig
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, optimizer.build(model.parameters())


@dataclass(frozen=True)
class ManualDataParallel(Strategy):
    """Data parallelism by hand: broadcast rank 0's parameters, then after every backward
    average each gradient with our ring all-reduce (:func:`average_gradients`)."""

    name: ClassVar[str] = "manual"

    def wrap(
        self, model: nn.Module, optimizer: OptimizerConfig
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        broadcast_parameters(model, src=0)
        return model, optimizer.build(model.parameters())

    def finish_gradient_synchronization(self, model: nn.Module) -> None:
        average_gradients(model)


@dataclass(frozen=True)
class TorchDDP(Strategy):
    """``torch.nn.parallel.DistributedDataParallel``: its constructor broadcasts, its hooks
    all-reduce gradient buckets during backward; ``buckets`` records each (index, numel)."""

    name: ClassVar[str] = "torch-ddp"
    bucket_cap_mb: float = 25.0
    find_unused_parameters: bool = False  # True for a model with parameters forward skips
    buckets: list[tuple[int, int]] = field(default_factory=list, compare=False)

    def wrap(
        self, model: nn.Module, optimizer: OptimizerConfig
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        device = next(model.parameters()).device
        device_ids = [device.index] if device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(
            model,
            device_ids,
            bucket_cap_mb=self.bucket_cap_mb,
            find_unused_parameters=self.find_unused_parameters,
        )
        ddp.register_comm_hook(self.buckets, _recording_hook)
        return ddp, optimizer.build(ddp.parameters())

    def no_sync(self, model: nn.Module) -> AbstractContextManager[None]:
        return model.no_sync()

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return super().full_parameters(model.module)

    def last_step_buckets(self) -> list[tuple[int, int]]:
        """The buckets of the last step (a step begins at bucket 0)."""
        starts = [i for i, (index, _) in enumerate(self.buckets) if index == 0]
        return self.buckets[starts[-1] :] if starts else []


def _recording_hook(buckets, bucket):  # no annotations: DDP compares them with real classes
    """A DDP communication hook that notes each bucket, then does DDP's usual mean all-reduce."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    buckets.append((bucket.index(), bucket.buffer().numel()))
    return allreduce_hook(None, bucket)


def train_single_process(config: DataParallelConfig) -> TrainResult:
    """The reference: one process, whole global batches, no communication."""
    from trainfast.datasets import digits

    model = make_model(config, config.seed)
    batches = shard_batches(digits("train"), config, 0, 1)
    trained = train_with_strategy(
        model, SingleProcess(), _optimizer(config), batches, nn.functional.cross_entropy
    )
    evaluation = evaluate_distributed(model, digits("test"), 0, 1)
    return TrainResult(trained.losses, trained.parameters, evaluation=evaluation)


def train_data_parallel(
    rank: int, world_size: int, config: DataParallelConfig, wrapper: str = "manual"
) -> TrainResult:
    """Train on this rank's share of every global batch; works under spawn and torchrun alike.

    Each rank starts from a *different* random initialisation (seed + rank) on purpose: the
    broadcast (by hand, or inside DDP's constructor) is what makes them equal.
    """
    from trainfast.datasets import digits

    strategies = {"manual": ManualDataParallel(), "ddp": TorchDDP(config.bucket_cap_mb)}
    if wrapper not in strategies:
        raise ValueError(f"Unknown wrapper: {wrapper!r} (expected 'manual' or 'ddp')")
    strategy = strategies[wrapper]
    model = make_model(config, config.seed + rank)  # the loop puts it on rank_device()
    batches = shard_batches(digits("train"), config, rank, world_size)
    trained = train_with_strategy(
        model, strategy, _optimizer(config), batches, nn.functional.cross_entropy
    )
    evaluation = evaluate_distributed(model, digits("test"), rank, world_size)  # trained in place
    buckets = strategy.last_step_buckets() if isinstance(strategy, TorchDDP) else []
    return TrainResult(trained.losses, trained.parameters, buckets, evaluation)


def _optimizer(config: DataParallelConfig) -> OptimizerConfig:
    return OptimizerConfig(config.optimizer, config.lr)


def main(argv: list[str] | None = None) -> None:
    """Entry point under torchrun: the process group comes from the environment it sets."""
    from trainfast.distributed.launch import init_from_env

    parser = argparse.ArgumentParser(prog="python -m trainfast.distributed.data_parallel")
    parser.add_argument("--steps", type=int, default=DataParallelConfig.steps)
    parser.add_argument("--wrapper", choices=["manual", "ddp"], default="manual")
    args = parser.parse_args(argv)
    rank, world_size = init_from_env()
    config = DataParallelConfig(steps=args.steps)
    result = train_data_parallel(rank, world_size, config, args.wrapper)
    if rank == 0:  # print once, not once per rank
        checksum = sum(float(p.double().sum()) for p in result.parameters.values())
        print(
            f"{world_size} ranks, {args.wrapper}: loss {result.losses[0]:.4f} -> "
            f"{result.losses[-1]:.4f}, parameter checksum {checksum:.6f}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
