"""A dot product's running sum kept in too few bits, and promotion to float32 every N terms.

Tensor cores multiply low-precision inputs exactly and add the products into an accumulator.
How many bits that accumulator keeps is a property of the hardware and the kernel, not of the
input format: DeepSeek-V3 (DeepSeek-AI 2024, section 3.3.2) measured the FP8 GEMMs of Hopper
GPUs keeping only about 14 bits of the running sum, found a maximum relative error near 2%
for an inner dimension of 4096, and fixed it by copying the partial sums to float32 registers
every ``N_C = 128`` elements (*promotion*). PyTorch exposes the same trade elsewhere:
``torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction`` and
``allow_bf16_reduced_precision_reduction`` let cuBLAS reduce fp16/bf16 GEMMs partly in reduced
precision, ``allow_fp16_accumulation`` lets it accumulate fp16 GEMMs in fp16, and
``scaled_mm(..., use_fast_accum=True)`` skips the float32 promotion of FP8 products.

:func:`limited_precision_sum` emulates such an accumulator on a CPU: products added one by one
into a running sum rounded to ``mantissa_bits`` after every addition, optionally added into a
float32 total every ``promote_every`` terms. It is a model with two assumptions NVIDIA does
not document: the rounding mode (nearest-even or toward zero) and that every addition rounds.
DeepSeek-V3 (2024, section 3.5.2) reports that Hopper aligns 32 products to their largest
exponent and truncates them to 14 bits before adding them, which this model only approximates.
:func:`accumulation_error` measures it on FP8 dot products against float64: the products of raw
FP8 values are exact, and the per-tensor scales are applied after the sum, as the hardware
applies them (:func:`fp8_dot_products`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainfast.precision.formats import round_mantissa
from trainfast.validation import check_choice, check_int

__all__ = [
    "ROUNDING_MODES",
    "accumulation_error",
    "fp8_dot_products",
    "limited_precision_sum",
    "round_toward_zero",
]

#: How :func:`limited_precision_sum` rounds the running sum after each addition.
ROUNDING_MODES = ("nearest", "toward_zero")


def round_toward_zero(x: Tensor, mantissa_bits: int) -> Tensor:
    """Truncate float32 ``x`` to ``mantissa_bits`` mantissa bits (drop the rest); float32 out."""
    if x.dtype != torch.float32:
        raise ValueError(f"round_toward_zero expects float32, got {x.dtype}")
    check_int("mantissa_bits", mantissa_bits, minimum=0, maximum=23)  # float32 has 23
    mask = ~((1 << (23 - mantissa_bits)) - 1)
    return (x.contiguous().view(torch.int32) & mask).view(torch.float32)


def limited_precision_sum(
    terms: Tensor,
    mantissa_bits: int,
    *,
    promote_every: int | None = None,
    rounding: str = "nearest",
) -> Tensor:
    """Sum float32 ``terms`` ``(..., K)`` along the last axis in a ``mantissa_bits`` accumulator.

    Sequentially, as one accumulator does: ``partial = round(partial + term)`` for each term.
    With ``promote_every = N``, after every ``N`` terms the partial sum is added to a float32
    total and reset to zero (DeepSeek-V3's promotion); the result is ``total + partial``.
    With ``mantissa_bits = 23`` and no promotion this is exactly float32's sequential sum.
    Returns float32 ``(...)``.
    """
    if terms.dtype != torch.float32:
        raise ValueError(f"limited_precision_sum expects float32 terms, got {terms.dtype}")
    check_choice("rounding", rounding, ROUNDING_MODES)
    check_int("mantissa_bits", mantissa_bits, minimum=0, maximum=23)
    if promote_every is not None:
        check_int("promote_every", promote_every, minimum=1)
    round_to = round_mantissa if rounding == "nearest" else round_toward_zero
    partial = torch.zeros(terms.shape[:-1], dtype=torch.float32, device=terms.device)
    total = torch.zeros_like(partial)
    for i in range(terms.shape[-1]):
        partial = round_to(partial + terms[..., i], mantissa_bits)
        if promote_every is not None and (i + 1) % promote_every == 0:
            total, partial = total + partial, torch.zeros_like(partial)
    return total + partial


def fp8_dot_products(k: int, *, rows: int = 64, seed: int = 0) -> tuple[Tensor, Tensor]:
    """The terms of ``rows`` FP8 dot products of length ``k``, as a tensor core forms them.

    Standard normal vectors are cast to e4m3 with per-tensor scales
    (:func:`~trainfast.precision.fp8.to_fp8`). The terms are products of the *raw* FP8 values:
    two 4-bit significands make at most 8 bits, so each product is exact in float32. The scales
    (``448 / amax``, not powers of two) are not applied to the terms, since a product of
    dequantised values would round; like the hardware, multiply the sum by the returned
    ``decode`` scale afterwards.
    Returns ``(products, decode)``: float32 ``(rows, k)`` and a float32 scalar.
    """
    from trainfast.precision.fp8 import to_fp8

    check_int("k", k, minimum=1)
    check_int("rows", rows, minimum=1)
    check_int("seed", seed)
    generator = torch.Generator().manual_seed(seed)
    a8, scale_a = to_fp8(torch.randn(rows, k, generator=generator))
    b8, scale_b = to_fp8(torch.randn(rows, k, generator=generator))
    products = a8.float() * b8.float()  # (rows, k), exact
    return products, 1.0 / (scale_a * scale_b)


def accumulation_error(
    k: int,
    mantissa_bits: int,
    *,
    promote_every: int | None = None,
    rounding: str = "nearest",
    rows: int = 64,
    seed: int = 0,
) -> float:
    """Relative error ``||s - s_64|| / ||s_64||`` of ``rows`` FP8 dot products of length ``k``.

    The exact products of :func:`fp8_dot_products` are summed by :func:`limited_precision_sum`
    and the sum is then scaled, so all the error comes from the accumulator (and one rounding
    of the scaled sum); ``s_64`` sums the same products in float64 and scales them there.
    """
    products, decode = fp8_dot_products(k, rows=rows, seed=seed)
    exact = products.double().sum(-1) * decode.double()
    approx = (
        limited_precision_sum(
            products, mantissa_bits, promote_every=promote_every, rounding=rounding
        )
        * decode
    )  # the scales applied after the sum
    return float(torch.linalg.norm(approx.double() - exact) / torch.linalg.norm(exact))
