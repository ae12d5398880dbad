"""A reader's answer to the memory-hierarchy chapter's Triton exercise, for its check's test.

Written as a reader writes it in a notebook cell: at module level, with real annotations (no
``from __future__ import annotations``), because Triton 3.0's interpreter looks for
``triton.language`` among the kernel's module globals and reads ``tl.constexpr`` annotations as
objects, not strings.
"""

from trainfast.kernels.triton_runtime import tl, triton


@triton.jit
def axpb_kernel(x_ptr, y_ptr, n, a, b, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASKED:
        x = tl.load(x_ptr + offsets, mask=offsets < n)
        tl.store(y_ptr + offsets, (a * x.to(tl.float32) + b).to(x.dtype), mask=offsets < n)
    else:
        x = tl.load(x_ptr + offsets)
        tl.store(y_ptr + offsets, (a * x.to(tl.float32) + b).to(x.dtype))


def launcher(masked: bool):
    """``axpb(x, a, b, out)`` launching the kernel with or without its mask."""

    def axpb(x, a, b, out):
        axpb_kernel[(triton.cdiv(x.numel(), 256),)](
            x, out, x.numel(), a, b, BLOCK=256, MASKED=masked
        )

    return axpb
