"""Tensor parallelism: one layer's weight matrix split over ranks (Megatron-LM's MLP).

Shoeybi et al. (2019, "Megatron-LM") split a transformer MLP ``y = W2 gelu(W1 x)`` so that it
needs one all-reduce forward and one backward:

* :class:`ColumnParallelLinear` splits ``W1`` by output features (rows of the ``(out, in)``
  weight): rank ``r`` computes its slice of the hidden units from the whole input. GELU acts
  element-wise, so it runs on the slice without talking to anyone.
* :class:`RowParallelLinear` splits ``W2`` by input features: rank ``r`` multiplies its hidden
  slice by its columns of ``W2``, giving a *partial sum* of the output; an all-reduce adds them.

In autograd this is two conjugate operators: ``f`` (identity forward, all-reduce of the input's
gradient backward) in front of the column layer, and ``g`` (all-reduce forward, identity
backward) after the row layer. Uneven splits are fine: a rank's slice is ``tensor_split``'s.
Every layer takes an optional ``group`` (default: all ranks), the tensor-parallel ranks of a
layout with several axes (:mod:`trainfast.distributed.mesh`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainfast.distributed.collectives import ring_all_reduce
from trainfast.distributed.launch import rank_device
from trainfast.validation import check_int

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallelMLP",
    "copy_to_tensor_parallel",
    "reduce_from_tensor_parallel",
    "shard_range",
    "tensor_parallel_worker",
]


class _CopyToTensorParallel(torch.autograd.Function):
    """``f``: every rank uses the whole input; their input-gradients are partial, so add them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        ring_all_reduce(grad, op="sum", group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """``g``: add the ranks' partial outputs; each rank's share gets the whole gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        x = x.contiguous().clone()
        ring_all_reduce(x, op="sum", group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tensor_parallel(
    x: torch.Tensor, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Megatron's ``f``: identity forward, all-reduce (sum) of the gradient backward."""
    return _CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(
    x: torch.Tensor, group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """Megatron's ``g``: all-reduce (sum) forward, identity backward."""
    return _ReduceFromTensorParallel.apply(x, group)


def shard_range(size: int, rank: int, world_size: int) -> slice:
    """This rank's part of ``range(size)``, as ``torch.tensor_split`` cuts it.

    The one rule by which tensor parallelism (here) and sequence parallelism
    (:mod:`trainfast.distributed.sequence_parallel`) give each rank its output features, input
    features or attention heads: the first ``size % world_size`` ranks get one more.
    """
    check_int("size", size, minimum=0)
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0, maximum=world_size - 1)  # -1 would slice the last
    bounds = [len(part) for part in torch.arange(size).tensor_split(world_size)]
    start = sum(bounds[:rank])
    return slice(start, start + bounds[rank])


class ColumnParallelLinear(nn.Module):
    """``y[:, slice_r] = x @ W[slice_r].T + b[slice_r]``: this rank's output features only."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        world_size: int,
        bias: bool = True,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.group = group
        self.features = shard_range(out_features, rank, world_size)
        local = self.features.stop - self.features.start
        self.weight = nn.Parameter(torch.empty(local, in_features))  # (out / N, in)
        self.bias = nn.Parameter(torch.zeros(local)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out / N)
        return nn.functional.linear(copy_to_tensor_parallel(x, self.group), self.weight, self.bias)

    @classmethod
    def from_dense(
        cls,
        linear: nn.Linear,
        rank: int,
        world_size: int,
        group: dist.ProcessGroup | None = None,
    ) -> ColumnParallelLinear:
        layer = cls(
            linear.in_features,
            linear.out_features,
            rank,
            world_size,
            linear.bias is not None,
            group,
        )
        with torch.no_grad():
            layer.weight.copy_(linear.weight[layer.features])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias[layer.features])
        return layer


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_r @ W[:, slice_r].T) + b``: a partial product per rank, then a sum."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        rank: int,
        world_size: int,
        bias: bool = True,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.group = group
        self.features = shard_range(in_features, rank, world_size)
        local = self.features.stop - self.features.start
        self.weight = nn.Parameter(torch.empty(out_features, local))  # (out, in / N)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None  # added once

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in / N) -> (..., out)
        y = reduce_from_tensor_parallel(nn.functional.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias

    @classmethod
    def from_dense(
        cls,
        linear: nn.Linear,
        rank: int,
        world_size: int,
        group: dist.ProcessGroup | None = None,
    ) -> RowParallelLinear:
        layer = cls(
            linear.in_features,
            linear.out_features,
            rank,
            world_size,
            linear.bias is not None,
            group,
        )
        with torch.no_grad():
            layer.weight.copy_(linear.weight[:, layer.features])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer


class TensorParallelMLP(nn.Module):
    """Column-parallel linear, GELU, row-parallel linear: one all-reduce each way."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear) -> None:
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, d_model) -> (batch, d_model)
        return self.fc2(nn.functional.gelu(self.fc1(x)))  # hidden: (batch, d_hidden / N)

    @classmethod
    def from_dense(
        cls,
        mlp: nn.Sequential,
        rank: int,
        world_size: int,
        group: dist.ProcessGroup | None = None,
    ) -> TensorParallelMLP:
        """Shard a dense ``Sequential(Linear, GELU, Linear)``: rank ``r`` keeps its slices.

        ``rank`` and ``world_size`` are within ``group``, the tensor-parallel ranks.
        """
        fc1, _, fc2 = mlp
        return cls(
            ColumnParallelLinear.from_dense(fc1, rank, world_size, group),
            RowParallelLinear.from_dense(fc2, rank, world_size, group),
        )


def tensor_parallel_worker(
    rank: int, world_size: int, d_model: int = 16, d_hidden: int = 40, batch: int = 8, seed: int = 0
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Run a dense MLP and its tensor-parallel shards on the same input and upstream gradient.

    Returns ``name -> (tensor-parallel value, dense value)`` for the output, the input gradient
    and this rank's slice of every weight and bias gradient; they should be equal.
    """
    torch.manual_seed(seed)  # the same dense layer, input and upstream gradient on every rank
    dense = nn.Sequential(nn.Linear(d_model, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_model))
    x = torch.randn(batch, d_model)
    upstream = torch.randn(batch, d_model)
    device = rank_device()  # its own GPU under NCCL, else the CPU
    dense, x, upstream = dense.to(device), x.to(device), upstream.to(device)
    parallel = TensorParallelMLP.from_dense(dense, rank, world_size)

    x_dense, x_parallel = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_dense, y_parallel = dense(x_dense), parallel(x_parallel)
    (y_dense * upstream).sum().backward()
    (y_parallel * upstream).sum().backward()

    fc1, fc2 = dense[0], dense[2]
    hidden = parallel.fc1.features
    pairs = {
        "output": (y_parallel.detach(), y_dense.detach()),
        "input grad": (x_parallel.grad, x_dense.grad),
        "fc1.weight grad": (parallel.fc1.weight.grad, fc1.weight.grad[hidden]),
        "fc1.bias grad": (parallel.fc1.bias.grad, fc1.bias.grad[hidden]),
        "fc2.weight grad": (parallel.fc2.weight.grad, fc2.weight.grad[:, hidden]),
        "fc2.bias grad": (parallel.fc2.bias.grad, fc2.bias.grad),
    }
    return {name: (ours.cpu(), theirs.cpu()) for name, (ours, theirs) in pairs.items()}
