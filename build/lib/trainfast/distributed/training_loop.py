"""The one training loop of the data-parallel strategies, and the interface they share.

DDP, ZeRO-1, ZeRO-2, our FSDP and PyTorch's ``fully_shard`` differ in what each rank keeps and
when gradients travel, not in the shape of a training step. Each :class:`Strategy` answers the
same three questions (see :mod:`trainfast.distributed.strategy`, where they live), and
:func:`train_with_strategy` trains with any of them: wrap, then per step forward, backward,
finish the gradient synchronisation, step. The hand-written and ``torch.nn.parallel`` data
parallelism of :mod:`~trainfast.distributed.data_parallel`, and one process alone, are
strategies too, so the book has one loop. :func:`held_bytes` counts what a rank holds, from the
live tensors.

This module sits below the strategies: it imports none of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from trainfast.accounting import MemoryBreakdown
from trainfast.distributed.launch import rank_device
from trainfast.distributed.zero import Zero2Optimizer
from trainfast.optim.state import state_bytes
from trainfast.training.arguments import build_optimizer
from trainfast.validation import check_positive

__all__ = [
    "OptimizerConfig",
    "Strategy",
    "StrategyResult",
    "held_bytes",
    "train_with_strategy",
]


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
    """A way to train one model on several ranks (its contract: :mod:`.strategy`'s docstring).

    Every rank must call the methods in the same order (they communicate). The model handed to
    :meth:`wrap` may start different on each rank: the strategy makes rank 0's the start.
    """

    #: The strategy's name in :data:`~trainfast.distributed.strategy.STRATEGIES`.
    name: ClassVar[str]

    @abstractmethod
    def wrap(
        self, model: nn.Module, optimizer: OptimizerConfig
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model the loop runs and the optimizer that steps it."""

    def finish_gradient_synchronization(self, model: nn.Module) -> None:  # noqa: B027
        """After ``loss.backward()``: make the gradients the optimizer sees the mean over ranks.
        Nothing by default (strategies that reduce-scatter during backward are done)."""

    def no_sync(self, model: nn.Module) -> AbstractContextManager[None]:
        """A context in which backward passes only accumulate gradients locally, for gradient
        accumulation (DDP's ``no_sync``). By default none: a strategy without the switch either
        reduces after the last backward anyway or reduces every micro-batch's gradients."""
        return nullcontext()

    def full_parameters(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Every parameter in full, detached, on the CPU, under the unwrapped model's names."""
        return {
            name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
            for name, p in model.named_parameters()
        }  # a DTensor (PyTorch's FSDP) gathers itself with full_tensor()


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


def _check_device(model: nn.Module, device: torch.device, strategy: Strategy) -> None:
    """Refuse a wrapped model whose parameters left ``device``: its outputs would meet the
    batches on another device (PyTorch's ``fully_shard`` without a mesh picks the GPU)."""
    for name, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if local.device != device:
            raise RuntimeError(
                f"Strategy {strategy.name!r} moved parameter {name!r} to {local.device}; "
                f"this rank trains on {device} (rank_device())"
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
    strategy: Strategy,
    optimizer_config: OptimizerConfig,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    micro_batches: int = 1,
    no_sync: bool = False,
) -> StrategyResult:
    """Train ``model`` on this rank's ``(inputs, targets)`` batches with ``strategy``.

    The one loop of the sharded strategies: wrap, then per step forward, backward, finish the
    gradient synchronisation, step; the loss reported is the mean over ranks. With
    ``micro_batches = k`` each batch is cut into ``k`` equal micro-batches whose losses, each
    divided by ``k``, are backpropagated one after another (gradient accumulation: the same
    gradient as the whole batch); ``no_sync`` runs the first ``k - 1`` under
    :meth:`Strategy.no_sync`. The model (moved
    in place), the batches and the loss live on :func:`~trainfast.distributed.launch.rank_device`:
    the CPU under gloo, even on a machine with a GPU, and this rank's GPU under NCCL. A strategy
    that moves the model elsewhere is an error.
    """
    check_positive("micro_batches", micro_batches)
    device = rank_device()
    model, optimizer = strategy.wrap(model.to(device), optimizer_config)
    _check_device(model, device, strategy)
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    losses, held = [], None
    for inputs, targets in batches:
        if len(inputs) % micro_batches:
            raise ValueError(
                f"Invalid micro_batches: {micro_batches} (must divide the batch of {len(inputs)})"
            )
        optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=device)
        pieces = zip(inputs.chunk(micro_batches), targets.chunk(micro_batches), strict=True)
        for i, (x, y) in enumerate(pieces):
            local = no_sync and i < micro_batches - 1
            with strategy.no_sync(model) if local else nullcontext():
                micro_loss = loss_fn(model(x.to(device)), y.to(device)) / micro_batches
                micro_loss.backward()
            loss = loss + micro_loss.detach()
        strategy.finish_gradient_synchronization(model)
        held = held_bytes(model, optimizer)
        optimizer.step()
        reported = loss.detach().reshape(1)
        if world_size > 1:
            dist.all_reduce(reported)
        losses.append(float(reported) / world_size)
    local_numel = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters()
    )
    return StrategyResult(losses, strategy.full_parameters(model), local_numel, held)
