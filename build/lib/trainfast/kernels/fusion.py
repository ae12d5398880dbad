"""Fusion's running example: RMSNorm, whose eager autograd keeps twice the bytes a compiler keeps.

RMSNorm (Zhang and Sennrich, 2019) scales each row by the inverse of its root mean square:
``y = x / sqrt(mean(x²) + eps) · w``. Written in PyTorch it dispatches six operations (``pow``,
``mean``, ``add``, ``rsqrt`` and two ``mul``; :func:`dispatched_operations` lists them), and
eager autograd saves, for each one, the inputs its backward formula needs: ``x`` (for ``pow``
and the first ``mul``), ``1/rms`` (twice), ``x · 1/rms`` and ``w``, two distinct tensors the size
of ``x``. A compiler that sees the whole function (``torch.compile``: AOTAutograd traces
forward and backward together, and its min-cut partitioner chooses what to keep) saves ``x``,
``w`` and the per-row ``1/rms`` and recomputes the rest in the backward kernel: about half the
bytes. The chapter counts both with :func:`trainfast.counters.saved_tensor_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from trainfast.validation import check_number

__all__ = ["dispatched_operations", "rms_norm"]

#: Operations autograd dispatches for its own bookkeeping, not computations of the function
_BOOKKEEPING = {"aten.detach.default", "aten.alias.default"}


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """RMSNorm over the last dimension: ``x`` (..., d), ``weight`` (d,)."""

    check_number("eps", eps, above=0.0)
    inverse_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
    return x * inverse_rms * weight


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.operations: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if str(func) not in _BOOKKEEPING:
            self.operations.append(str(func))
        return func(*args, **(kwargs or {}))


def dispatched_operations(fn: Callable[..., object], *args: Any) -> list[str]:
    """The ATen operations ``fn(*args)`` dispatches in eager mode, in order (e.g.
    ``"aten.mean.dim"``): each is one kernel launch and one round trip through memory. Autograd's
    own ``detach``/``alias`` calls are left out. Uses a ``TorchDispatchMode``, the hook
    PyTorch's own ``FlopCounterMode`` and fake tensors use."""
    with _Recorder() as recorder:
        fn(*args)
    return recorder.operations
