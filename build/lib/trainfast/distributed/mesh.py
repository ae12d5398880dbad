"""Two axes at once: tensor parallelism within a replica, data parallelism across replicas.

A layout with several axes arranges its ``N = t * d`` ranks in a grid, as PyTorch's
``init_device_mesh(..., (d, t))`` does: rank ``data_rank * t + tensor_rank``,
so the ``t`` tensor-parallel ranks of one replica are neighbours (one node, on NVLink) and the
``d`` replicas of one shard are ``t`` apart. Each axis then talks only inside its own process
group (``dist.new_group``): the tensor-parallel all-reduces inside a row of the grid, the
data-parallel gradient averages down a column. :func:`tensor_data_parallel_worker` trains the
book's tensor-parallel MLP this way and returns every step's loss and every parameter next to
one process's, which should be equal.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainfast.distributed.agreement import rank_and_world_size
from trainfast.distributed.collectives import ring_all_reduce
from trainfast.distributed.launch import rank_device
from trainfast.distributed.tensor_parallel import TensorParallelMLP, shard_range

__all__ = ["Mesh2D", "tensor_data_mesh", "tensor_data_parallel_worker"]


@dataclass(frozen=True)
class Mesh2D:
    """This rank's place in a ``data x tensor`` grid, and the two groups it belongs to."""

    tensor_rank: int
    data_rank: int
    tensor_group: dist.ProcessGroup  # the t ranks that hold the shards of one replica
    data_group: dist.ProcessGroup  # the d ranks that hold the same shard
    tensor_ranks: tuple[int, ...]  # global ranks of tensor_group, in group order
    data_ranks: tuple[int, ...]


def tensor_data_mesh(tensor: int, data: int) -> Mesh2D:
    """Build the tensor- and data-parallel process groups of a ``data x tensor`` grid.

    Every rank must create every group, in the same order (``dist.new_group``'s rule), and keeps
    the two it belongs to. Raises ``ValueError`` unless ``tensor * data`` is the world size.
    """
    rank, world_size = rank_and_world_size()
    if tensor < 1 or data < 1 or tensor * data != world_size:
        raise ValueError(
            f"Invalid layout: tensor={tensor} x data={data} (expected a product of {world_size})"
        )
    groups = {}
    for d in range(data):  # one row per replica: its tensor-parallel ranks, neighbours
        ranks = tuple(d * tensor + t for t in range(tensor))
        groups["tensor", ranks] = dist.new_group(list(ranks))
    for t in range(tensor):  # one column per shard: the replicas, t apart
        ranks = tuple(d * tensor + t for d in range(data))
        groups["data", ranks] = dist.new_group(list(ranks))
    mine = {axis: (ranks, group) for (axis, ranks), group in groups.items() if rank in ranks}
    return Mesh2D(
        tensor_rank=rank % tensor,
        data_rank=rank // tensor,
        tensor_group=mine["tensor"][1],
        data_group=mine["data"][1],
        tensor_ranks=mine["tensor"][0],
        data_ranks=mine["data"][0],
    )


def tensor_data_parallel_worker(
    rank: int,
    world_size: int,
    tensor: int = 2,
    data: int = 2,
    steps: int = 3,
    seed: int = 0,
    d_model: int = 16,
    d_hidden: int = 40,
    batch: int = 8,
) -> dict[str, object]:
    """Train a dense MLP in one process and its ``tensor x data`` shards, ``steps`` SGD steps.

    Returns the losses of both (the sharded one averaged over the replicas), this rank's slice of
    every parameter after training next to the dense model's (``name -> (ours, dense)``), and
    the global ranks of both groups next to those of ``init_device_mesh``'s.
    """
    if batch % data:
        raise ValueError(f"Invalid batch: {batch} (expected a multiple of data={data})")
    torch.manual_seed(seed)  # the same dense model and data on every rank
    dense = nn.Sequential(nn.Linear(d_model, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_model))
    x, y = torch.randn(batch, d_model), torch.randn(batch, d_model)
    device = rank_device()  # NCCL moves only CUDA tensors
    dense, x, y = dense.to(device), x.to(device), y.to(device)
    reference = copy.deepcopy(dense)  # the one-process run
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference_losses = []
    for _ in range(steps):
        reference_optimizer.zero_grad()
        loss = nn.functional.mse_loss(reference(x), y)
        loss.backward()
        reference_optimizer.step()
        reference_losses.append(loss.item())

    mesh = tensor_data_mesh(tensor, data)
    model = TensorParallelMLP.from_dense(dense, mesh.tensor_rank, tensor, mesh.tensor_group)
    rows = shard_range(batch, mesh.data_rank, data)  # this replica's examples
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x[rows]), y[rows])  # all-reduces in tensor_group
        loss.backward()
        for parameter in model.parameters():  # average each shard's gradient over the replicas
            ring_all_reduce(parameter.grad, op="mean", group=mesh.data_group)
        optimizer.step()
        mean_loss = loss.detach().clone()
        ring_all_reduce(mean_loss, op="mean", group=mesh.data_group)
        losses.append(mean_loss.item())

    fc1, fc2, hidden = reference[0], reference[2], model.fc1.features
    pairs = {
        "fc1.weight": (model.fc1.weight, fc1.weight[hidden]),
        "fc1.bias": (model.fc1.bias, fc1.bias[hidden]),
        "fc2.weight": (model.fc2.weight, fc2.weight[:, hidden]),
        "fc2.bias": (model.fc2.bias, fc2.bias),
    }
    from torch.distributed.device_mesh import init_device_mesh

    device_mesh = init_device_mesh(device.type, (data, tensor), mesh_dim_names=("data", "tensor"))
    torch_groups = [device_mesh.get_group(axis) for axis in ("tensor", "data")]
    return {
        "losses": (losses, reference_losses),
        "parameters": {k: (a.detach().cpu(), b.detach().cpu()) for k, (a, b) in pairs.items()},
        "groups": (
            (mesh.tensor_ranks, mesh.data_ranks),
            tuple(tuple(dist.get_process_group_ranks(group)) for group in torch_groups),
        ),
    }
