"""PyTorch's own parallelism APIs beside ours, on one model, with parity.

The chapter builds each strategy from send/recv; production code calls PyTorch's:

* **tensor parallelism**: a ``DeviceMesh`` (the ranks, arranged in named dimensions) and
  ``parallelize_module`` with ``ColwiseParallel``/``RowwiseParallel`` plans; the weights become
  ``DTensor`` objects (a local shard plus its placement on the mesh);
* **pipeline parallelism**: ``torch.distributed.pipelining``'s ``PipelineStage`` and a schedule
  (``ScheduleGPipe``, ``Schedule1F1B``, ...);
* **fully sharded data parallelism**: ``fully_shard`` (FSDP2), parameters as ``DTensor`` shards.

:func:`torch_apis_worker` applies each to the pipeline chapter's model
(:func:`~trainfast.distributed.pipeline.make_pipeline_model`: ``Linear + tanh`` blocks) and
compares with one process, and with our own implementation where the package has one
(:class:`~trainfast.distributed.tensor_parallel.ColumnParallelLinear` and
:class:`~trainfast.distributed.tensor_parallel.RowParallelLinear` for tensor parallelism,
:func:`~trainfast.distributed.pipeline.pipeline_worker` for GPipe). These APIs are imported
lazily, so the package still imports on a torch that lacks them (they settled in torch 2.4-2.6);
all three run on CPU with gloo in torch 2.14.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from trainfast.distributed.launch import rank_device
from trainfast.distributed.pipeline import (
    PipelineConfig,
    make_pipeline_model,
    pipeline_batch,
    pipeline_worker,
)
from trainfast.distributed.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from trainfast.versions import parse_version

__all__ = [
    "fully_shard_api",
    "torch_apis_worker",
    "torch_fully_shard",
    "torch_pipelining",
    "torch_tensor_parallel",
]


def _linears(model: nn.Sequential) -> list[tuple[str, nn.Linear]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def _loss(output: Tensor, target: Tensor) -> Tensor:
    return F.mse_loss(output, target)  # mean over the batch: the pipeline chapter's loss


def _require_tensor_parallel_api() -> None:
    """Refuse torch 2.4, whose tensor-parallel API fails on the pipeline model's linears."""
    if parse_version(torch.__version__) < (2, 5):
        raise RuntimeError(
            f"torch {torch.__version__}'s tensor-parallel API cannot shard these linears (its plan "
            "walk applies ColwiseParallel to a Sequential, and DTensor's addmm sharding raises an "
            "IndexError); the package's tests run it on torch 2.11 and 2.14"
        )


def torch_tensor_parallel(model: nn.Sequential, world_size: int) -> nn.Sequential:
    """Megatron pairs with ``parallelize_module``: linears 1, 3, ... by column, the next by row."""
    _require_tensor_parallel_api()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(rank_device().type, (world_size,), mesh_dim_names=("tp",))
    names = [name for name, _ in _linears(model)]
    plan = {
        name: ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i, name in enumerate(names)
    }
    return parallelize_module(model, mesh, plan)


def torch_pipelining(stage_module: nn.Module, rank: int, world_size: int, n_micro: int) -> object:
    """A GPipe schedule over ``world_size`` stages; this rank runs ``stage_module``."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage = PipelineStage(
        stage_module, stage_index=rank, num_stages=world_size, device=rank_device()
    )
    # scale_grads: divide by n_micro, so micro-batch means add up to the full batch's mean
    return ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=_loss, scale_grads=True)


def fully_shard_api() -> tuple[Any, Any]:
    """``(fully_shard, MixedPrecisionPolicy)``, from where this torch keeps them."""
    try:  # torch >= 2.6
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.4 and 2.5
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def torch_fully_shard(model: nn.Sequential) -> nn.Sequential:
    """FSDP2: each linear its own unit (gathered just before use), then the whole model.

    The mesh is explicit, on :func:`~trainfast.distributed.launch.rank_device`: without one,
    ``fully_shard`` builds its own on the machine's accelerator and moves the parameters there,
    even when the ranks are gloo processes on the CPU.
    """
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, _ = fully_shard_api()
    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    for _, linear in _linears(model):
        fully_shard(linear, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _full(t: Tensor) -> Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu()


def torch_apis_worker(
    rank: int, world_size: int, config: PipelineConfig
) -> dict[str, dict[str, float]]:
    """Each API on ``make_pipeline_model(config, world_size)``; the largest differences.

    Returns ``api -> {"vs one process": ..., "vs ours": ...}``: the largest absolute difference
    of the loss and every parameter gradient (``"vs ours"`` where the package has its own).
    ``config.layers_per_stage`` must be even (linears pair up for tensor parallelism).
    """
    if config.layers_per_stage % 2:
        raise ValueError(f"Invalid layers_per_stage: {config.layers_per_stage} (must be even)")
    device = rank_device()
    x, y = (t.to(device) for t in pipeline_batch(config))
    reference = make_pipeline_model(config, world_size).to(device)
    reference_loss = _loss(reference(x), y)
    reference_loss.backward()
    grads = {name: p.grad.detach().cpu() for name, p in reference.named_parameters()}

    def gap(loss: float, named: dict[str, Tensor], against: dict[str, Tensor]) -> float:
        worst = abs(loss - reference_loss.item())
        return max(worst, *((named[n] - against[n]).abs().max().item() for n in named))

    results = {}
    # tensor parallelism: DTensor and parallelize_module, against ours and one process
    dtensor = torch_tensor_parallel(make_pipeline_model(config, world_size).to(device), world_size)
    loss = _loss(dtensor(x), y)
    loss.backward()
    theirs = {name: _full(p.grad) for name, p in dtensor.named_parameters()}
    ours_model = make_pipeline_model(config, world_size).to(device)
    for i, (name, linear) in enumerate(_linears(ours_model)):
        parent, child = name.rsplit(".", 1)
        layer = ColumnParallelLinear if i % 2 == 0 else RowParallelLinear
        setattr(ours_model.get_submodule(parent), child, layer.from_dense(linear, rank, world_size))
    ours_loss = _loss(ours_model(x), y)
    ours_loss.backward()
    ours_vs_dense = 0.0
    for i, (name, linear) in enumerate(_linears(reference)):
        layer = ours_model.get_submodule(name)
        rows = layer.features if i % 2 == 0 else slice(None)
        cols = slice(None) if i % 2 == 0 else layer.features
        ours_vs_dense = max(
            ours_vs_dense,
            (layer.weight.grad.cpu() - linear.weight.grad[rows][:, cols].cpu()).abs().max().item(),
        )
    results["DTensor + parallelize_module"] = {
        "vs one process": gap(loss.item(), theirs, grads),
        "vs ours": max(abs(loss.item() - ours_loss.item()), ours_vs_dense),
    }

    # pipelining: torch's GPipe against our pipeline_worker (same model, same micro-batches)
    stage_module = make_pipeline_model(config, world_size)[rank].to(device)
    schedule = torch_pipelining(stage_module, rank, world_size, config.n_micro)
    losses: list[Tensor] = []
    if rank == 0 and world_size == 1:
        schedule.step(x, target=y, losses=losses)
    elif rank == 0:
        schedule.step(x)
    elif rank == world_size - 1:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    theirs = {
        f"{rank}.{name}": p.grad.detach().cpu() for name, p in stage_module.named_parameters()
    }
    ours = pipeline_worker(rank, world_size, replace(config, schedule="gpipe")).grads
    ours = {f"{rank}.{name}": grad for name, grad in ours.items()}
    loss_gap = (
        abs(sum(micro.item() for micro in losses) / config.n_micro - reference_loss.item())
        if losses
        else 0.0
    )
    results["torch.distributed.pipelining"] = {
        "vs one process": max(
            loss_gap, *((theirs[n] - grads[n]).abs().max().item() for n in theirs)
        ),
        "vs ours": max((theirs[n] - ours[n]).abs().max().item() for n in theirs),
    }

    # fully_shard: each rank its share of the batch; the gradients averaged over ranks
    fsdp = torch_fully_shard(make_pipeline_model(config, world_size).to(device))
    mine = slice(rank * len(x) // world_size, (rank + 1) * len(x) // world_size)
    loss = _loss(fsdp(x[mine]), y[mine])  # FSDP averages: the mean of equal shards' means
    loss.backward()
    theirs = {name: _full(p.grad) for name, p in fsdp.named_parameters()}
    results["fully_shard"] = {"vs one process": gap(reference_loss.item(), theirs, grads)}
    return results
