"""Parallel training from first principles: collectives, data, tensor and pipeline parallelism.

Everything runs on one CPU as several gloo processes (and on GPUs with NCCL): :func:`spawn`
starts the ranks; :mod:`~trainfast.distributed.collectives` builds every collective from
``send``/``recv``; the other modules here are the algorithms built on them, one concept per
module (``data_parallel``, ``ddp``, ``zero``, ``fsdp``, ``tensor_parallel``, ``pipeline``, ...),
with :mod:`~trainfast.distributed.strategy` giving every data-parallel one the same interface
and one training loop, and ``cost_model`` and ``layout`` planning them. Two subpackages hold
the rest: :mod:`~trainfast.distributed.parity` (workers that check each algorithm against its
reference) and :mod:`~trainfast.distributed.measurements` (timelines and benchmark records).

The collectives have ``torch.distributed``'s call shape and act in place inside an initialised
process group, e.g. ``ring_all_reduce(tensor, op="mean")``.
"""

from trainfast.distributed.agreement import OPS, check_same_tensor_meta
from trainfast.distributed.collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    ring_all_reduce,
    ring_chunks,
    ring_shift,
    scatter,
)
from trainfast.distributed.ddp import DDP
from trainfast.distributed.fsdp import FSDP
from trainfast.distributed.launch import (
    SpawnError,
    default_backend,
    init_from_env,
    rank_device,
    spawn,
)

__all__ = [
    "DDP",
    "FSDP",
    "OPS",
    "SpawnError",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "check_same_tensor_meta",
    "default_backend",
    "gather",
    "init_from_env",
    "rank_device",
    "reduce",
    "reduce_scatter",
    "ring_all_reduce",
    "ring_chunks",
    "ring_shift",
    "scatter",
    "spawn",
]
