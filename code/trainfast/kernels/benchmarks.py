"""The chapter's measurements, as ``python -m trainfast.measure`` benchmarks.

Each function takes ``(device, quick)`` and returns a :class:`~trainfast.records.Record`. On a GPU
the Triton kernels run compiled and are compared, in the same run, with what PyTorch ships:

=====================  ==================================================  ===========
benchmark              measures                                            target
=====================  ==================================================  ===========
``copy-bandwidth``     Triton copy vs ``torch`` copy, by size               ≥ 0.90
``matmul-tiles``       tiled Triton matmul vs ``torch.matmul`` at 4096³,    ≥ 0.75
                       fp16 and bf16, over a sweep of tile sizes
``attention-forward``  Triton flash-attention forward vs                    ≥ 0.60
                       ``scaled_dot_product_attention``, bf16, seq 4096
``attention-fwd-bwd``  forward + backward over sequence lengths and head     (none)
                       dimensions: Triton (GPU) or tiled (CPU) flash
                       attention, SDPA, FlexAttention under compile (CPU)
``roofline``           elementwise ops, a reduction, matmuls: FLOP/s and    (none)
                       intensity, with the measured ridge
``strided-access``     one gather of a buffer in stride order, by stride     (none)
``host-transfers``     ``.item()``, pageable and pinned copies              (none)
``fused-linear-gelu``  ``gelu(a @ b + bias)``: the Triton epilogue vs      (none)
                       eager, ``torch.compile`` and cuBLASLt's epilogue
=====================  ==================================================  ===========

:func:`target_ratios` reads the three ratios back from records and prints them beside their
targets (each benchmark prints its own when it finishes). On a CPU the Triton kernels run in
the interpreter, whose timings measure the interpreter, not the hardware: those benchmarks then
time the PyTorch side only (the cache hierarchy, the roofline, the tiled PyTorch attention),
and run the Triton kernels once at a tiny size to prove they work.
"""

from __future__ import annotations

from trainfast.kernels.attention_benchmarks import (
    attention_forward_prediction,
    attention_record,
    attention_sweep_prediction,
    attention_sweep_record,
)
from trainfast.kernels.bandwidth_benchmarks import (
    copy_prediction,
    copy_record,
    host_transfer_prediction,
    host_transfer_record,
    roofline_record,
    strided_record,
)
from trainfast.kernels.benchmark_targets import ELEMENT_BYTES, TARGETS, target_ratios
from trainfast.kernels.matmul_benchmarks import (
    FUSED_LINEAR_GELU_SHAPE,
    fused_linear_gelu_prediction,
    fused_linear_gelu_record,
    launch_order_prediction,
    matmul_prediction,
    matmul_record,
    quantisation_prediction,
)

__all__ = [
    "ELEMENT_BYTES",
    "FUSED_LINEAR_GELU_SHAPE",
    "TARGETS",
    "attention_forward_prediction",
    "attention_record",
    "attention_sweep_prediction",
    "attention_sweep_record",
    "copy_prediction",
    "copy_record",
    "fused_linear_gelu_prediction",
    "fused_linear_gelu_record",
    "host_transfer_prediction",
    "host_transfer_record",
    "launch_order_prediction",
    "matmul_prediction",
    "matmul_record",
    "quantisation_prediction",
    "roofline_record",
    "strided_record",
    "target_ratios",
]
