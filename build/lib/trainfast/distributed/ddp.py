"""Our own ``DistributedDataParallel``: gradient all-reduces overlapped with the backward pass.

:func:`~trainfast.distributed.data_parallel.average_gradients` waits for the whole backward pass
and then all-reduces one gradient at a time. :class:`DDP` does what
``torch.nn.parallel.DistributedDataParallel`` does (Li et al., 2020, "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training"):

1. At construction it broadcasts rank 0's parameters and buffers, so every replica starts equal.
2. It groups the parameters into *buckets* in reverse registration order (the order backward
   produces their gradients), ``bucket_cap_mb`` each (torch's name); ``None`` gives every
   parameter its own (in torch's DDP ``None`` means its default, 25 MiB).
3. A hook on every parameter (``Tensor.register_post_accumulate_grad_hook``) fires when backward
   has finished that gradient. When a bucket's last gradient arrives, its gradients are copied
   into one flat buffer and an *asynchronous* all-reduce starts, while backward goes on
   computing the earlier layers' gradients.
4. :meth:`DDP.finish_gradient_synchronization`, called after ``loss.backward()``, waits for the
   all-reduces and writes the averaged gradients back.

**Gradient accumulation.** Several backward passes before one optimizer step work as in torch's
DDP. Without a switch, every backward all-reduces: the next ``forward`` first finishes the
previous backward's synchronisation (as torch's reducer does when its backward ends), so the
gradients autograd adds to are already the mean, and the mean of ``mean + local`` is the mean of
both micro-batches. Under :meth:`DDP.no_sync` the hooks do nothing and the gradients add up
locally; the first backward outside it all-reduces their sum, so ``k`` micro-batches cost one
round of all-reduces. A second backward with no ``forward`` and no
``finish_gradient_synchronization`` in between is refused: its hooks would relaunch buckets
whose first all-reduce is still in flight.

Parameters with ``requires_grad=False`` get no hook and are never sent. A parameter that got no
gradient this step (a branch the forward pass skipped) leaves its bucket incomplete; the bucket
is sent in ``finish_gradient_synchronization`` and the parameter's gradient stays ``None``, as
in one process. That must be true on all ranks alike (torch needs ``find_unused_parameters`` for
the rest). Tied weights are one parameter (``module.parameters()`` lists it once), so one hook
fires after both uses have accumulated into it.

``overlap=False`` launches the same buckets only in ``finish_gradient_synchronization``: the
synchronous baseline the chapter measures the overlap against. :meth:`DDP.register_comm_hook`
replaces the all-reduce of a bucket, as torch's DDP's does (the chapter's timeline uses it to
note when each bucket travels, from outside the algorithm).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DDP", "CommHook", "all_reduce_bucket"]

#: ``hook(bucket_index, flat_gradients) -> work``: start summing the bucket's flat gradients
#: over ranks, in place, and return the asynchronous handle (``work.wait()``).
CommHook = Callable[[int, torch.Tensor], Any]


def all_reduce_bucket(index: int, buffer: torch.Tensor) -> Any:
    """The default :data:`CommHook`: an asynchronous sum over ranks of the bucket, in place."""
    return dist.all_reduce(buffer, async_op=True)


@dataclass
class _Bucket:
    index: int
    params: list[nn.Parameter]
    buffer: torch.Tensor  # (sum of numel,), the flat gradients on the wire
    ready: set[int] = field(default_factory=set)  # ids of parameters whose gradient is final
    work: Any = None  # the asynchronous all-reduce, once launched


class DDP(nn.Module):
    """Data parallelism with bucketed, asynchronous gradient all-reduces during backward.

    ``ddp = DDP(model, bucket_cap_mb=25)``; then each step ``loss = f(ddp(x))``,
    ``loss.backward()``, ``ddp.finish_gradient_synchronization()``, ``optimizer.step()``. Use
    inside an initialised process group. To accumulate ``k`` micro-batches, run the first
    ``k - 1`` forward and backward passes under ``with ddp.no_sync():`` (or not: see the module's
    docstring), then finish once.
    """

    def __init__(
        self, module: nn.Module, *, bucket_cap_mb: float | None = None, overlap: bool = True
    ) -> None:
        super().__init__()
        if bucket_cap_mb is not None and not bucket_cap_mb > 0:
            raise ValueError(f"Invalid bucket_cap_mb: {bucket_cap_mb!r} (expected > 0 or None)")
        if not dist.is_initialized():
            raise RuntimeError("DDP needs an initialised process group (run under spawn)")
        self.module = module
        self.overlap = overlap
        self.world_size = dist.get_world_size()
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=0)
        trainable = [p for p in module.parameters() if p.requires_grad]  # tied weights once
        self.buckets = self._make_buckets(trainable[::-1], bucket_cap_mb)
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.comm_hook: CommHook = all_reduce_bucket
        self.require_gradient_sync = True  # False under no_sync(): the hooks only accumulate
        for p in trainable:
            p.register_post_accumulate_grad_hook(self._on_gradient_ready)

    @staticmethod
    def _make_buckets(params: list[nn.Parameter], bucket_cap_mb: float | None) -> list[_Bucket]:
        """Consecutive parameters (already in reverse order) until a bucket reaches its size."""
        groups: list[list[nn.Parameter]] = []
        limit = float("inf") if bucket_cap_mb is None else bucket_cap_mb * 2**20
        size = limit  # start a new group at the first parameter
        for p in params:
            nbytes = p.numel() * p.element_size()
            if bucket_cap_mb is None or size >= limit or p.dtype != groups[-1][0].dtype:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += nbytes
        buckets = []
        for i, group in enumerate(groups):
            numel = sum(p.numel() for p in group)
            flat = torch.zeros(numel, dtype=group[0].dtype, device=group[0].device)
            buckets.append(_Bucket(i, group, flat))
        return buckets

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward, after finishing a previous backward's synchronisation (gradient
        accumulation without :meth:`no_sync`): the gradients this backward adds to are the
        mean."""
        if any(bucket.ready or bucket.work is not None for bucket in self.buckets):
            self.finish_gradient_synchronization()
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients locally (torch's DDP's switch); the
        first backward after it all-reduces the sum."""
        previous, self.require_gradient_sync = self.require_gradient_sync, False
        try:
            yield
        finally:
            self.require_gradient_sync = previous

    def register_comm_hook(self, hook: CommHook) -> None:
        """Send every bucket with ``hook`` instead of :func:`all_reduce_bucket` (which it may
        call): to compress gradients, or to note when each bucket travels."""
        self.comm_hook = hook

    def _on_gradient_ready(self, p: nn.Parameter) -> None:
        if not self.require_gradient_sync:
            return
        bucket = self._bucket_of[id(p)]
        if id(p) in bucket.ready:
            raise RuntimeError(
                f"DDP: a second backward reached bucket {bucket.index} before its gradients were "
                "synchronised; run a forward or finish_gradient_synchronization() between "
                "backward passes, or accumulate under no_sync()"
            )
        bucket.ready.add(id(p))
        if self.overlap and len(bucket.ready) == len(bucket.params):
            self._launch(bucket)

    def _launch(self, bucket: _Bucket) -> None:
        """Flatten the bucket's gradients (zeros where none came) and start the all-reduce."""
        offset = 0
        for p in bucket.params:
            view = bucket.buffer[offset : offset + p.numel()]
            view.copy_(p.grad.reshape(-1)) if p.grad is not None else view.zero_()
            offset += p.numel()
        bucket.work = self.comm_hook(bucket.index, bucket.buffer)

    def finish_gradient_synchronization(self) -> None:
        """Send what is still unsent, wait for every bucket, write back the mean gradients."""
        for bucket in self.buckets:  # incomplete buckets (unused parameters), or overlap=False
            if bucket.work is None and bucket.ready:
                self._launch(bucket)
        for bucket in self.buckets:
            if bucket.work is None:
                continue  # no parameter of this bucket got a gradient on this step
            bucket.work.wait()
            bucket.buffer.div_(self.world_size)
            offset = 0
            for p in bucket.params:
                if id(p) in bucket.ready:
                    p.grad.copy_(bucket.buffer[offset : offset + p.numel()].view_as(p.grad))
                offset += p.numel()
            bucket.work = None
            bucket.ready.clear()
