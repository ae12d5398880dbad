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

:func:`train_with_strategy` is the loop; :func:`train_sharded` (the digits MLP of the
data-parallel section) and :func:`~trainfast.distributed.parity.strategies.strategy_worker`
(a model with tied, frozen and unused parameters) only choose a model and batches.
:func:`held_bytes` counts what a rank holds, from the live tensors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from trainfast.accounting import MemoryBreakdown
from trainfast.distributed.data_parallel import (
    DataParallelConfig,
    average_gradients,
    broadcast_parameters,
    make_model,
    shard_batches,
)
from trainfast.distributed.ddp import DDP
from trainfast.distributed.fsdp import FSDP
from trainfast.distributed.launch import rank_device
from trainfast.distributed.zero import Zero2Optimizer, ZeroOptimizer
from trainfast.optim.state import state_bytes
from trainfast.training.arguments import build_optimizer

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
class OptimizerConfig:
    """Which optimizer, for :func:`~trainfast.training.arguments.build_optimizer`.

    ``weight_decay=None`` keeps torch's default for that optimizer (0.01 for AdamW, 0 for SGD).
    """

    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float | None = None

    def hyperparameters(self) -> dict[str, float]:
        """The defaults of every parameter group: ``lr``, and ``weight_decay`` if it is set."""
        extra = {} if self.weight_decay is None else {"weight_decay": self.weight_decay}
        return {"lr": self.lr, **extra}

    def factory(self) -> Callable[..., torch.optim.Optimizer]:
        """``(params, **hyperparameters) -> optimizer``: what a ZeRO optimizer runs locally."""
        return partial(build_optimizer, self.name)

    def build(self, parameters: Iterable[Any]) -> torch.optim.Optimizer:
        """The optimizer over ``parameters`` (tensors or parameter groups)."""
        return self.factory()(parameters, **self.hyperparameters())


class Strategy(ABC):
    """A way to train one model on several ranks; see the module docstring for the contract.

    Every rank must call the methods in the same order (they communicate). The model handed to
    :meth:`wrap` may start different on each rank: the strategy makes rank 0's the start.
    """

    #: The strategy's name in :data:`STRATEGIES`.
    name: ClassVar[str]

    @abstractmethod
    def wrap(
        self, model: nn.Module, optimizer: OptimizerConfig
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model the loop runs and the optimizer that steps it."""

    def finish_gradient_synchronization(self, model: nn.Module) -> None:  # noqa: B027
        """After ``loss.backward()``: make the gradients the optimizer sees the mean over ranks.
        Nothing by default (strategies that reduce-scatter during backward are done)."""

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Every parameter in full, detached, on the CPU, under the unwrapped model's names."""
        return {
            name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
            for name, p in model.named_parameters()
        }  # a DTensor (PyTorch's FSDP) gathers itself with full_tensor()


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


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> MemoryBreakdown:
    """Bytes of model state this rank holds now, by part, counted from the live tensors.

    Parameters count only their local storage (a DTensor's local shard; our FSDP's flat shard);
    gradients include a ZeRO-2 shard's; ``master_weights`` are a ZeRO-2 optimizer's fp32 slices;
    ``optimizer_state`` is :func:`~trainfast.optim.state.state_bytes` of the optimizer (a ZeRO
    optimizer's local one), without step counts, as the ZeRO paper counts it.
    """

    def size(t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    parameters = list(model.parameters())
    masters = list(optimizer.shard.values()) if isinstance(optimizer, Zero2Optimizer) else []
    inner = getattr(optimizer, "local_optimizer", optimizer)
    return MemoryBreakdown(
        parameters=sum(size(p) for p in parameters),
        gradients=sum(size(p.grad) for p in parameters + masters),
        master_weights=sum(size(m) for m in masters),
        optimizer_state=state_bytes(inner, scalars=False),
    )


@dataclass
class StrategyResult:
    """What one rank reports: the loss over the whole batch per step, the full parameters at the
    end, the parameter elements it stored, and the bytes it held after the last backward."""

    losses: list[float]
    parameters: dict[str, torch.Tensor]
    parameter_numel: int = 0  # elements of parameters this rank stores between steps
    held: MemoryBreakdown | None = None


def train_with_strategy(
    model: nn.Module,
    strategy: Strategy | str,
    optimizer_config: OptimizerConfig,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> StrategyResult:
    """Train ``model`` on this rank's ``(inputs, targets)`` batches with ``strategy``.

    The one loop of the sharded strategies: wrap, then per step forward, backward, finish the
    gradient synchronisation, step; the loss reported is the mean over ranks.
    """
    strategy = make_strategy(strategy)
    device = next(model.parameters()).device
    model, optimizer = strategy.wrap(model, optimizer_config)
    world_size = dist.get_world_size()
    losses, held = [], None
    for inputs, targets in batches:
        loss = loss_fn(model(inputs.to(device)), targets.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        strategy.finish_gradient_synchronization(model)
        held = held_bytes(model, optimizer)
        optimizer.step()
        reported = loss.detach().reshape(1)
        dist.all_reduce(reported)
        losses.append(float(reported) / world_size)
    local_numel = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters()
    )
    return StrategyResult(losses, strategy.full_parameters(model), local_numel, held)


def train_sharded(
    rank: int, world_size: int, config: DataParallelConfig, strategy: Strategy | str = "zero1"
) -> StrategyResult:
    """Train like :func:`~trainfast.distributed.data_parallel.train_data_parallel`, with
    ``strategy`` (a :class:`Strategy` or a name in :data:`STRATEGIES`); a spawn worker.

    Each rank starts from different parameters (seed + rank); the strategy makes them equal.
    """
    from trainfast.datasets import digits

    strategy = make_strategy(strategy)
    model = make_model(config, config.seed + rank).to(rank_device())
    batches = shard_batches(digits("train"), config, rank, world_size)
    optimizer = OptimizerConfig(config.optimizer, config.lr)
    return train_with_strategy(model, strategy, optimizer, batches, nn.functional.cross_entropy)
