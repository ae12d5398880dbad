"""Mixed precision: number formats, loss scaling, autocast recipes, TF32 and FP8.

* :mod:`~trainfast.precision.formats`: every format's range and precision derived from its bits
  (:func:`float_format`), TF32 rounding (:func:`round_to_tf32`), raw bit fields (:func:`decompose`);
* :mod:`~trainfast.precision.loss_scaling`: dynamic loss scaling written out (:class:`GradScaler`,
  step for step equal to ``torch.amp.GradScaler``), and a constant scale from gradient statistics
  (:func:`constant_loss_scale`);
* :mod:`~trainfast.precision.recipes`: one training step under a recipe of
  :data:`trainfast.recipes.RECIPES` (fp32, bf16/fp16 autocast, loss scaling, pure bf16), and the
  runs the chapter compares;
* :mod:`~trainfast.precision.numerics`: swamping, softmax overflow, matmul error, autocast policy;
* :mod:`~trainfast.precision.fp8`: per-tensor current and delayed scaling, FP8 matrix products;
* :mod:`~trainfast.precision.block_scaling`: MXFP8 and NVFP4 block scaling, emulated;
* :mod:`~trainfast.precision.accumulation`: a dot product's accumulator with too few bits, and
  promotion to float32 every N terms (DeepSeek-V3);
* :mod:`~trainfast.precision.compensated`: Kahan-compensated AdamW for bf16 weights without
  master weights;
* :mod:`~trainfast.precision.tf32`: TF32 on and off through the installed torch's API.
"""

from trainfast.precision.accumulation import (
    accumulation_error,
    fp8_dot_products,
    limited_precision_sum,
)
from trainfast.precision.block_scaling import (
    BLOCK_FORMATS,
    BlockFormat,
    ErrorByPosition,
    error_by_position,
    fake_quantize,
)
from trainfast.precision.compensated import KahanAdamW, kahan_adamw_step_, kahan_add_
from trainfast.precision.formats import (
    FORMAT_NAMES,
    FloatFormat,
    decompose,
    float_format,
    format_from_bits,
    representable_values,
    round_mantissa,
    round_to_tf32,
)
from trainfast.precision.fp8 import (
    FP8_RECIPES,
    FP8_STATED_BYTES,
    DelayedScaling,
    fp8_linear,
    fp8_matmul,
    fp8_scale,
    from_fp8,
    has_fp8_tensor_cores,
    scaled_matmul,
    to_fp8,
)
from trainfast.precision.loss_scaling import (
    GradScaler,
    constant_loss_scale,
    unscale_grads_,
    updated_scale,
)
from trainfast.precision.numerics import (
    autocast_policy,
    matmul_error,
    running_sum,
    softmax_naive,
    softmax_stable,
)
from trainfast.precision.recipes import RecipeRun, check_runnable, train_recipe, training_step
from trainfast.precision.tf32 import tf32_matmuls

__all__ = [
    "BLOCK_FORMATS",
    "BlockFormat",
    "DelayedScaling",
    "ErrorByPosition",
    "FORMAT_NAMES",
    "FP8_RECIPES",
    "FP8_STATED_BYTES",
    "FloatFormat",
    "GradScaler",
    "KahanAdamW",
    "RecipeRun",
    "accumulation_error",
    "autocast_policy",
    "check_runnable",
    "constant_loss_scale",
    "decompose",
    "error_by_position",
    "float_format",
    "fake_quantize",
    "fp8_dot_products",
    "fp8_linear",
    "format_from_bits",
    "fp8_matmul",
    "fp8_scale",
    "from_fp8",
    "has_fp8_tensor_cores",
    "kahan_add_",
    "kahan_adamw_step_",
    "limited_precision_sum",
    "matmul_error",
    "representable_values",
    "round_mantissa",
    "round_to_tf32",
    "running_sum",
    "scaled_matmul",
    "softmax_naive",
    "softmax_stable",
    "tf32_matmuls",
    "to_fp8",
    "train_recipe",
    "training_step",
    "unscale_grads_",
    "updated_scale",
]
