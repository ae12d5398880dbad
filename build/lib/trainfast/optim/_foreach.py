"""Split parallel tensor lists by device and dtype, for the ``torch._foreach_*`` paths.

On a GPU, a ``torch._foreach_*`` op launches one fused kernel per list only when every tensor in
it is on the same device with the same dtype; otherwise it silently falls back to a loop of
ordinary ops (on a CPU every ``torch._foreach_*`` op is such a loop). A model with, say,
bfloat16 weights and float32 norms therefore runs the fast path once per (device, dtype) bucket.
``torch.optim`` does the same with a private helper
(``Optimizer._group_tensors_by_device_and_dtype``); this is the public-API version.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["group_by_device_and_dtype"]


def group_by_device_and_dtype(
    *tensor_lists: Sequence[Tensor | None],
) -> list[tuple[list[list[Tensor | None]], list[int]]]:
    """Bucket the parallel ``tensor_lists`` by the device and dtype of the first list's tensors.

    Returns one ``(lists, indices)`` pair per bucket: ``lists[k]`` holds the bucket's entries of
    ``tensor_lists[k]`` and ``indices`` their positions in the original lists (to write new state
    back). An empty list (a state the configuration does not keep, such as ``max_exp_avg_sqs``
    without amsgrad) stays empty in every bucket.
    """
    buckets: dict[tuple[torch.device, torch.dtype], tuple[list[list[Tensor | None]], list[int]]]
    buckets = {}
    for i, tensor in enumerate(tensor_lists[0]):
        if tensor is None:
            raise ValueError(f"The first tensor list has None at position {i}")
        key = (tensor.device, tensor.dtype)
        if key not in buckets:
            buckets[key] = ([[] for _ in tensor_lists], [])
        lists, indices = buckets[key]
        for bucket_list, source in zip(lists, tensor_lists, strict=True):
            if len(source) > 0:
                bucket_list.append(source[i])
        indices.append(i)
    return list(buckets.values())
