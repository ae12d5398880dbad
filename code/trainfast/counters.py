"""What PyTorch counts while a step runs: the measurements :mod:`trainfast.accounting` is tested
against (FLOPs by ``FlopCounterMode``, activation bytes by autograd's saved-tensor hooks, the
peak of allocated bytes by the profiler's allocation events).

All three are re-exported by :mod:`trainfast.accounting`, which is where a reader meets them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["counted_flops", "peak_allocated_bytes", "saved_tensor_bytes"]


def counted_flops(fn: Callable[[], object]) -> int:
    """FLOPs that ``torch.utils.flop_counter.FlopCounterMode`` counts while ``fn()`` runs.

    It counts matmuls, convolutions and attention kernels it has formulas for, on any device,
    from shapes alone; ``fn`` typically runs a forward and ``.backward()``.
    """
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def saved_tensor_bytes(fn: Callable[[], object], *, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn()`` runs.

    Measured with ``torch.autograd.graph.saved_tensors_hooks``: every tensor an operation saves
    passes through the pack hook. Views share a storage and count once, at the storage's full
    size (that is what stays allocated); storages of ``exclude`` (pass the model's parameters
    and buffers: they are not activations) are skipped. Run only the forward (and loss) in
    ``fn``; the saved tensors stay alive until the function returns, so no address is reused.
    """
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    sizes: dict[int, int] = {}
    alive: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in excluded:
            sizes[storage.data_ptr()] = storage.nbytes()
        alive.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    alive.clear()
    return sum(sizes.values())


def peak_allocated_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """The most bytes ``fn()`` had allocated on ``device`` at once beyond what was live before.

    On any device what ``torch.cuda.max_memory_allocated`` is on a GPU, less the bytes live
    before: every allocation and free of the device's allocator, in the order they happened,
    from ``torch.profiler`` with ``profile_memory=True`` (the allocation events of its event
    tree; ``profile().events()`` folds those inside an operator into the operator). Frees of
    tensors allocated before ``fn`` count, so the running sum can go below zero; the peak is at
    least 0. Kernels' own scratch buffers count, as they do on a GPU; the caching allocator's
    rounding does not. Slow: use it on small models, in tests.

    The garbage collector runs before ``fn`` and not during it, so the peak is the one
    reference counting alone gives, not one that depends on when a collection happens to free a
    reference cycle's tensors (in a checkpointed backward that lowered the peak by up to a third
    of an activation in 10 runs of 60).
    """
    import gc

    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with profile(activities=activities, profile_memory=True) as profiler:
            fn()
    finally:
        if enabled:
            gc.enable()
    events, stack = [], list(profiler.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == device.type:
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return peak
