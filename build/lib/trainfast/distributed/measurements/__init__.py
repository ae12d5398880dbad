"""Measurements of the distributed algorithms: what the chapter's timelines and records show.

The algorithms themselves are in :mod:`trainfast.distributed`; these modules time them from the
outside (hooks and the package's one timer) and write records for ``python -m
trainfast.measure``:

* :mod:`~trainfast.distributed.measurements.all_reduce`: all-reduce time by algorithm and size;
* :mod:`~trainfast.distributed.measurements.ddp_overlap`: when DDP's buckets travel, and what
  overlapping them with backward buys;
* :mod:`~trainfast.distributed.measurements.fsdp_timeline`: when FSDP gathers, computes,
  reduce-scatters and frees each weight;
* :mod:`~trainfast.distributed.measurements.launchers`: how our launcher and PyTorch's fail
  (and how torchrun restarts).
"""

__all__: list[str] = []
