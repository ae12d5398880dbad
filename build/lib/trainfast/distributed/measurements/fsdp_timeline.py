"""When our FSDP gathers, computes, reduce-scatters and frees each weight: the chapter's timeline.

:class:`FSDPRecorder` times :class:`~trainfast.distributed.fsdp.FSDP` from outside, with hooks
around its own, so ``fsdp.py`` reads as the algorithm. For each module that owns a sharded
weight it adds

* a forward pre-hook *before* FSDP's (the all-gather starts) and one *after* it (the weight is
  whole: compute starts), and a forward hook before FSDP's (compute ends, the free starts) and
  one after it (the weight is freed);
* on the module's output, a gradient hook before FSDP's (the backward all-gather starts) and one
  after it (compute starts);
* on the full weight, a gradient hook (its gradient is computed: the reduce-scatter starts) and
  a post-accumulate hook after FSDP's (reduce-scattered and freed).

Module and tensor hooks run in the order they were registered (``prepend=True`` puts a module
hook first), which is what makes "before" and "after" exact. :func:`fsdp_timeline_worker` is
the chapter's :func:`~trainfast.distributed.spawn` worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainfast.distributed.fsdp import FSDP
from trainfast.timing import timestamp

__all__ = ["FSDPEvent", "FSDPRecorder", "fsdp_timeline_worker"]


@dataclass
class FSDPEvent:
    """One thing that happened to a sharded weight, in ``timestamp()`` seconds."""

    weight: str  # the parameter's name in the wrapped module
    kind: str  # "all-gather", "compute", "reduce-scatter" (backward: and the free) or "free"
    phase: str  # "forward" or "backward"
    start: float
    end: float


@dataclass
class FSDPRecorder:
    """Hooks that note :class:`FSDPEvent` s of ``fsdp``'s sharded weights in ``events``."""

    fsdp: FSDP
    events: list[FSDPEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._hooked: set[int] = set()
        for key in self.fsdp.shards:  # "layer/0/weight" for layer.0.weight
            name = key.replace("/", ".")
            path, attr = name.rpartition(".")[::2]
            owner = self.fsdp.module.get_submodule(path)
            self._watch(owner, attr, name)

    def _note(self, name: str, kind: str, phase: str, marks: dict[str, float], begin: str) -> None:
        self.events.append(FSDPEvent(name, kind, phase, marks[begin], timestamp()))

    def _watch(self, owner: nn.Module, attr: str, name: str) -> None:
        marks: dict[str, float] = {}

        def mark(key: str) -> None:
            marks[key] = timestamp()

        def gather_starts(module: nn.Module, args: tuple) -> None:
            mark("gather")

        def compute_starts(module: nn.Module, args: tuple) -> None:
            self._note(name, "all-gather", "forward", marks, "gather")
            mark("compute")

        def compute_ends(module: nn.Module, args: tuple, output: Any) -> None:
            self._note(name, "compute", "forward", marks, "compute")
            mark("free")
            if torch.is_tensor(output) and output.requires_grad:  # before FSDP's gather hook
                output.register_hook(lambda grad: mark("backward gather"))

        def freed(module: nn.Module, args: tuple, output: Any) -> None:
            self._note(name, "free", "forward", marks, "free")
            if torch.is_tensor(output) and output.requires_grad:  # after FSDP's gather hook
                output.register_hook(lambda grad: backward_compute_starts())
            full = getattr(owner, attr)  # FSDP's full-size tensor, the one autograd saved
            if id(full) not in self._hooked and full.requires_grad:
                self._hooked.add(id(full))
                full.register_hook(lambda grad: reduce_starts())
                full.register_post_accumulate_grad_hook(lambda full: reduced())

        def backward_compute_starts() -> None:
            self._note(name, "all-gather", "backward", marks, "backward gather")
            mark("backward compute")

        def reduce_starts() -> None:
            self._note(name, "compute", "backward", marks, "backward compute")
            mark("reduce")

        def reduced() -> None:
            self._note(name, "reduce-scatter", "backward", marks, "reduce")

        owner.register_forward_pre_hook(gather_starts, prepend=True)
        owner.register_forward_pre_hook(compute_starts)
        owner.register_forward_hook(compute_ends, prepend=True)
        owner.register_forward_hook(freed)


def fsdp_timeline_worker(
    rank: int, world_size: int, width: int = 256, depth: int = 4, prefetch: bool = False
) -> list[FSDPEvent]:
    """One training step of an MLP under :class:`~trainfast.distributed.fsdp.FSDP`, recorded by
    an :class:`FSDPRecorder`: its events, in seconds since the step began (after a warm-up)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [nn.Linear(width, width, bias=False) for _ in range(depth)]
    fsdp = FSDP(nn.Sequential(*layers), prefetch=prefetch)
    recorder = FSDPRecorder(fsdp)
    x = torch.randn(64, width)
    for _ in range(2):  # the first step learns the order of the layers (for prefetching)
        recorder.events.clear()
        dist.barrier()
        start = timestamp()
        fsdp(x).pow(2).mean().backward()
        fsdp.finish_gradient_synchronization()
    return [
        FSDPEvent(e.weight, e.kind, e.phase, e.start - start, e.end - start)
        for e in recorder.events
    ]
