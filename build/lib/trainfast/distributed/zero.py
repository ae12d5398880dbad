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
per-rank arithmetic, lives in :mod:`trainfast.accounting`; the strategies that train with them
are in :mod:`trainfast.distributed.strategy`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from trainfast.distributed.agreement import rank_and_world_size
from trainfast.distributed.collectives import all_gather, broadcast, reduce_scatter

__all__ = ["Zero2Optimizer", "ZeroOptimizer", "largest_share", "owners"]


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


def owners(numels: list[int], owned: list[int]) -> list[int]:
    """The rank that owns each of tensors of ``numels`` elements under ZeRO-1's whole-tensor split.

    Sorted-greedy, as torch's ``ZeroRedundancyOptimizer._partition_parameters``: largest first,
    each to the rank that owns the fewest elements so far (the lowest such rank); ``owned`` holds
    each rank's elements so far and is updated (several parameter groups share it). A tensor is
    never split, so the largest owner holds at least the largest tensor: the split is even only
    when every tensor is much smaller than ``1 / N`` of the model.
    """
    ranks = [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda i: -numels[i]):  # stable: ties in order
        ranks[i] = min(range(len(owned)), key=lambda r: (owned[r], r))
        owned[ranks[i]] += numels[i]
    return ranks


def largest_share(numels: list[int], world_size: int) -> float:
    """The elements the busiest ZeRO-1 owner holds over the mean, ``1`` for an even split
    (:func:`owners` on tensors of ``numels`` elements, one parameter group)."""
    owned = [0] * world_size
    owners(numels, owned)
    return max(owned) / (sum(owned) / world_size)


class ZeroOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1: each rank keeps the optimizer state of about 1/N of the parameters.

    ``optimizer_cls`` is an optimizer class or any callable ``(params, **kwargs) -> optimizer``
    (``functools.partial(build_optimizer, "adamw")``); ``kwargs`` are the groups' defaults.
    Every parameter has one owner (:func:`owners`: largest first, each to the rank that owns the
    fewest elements so far, as torch's ``ZeroRedundancyOptimizer`` does). Rank ``r`` runs
    ``optimizer_cls``
    only on the parameters it owns, so only it holds their state; after its step, each owner
    broadcasts its updated parameters. Whole tensors, not slices, so any optimizer works, also
    those that look at whole matrices (Muon, LAMB).

    It shards only optimizer state: the gradients it sees must already be averaged over ranks,
    which is data parallelism's job (:class:`~trainfast.distributed.ddp.DDP` or
    :func:`~trainfast.distributed.data_parallel.average_gradients`).
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter] | Iterable[dict],
        optimizer_cls: Callable[..., torch.optim.Optimizer],
        **kwargs: Any,
    ) -> None:
        self.rank, self.world_size = rank_and_world_size()
        self.optimizer_cls = optimizer_cls
        self.owner: dict[nn.Parameter, int] = {}
        self._owned_numel = [0] * self.world_size
        self.local_optimizer: torch.optim.Optimizer | None = None
        super().__init__(params, kwargs)  # calls add_param_group for every group

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; give each of its parameters an owner (:func:`owners`)."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        ranks = owners([p.numel() for p in group["params"]], self._owned_numel)
        mine = []
        for p, owner in zip(group["params"], ranks, strict=True):
            self.owner[p] = owner
            if owner == self.rank:
                mine.append(p)
        local_group = {**_hyperparameters(group), "params": mine}
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local_group], **self.defaults)
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


class Zero2Optimizer(torch.optim.Optimizer):
    """ZeRO stage 2: optimizer state *and* gradients sharded; each rank keeps 1/N of each.

    Every parameter is viewed flat, padded to a multiple of ``N`` and cut into ``N`` slices;
    rank ``r`` keeps slice ``r`` as an fp32 master ``shard`` with its own optimizer state. A
    hook (``register_post_accumulate_grad_hook``) fires as soon as backward has finished a
    parameter's gradient: it reduce-scatters that gradient (the mean over ranks, so it does
    data parallelism's averaging too), keeps this rank's slice as the shard's gradient and frees
    the full one. So at most one full gradient exists at a time, instead of all of them. After
    the step, each parameter is all-gathered from the updated slices.

    What travels: the gradients in ``reduce_dtype`` (``None``: the gradient's own dtype, two bytes
    for bf16 parameters; ``torch.float32`` reduces in fp32 as Llama 3 did, as FSDP2's
    ``MixedPrecisionPolicy(reduce_dtype=...)`` does), accumulated on the fp32 shard; the
    updated weights in the parameters' dtype. So the bytes are
    :func:`~trainfast.distributed.step_time.data_parallel_bytes`' with the recipe's gradient and
    weight bytes.

    Element-wise optimizers only (SGD, Adam, AdamW): a slice is not a matrix. A parameter must
    get a gradient on all ranks or on none in a step (as with DDP), or the ranks would wait for
    each other.
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter] | Iterable[dict],
        optimizer_cls: Callable[..., torch.optim.Optimizer],
        *,
        reduce_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        self.rank, self.world_size = rank_and_world_size()
        self.optimizer_cls = optimizer_cls
        self.reduce_dtype = reduce_dtype
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
            self.local_optimizer = self.optimizer_cls([local_group], **self.defaults)
        else:
            self.local_optimizer.add_param_group(local_group)

    def _reduce_gradient(self, p: nn.Parameter) -> None:
        """During backward: keep my slice of the mean gradient, drop the full gradient."""
        shard = self.shard[p]
        dtype = self.reduce_dtype or p.grad.dtype  # what travels
        mine = torch.empty(shard.shape, dtype=dtype, device=shard.device)
        reduce_scatter(mine, [s.to(dtype) for s in self._slices(p.grad)], op="mean", check=False)
        mine = mine.float()  # accumulated on the fp32 shard
        shard.grad = mine if shard.grad is None else shard.grad.add_(mine)
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
                mine = self.shard[p].to(p.dtype)  # the weights travel in their own dtype
                slices = [torch.empty_like(mine) for _ in range(self.world_size)]
                all_gather(slices, mine, check=False)
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
