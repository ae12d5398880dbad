"""The simplest Triton kernel, a copy, beside its PyTorch reference (``Tensor.clone``).

A copy does no arithmetic: every byte is read once from memory and written once, so its speed is
the memory's bandwidth. That makes it the yardstick for every memory-bound kernel (elementwise
ops, normalisations, optimizer steps): a kernel that moves B bytes cannot take less than
B / (copy bandwidth). The chapter measures this kernel against ``torch``'s own copy.

The kernel is Triton's canonical first example (the "vector add" tutorial) with the addition
removed. Each *program* (a thread block on the GPU) handles ``BLOCK_SIZE`` consecutive
elements; a mask switches off the lanes past the end of the tensor. Offsets are computed in
int64, so tensors with more than 2**31 elements are addressed correctly.
"""

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from trainfast.gpus import GPUSpec
from trainfast.kernels.targets import launch_target
from trainfast.kernels.triton_runtime import check_launch, is_interpreted, tl, triton
from trainfast.validation import check_positive

__all__ = [
    "CopyTiles",
    "check_block_tiles",
    "copy_kernel",
    "copy_launch",
    "copy_tensor",
    "copy_tiles",
]


@dataclass(frozen=True)
class CopyTiles:
    """Launch settings of :func:`copy_kernel`: ``block_size`` elements per program (a power of
    two), shared by ``num_warps`` warps of 32 threads."""

    block_size: int = 1024
    num_warps: int = 4
    num_stages: int = 1  # no loop, nothing to pipeline

    def __post_init__(self) -> None:
        check_block_tiles(self)


def check_block_tiles(tiles: Any) -> None:
    """``ValueError`` naming the value unless ``tiles``' ``block_size``, ``num_warps`` and
    ``num_stages`` are positive and ``block_size`` is a power of two: the launch settings of a
    one-block-per-program kernel (:class:`CopyTiles`, the fused softmax's ``SoftmaxTiles``)."""
    for name in ("block_size", "num_warps", "num_stages"):
        check_positive(name, getattr(tiles, name))
    if tiles.block_size & (tiles.block_size - 1):
        raise ValueError(f"Invalid block_size: {tiles.block_size} (need a power of two)")


def copy_tiles(target: GPUSpec | None, dtype: torch.dtype) -> CopyTiles:
    """The copy's launch settings on ``target`` (``None``: Triton's CPU interpreter).

    A copy keeps nothing in shared memory, so one setting suits every GPU: 1,024 elements per
    program, 4 warps, i.e. 8 elements (16 to 32 bytes) per thread, enough for vector loads.
    ``dtype`` does not change it; it is taken so that every kernel's tile function has the same
    shape.
    """
    del target, dtype
    return CopyTiles()


@triton.jit
def copy_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """Copy ``n_elements`` values from ``x_ptr`` to ``y_ptr``, ``BLOCK_SIZE`` per program."""
    pid = tl.program_id(axis=0).to(tl.int64)  # which block of the flat tensor this program copies
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # (BLOCK_SIZE,)
    mask = offsets < n_elements  # the last block may stick out past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, x, mask=mask)


def copy_tensor(
    x: Tensor,
    *,
    implementation: Literal["triton", "torch"] = "triton",
    block_size: int | None = None,
    num_warps: int | None = None,
) -> Tensor:
    """A copy of ``x``, by the Triton :func:`copy_kernel` or by ``torch`` (``x.clone()``).

    ``block_size`` (a power of two) is the number of elements one program copies and
    ``num_warps`` the number of 32-thread warps that share them (GPU only); both default to
    :func:`copy_tiles` for the tensor's device. The Triton path
    reads ``x`` as one flat array, so ``x`` must be contiguous; it raises ``ValueError``
    otherwise rather than silently copying twice.
    """
    if implementation == "torch":
        return x.clone()
    if implementation != "triton":
        raise ValueError(
            f"Unknown implementation: {implementation!r} (expected 'triton' or 'torch')"
        )
    if not x.is_contiguous():
        raise ValueError(
            f"copy_tensor(implementation='triton') needs a contiguous tensor, got shape "
            f"{tuple(x.shape)} with strides {x.stride()}; call .contiguous() first"
        )
    check_launch(copy_kernel, x)
    target = None if is_interpreted(copy_kernel) else launch_target(x.device)
    default = copy_tiles(target, x.dtype)
    tiles = CopyTiles(
        default.block_size if block_size is None else block_size,
        default.num_warps if num_warps is None else num_warps,
    )
    y = torch.empty_like(x)
    if x.numel():
        grid, args, kwargs = copy_launch(x, y, tiles)
        copy_kernel[grid](*args, **kwargs)
    return y


def copy_launch(x: Any, y: Any, tiles: CopyTiles) -> tuple[tuple[int], tuple, dict[str, Any]]:
    """Grid, arguments and keywords of :func:`copy_kernel` for ``y = x`` (flat, contiguous).

    Shared by :func:`copy_tensor` and the compile report, which passes stand-ins for tensors.
    """
    n_elements = x.numel()
    kwargs = dict(
        BLOCK_SIZE=tiles.block_size, num_warps=tiles.num_warps, num_stages=tiles.num_stages
    )
    return (triton.cdiv(n_elements, tiles.block_size),), (x, y, n_elements), kwargs
