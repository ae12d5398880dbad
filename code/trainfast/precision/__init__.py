"""Mixed precision: number formats, loss scaling, autocast recipes, TF32 and FP8.

* :mod:`~trainfast.precision.formats`: every format's range and precision derived from its bits
  (:func:`float_format`), TF32 rounding (:func:`round_to_tf32`), raw bit fields (:func:`decompose`);
* :mod:`~trainfast.precision.loss_scaling`: dynamic loss scaling written out (:class:`GradScaler`,
  step for step equal to ``torch.amp.GradScaler``);
* :mod:`~trainfast.precision.recipes`: one training step under fp32, bf16/fp16 autocast, loss
  scaling or pure bf16, and the runs the chapter compares;
* :mod:`~trainfast.precision.numerics`: swamping, softmax overflow, matmul error, autocast policy;
* :mod:`~trainfast.precision.fp8`: per-tensor scaling and FP8 matrix products.
"""

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
    fp8_matmul,
    fp8_scale,
    from_fp8,
    has_fp8_tensor_cores,
    to_fp8,
)
from trainfast.precision.loss_scaling import GradScaler, unscale_grads_, updated_scale
from trainfast.precision.numerics import (
    autocast_policy,
    matmul_error,
    running_sum,
    softmax_naive,
    softmax_stable,
)
from trainfast.precision.recipes import (
    RECIPES,
    RecipeRun,
    TrainingRecipe,
    train_recipe,
    training_step,
)

__all__ = [
    "FORMAT_NAMES",
    "FP8_RECIPES",
    "RECIPES",
    "FloatFormat",
    "GradScaler",
    "RecipeRun",
    "TrainingRecipe",
    "autocast_policy",
    "decompose",
    "float_format",
    "format_from_bits",
    "fp8_matmul",
    "fp8_scale",
    "from_fp8",
    "has_fp8_tensor_cores",
    "matmul_error",
    "representable_values",
    "round_mantissa",
    "round_to_tf32",
    "running_sum",
    "softmax_naive",
    "softmax_stable",
    "to_fp8",
    "train_recipe",
    "training_step",
    "unscale_grads_",
    "updated_scale",
]
