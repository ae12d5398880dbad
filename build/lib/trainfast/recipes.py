"""Precision recipes: which formats a training step uses, and the bytes that costs.

A *recipe* is one thing with two readings. The training step
(:func:`trainfast.precision.recipes.training_step`) reads its dtypes: the parameters'
``param_dtype``, the ``autocast_dtype`` the matrix products run in (``None``: no autocast),
whether the loss is scaled. The resource arithmetic (:func:`trainfast.accounting.training_memory`)
and the step-time model (:func:`trainfast.distributed.step_time.estimate`) read its bytes per
parameter of each kind of model state and per activation value, and its ``compute_format``, the
key of ``peak_flops`` in :class:`trainfast.gpus.GPUSpec` its matrix products run at. The bytes are
stated, not derived from the dtypes, because a recipe from the literature can spend a fractional
or composite number of bytes (an FP8 recipe with per-block scales, a 16-bit gradient with an
fp32 accumulation buffer); :class:`Recipe` checks that its weights' bytes agree with
``param_dtype``.

:data:`RECIPES` are the book's recipes, one set of names for every chapter; the FP8 recipes of
the literature are recipes of the same type (:data:`trainfast.precision.fp8.FP8_RECIPES`).
Mixed precision with fp32 master weights follows Rajbhandari et al. 2020 ("ZeRO", Section 3.1)
and Micikevicius et al. 2018 ("Mixed Precision Training").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["COMPUTE_FORMATS", "RECIPES", "Recipe"]

#: Formats a recipe's matrix products can run at (keys of ``GPUSpec.peak_flops``).
COMPUTE_FORMATS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")

_BYTES = (
    "weight_bytes",
    "gradient_bytes",
    "master_bytes",
    "state_bytes_per_moment",
    "activation_bytes_per_value",
)


@dataclass(frozen=True)
class Recipe:
    """A precision recipe: the dtypes a training step uses and the bytes accounting counts.

    Bytes per parameter: ``weight_bytes`` (the weights as stored), ``gradient_bytes`` (with any
    higher-precision accumulation buffer), ``master_bytes`` (an fp32 copy the optimizer updates
    when the weights themselves are low-precision; 0 if none), ``state_bytes_per_moment`` (one
    optimizer moment: Adam keeps two); and ``activation_bytes_per_value``, the size of a value
    the forward pass saves. Values may be fractional. ``compute_format``: the matmul format, one
    of :data:`COMPUTE_FORMATS`. The dtypes: ``param_dtype`` (must take ``weight_bytes``),
    ``autocast_dtype`` (``None``: no autocast), ``loss_scaling`` (dynamic loss scaling).

    When not to use it for a run: :func:`~trainfast.precision.recipes.training_step` keeps no
    master weights and runs no FP8 products, so it refuses recipes that need them; which dtype
    the optimizer keeps its moments in is the optimizer's choice, not the recipe's.
    """

    name: str
    weight_bytes: float
    gradient_bytes: float
    master_bytes: float
    state_bytes_per_moment: float
    activation_bytes_per_value: float
    compute_format: str = "fp32"
    param_dtype: torch.dtype = torch.float32
    autocast_dtype: torch.dtype | None = None
    loss_scaling: bool = False

    def __post_init__(self) -> None:
        for part in _BYTES:
            value = getattr(self, part)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"Invalid {part}: {value!r} (expected a number >= 0)")
        if self.weight_bytes == 0 or self.activation_bytes_per_value == 0:
            raise ValueError(f"Invalid recipe {self.name!r}: weights and activations need bytes")
        if self.compute_format not in COMPUTE_FORMATS:
            raise ValueError(
                f"Invalid compute_format: {self.compute_format!r} (expected one of "
                f"{COMPUTE_FORMATS})"
            )
        if self.param_dtype.itemsize != self.weight_bytes:
            raise ValueError(
                f"Invalid recipe {self.name!r}: param_dtype {self.param_dtype} takes "
                f"{self.param_dtype.itemsize} bytes, weight_bytes is {self.weight_bytes!r}"
            )

    @property
    def bytes(self) -> dict[str, float]:
        """The bytes accounting counts, by field name (what the calculator widget exports)."""
        return {part: getattr(self, part) for part in _BYTES}


_FP32, _BF16, _FP16 = torch.float32, torch.bfloat16, torch.float16

#: The book's recipes. With ``torch.autocast`` the weights, gradients and moments stay fp32 and
#: matmuls and most activations run in 16 bits; the residual stream, LayerNorm, softmax (on CUDA)
#: and the loss stay fp32, and autocast keeps a 2-byte copy of each weight for backward, so the
#: 2-byte activation count is a lower bound (measured in ``tests/test_accounting.py``).
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("fp32", 4, 4, 0, 4, 4),
        Recipe("tf32", 4, 4, 0, 4, 4, compute_format="tf32"),  # fp32 values, TF32 matmuls
        Recipe("bf16 autocast", 4, 4, 0, 4, 2, "bf16", autocast_dtype=_BF16),
        Recipe(
            "fp16 autocast + scaler", 4, 4, 0, 4, 2, "fp16", autocast_dtype=_FP16, loss_scaling=True
        ),
        Recipe("fp16 autocast, no scaler", 4, 4, 0, 4, 2, "fp16", autocast_dtype=_FP16),
        # ZeRO's mixed precision: 16-bit weights and gradients, fp32 master weights and moments
        Recipe("bf16 + fp32 master", 2, 2, 4, 4, 2, "bf16", param_dtype=_BF16),
        # Megatron-LM and Llama 3 accumulate and reduce gradients in fp32 (a main_grad buffer)
        Recipe("bf16 + fp32 master and gradients", 2, 4, 4, 4, 2, "bf16", param_dtype=_BF16),
        Recipe("bf16, fp32 moments", 2, 2, 0, 4, 2, "bf16", param_dtype=_BF16),  # no master copy
        Recipe("pure bf16", 2, 2, 0, 2, 2, "bf16", param_dtype=_BF16),  # everything in bf16
    )
}
