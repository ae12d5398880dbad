"""Kernels beside their PyTorch references: where the time and memory of training go.

Pure PyTorch, imported eagerly:

* :mod:`~trainfast.kernels.softmax`: the online softmax and the merge steps flash attention and
  ring attention are built on;
* :mod:`~trainfast.kernels.attention`: :class:`FlashAttention` tiled in PyTorch,
  :func:`flash_attention`, and the textbook attention it replaces;
* :mod:`~trainfast.kernels.custom_ops`: a fused bias + GELU operator in C++ and CUDA (compiled
  on first use) registered with ``torch.library``;
* :mod:`~trainfast.kernels.roofline`, :mod:`~trainfast.kernels.allocator`: the arithmetic of
  the roofline model and of PyTorch's CUDA caching allocator.

Triton, imported on first use of one of its names (so ``import trainfast.kernels`` works
without Triton, and decides nothing about ``TRITON_INTERPRET``, see
:mod:`~trainfast.kernels.triton_runtime`): :func:`copy_tensor` (:mod:`.elementwise`),
:func:`matmul` (:mod:`.tiled_matmul`), :func:`fused_softmax` (:mod:`.softmax_triton`),
:class:`FlashAttentionTriton` (:mod:`.attention_triton`,
the launchers; the kernels in :mod:`.attention_triton_forward` and
:mod:`.attention_triton_backward`; :mod:`.attention_inputs` checks the inputs for both
attention implementations). Their tiles depend on the GPU (:mod:`.targets`);
:mod:`.compile_report` compiles them for any GPU of :data:`trainfast.gpus.GPUS` on a CPU
(through :mod:`.compile_jobs`) and reports the resources they need.

Benchmarks (``python -m trainfast.measure``) and the predictions beside them sit next to the
kernels they time: :mod:`.bandwidth_benchmarks`, :mod:`.matmul_benchmarks`,
:mod:`.attention_benchmarks`; :mod:`.benchmark_targets` holds the targets, and
:mod:`.benchmarks` is the index that imports them all.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainfast.kernels.attention import (
    FlashAttention,
    attention_reference,
    check_tile_sizes,
    flash_attention,
    validate_attention_inputs,
)
from trainfast.kernels.custom_ops import bias_gelu, bias_gelu_reference, load_bias_gelu
from trainfast.kernels.softmax import (
    merge_attention_outputs,
    merge_softmax_stats,
    online_softmax,
    softmax_stats,
)

#: names whose modules import Triton, and those modules
_TRITON_NAMES = {
    "FlashAttentionTriton": "trainfast.kernels.attention_triton",
    "MatmulTiles": "trainfast.kernels.tiled_matmul",
    "copy_tensor": "trainfast.kernels.elementwise",
    "fused_softmax": "trainfast.kernels.softmax_triton",
    "matmul": "trainfast.kernels.tiled_matmul",
}

__all__ = [
    "FlashAttention",
    "FlashAttentionTriton",
    "MatmulTiles",
    "attention_reference",
    "bias_gelu",
    "bias_gelu_reference",
    "copy_tensor",
    "flash_attention",
    "fused_softmax",
    "load_bias_gelu",
    "matmul",
    "merge_attention_outputs",
    "merge_softmax_stats",
    "online_softmax",
    "softmax_stats",
    "check_tile_sizes",
    "validate_attention_inputs",
]


def __getattr__(name: str) -> Any:
    """Import a Triton-backed name on first use (PEP 562)."""
    if name in _TRITON_NAMES:
        value = getattr(importlib.import_module(_TRITON_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
