"""One interface for every data-parallel strategy, and the one loop that trains with any of them.

DDP, ZeRO-1, ZeRO-2, our FSDP and PyTorch's ``fully_shard`` differ in what each rank keeps and
when gradients travel, not in the shape of a training step. As picotron's interchangeable
data-parallel modules do, each strategy here answers the same three questions:

1. :meth:`Strategy.wrap`: which model does the loop run, and which optimizer steps it (always
   built by the package's one factory, :func:`~trainfast.training.arguments.build_optimizer`)?
2. :meth:`Strategy.finish_gradient_synchronization`: what is left to do after ``backward`` for
   every rank's gradients to be the mean over ranks (nothing, for those that reduce-scatter
   during backward)?
3. :meth:`Strategy.full_parameters`: the whole parameters, under the original names, on every
   rank (gathered where they are sharded).

:func:`~trainfast.distributed.training_loop.train_with_strategy` is the one loop (the
:class:`Strategy` interface lives beside it, below every strategy); :func:`train_sharded` (the
digits MLP of the data-parallel section) and
:func:`~trainfast.distributed.parity.strategies.strategy_worker` (a model with tied, frozen and
unused parameters) only choose a model and batches. :func:`held_bytes` counts what a rank
holds, from the live tensors.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from trainfast.distributed.data_parallel import (
    DataParallelConfig,
    average_gradients,
    broadcast_parameters,
    make_model,
    shard_batches,
)
from trainfast.distributed.ddp import DDP
from trainfast.distributed.fsdp import FSDP
from trainfast.distributed.training_loop import (
    OptimizerConfig,
    Strategy,
    StrategyResult,
    held_bytes,
    train_with_strategy,
)
from trainfast.distributed.zero import Zero2Optimizer, ZeroOptimizer

__all__ = [
    "DDPStrategy",
    "FSDPStrategy",
    "FSDP_ON_CPU",
    "OptimizerConfig",
    "STRATEGIES",
    "Strategy",
    "StrategyResult",
    "TorchFSDPStrategy",
    "Zero1Strategy",
    "Zero2Strategy",
    "held_bytes",
    "make_strategy",
    "train_sharded",
    "train_with_strategy",
]

#: FSDP on CPU (gloo) trains correctly from torch 2.9: 2.4-2.5 need CUDA streams, 2.6 lacks CPU
#: stream events, and before 2.9 gloo's reduce-scatter ignores AVG and sums the gradients.
FSDP_ON_CPU = torch.torch_version.TorchVersion(torch.__version__) >= (2, 9)


@dataclass(frozen=True)
class DDPStrategy(Strategy):
    """:class:`~trainfast.distributed.ddp.DDP`: gradient buckets all-reduced during backward."""

    name: ClassVar[str] = "ddp"
    bucket_cap_mb: float | None = None  # None: every parameter its own bucket

    def wrap(
        self, model: nn.Module, optimizer: OptimizerConfig
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        ddp = DDP(model, bucket_cap_mb=self.bucket_cap_mb)  # broadcasts rank 0's parameters
        return ddp, optimizer.build(ddp.parameters())

    def finish_gradient_synchronization(self, model: nn.Module) -> None:
        model.finish_gradient_synchronization()

    def no_sync(self, model: nn.Module) -> AbstractContextManager[None]:
        return model.no_sync()

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return super().full_parameters(model.module)


@dataclass(frozen=True)
class Zero1Strategy(Strategy):
    """:class:`~trainfast.distributed.zero.ZeroOptimizer`, with gradients averaged by hand."""

    name: ClassVar[str] = "zero1"

    def make_optimizer(
        self, parameters: Iterable[Any], optimizer: OptimizerConfig
    ) -> torch.optim.Optimizer:
        """The ZeRO optimizer over ``parameters``, each rank's part built by the one factory."""
        return ZeroOptimizer(parameters, optimizer.factory(), **optimizer.hyperparameters())

    def wrap(
        self, model: nn.Module, optimizer: OptimizerConfig
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        broadcast_parameters(model, src=0)
        return model, self.make_optimizer(model.parameters(), optimizer)

    def finish_gradient_synchronization(self, model: nn.Module) -> None:
        average_gradients(model)  # data parallelism's job, not the optimizer's


@dataclass(frozen=True)
class Zero2Strategy(Zero1Strategy):
    """:class:`~trainfast.distributed.zero.Zero2Optimizer`: it reduce-scatters during backward."""

    name: ClassVar[str] = "zero2"

    def make_optimizer(
        self, parameters: Iterable[Any], optimizer: OptimizerConfig
    ) -> torch.optim.Optimizer:
        return Zero2Optimizer(parameters, optimizer.factory(), **optimizer.hyperparameters())

    def finish_gradient_synchronization(self, model: nn.Module) -> None:
        """Nothing: the optimizer's hooks reduce-scattered every gradient during backward."""


@dataclass(frozen=True)
class FSDPStrategy(Strategy):
    """Our :class:`~trainfast.distributed.fsdp.FSDP` (ZeRO-3), in ``compute_dtype`` if set."""

    name: ClassVar[str] = "fsdp"
    compute_dtype: torch.dtype | None = None

    def wrap(
        self, model: nn.Module, optimizer: OptimizerConfig
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        fsdp = FSDP(model, compute_dtype=self.compute_dtype)  # broadcasts rank 0's parameters
        return fsdp, optimizer.build(fsdp.parameters())  # the shards: state sharded for free

    def finish_gradient_synchronization(self, model: nn.Module) -> None:
        model.finish_gradient_synchronization()

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in model.full_state_dict().items()}


@dataclass(frozen=True)
class TorchFSDPStrategy(Strategy):
    """PyTorch's ``fully_shard`` (FSDP2): every parameter a ``DTensor`` cut along dim 0."""

    name: ClassVar[str] = "torch-fsdp"

    def wrap(
        self, model: nn.Module, optimizer: OptimizerConfig
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from trainfast.distributed.torch_apis import torch_fully_shard

        if next(model.parameters()).device.type == "cpu" and not FSDP_ON_CPU:
            raise RuntimeError(f"FSDP on CPU needs torch >= 2.9, not {torch.__version__}")
        broadcast_parameters(model, src=0)  # fully_shard assumes equal parameters
        model = torch_fully_shard(model)  # each Linear its own unit, then the whole model
        return model, optimizer.build(model.parameters())


#: Every strategy by name; :func:`make_strategy` builds one with its defaults.
STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (DDPStrategy, Zero1Strategy, Zero2Strategy, FSDPStrategy, TorchFSDPStrategy)
}


def make_strategy(strategy: Strategy | str) -> Strategy:
    """``strategy`` itself, or the strategy of that name with its default options."""
    if isinstance(strategy, Strategy):
        return strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown strategy: {strategy!r} (expected one of {tuple(STRATEGIES)})")
    return STRATEGIES[strategy]()


def train_sharded(
    rank: int, world_size: int, config: DataParallelConfig, strategy: Strategy | str = "zero1"
) -> StrategyResult:
    """Train like :func:`~trainfast.distributed.data_parallel.train_data_parallel`, with
    ``strategy`` (a :class:`Strategy` or a name in :data:`STRATEGIES`); a spawn worker.

    Each rank starts from different parameters (seed + rank); the strategy makes them equal.
    """
    from trainfast.datasets import digits

    strategy = make_strategy(strategy)
    model = make_model(config, config.seed + rank)  # the loop puts it on rank_device()
    batches = shard_batches(digits("train"), config, rank, world_size)
    optimizer = OptimizerConfig(config.optimizer, config.lr)
    return train_with_strategy(model, strategy, optimizer, batches, nn.functional.cross_entropy)
