"""FP8 with per-tensor scaling: fit a tensor into 8 bits by its absolute maximum.

float8_e4m3fn holds numbers up to 448 with 3 mantissa bits, float8_e5m2 up to 57344 with 2.
Neither range is anywhere near a tensor's natural one, so every FP8 recipe multiplies a
tensor by a *scale* before the cast and divides it out after the matrix product. With
*per-tensor current scaling* the scale maps the tensor's absolute maximum (``amax``) to the
format's largest number: ``s = fp8_max / amax``. Transformer Engine's default, *delayed*
scaling, takes ``amax`` from a history of earlier steps instead, so the scale is known before
the tensor is (Micikevicius et al. 2022, "FP8 Formats for Deep Learning"); DeepSeek-V3 scales
per 1x128 tile of activations and 128x128 block of weights instead of per tensor (DeepSeek-AI
2024, "DeepSeek-V3 Technical Report").

:func:`fp8_matmul` runs the product on tensor cores with ``torch._scaled_mm`` where the GPU
has FP8 units (compute capability 8.9 and up: Ada, Hopper, Blackwell) and otherwise emulates it
exactly as the hardware defines it: FP8 inputs, products accumulated in float32, then scaled.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainfast.accounting import PrecisionRecipe

__all__ = ["FP8_RECIPES", "fp8_matmul", "fp8_scale", "from_fp8", "has_fp8_tensor_cores", "to_fp8"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


#: Model-state recipes of FP8 training as the Ultra-Scale Playbook's table summarises them (Tazi et
#: al. 2025, "The Ultra-Scale Playbook", section "FP8 pretraining"), each with the total bytes per
#: parameter the table states. To fit :class:`~trainfast.accounting.PrecisionRecipe`, gradients
#: include the higher-precision copy that gradient accumulation keeps, and the two Adam moments,
#: when stored differently (FP8-LM: FP8 and FP16), are averaged. Activation bytes: the GEMMs'
#: input precision. Sources of the rows: FP8-LM, Peng et al. 2023; DeepSeek-V3, DeepSeek-AI 2024;
#: Transformer Engine, NVIDIA; Nanotron, Hugging Face.
FP8_RECIPES: list[tuple[PrecisionRecipe, float]] = [
    # name, weights, gradients (+ accumulated), master weights, bytes per moment, GEMM inputs
    (PrecisionRecipe("BF16 + FP32 master + FP32 grad accumulation", 2, 2 + 4, 4, 4, 2), 20),
    (PrecisionRecipe("BF16 + FP32 master", 2, 2, 4, 4, 2), 16),
    (PrecisionRecipe("Transformer Engine (FP8 GEMMs)", 4, 4, 0, 4, 1), 16),
    (PrecisionRecipe("FP8-LM O3", 1, 1 + 2, 2, (1 + 2) / 2, 1), 9),
    (PrecisionRecipe("DeepSeek-V3", 1, 2 + 4, 4, 2, 1), 15),
    (PrecisionRecipe("Nanotron FP8", 1, 1 + 4, 2, 1, 1), 10),
]


def _check_fp8(dtype: torch.dtype) -> None:
    if dtype not in _FP8:
        raise ValueError(f"Unsupported FP8 dtype: {dtype} (expected one of {_FP8})")


def fp8_scale(amax: Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> Tensor:
    """The per-tensor scale ``fp8_max / amax`` (float32); 1 where ``amax`` is 0 or not finite."""
    _check_fp8(dtype)
    amax = amax.float()
    usable = torch.isfinite(amax) & (amax > 0)
    return torch.where(usable, torch.finfo(dtype).max / torch.where(usable, amax, 1.0), 1.0)


def to_fp8(
    x: Tensor, dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[Tensor, Tensor]:
    """Cast ``x`` to FP8 with per-tensor current scaling: ``(x_fp8, scale)``.

    ``x_fp8 = saturate(x * scale)``, ``scale = fp8_scale(amax(x))``; recover
    ``x`` (up to FP8 rounding) with :func:`from_fp8`. The clamp matters for
    e4m3fn: it has no infinity, so an overflow would become NaN.
    """
    scale = fp8_scale(x.detach().abs().amax(), dtype)
    largest = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-largest, largest).to(dtype), scale


def from_fp8(x_fp8: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Undo :func:`to_fp8`: ``x_fp8 / scale`` in ``dtype``."""
    return (x_fp8.float() / scale).to(dtype)


def has_fp8_tensor_cores(device: torch.device) -> bool:
    """True on CUDA GPUs of compute capability 8.9 or later, which have FP8 tensor cores."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_matmul(a: Tensor, b: Tensor, out_dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """``a @ b`` with both operands in e4m3 under per-tensor scaling: ``(M, K) @ (K, N)``.

    On a GPU with FP8 tensor cores this calls ``torch._scaled_mm``, which wants the second
    operand column-major and every dimension a multiple of 16; elsewhere it emulates the same
    arithmetic (FP8 values, float32 accumulation). Both paths scale by ``1 / (s_a s_b)``.
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"fp8_matmul needs (M, K) @ (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}")
    a8, scale_a = to_fp8(a)
    b8, scale_b = to_fp8(b)
    if has_fp8_tensor_cores(a.device):
        if any(size % 16 for size in (*a.shape, b.shape[1])):
            raise ValueError(f"torch._scaled_mm needs multiples of 16, got {tuple(a.shape)} @ {tuple(b.shape)}")
        column_major = b8.t().contiguous().t()  # (K, N) with strides (1, K)
        out = torch._scaled_mm(
            a8, column_major, scale_a=scale_a.reciprocal(), scale_b=scale_b.reciprocal(),
            out_dtype=out_dtype,
        )  # fmt: skip
        return out[0] if isinstance(out, tuple) else out  # some torch versions also return amax
    product = a8.float() @ b8.float()  # exact FP8 inputs, float32 accumulation
    return (product / (scale_a * scale_b)).to(out_dtype)
