"""Resource accounting: parameters, FLOPs and memory of a training step, from a model's shape.

The book's one home for this arithmetic. Every formula is written for the decoder of
:mod:`trainfast.transformer` and tested against it: parameter counts against ``numel()``,
FLOPs against ``torch.utils.flop_counter.FlopCounterMode``
(:func:`~trainfast.counters.counted_flops`), activation bytes against the tensors autograd
saves (:func:`~trainfast.counters.saved_tensor_bytes`).

One module per quantity, each documented below and all imported from here
(``from trainfast.accounting import training_memory``): :mod:`~trainfast.accounting.parameters`
counts parameters, :mod:`~trainfast.accounting.flops` the matmul FLOPs of a step,
:mod:`~trainfast.accounting.activations` the bytes saved for backward and the loss's buffers,
and :mod:`~trainfast.accounting.memory` puts model state and activations together, per device
and per ZeRO rank.

Conventions:

* **Units.** Bytes, FLOPs and seconds; ``GB`` means 10^9 bytes. Hardware numbers come from
  :mod:`trainfast.gpus`.
* **FLOPs** are matrix-multiply FLOPs, 2 per multiply-add (PaLM's "model FLOPs", Chowdhery et
  al. 2022, Appendix B). Element-wise work (softmax, LayerNorm, GELU, the optimizer) is not
  counted; attention's ``QK^T`` and ``PV`` are, in full, with no discount for the causal mask;
  recomputation by activation checkpointing is not (it is work the hardware does, not the model).
* **Memory** of a training step is model state (weights, gradients, fp32 master weights,
  optimizer moments) plus activations, the tensors the forward pass saves for backward; its
  peak adds the loss's float32 buffers alive with them at the start of backward. Not counted:
  the CUDA context, the caching allocator's rounding and fragmentation, temporary buffers of
  single kernels, communication buckets.
* **Utilisation** (MFU, with the book's one denominator) and the length of a run are in
  :mod:`trainfast.utilization`, the measuring side
  (:func:`~trainfast.counters.counted_flops`, :func:`~trainfast.counters.saved_tensor_bytes`)
  in :mod:`trainfast.counters`; both are re-exported here, documented where they live.
* **Inputs.** A model's sizes are a :class:`~trainfast.transformer.TransformerShape` (the
  model's own configuration); a precision recipe's bytes come from :mod:`trainfast.recipes`.
* **Shapes.** ``s`` sequence length, ``b`` (micro-)batch, ``h`` = ``d_model``, ``f`` = ``d_ff``,
  ``a`` heads, ``L`` layers, ``V`` vocabulary, ``t`` tensor-parallel size.
"""

from __future__ import annotations

from trainfast.accounting.activations import (
    LOSS_BYTES_PER_LOGIT,
    activation_bytes,
    checkpoint_sequential_segments,
    checkpointed_layer_bytes,
    head_activation_values,
    loss_buffer_bytes,
    model_activation_bytes,
    segmented_activation_bytes,
    sqrt_checkpoint_segments,
)
from trainfast.accounting.flops import linear_training_flops, matmul_flops, training_flops
from trainfast.accounting.memory import (
    OPTIMIZER_MOMENTS,
    MemoryBreakdown,
    bytes_per_parameter,
    training_memory,
    zero_memory,
)
from trainfast.accounting.parameters import (
    matmul_parameter_count,
    mlp_parameter_count,
    parameter_count,
)

# re-exported for callers of the older names; documented where they live
from trainfast.counters import counted_flops as counted_flops
from trainfast.counters import peak_allocated_bytes as peak_allocated_bytes
from trainfast.counters import saved_tensor_bytes as saved_tensor_bytes
from trainfast.utilization import model_flops_utilization as model_flops_utilization
from trainfast.utilization import training_run_seconds as training_run_seconds

__all__ = [
    "LOSS_BYTES_PER_LOGIT",
    "OPTIMIZER_MOMENTS",
    "MemoryBreakdown",
    "activation_bytes",
    "bytes_per_parameter",
    "checkpoint_sequential_segments",
    "checkpointed_layer_bytes",
    "linear_training_flops",
    "loss_buffer_bytes",
    "matmul_flops",
    "matmul_parameter_count",
    "mlp_parameter_count",
    "head_activation_values",
    "model_activation_bytes",
    "parameter_count",
    "segmented_activation_bytes",
    "sqrt_checkpoint_segments",
    "training_flops",
    "training_memory",
    "zero_memory",
]
