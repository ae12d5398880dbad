"""What PyTorch counts while a step runs: the measurements :mod:`trainfast.accounting` is tested
against (FLOPs by ``FlopCounterMode``, activation bytes by autograd's saved-tensor hooks).

Both are re-exported by :mod:`trainfast.accounting`, which is where a reader meets them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["counted_flops", "saved_tensor_bytes"]


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
