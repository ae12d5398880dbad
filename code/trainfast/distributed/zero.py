"""ZeRO: stop storing the same optimizer state, gradients and parameters on every rank.

Data parallelism keeps ``N`` identical copies of everything. Rajbhandari et al. (2020, "ZeRO:
Memory Optimizations Toward Training Trillion Parameter Models") partition them instead:

* stage 1 shards the optimizer state (:class:`ZeroOptimizer`);
* stage 2 also shards the gradients (:class:`Zero2Optimizer`);
* stage 3 also shards the parameters (:class:`~trainfast.distributed.fsdp.FSDP`; PyTorch's
  ``FullyShardedDataParallel`` is this stage).

Both optimizers here are real ``torch.optim.Optimizer`` subclasses: they have ``param_groups``
(a learning-rate scheduler can change them), ``add_param_group``, ``zero_grad``, and
``state_dict``/``load_state_dict`` of *this rank's* shard of the state (each rank saves its own,
as DeepSpeed's ZeRO checkpoints do). :func:`~trainfast.accounting.zero_memory`, the paper's
per-rank arithmetic, lives in :mod:`trainfast.accounting` and is imported here too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainfast.accounting import MemoryBreakdown, zero_memory  # noqa: F401 (older imports)
from trainfast.distributed.collectives import all_gather, broadcast, reduce_scatter
from trainfast.distributed.data_parallel import (
    DataParallelConfig,
    TrainResult,
    average_gradients,
    broadcast_parameters,
    make_model,
    shard_batches,
)
from trainfast.distributed.launch import rank_device

#: The old name of what :func:`zero_memory` returns (its ``optimizer_states`` part is now
#: :class:`~trainfast.accounting.MemoryBreakdown`'s ``optimizer_state``).
ZeroMemory = MemoryBreakdown

__all__ = [
    "STRATEGIES",
    "ShardedResult",
    "Zero2Optimizer",
    "ZeroOptimizer",
    "held_bytes",
    "train_sharded",
]  # zero_memory and ZeroMemory stay importable here for older code; accounting documents them


def _world() -> tuple[int, int]:
    if not dist.is_initialized():
        raise RuntimeError("ZeRO optimizers need an initialised process group (run under spawn)")
    return dist.get_rank(), dist.get_world_size()


def _hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in group.items() if key != "params"}


def _step_local(optimizer: Any, closure: Any) -> Any:
    """Run ``closure`` (with gradients on), copy the hyperparameters of ``optimizer.param_groups``
    (a scheduler may have changed them) into its local optimizer and step it; the loss."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    groups = zip(optimizer.param_groups, optimizer.local_optimizer.param_groups, strict=True)
    for group, local in groups:
        local.update(_hyperparameters(group))
    optimizer.local_optimizer.step()
    return loss


class ZeroOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1: each rank keeps the optimizer state of about 1/N of the parameters.

    Every parameter has one owner, chosen greedily so that the ranks own nearly equal numbers of
    elements (as torch's ``ZeroRedundancyOptimizer`` does). Rank ``r`` runs ``optimizer_cls``
    only on the parameters it owns, so only it holds their state; after its step, each owner
    broadcasts its updated parameters. Whole tensors, not slices, so any optimizer works, also
    those that look at whole matrices (Muon, LAMB).

    It shards only optimizer state: the gradients it sees must already be averaged over ranks,
    which is data parallelism's job (:class:`~trainfast.distributed.ddp.DDP` or
    :func:`~trainfast.distributed.data_parallel.average_gradients`).
    """

    def __init__(
        self, params: Iterable[nn.Parameter] | Iterable[dict], optimizer_cls: type, **kwargs: Any
    ) -> None:
        self.rank, self.world_size = _world()
        self.optimizer_cls = optimizer_cls
        self.owner: dict[nn.Parameter, int] = {}
        self._owned_numel = [0] * self.world_size
        self.local_optimizer: torch.optim.Optimizer | None = None
        super().__init__(params, kwargs)  # calls add_param_group for every group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; give each of its parameters to the rank that owns the fewest elements."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            owner = min(range(self.world_size), key=lambda r: (self._owned_numel[r], r))
            self.owner[p] = owner
            self._owned_numel[owner] += p.numel()
            if owner == self.rank:
                mine.append(p)
        local_group = {**_hyperparameters(group), "params": mine}
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local_group])
        else:
            self.local_optimizer.add_param_group(local_group)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Step my parameters with the hyperparameters in ``param_groups``; share the results."""
        loss = _step_local(self, closure)
        for group in self.param_groups:
            for p in group["params"]:
                broadcast(p.data, src=self.owner[p], check=False)
        return loss

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard: its local optimizer's state dict, plus who owns what."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local": self.local_optimizer.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a shard saved by the same rank of a run with the same world size."""
        if (state_dict["rank"], state_dict["world_size"]) != (self.rank, self.world_size):
            raise ValueError(
                f"Invalid state_dict: saved by rank {state_dict['rank']} of "
                f"{state_dict['world_size']}, loaded by rank {self.rank} of {self.world_size}"
            )
        self.local_optimizer.load_state_dict(state_dict["local"])
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            group.update(_hyperparameters(local))

    def state_numel(self) -> int:
        """Elements of optimizer state this rank holds (about 1/N of an unsharded optimizer's)."""
        return _state_numel(self.local_optimizer)


def _state_numel(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        value.numel()
        for state in optimizer.state.values()
        for value in state.values()
        if torch.is_tensor(value) and value.dim() > 0
    )


class Zero2Optimizer(torch.optim.Optimizer):
    """ZeRO stage 2: optimizer state *and* gradients sharded; each rank keeps 1/N of each.

    Every parameter is viewed flat, padded to a multiple of ``N`` and cut into ``N`` slices;
    rank ``r`` keeps slice ``r`` as an fp32 master ``shard`` with its own optimizer state. A
    hook (``register_post_accumulate_grad_hook``) fires as soon as backward has finished a
    parameter's gradient: it reduce-scatters that gradient (the mean over ranks, so it does
    data parallelism's averaging too), keeps this rank's slice as the shard's gradient and frees
    the full one. So at most one full gradient exists at a time, instead of all of them. After
    the step, each parameter is all-gathered from the updated slices.

    Element-wise optimizers only (SGD, Adam, AdamW): a slice is not a matrix. A parameter must
    get a gradient on all ranks or on none in a step (as with DDP), or the ranks would wait for
    each other.
    """

    def __init__(
        self, params: Iterable[nn.Parameter] | Iterable[dict], optimizer_cls: type, **kwargs: Any
    ) -> None:
        self.rank, self.world_size = _world()
        self.optimizer_cls = optimizer_cls
        self.shard: dict[nn.Parameter, nn.Parameter] = {}
        self._hooks: list[Any] = []
        self.local_optimizer: torch.optim.Optimizer | None = None
        super().__init__(params, kwargs)

    def _slices(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """``N`` equal slices of a flat, zero-padded copy of ``tensor``."""
        flat = tensor.detach().reshape(-1)
        pad = -flat.numel() % self.world_size
        return list(nn.functional.pad(flat, (0, pad)).chunk(self.world_size))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group: make my slice of each parameter and hook its gradient."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        shards = []
        for p in group["params"]:
            shard = nn.Parameter(self._slices(p)[self.rank].float().clone())
            self.shard[p] = shard
            shards.append(shard)
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._reduce_gradient))
        local_group = {**_hyperparameters(group), "params": shards}
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local_group])
        else:
            self.local_optimizer.add_param_group(local_group)

    def _reduce_gradient(self, p: nn.Parameter) -> None:
        """During backward: keep my slice of the mean gradient, drop the full gradient."""
        shard = self.shard[p]
        mine = torch.empty_like(shard)
        reduce_scatter(mine, [s.float() for s in self._slices(p.grad)], op="mean", check=False)
        shard.grad = mine if shard.grad is None else shard.grad.add_(mine)  # accumulation
        p.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.local_optimizer.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Step my slices, then all-gather every parameter from everyone's slices."""
        loss = _step_local(self, closure)
        for group in self.param_groups:
            for p in group["params"]:
                shard = self.shard[p]
                slices = [torch.empty_like(shard) for _ in range(self.world_size)]
                all_gather(slices, shard, check=False)
                p.copy_(torch.cat(slices)[: p.numel()].view_as(p))
        return loss

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard: its slices' optimizer state and the slices (fp32 masters)."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local": self.local_optimizer.state_dict(),
            "shards": [s.detach().clone() for s in self.shard.values()],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a shard saved by the same rank of a run with the same world size."""
        if (state_dict["rank"], state_dict["world_size"]) != (self.rank, self.world_size):
            raise ValueError(
                f"Invalid state_dict: saved by rank {state_dict['rank']} of "
                f"{state_dict['world_size']}, loaded by rank {self.rank} of {self.world_size}"
            )
        self.local_optimizer.load_state_dict(state_dict["local"])
        with torch.no_grad():
            for shard, saved in zip(self.shard.values(), state_dict["shards"], strict=True):
                shard.copy_(saved)
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            group.update(_hyperparameters(local))

    def state_numel(self) -> int:
        """Elements of optimizer state this rank holds."""
        return _state_numel(self.local_optimizer)


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> MemoryBreakdown:
    """Bytes of model state this rank holds now, by part, counted from the live tensors.

    Parameters count only their local storage (a DTensor's local shard; our FSDP's flat shard);
    gradients include a ZeRO-2 shard's; ``master_weights`` are a ZeRO-2 optimizer's fp32 slices;
    ``optimizer_state`` is every state tensor of the optimizer (or of its local optimizer).
    """

    def size(t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    parameters = list(model.parameters())
    masters = list(optimizer.shard.values()) if isinstance(optimizer, Zero2Optimizer) else []
    inner = getattr(optimizer, "local_optimizer", optimizer)
    state = sum(
        size(value)
        for s in inner.state.values()
        for value in s.values()
        if torch.is_tensor(value) and value.dim() > 0
    )
    return MemoryBreakdown(
        parameters=sum(size(p) for p in parameters),
        gradients=sum(size(p.grad) for p in parameters + masters),
        master_weights=sum(size(m) for m in masters),
        optimizer_state=state,
    )


@dataclass
class ShardedResult(TrainResult):
    """A :class:`~trainfast.distributed.data_parallel.TrainResult` plus what this rank stored."""

    optimizer_state_numel: int = 0  # elements of optimizer state held by this rank
    parameter_numel: int = 0  # elements of parameters held by this rank between steps
    held: MemoryBreakdown | None = None  # bytes held after the last backward, before its step


#: FSDP on CPU (gloo) trains correctly from torch 2.9: 2.4-2.5 need CUDA streams, 2.6 lacks CPU
#: stream events, and before 2.9 gloo's reduce-scatter ignores AVG and sums the gradients.
FSDP_ON_CPU = torch.torch_version.TorchVersion(torch.__version__) >= (2, 9)

#: What :func:`train_sharded` can train with: ZeRO-1 and ZeRO-2 here, our FSDP (ZeRO-3) and
#: PyTorch's ``fully_shard``.
STRATEGIES = ("zero1", "zero2", "fsdp", "torch-fsdp")


def _wrap(model: nn.Module, strategy: str, config: DataParallelConfig) -> tuple[nn.Module, Any]:
    """The model to run and the optimizer to step, for one strategy (AdamW throughout)."""
    hyper = {"lr": config.lr, "weight_decay": 0.01}
    if strategy == "zero1":
        return model, ZeroOptimizer(model.parameters(), torch.optim.AdamW, **hyper)
    if strategy == "zero2":
        return model, Zero2Optimizer(model.parameters(), torch.optim.AdamW, **hyper)
    if strategy == "fsdp":
        from trainfast.distributed.fsdp import FSDP

        wrapped = FSDP(model)
        return wrapped, torch.optim.AdamW(wrapped.parameters(), **hyper)
    if next(model.parameters()).device.type == "cpu" and not FSDP_ON_CPU:
        raise RuntimeError(f"FSDP on CPU needs torch >= 2.9, not {torch.__version__}")
    from trainfast.distributed.torch_apis import torch_fully_shard

    model = torch_fully_shard(model)  # each Linear its own unit, then the whole model
    return model, torch.optim.AdamW(model.parameters(), **hyper)


def train_sharded(
    rank: int, world_size: int, config: DataParallelConfig, strategy: str = "zero1"
) -> ShardedResult:
    """Train like :func:`~trainfast.distributed.data_parallel.train_data_parallel`, sharded.

    ``strategy`` is one of :data:`STRATEGIES`. ZeRO-1 averages gradients with data
    parallelism's :func:`~trainfast.distributed.data_parallel.average_gradients`; ZeRO-2
    reduce-scatters them during backward; the FSDPs reduce-scatter them in their backward.
    Returns the full parameters (gathered), the optimizer state and parameter elements this rank
    held, and the bytes of model state it held after the last backward.
    """
    from trainfast.datasets import digits

    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown strategy: {strategy!r} (expected one of {STRATEGIES})")
    if config.optimizer != "adamw":
        raise ValueError(
            f"Invalid optimizer: {config.optimizer!r} (sharding pays off with 'adamw')"
        )
    device = rank_device()
    model = make_model(config, config.seed + rank).to(device)
    broadcast_parameters(model, src=0)  # FSDP assumes equal initial parameters too
    model, optimizer = _wrap(model, strategy, config)
    losses, held = [], None
    for inputs, labels in shard_batches(digits("train"), config, rank, world_size):
        inputs, labels = inputs.to(device), labels.to(device)
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # ZeRO-2 and the FSDPs reduce-scatter the gradients here
        if strategy == "zero1":
            average_gradients(model)  # data parallelism's job, not the optimizer's
        elif strategy == "fsdp":
            model.finish_gradient_synchronization()
        held = held_bytes(model, optimizer)
        optimizer.step()
        reported = loss.detach().reshape(1)
        dist.all_reduce(reported)
        losses.append(float(reported) / world_size)
    if strategy == "fsdp":
        parameters = {k: v.detach().cpu().clone() for k, v in model.full_state_dict().items()}
        local_numel = sum(p.numel() for p in model.parameters())
    else:
        parameters, local_numel = {}, 0
        for name, p in model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP: gather the DTensor
            local_numel += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
            parameters[name] = full.detach().cpu().clone()
    inner = getattr(optimizer, "local_optimizer", optimizer)
    state_numel = sum(
        (v.to_local() if hasattr(v, "to_local") else v).numel()
        for s in inner.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0
    )  # fmt: skip
    return ShardedResult(
        losses,
        parameters,
        optimizer_state_numel=state_numel,
        parameter_numel=local_numel,
        held=held,
    )
