"""Parallel training from first principles: collectives, data, tensor and pipeline parallelism.

Everything runs on one CPU as several gloo processes (and on GPUs with NCCL): :func:`spawn`
starts the ranks; :mod:`~trainfast.distributed.collectives` builds every collective from
``send``/``recv``; the other modules build training strategies on top of them, one concept per
module (``data_parallel``, ``zero``, ``tensor_parallel``, ``pipeline``, ``layout``, ...).

The collectives have ``torch.distributed``'s call shape and act in place inside an initialised
process group, e.g. ``ring_all_reduce(tensor, op="mean")``.
"""

from trainfast.distributed.collectives import (
    OPS,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    check_same_tensor_meta,
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
