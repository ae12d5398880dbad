"""TF32 on and off, through whichever API the installed torch has.

PyTorch 2.9 introduced per-backend precision settings: ``torch.backends.cuda.matmul.fp32_precision``
(``"tf32"`` or ``"ieee"``; ``"none"`` inherits ``torch.backends.fp32_precision``) and
``torch.backends.cudnn.conv.fp32_precision`` for convolutions. It also refuses to read the old
flags (``torch.backends.cuda.matmul.allow_tf32``, ``torch.get_float32_matmul_precision()``) once
the new ones were set, so a program should use one API throughout (PyTorch, "CUDA semantics",
section "TensorFloat-32 (TF32) on Ampere (and later) devices"). :func:`tf32_matmuls` uses the new
setting where it exists and ``allow_tf32`` on older torch (2.4 to 2.8), and restores the previous
value on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["has_fp32_precision_api", "tf32_matmuls"]


def has_fp32_precision_api() -> bool:
    """True if this torch has ``torch.backends.cuda.matmul.fp32_precision`` (torch 2.9+)."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


@contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """Within the block, float32 CUDA matmuls run in TF32 (``enabled``) or in IEEE float32.

    New API: ``torch.backends.cuda.matmul.fp32_precision = "tf32"`` or ``"ieee"``; old API:
    ``torch.backends.cuda.matmul.allow_tf32``. Has no effect on CPU matmuls.
    """
    matmul = torch.backends.cuda.matmul
    if has_fp32_precision_api():
        previous = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = previous
    else:
        previous_flag = matmul.allow_tf32
        matmul.allow_tf32 = enabled
        try:
            yield
        finally:
            matmul.allow_tf32 = previous_flag
