"""A reader's answer to the memory-hierarchy chapter's Triton exercise, for its check's test.

Written as a reader writes it in a notebook cell: at module level, with real annotations (no
``from __future__ import annotations``), because Triton 3.0's interpreter looks for
``triton.language`` among the kernel's module globals and reads ``tl.constexpr`` annotations as
objects, not strings.
"""

from trainfast.kernels.triton_runtime import tl, triton


@triton.jit
def axpb_kernel(
    x_ptr, y_ptr, n, a, b, BLOCK: tl.constexpr, MASK_LOAD: tl.constexpr, MASK_STORE: tl.constexpr
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK_LOAD:
        x = tl.load(x_ptr + offsets, mask=offsets < n)
    else:
        x = tl.load(x_ptr + offsets)
    if MASK_STORE:
        tl.store(y_ptr + offsets, (a * x.to(tl.float32) + b).to(x.dtype), mask=offsets < n)
    else:
        tl.store(y_ptr + offsets, (a * x.to(tl.float32) + b).to(x.dtype))


def launcher(masked: bool, mask_load: bool | None = None):
    """``axpb(x, a, b, out)`` launching the kernel with or without its masks (``mask_load``
    defaults to ``masked``: a store mask alone is the half-fixed answer)."""
    mask_load = masked if mask_load is None else mask_load

    def axpb(x, a, b, out):
        axpb_kernel[(triton.cdiv(x.numel(), 256),)](
            x, out, x.numel(), a, b, BLOCK=256, MASK_LOAD=mask_load, MASK_STORE=masked
        )

    return axpb
