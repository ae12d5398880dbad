"""FP8 with per-tensor scaling: fit a tensor into 8 bits by its absolute maximum.

float8_e4m3fn holds numbers up to 448 with 3 mantissa bits, float8_e5m2 up to 57344 with 2.
Neither range is anywhere near a tensor's natural one, so every FP8 recipe multiplies a
tensor by a *scale* before the cast and divides it out after the matrix product. With
*per-tensor current scaling* the scale maps the tensor's absolute maximum (``amax``) to the
format's largest number: ``s = fp8_max / amax``. *Delayed* scaling (:class:`DelayedScaling`),
Transformer Engine's ``DelayedScaling`` recipe (NVIDIA Transformer Engine documentation,
``transformer_engine.common.recipe.DelayedScaling``), takes ``amax`` from a history of earlier
steps instead, so the scale is known before the tensor is read; DeepSeek-V3 scales per 1x128
tile of activations and 128x128 block of weights instead of per tensor (DeepSeek-AI 2024,
"DeepSeek-V3 Technical Report"; block formats: :mod:`~trainfast.precision.block_scaling`).

:func:`scaled_matmul` calls PyTorch's public ``torch.nn.functional.scaled_mm`` where the
installed torch has it and ``torch._scaled_mm`` otherwise (torch 2.4 and later).
:func:`fp8_matmul` uses it where the GPU has FP8 tensor cores (compute capability 8.9 and up:
Ada, Hopper, Blackwell) and otherwise emulates the product: FP8 inputs, products exact,
accumulated in float32, then scaled. That is an idealisation, not the hardware's definition:
DeepSeek-V3 (section 3.3.2) measured Hopper's FP8 tensor cores keeping only about 14 bits
of the running sum, and ``use_fast_accum=True`` leaves the whole sum to them, while
``use_fast_accum=False`` (the default) has cuBLAS promote partial sums to float32
(:mod:`~trainfast.precision.accumulation` emulates both).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainfast.recipes import Recipe
from trainfast.validation import check_choice, check_int

__all__ = [
    "FP8_RECIPES",
    "FP8_STATED_BYTES",
    "DelayedScaling",
    "fp8_linear",
    "fp8_matmul",
    "fp8_scale",
    "from_fp8",
    "has_fp8_tensor_cores",
    "scaled_matmul",
    "to_fp8",
]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_BF16, _E4M3 = torch.bfloat16, torch.float8_e4m3fn


#: Model-state recipes of FP8 training as the Ultra-Scale Playbook's table summarises them (Tazi et
#: al. 2025, "The Ultra-Scale Playbook", section "FP8 pretraining"): recipes of the same type as
#: the book's own (:class:`~trainfast.recipes.Recipe`), counted by the same accounting. To fit it,
#: gradients include the higher-precision copy that gradient accumulation keeps, and the two Adam
#: moments, when stored differently (FP8-LM: FP8 and FP16), are averaged. Activation bytes: the
#: GEMMs' input precision. Sources of the rows: FP8-LM, Peng et al. 2023; DeepSeek-V3,
#: DeepSeek-AI 2024; Transformer Engine, NVIDIA; Nanotron, Hugging Face.
FP8_RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        # name, weights, gradients (+ accumulated), master weights, bytes per moment, GEMM inputs
        Recipe("BF16 + FP32 master + FP32 grad accumulation", 2, 2 + 4, 4, 4, 2, "bf16", _BF16),
        Recipe("BF16 + FP32 master", 2, 2, 4, 4, 2, "bf16", _BF16),
        Recipe("Transformer Engine (FP8 GEMMs)", 4, 4, 0, 4, 1, "fp8"),  # fp32 weights
        Recipe("FP8-LM O3", 1, 1 + 2, 2, (1 + 2) / 2, 1, "fp8", _E4M3),
        Recipe("DeepSeek-V3", 1, 2 + 4, 4, 2, 1, "fp8", _E4M3),
        Recipe("Nanotron FP8", 1, 1 + 4, 2, 1, 1, "fp8", _E4M3),
    )
}

#: The total bytes per parameter the Playbook's table states for each of :data:`FP8_RECIPES`.
#: The book typed both the rows and these totals from that table, so the test that they add up
#: checks the arithmetic of those typed numbers, not the recipes.
FP8_STATED_BYTES: dict[str, float] = {
    "BF16 + FP32 master + FP32 grad accumulation": 20,
    "BF16 + FP32 master": 16,
    "Transformer Engine (FP8 GEMMs)": 16,
    "FP8-LM O3": 9,
    "DeepSeek-V3": 15,
    "Nanotron FP8": 10,
}


def _check_fp8(dtype: torch.dtype) -> None:
    if dtype not in _FP8:
        raise ValueError(f"Unsupported FP8 dtype: {dtype} (expected one of {_FP8})")


def _check_margin(margin: int, dtype: torch.dtype) -> None:
    """A margin (in binades, an int as Transformer Engine's) that keeps something of the range:
    a negative one maps the history's amax past ``fp8_max``, so the largest values saturate
    (``margin=-200``: every nonzero value), and one of ``log2(fp8_max / smallest subnormal)``
    or more maps the amax below the smallest subnormal, so every value rounds to zero or to
    that one subnormal."""
    finfo = torch.finfo(dtype)
    widest = math.floor(math.log2(finfo.max / (finfo.smallest_normal * finfo.eps)))
    check_int("margin", margin, minimum=0, maximum=widest)


def fp8_scale(amax: Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> Tensor:
    """The per-tensor scale ``fp8_max / amax`` (float32); 1 where ``amax`` is 0 or not finite."""
    _check_fp8(dtype)
    amax = amax.float()
    usable = torch.isfinite(amax) & (amax > 0)
    return torch.where(usable, torch.finfo(dtype).max / torch.where(usable, amax, 1.0), 1.0)


def to_fp8(x: Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[Tensor, Tensor]:
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


def scaled_matmul(
    a8: Tensor,
    b8: Tensor,
    inv_scale_a: Tensor,
    inv_scale_b: Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    use_fast_accum: bool = False,
) -> Tensor:
    """``(a8 * inv_scale_a) @ (b8 * inv_scale_b)`` through PyTorch's scaled matrix product.

    ``a8`` is ``(M, K)`` row-major, ``b8`` ``(K, N)`` column-major, both FP8, with per-tensor
    *decoding* scales (the reciprocals of :func:`to_fp8`'s). Calls the public
    ``torch.nn.functional.scaled_mm`` (tensor-wise recipe) where this torch has it, else
    ``torch._scaled_mm`` (torch 2.4+). ``use_fast_accum=True`` lets Hopper's tensor cores keep
    the whole running sum in their reduced-precision accumulator; False promotes to float32.
    """
    functional = getattr(torch.nn.functional, "scaled_mm", None)
    if functional is not None and hasattr(torch.nn.functional, "ScalingType"):
        tensorwise = torch.nn.functional.ScalingType.TensorWise
        return functional(
            a8,
            b8,
            inv_scale_a,
            tensorwise,
            inv_scale_b,
            tensorwise,
            output_dtype=out_dtype,
            use_fast_accum=use_fast_accum,
        )
    out = torch._scaled_mm(
        a8,
        b8,
        scale_a=inv_scale_a,
        scale_b=inv_scale_b,
        out_dtype=out_dtype,
        use_fast_accum=use_fast_accum,
    )
    return out[0] if isinstance(out, tuple) else out  # torch 2.4 also returned amax


def fp8_matmul(
    a: Tensor, b: Tensor, out_dtype: torch.dtype = torch.bfloat16, *, use_fast_accum: bool = False
) -> Tensor:
    """``a @ b`` with both operands in e4m3 under per-tensor scaling: ``(M, K) @ (K, N)``.

    On a GPU with FP8 tensor cores this calls :func:`scaled_matmul`, which wants the second
    operand column-major and every dimension a multiple of 16; elsewhere it emulates the
    product with FP8 values and float32 accumulation (an idealisation of the hardware: see the
    module docstring). Both paths scale by ``1 / (s_a s_b)``.
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"fp8_matmul needs (M, K) @ (K, N), got {tuple(a.shape)} @ {tuple(b.shape)}"
        )
    a8, scale_a = to_fp8(a)
    b8, scale_b = to_fp8(b)
    if has_fp8_tensor_cores(a.device):
        if any(size % 16 for size in (*a.shape, b.shape[1])):
            raise ValueError(
                f"scaled matmul needs multiples of 16, got {tuple(a.shape)} @ {tuple(b.shape)}"
            )
        column_major = b8.t().contiguous().t()  # (K, N) with strides (1, K)
        return scaled_matmul(
            a8,
            column_major,
            scale_a.reciprocal(),
            scale_b.reciprocal(),
            out_dtype=out_dtype,
            use_fast_accum=use_fast_accum,
        )
    product = a8.float() @ b8.float()  # exact FP8 inputs, float32 accumulation
    return (product / (scale_a * scale_b)).to(out_dtype)


class DelayedScaling:
    """Per-tensor *delayed* scaling: the scale of step ``t`` comes from the amaxes of earlier steps.

    Transformer Engine's ``DelayedScaling`` recipe (NVIDIA, Transformer Engine documentation):
    each quantised tensor keeps a history of its last ``history_len`` amaxes; the scale used at
    a step is ``fp8_max / amax_hist / 2**margin`` with ``amax_hist`` the maximum of the history
    (``"max"``) or its latest entry (``"most_recent"``), computed *before* the tensor is read,
    so quantising needs one pass over it instead of two. The amax of the tensor just quantised
    is recorded afterwards. Values above the delayed scale's range saturate at ``fp8_max``
    (the price of a sudden jump); with an empty history the scale is 1. Current scaling
    (:func:`to_fp8`) is the special case ``history_len=1`` applied to the same step.

    An amax that is not finite (one ``inf`` or ``NaN`` in a tensor) or zero does not reset the
    scale: the scale of the previous step is kept, as Transformer Engine's
    ``_default_sf_compute`` does (``torch.where(torch.isfinite(amax), sf, scale)``, and likewise
    for ``amax > 0``; ``transformer_engine/pytorch/fp8.py``). The non-finite amax stays in the
    history, so under ``"max"`` the scale is frozen at its last finite value until that entry
    leaves the history; falling back to 1 instead would flush every small value to zero for
    up to ``history_len`` steps.
    """

    def __init__(
        self,
        history_len: int = 1024,
        *,
        margin: int = 0,
        amax_compute: str = "max",
        dtype: torch.dtype = torch.float8_e4m3fn,
    ) -> None:
        check_int("history_len", history_len, minimum=1)
        check_choice("amax_compute", amax_compute, ("max", "most_recent"))
        _check_fp8(dtype)
        _check_margin(margin, dtype)
        self.history_len, self.margin, self.amax_compute, self.dtype = (
            history_len,
            margin,
            amax_compute,
            dtype,
        )
        self.amax_history: list[float] = []
        self.previous_scale = torch.tensor(1.0)  # the scale the last quantize used

    @property
    def scale(self) -> Tensor:
        """The scale the next :meth:`quantize` will use (float32 scalar): from the history, or
        the previous step's where the history's amax is not finite or is zero."""
        if not self.amax_history:
            return self.previous_scale
        window = self.amax_history if self.amax_compute == "max" else self.amax_history[-1:]
        amax = torch.tensor(window).max()  # NaN propagates, as torch.max does in TE
        if not (torch.isfinite(amax) and amax > 0):
            return self.previous_scale
        return fp8_scale(amax, self.dtype) / 2.0**self.margin

    def quantize(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(x_fp8, scale)`` with the delayed scale, then record ``amax(x)`` in the history."""
        self.previous_scale = self.scale
        scale = self.previous_scale.to(x.device)
        largest = torch.finfo(self.dtype).max
        x_fp8 = (x.float() * scale).clamp(-largest, largest).to(self.dtype)
        self.amax_history = [*self.amax_history, float(x.detach().abs().amax())][
            -self.history_len :
        ]
        return x_fp8, scale


def fp8_linear(
    x: Tensor,
    weight: Tensor,
    x_scaling: DelayedScaling,
    weight_scaling: DelayedScaling,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``x @ weight.T`` with both operands cast to FP8 under delayed scaling, emulated.

    ``x`` is ``(..., in_features)``, ``weight`` ``(out_features, in_features)`` as in
    ``torch.nn.functional.linear``. Each operand is quantised by its own
    :class:`DelayedScaling` (which then records the operand's amax for the next call), the
    product of the FP8 values is taken in float32 and divided by both scales. A forward pass
    only: a training recipe would also quantise the gradients (in e5m2) in backward.
    """
    if weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"fp8_linear needs (..., in) and (out, in), "
            f"got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    x8, scale_x = x_scaling.quantize(x.reshape(-1, x.shape[-1]))  # (tokens, in)
    w8, scale_w = weight_scaling.quantize(weight)  # (out, in)
    out = (x8.float() @ w8.float().t()) / (scale_x * scale_w)  # (tokens, out)
    return out.reshape(*x.shape[:-1], weight.shape[0]).to(out_dtype)
