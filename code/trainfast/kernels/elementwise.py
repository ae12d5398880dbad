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

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from trainfast.kernels.triton_runtime import check_launch, tl, triton

__all__ = ["copy_kernel", "copy_tensor"]


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
    block_size: int = 1024,
    num_warps: int = 4,
) -> Tensor:
    """A copy of ``x``, by the Triton :func:`copy_kernel` or by ``torch`` (``x.clone()``).

    ``block_size`` (a power of two) is the number of elements one program copies and
    ``num_warps`` the number of 32-thread warps that share them (GPU only). The Triton path
    reads ``x`` as one flat array, so ``x`` must be contiguous; it raises ``ValueError``
    otherwise rather than silently copying twice.
    """
    if implementation == "torch":
        return x.clone()
    if implementation != "triton":
        raise ValueError(f"Unknown implementation: {implementation!r} (expected 'triton' or 'torch')")
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"Invalid block_size: {block_size} (need a power of two)")
    if not x.is_contiguous():
        raise ValueError(
            f"copy_tensor(implementation='triton') needs a contiguous tensor, got shape "
            f"{tuple(x.shape)} with strides {x.stride()}; call .contiguous() first"
        )
    check_launch(copy_kernel, x)
    y = torch.empty_like(x)
    n_elements = x.numel()
    if n_elements:
        grid = (triton.cdiv(n_elements, block_size),)
        copy_kernel[grid](x, y, n_elements, BLOCK_SIZE=block_size, num_warps=num_warps)
    return y
