"""A fused softmax in Triton, one row per program, beside its reference ``torch.softmax``.

The kernel of Triton's fused-softmax tutorial (``python/tutorials/02-fused-softmax.py``) in
its first form: each program loads one row into registers, subtracts the row's maximum,
exponentiates, sums and divides, and writes the row back. The row is read from memory once and
written once; the same softmax as five eager PyTorch ops (max, subtract, exp, sum, divide)
reads 5MN + 2M elements of an M × N input and writes 3MN + 2M (the tutorial's current count;
its first form counted 7MN read), about four times the traffic. It is the standard
memory-bound Triton kernel with a reduction: its speed is bandwidth, and its yardstick is the
copy of :mod:`~trainfast.kernels.elementwise`. The tutorial's current version launches fewer,
persistent programs that stride over the rows (as many as the compiled kernel's registers and
shared memory let the SMs hold); one row per program is the form it started from, and the
simplest.

A whole row lives in one block: ``BLOCK_SIZE`` is the next power of two at or above the row's
length, and the lanes past the end are masked (their loads read ``-inf``, which ``exp`` turns
into 0). That bounds the row (:data:`MAX_SOFTMAX_COLUMNS`); a longer row needs the online
softmax of :mod:`trainfast.kernels.softmax`, which walks a row in blocks. Arithmetic is float32
whatever the input's dtype; offsets are int64, so ``row × stride`` may pass 2**31.

When not to use it: ``torch.softmax`` is already one fused kernel on a GPU, and takes any
dimension; this one shows what such a kernel is, over the last dimension only.
"""

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from trainfast.gpus import GPUSpec
from trainfast.kernels.elementwise import check_block_tiles
from trainfast.kernels.targets import launch_target
from trainfast.kernels.triton_runtime import check_launch, is_interpreted, tl, triton
from trainfast.validation import check_positive

__all__ = [
    "MAX_SOFTMAX_COLUMNS",
    "SoftmaxTiles",
    "fused_softmax",
    "softmax_kernel",
    "softmax_launch",
    "softmax_tiles",
]

#: the longest row :func:`fused_softmax` takes: 16,384 float32 values over 16 warps are 32 a
#: thread, which the compile report's test checks spill nothing (a limit of this kernel's one
#: block a row, not of Triton)
MAX_SOFTMAX_COLUMNS = 16384


@dataclass(frozen=True)
class SoftmaxTiles:
    """Launch settings of :func:`softmax_kernel`: one row of up to ``block_size`` values (a
    power of two) per program, shared by ``num_warps`` warps of 32 threads."""

    block_size: int = 1024
    num_warps: int = 4
    num_stages: int = 1  # no loop, nothing to pipeline

    def __post_init__(self) -> None:
        check_block_tiles(self)


def softmax_tiles(target: GPUSpec | None, dtype: torch.dtype, n_cols: int) -> SoftmaxTiles:
    """The launch settings for rows of ``n_cols`` values on ``target`` (``None``: the CPU
    interpreter): the next power of two for the block, and the first version of the tutorial's
    heuristic for the warps (4; 8 from 2,048 values; 16 from 4,096), so that a thread holds at
    most 8 values up to 4,096 and 32 at :data:`MAX_SOFTMAX_COLUMNS`. ``target`` and ``dtype`` do
    not change it (a row keeps nothing in shared memory); they are taken so that every kernel's
    tile function has the same shape."""
    del target, dtype
    check_positive("n_cols", n_cols)
    block_size = 1 << (n_cols - 1).bit_length()  # the next power of two at or above n_cols
    num_warps = 4 if block_size < 2048 else 8 if block_size < 4096 else 16
    return SoftmaxTiles(block_size, num_warps)


@triton.jit
def softmax_kernel(y_ptr, x_ptr, x_row_stride, y_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    """Softmax of row ``program_id`` of x (``n_cols`` values) into the same row of y."""
    row = tl.program_id(axis=0).to(tl.int64)  # int64 from here on: row × stride can pass 2**31
    cols = tl.arange(0, BLOCK_SIZE)  # (BLOCK_SIZE,)
    mask = cols < n_cols  # the block may be longer than the row
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    z = x - tl.max(x, axis=0)  # softmax is unchanged by the shift, and exp cannot overflow
    numerator = tl.exp(z)  # masked lanes: exp(-inf) = 0
    y = numerator / tl.sum(numerator, axis=0)
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def fused_softmax(
    x: Tensor,
    *,
    implementation: Literal["triton", "torch"] = "triton",
    tiles: SoftmaxTiles | None = None,
) -> Tensor:
    """Softmax of ``x`` over its last dimension, by :func:`softmax_kernel` or ``torch.softmax``.

    ``implementation="torch"`` is ``torch.softmax(x, dim=-1)``. The Triton path needs the last
    dimension contiguous (stride 1) and the leading dimensions viewable as one dimension of rows
    (a 2-D slice ``x[:, :n]`` is, as the kernel takes the row stride); it raises ``ValueError``
    otherwise rather than copying. ``tiles`` defaults to :func:`softmax_tiles` for the row's
    length. The output has ``x``'s dtype and shape, and is contiguous.
    """
    if implementation == "torch":
        return torch.softmax(x, dim=-1)
    if implementation != "triton":
        raise ValueError(
            f"Unknown implementation: {implementation!r} (expected 'triton' or 'torch')"
        )
    if x.ndim == 0:
        raise ValueError("fused_softmax needs at least one dimension, got a 0-d tensor")
    n_cols = x.shape[-1]
    if n_cols > MAX_SOFTMAX_COLUMNS:
        raise ValueError(
            f"Rows of {n_cols} values are longer than MAX_SOFTMAX_COLUMNS "
            f"({MAX_SOFTMAX_COLUMNS}): one block holds one row; use implementation='torch' or "
            "trainfast.kernels.online_softmax"
        )
    if n_cols > 1 and x.stride(-1) != 1:
        raise ValueError(
            f"fused_softmax(implementation='triton') needs the last dimension contiguous, got "
            f"shape {tuple(x.shape)} with strides {x.stride()}; call .contiguous() first"
        )
    check_launch(softmax_kernel, x)
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    try:
        rows = x if x.ndim == 2 else x.view(-1, n_cols)  # (n_rows, n_cols)
    except RuntimeError as error:
        raise ValueError(
            f"fused_softmax(implementation='triton') cannot view shape {tuple(x.shape)} with "
            f"strides {x.stride()} as rows; call .contiguous() first"
        ) from error
    if tiles is None:
        target = None if is_interpreted(softmax_kernel) else launch_target(x.device)
        tiles = softmax_tiles(target, x.dtype, n_cols)
    y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)  # (n_rows, n_cols)
    grid, args, kwargs = softmax_launch(rows, y, tiles)
    softmax_kernel[grid](*args, **kwargs)
    return y.view(x.shape)


def softmax_launch(x: Any, y: Any, tiles: SoftmaxTiles) -> tuple[tuple[int], tuple, dict[str, Any]]:
    """Grid, arguments and keywords of :func:`softmax_kernel` for ``y = softmax(x)`` over the
    rows of 2-D ``x`` and ``y``: one program per row.

    Shared by :func:`fused_softmax` and the compile report, which passes stand-ins for tensors.
    ``ValueError`` naming the sizes if a row does not fit ``tiles.block_size``.
    """
    n_rows, n_cols = x.shape
    if n_cols > tiles.block_size:
        raise ValueError(
            f"Invalid block_size: {tiles.block_size} (rows have {n_cols} values; one block holds "
            "one row)"
        )
    args = (y, x, x.stride(0), y.stride(0), n_cols)
    kwargs = dict(
        BLOCK_SIZE=tiles.block_size, num_warps=tiles.num_warps, num_stages=tiles.num_stages
    )
    return (n_rows,), args, kwargs
