"""Floating-point formats from their bits: range, precision and subnormals, derived by formula.

A binary floating-point number is ``(-1)^s · 2^(E - bias) · 1.M`` for an exponent field ``E``
of ``e`` bits and a mantissa (fraction) field ``M`` of ``m`` bits, with ``bias = 2^(e-1) - 1``.
Everything a practitioner needs to know about a format follows from ``e`` and ``m``:

* ``eps = 2^-m``, the gap between 1 and the next number: the *precision*;
* ``min_normal = 2^(1 - bias)``; below it, ``E = 0`` encodes *subnormals* ``0.M · 2^(1 - bias)``,
  down to ``min_subnormal = 2^(1 - bias - m)``: the *range* at the small end;
* ``max``: IEEE formats reserve ``E = 2^e - 1`` for infinities and NaNs, so the largest finite
  number is ``(2 - 2^-m) · 2^(2^e - 2 - bias)``. OCP's ``float8_e4m3fn`` ("finite, NaN") has no
  infinities and spends only ``E = 1111, M = 111`` on NaN, so its largest number is
  ``(2 - 2^(1-m)) · 2^(2^e - 1 - bias) = 1.75 · 2^8 = 448``.

:func:`float_format` tabulates this for float32, TF32, float16, bfloat16 and the two FP8
formats; the tests check every value against ``torch.finfo``. TF32 is not a storage type but
the input format of NVIDIA's tensor cores for float32 matrix products: float32's 8 exponent
bits with 10 mantissa bits. :func:`round_to_tf32` rounds float32 values to it, which is how the
chapter emulates TF32 on a CPU. :func:`decompose` reads a tensor's raw bit fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trainfast.validation import check_flag, check_int, check_number

__all__ = [
    "FORMAT_NAMES",
    "FloatFormat",
    "decompose",
    "float_format",
    "format_from_bits",
    "representable_values",
    "round_mantissa",
    "round_to_tf32",
]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format, every property derived from its bit layout."""

    name: str
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    min_normal: float
    min_subnormal: float
    eps: float
    has_infinity: bool = True  # False for float8_e4m3fn, which has only NaN
    dtype: torch.dtype | None = None  # None for TF32, which has no storage dtype

    @property
    def bits(self) -> int:
        return self.sign_bits + self.exponent_bits + self.mantissa_bits


def format_from_bits(
    name: str,
    exponent_bits: int,
    mantissa_bits: int,
    *,
    has_infinity: bool = True,
    dtype: torch.dtype | None = None,
) -> FloatFormat:
    """A :class:`FloatFormat` derived from its field widths (see the module docstring)."""
    e = check_int("exponent_bits", exponent_bits, minimum=2, maximum=11)  # 11: float64's
    m = check_int("mantissa_bits", mantissa_bits, minimum=1, maximum=52)
    check_flag("has_infinity", has_infinity)
    bias = 2 ** (e - 1) - 1
    if has_infinity:  # the all-ones exponent is reserved for inf and NaN
        largest = (2 - 2.0**-m) * 2.0 ** (2**e - 2 - bias)
    else:  # only all-ones is NaN: the top exponent keeps all mantissas but one
        largest = (2 - 2.0 ** (1 - m)) * 2.0 ** (2**e - 1 - bias)
    return FloatFormat(
        name=name,
        sign_bits=1,
        exponent_bits=e,
        mantissa_bits=m,
        bias=bias,
        max=largest,
        min_normal=2.0 ** (1 - bias),
        min_subnormal=2.0 ** (1 - bias - m),
        eps=2.0**-m,
        has_infinity=has_infinity,
        dtype=dtype,
    )


_FORMATS: dict[str, FloatFormat] = {
    "float32": format_from_bits("float32", 8, 23, dtype=torch.float32),
    "tf32": format_from_bits("tf32", 8, 10),
    "float16": format_from_bits("float16", 5, 10, dtype=torch.float16),
    "bfloat16": format_from_bits("bfloat16", 8, 7, dtype=torch.bfloat16),
    "float8_e4m3fn": format_from_bits(
        "float8_e4m3fn", 4, 3, has_infinity=False, dtype=torch.float8_e4m3fn
    ),
    "float8_e5m2": format_from_bits("float8_e5m2", 5, 2, dtype=torch.float8_e5m2),
}
_ALIASES = {
    "fp32": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "fp8_e5m2": "float8_e5m2",
}

#: The formats :func:`float_format` knows, from widest to narrowest.
FORMAT_NAMES: tuple[str, ...] = tuple(_FORMATS)


def float_format(dtype_or_name: torch.dtype | str) -> FloatFormat:
    """The :class:`FloatFormat` of a torch dtype or a name (``"tf32"``, ``"bf16"``, ``"e4m3"``...).

    An unknown dtype or name raises ``ValueError`` listing the known formats.
    """
    if isinstance(dtype_or_name, torch.dtype):
        for fmt in _FORMATS.values():
            if fmt.dtype == dtype_or_name:
                return fmt
    elif isinstance(dtype_or_name, str):
        key = dtype_or_name.lower().removeprefix("torch.")
        key = _ALIASES.get(key, key)
        if key in _FORMATS:
            return _FORMATS[key]
    raise ValueError(
        f"Unknown floating-point format: {dtype_or_name!r} (known: {', '.join(FORMAT_NAMES)}; "
        f"aliases: {', '.join(sorted(_ALIASES))})"
    )


def representable_values(
    fmt: FloatFormat | torch.dtype | str, low: float, high: float, *, max_count: int = 1_000_000
) -> list[float]:
    """Every positive number of ``fmt`` in ``[low, high)``, subnormals included, ascending.

    Enumerated from the bit fields, not by casting: ``E = 0`` gives ``M / 2^m · 2^(1 - bias)``,
    ``E >= 1`` gives ``(1 + M / 2^m) · 2^(E - bias)``, stopping at ``fmt.max``. Between two
    powers of two there are always ``2^m`` of them: 8 for e4m3, 4 for e5m2, 1024 for float16.
    A range holding more than ``max_count`` values (float32 has 2^31 positive ones) raises
    ``ValueError`` saying how many, before anything is allocated.
    """
    fmt = fmt if isinstance(fmt, FloatFormat) else float_format(fmt)
    check_number("low", low, above=0.0)
    check_number("high", high, above=0.0, allow_inf=True)
    check_int("max_count", max_count, minimum=1)
    if not low < high:
        raise ValueError(f"Invalid range: low={low}, high={high} (need 0 < low < high)")
    m, bias = fmt.mantissa_bits, fmt.bias
    count = 0  # an upper bound: whole binades from the one holding low to the one holding high
    for exponent_field in range(2**fmt.exponent_bits):
        scale = 2.0 ** (max(exponent_field, 1) - bias)
        lowest = scale if exponent_field else scale / 2**m  # the subnormals lie below scale
        if scale * 2 > low and not (lowest >= high or scale > fmt.max):
            count += 2**m
    if count > max_count:
        raise ValueError(
            f"Invalid range: {fmt.name} has up to {count:,} values in [{low:g}, {high:g}), "
            f"more than max_count={max_count:,} (narrow the range or raise max_count)"
        )
    values = []
    for exponent_field in range(2**fmt.exponent_bits):
        scale = 2.0 ** (max(exponent_field, 1) - bias)
        if scale * 2 <= low:
            continue
        lowest = scale if exponent_field else scale / 2**m  # the subnormals lie below scale
        if lowest >= high or scale > fmt.max:
            break
        lead = 0 if exponent_field == 0 else 1
        for mantissa in range(2**m):
            value = (lead + mantissa / 2**m) * scale
            if value > fmt.max:
                break
            if low <= value < high:
                values.append(value)
    return values


def round_mantissa(x: Tensor, mantissa_bits: int) -> Tensor:
    """Round float32 ``x`` to ``mantissa_bits`` mantissa bits, round-to-nearest-even; float32 out.

    The exponent range stays float32's, so this gives bfloat16's values for 7 bits (the tests
    check it against torch's own bfloat16 cast) and TF32's for 10. It works on the raw bits:
    add half of the dropped part, plus one if the kept part is odd (ties go to even), then clear
    the dropped bits; a carry out of the mantissa correctly bumps the exponent, and values that
    round past float32's maximum become infinity. NaN and infinity pass through unchanged.
    """
    if x.dtype != torch.float32:
        raise ValueError(f"round_mantissa expects float32, got {x.dtype}")
    check_int("mantissa_bits", mantissa_bits, minimum=0, maximum=23)  # float32 has 23
    drop = 23 - mantissa_bits
    if drop == 0:
        return x.clone()
    bits = x.contiguous().view(torch.int32)
    lowest_kept = (bits >> drop) & 1
    rounded = (bits + (1 << (drop - 1)) - 1 + lowest_kept) & ~((1 << drop) - 1)
    return torch.where(torch.isfinite(x), rounded.view(torch.float32), x)


def round_to_tf32(x: Tensor) -> Tensor:
    """Round a float32 tensor to TF32 (10 mantissa bits, round-to-nearest-even), as float32.

    Emulates the rounding of a float32 matrix product's inputs on tensor cores with TF32 on
    (``torch.backends.cuda.matmul.allow_tf32``). NVIDIA does not document which rounding its
    libraries use when converting (PTX offers round-to-nearest-away ``cvt.rna.tf32.f32``), so
    this is an emulation of the format, not of a particular kernel.
    """
    return round_mantissa(x, 10)


def decompose(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The integer bit fields ``(sign, exponent, mantissa)`` of a float tensor, read with ``view``.

    Each is an int64 tensor of ``x``'s shape: ``sign`` is 0 or 1, ``exponent`` the *stored*
    (biased) field ``E`` and ``mantissa`` the field ``M``. For a normal number
    ``x = (-1)^sign · 2^(exponent - bias) · (1 + mantissa / 2^m)``; ``exponent == 0`` marks zero
    and subnormals. Works for float64 and every format of :data:`FORMAT_NAMES` with a dtype.
    """
    if x.dtype == torch.float64:
        e, m, width, as_int = 11, 52, 64, torch.int64
    else:
        fmt = float_format(x.dtype)
        e, m, width = fmt.exponent_bits, fmt.mantissa_bits, fmt.bits
        as_int = {32: torch.int32, 16: torch.int16, 8: torch.uint8}[width]
    bits = x.contiguous().view(as_int).to(torch.int64)
    if width < 64:
        bits = bits & ((1 << width) - 1)  # undo the sign extension of int16/int32 views
    sign = (bits >> (width - 1)) & 1
    exponent = (bits >> m) & ((1 << e) - 1)
    mantissa = bits & ((1 << m) - 1)
    return sign, exponent, mantissa
