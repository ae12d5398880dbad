"""ZeRO: stop storing the same optimizer state, gradients and parameters on every rank.

Data parallelism keeps ``N`` identical copies of everything. Rajbhandari et al. (2020, "ZeRO:
Memory Optimizations Toward Training Trillion Parameter Models") partition them instead:

* stage 1 shards the optimizer state (Adam's fp32 master weights, ``exp_avg``, ``exp_avg_sq``);
* stage 2 also shards the gradients (each rank keeps only the reduced slice it updates);
* stage 3 also shards the parameters (gathered layer by layer when needed); PyTorch's
  ``FullyShardedDataParallel`` (FSDP) is this stage.

:func:`~trainfast.accounting.zero_memory`, the paper's per-rank arithmetic, lives with the rest of
the book's resource arithmetic in :mod:`trainfast.accounting` (imported here too, for the old
import path). :class:`ZeroOptimizer` is a working
stage-1 optimizer on our collectives: gradients are *reduce-scattered* (each rank receives the
mean of its own 1/N slice), each rank steps an ordinary optimizer on its slice, and the updated
slices are *all-gathered* back into the model. Reduce-scatter plus all-gather is exactly the ring
all-reduce's traffic, so this saves memory at no extra communication. It keeps flat fp32
buffers and ignores mixed precision and overlap, which real implementations do not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainfast.accounting import MemoryBreakdown, zero_memory
from trainfast.distributed.collectives import all_gather, reduce_scatter
from trainfast.distributed.data_parallel import (
    DataParallelConfig,
    TrainResult,
    broadcast_parameters,
    make_model,
    shard_batches,
)
from trainfast.distributed.launch import rank_device

#: The old name of what :func:`zero_memory` returns (its ``optimizer_states`` part is now
#: :class:`~trainfast.accounting.MemoryBreakdown`'s ``optimizer_state``).
ZeroMemory = MemoryBreakdown

__all__ = ["ShardedResult", "ZeroMemory", "ZeroOptimizer", "train_sharded", "zero_memory"]


class ZeroOptimizer:
    """ZeRO stage 1: each rank keeps optimizer state for 1/N of the parameters.

    Wraps any element-wise ``torch.optim`` optimizer (SGD, Adam, AdamW, ...): the parameters are
    viewed as one flat vector, padded to a multiple of ``N`` and cut into ``N`` equal slices;
    rank ``r`` runs ``optimizer_class`` on slice ``r`` only. Optimizers that look at whole
    tensors (LAMB's trust ratio, Muon's orthogonalisation) would need whole-tensor shards.
    Call it inside an initialised process group, after the gradients of the local loss exist.
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        optimizer_class: type = torch.optim.AdamW,
        **defaults: Any,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ZeroOptimizer got no parameters that require gradients")
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"Mixed parameter dtypes: {sorted(map(str, dtypes))} (expected one)")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-self.numel // self.world_size)  # ceil(numel / N)
        flat = self._flatten([p.detach() for p in self.params])  # (N * shard_size,)
        start = self.rank * self.shard_size
        self.shard = nn.Parameter(flat[start : start + self.shard_size].clone())
        self.optimizer = optimizer_class([self.shard], **defaults)

    def _flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return nn.functional.pad(flat, (0, self.shard_size * self.world_size - self.numel))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        """Reduce-scatter the mean gradient, update my slice, all-gather the new parameters."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        grad_slices = list(self._flatten(grads).split(self.shard_size))  # N x (shard_size,)
        self.shard.grad = torch.empty_like(self.shard)
        reduce_scatter(self.shard.grad, grad_slices, op="mean")
        self.optimizer.step()
        slices = [torch.empty_like(self.shard) for _ in range(self.world_size)]
        all_gather(slices, self.shard.detach())
        flat = torch.cat(slices)[: self.numel]
        with torch.no_grad():
            for p, new in zip(
                self.params, flat.split([p.numel() for p in self.params]), strict=True
            ):
                p.copy_(new.view_as(p))

    def state_numel(self) -> int:
        """Elements of optimizer state this rank holds (about 1/N of an unsharded optimizer's)."""
        return sum(
            value.numel()
            for state in self.optimizer.state.values()
            for value in state.values()
            if torch.is_tensor(value) and value.dim() > 0
        )


@dataclass
class ShardedResult(TrainResult):
    """A :class:`~trainfast.distributed.data_parallel.TrainResult` plus what this rank stored."""

    optimizer_state_numel: int = 0  # elements of optimizer state held by this rank
    parameter_numel: int = 0  # elements of parameters held by this rank between steps


#: FSDP on CPU (gloo) trains correctly from torch 2.9: 2.4-2.5 need CUDA streams, 2.6 lacks CPU
#: stream events, and before 2.9 gloo's reduce-scatter ignores AVG and sums the gradients.
FSDP_ON_CPU = torch.torch_version.TorchVersion(torch.__version__) >= (2, 9)


def _fully_shard() -> Any:
    try:  # torch >= 2.6
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4 and 2.5
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def train_sharded(
    rank: int, world_size: int, config: DataParallelConfig, strategy: str = "zero1"
) -> ShardedResult:
    """Train like :func:`~trainfast.distributed.data_parallel.train_data_parallel`, sharded.

    ``strategy="zero1"`` uses :class:`ZeroOptimizer`; ``"fsdp"`` uses PyTorch's FSDP (its
    ``fully_shard``, stage 3) on each linear layer and the whole model. Returns the
    :class:`~trainfast.distributed.data_parallel.TrainResult` (full parameters, gathered) and the
    optimizer state and parameter elements this rank held, as a :class:`ShardedResult`.
    """
    from trainfast.datasets import digits

    if strategy not in ("zero1", "fsdp"):
        raise ValueError(f"Unknown strategy: {strategy!r} (expected 'zero1' or 'fsdp')")
    if config.optimizer != "adamw":
        raise ValueError(
            f"Invalid optimizer: {config.optimizer!r} (sharding pays off with 'adamw')"
        )
    device = rank_device()
    model = make_model(config, config.seed + rank).to(device)
    broadcast_parameters(model, src=0)  # FSDP assumes equal initial parameters too
    if strategy == "zero1":
        optimizer = ZeroOptimizer(
            model.parameters(), torch.optim.AdamW, lr=config.lr, weight_decay=0.01
        )
    else:
        if device.type == "cpu" and not FSDP_ON_CPU:
            raise RuntimeError(f"FSDP on CPU needs torch >= 2.9, not {torch.__version__}")
        fully_shard = _fully_shard()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    losses = []
    for inputs, labels in shard_batches(digits("train"), config, rank, world_size):
        inputs, labels = inputs.to(device), labels.to(device)
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # FSDP reduce-scatters the gradients here; ZeRO-1 in step()
        optimizer.step()
        reported = loss.detach().reshape(1)
        dist.all_reduce(reported)
        losses.append(float(reported) / world_size)
    parameters, local_numel = {}, 0
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP: gather the DTensor
        local_numel += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
        parameters[name] = full.detach().cpu().clone()
    if strategy == "zero1":
        state_numel = optimizer.state_numel()
    else:
        state_numel = sum(
            (v.to_local() if hasattr(v, "to_local") else v).numel()
            for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0
        )  # fmt: skip
    return ShardedResult(losses, parameters, [], state_numel, local_numel)
