"""Block scaling, emulated: one scale per small block of values instead of one per tensor.

A per-tensor scale is set by the tensor's largest value, so a single outlier pushes every
other value toward the format's floor. Block formats give each run of ``block_size``
consecutive values (along the last axis) its own scale:

* **MXFP8** (Open Compute Project, "OCP Microscaling Formats (MX) Specification" v1.0, 2023;
  Rouhani et al. 2023): blocks of 32 FP8 values (the specification allows e4m3 or e5m2; this
  module emulates e4m3, Transformer Engine's default) sharing an E8M0 scale, a bare power of two.
  The specification's conversion (its section 6.3, as torchao's ``to_mx``, which cites that
  section, and Microsoft's microxcaling ``_quantize_mx`` implement it) sets the scale to the
  largest power of two not above the block's amax divided by the element type's largest power
  of two, here ``2^(floor(log2 amax) - 8)`` (e4m3's is 2^8), which puts the block's amax in
  [256, 512), and clamps elements above the element type's largest normal value to it,
  preserving the sign: values above 448 saturate, as :func:`round_to_minifloat` does. It
  overshoots rather than leaving a binade unused. Transformer Engine rounds ``amax / 448`` *up*
  to a power of two instead, which never saturates but can leave up to one binade unused (its
  MXFP8 documentation). The specification's other formats share the 32-element block and the
  E8M0 scale and are not emulated here: MXFP6 (E3M2 or E2M3 elements), MXFP4 (E2M1) and
  MXINT8 (8-bit integers);
* **NVFP4** (NVIDIA, Transformer Engine documentation, ``NVFP4BlockScaling``): blocks of 16
  E2M1 values (4 bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6) sharing an e4m3 scale ``amax / 6``, with a
  second, per-tensor float32 scale that brings the block scales into e4m3's range.

Blackwell tensor cores consume these formats directly (and MXFP6 and MXFP4, not MXINT8); here
:func:`fake_quantize` returns the dequantised values (float32) so that their error can be
measured on any device. Rounding is round-to-nearest-even (:func:`round_to_minifloat`, checked
against torch's e4m3 cast).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "BLOCK_FORMATS",
    "BlockFormat",
    "ErrorByPosition",
    "error_by_position",
    "fake_quantize",
    "round_to_minifloat",
]


@dataclass(frozen=True)
class Minifloat:
    """An element or scale format: mantissa bits, smallest normal, largest value."""

    mantissa_bits: int
    min_normal: float
    max: float


_E4M3 = Minifloat(3, 2.0**-6, 448.0)
_E2M1 = Minifloat(1, 1.0, 6.0)


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format: ``block_size`` elements in ``element`` share one scale.

    ``scale`` is ``"e8m0"`` (a power of two, MX) or ``"e4m3"`` (NVFP4, with a float32
    per-tensor scale on top); ``None`` with ``block_size = 0`` is plain per-tensor scaling.
    """

    name: str
    block_size: int
    element: Minifloat
    scale: str | None


BLOCK_FORMATS: dict[str, BlockFormat] = {
    "per-tensor e4m3": BlockFormat("per-tensor e4m3", 0, _E4M3, None),
    "MXFP8": BlockFormat("MXFP8", 32, _E4M3, "e8m0"),
    "NVFP4": BlockFormat("NVFP4", 16, _E2M1, "e4m3"),
}


def round_to_minifloat(x: Tensor, fmt: Minifloat) -> Tensor:
    """Round float32 ``x`` to the nearest value of ``fmt`` (ties to even), saturating at its max.

    Within the binade of ``|x|`` (at least the smallest normal's, which gives the subnormals)
    the spacing is ``2^(exponent - mantissa_bits)``; ``torch.round`` rounds half to even.
    Out of range it saturates, as the saturating conversion of the OCP 8-bit floating point
    specification (OFP8) does: a magnitude above ``fmt.max``, infinity included, becomes
    ``±fmt.max`` and NaN stays NaN (CUDA's ``__NV_SATFINITE`` and torch's own CPU cast to
    ``float8_e4m3fn`` since PyTorch PR #178817 do the same; the non-saturating conversion gives
    e4m3 NaN for both).
    """
    magnitude = x.abs().float().clamp(max=fmt.max)  # inf -> max; NaN passes through
    exponent = torch.floor(torch.log2(magnitude.clamp_min(fmt.min_normal)))
    step = torch.exp2(exponent - fmt.mantissa_bits)
    return torch.sign(x) * torch.round(magnitude / step) * step


def fake_quantize(x: Tensor, fmt: BlockFormat | str) -> Tensor:
    """``x`` quantised to ``fmt`` and dequantised again, float32; last axis divisible by the block.

    Per block (``(..., n_blocks, block_size)``): compute the scale from the block's amax,
    round the scale to its own format, divide, round the elements, multiply back.
    """
    fmt = BLOCK_FORMATS[fmt] if isinstance(fmt, str) else fmt
    x = x.float()
    if fmt.block_size == 0:  # one scale for the tensor, amax -> the element format's max
        amax = x.abs().amax()
        scale = fmt.element.max / amax if amax > 0 else torch.tensor(1.0)
        return round_to_minifloat(x * scale, fmt.element) / scale
    if x.shape[-1] % fmt.block_size:
        raise ValueError(
            f"Last dimension {x.shape[-1]} is not a multiple of the block size {fmt.block_size}"
        )
    blocks = x.unflatten(-1, (-1, fmt.block_size))  # (..., n_blocks, block_size)
    amax = blocks.abs().amax(-1, keepdim=True)  # (..., n_blocks, 1)
    if fmt.scale == "e8m0":  # power of two: 2^(floor(log2 amax) - emax of the element format)
        emax = math.floor(math.log2(fmt.element.max))
        decode = torch.exp2(torch.floor(torch.log2(amax.clamp_min(2.0**-127))) - emax)
    elif fmt.scale == "e4m3":  # e4m3 block scale amax / max, under a float32 per-tensor scale
        tensor_amax = float(x.abs().amax())
        per_tensor = tensor_amax / (fmt.element.max * _E4M3.max) if tensor_amax > 0 else 1.0
        block_scale = round_to_minifloat(amax / fmt.element.max / per_tensor, _E4M3)
        decode = block_scale * per_tensor
    else:
        raise ValueError(f"Unknown scale format: {fmt.scale!r}")
    decode = torch.where(decode > 0, decode, torch.ones_like(decode))  # all-zero blocks
    return (round_to_minifloat(blocks / decode, fmt.element) * decode).flatten(-2)


@dataclass(frozen=True)
class ErrorByPosition:
    """Relative errors of a quantised tensor with one outlier column, split by position.

    ``block_mates``: the other values of the outlier's blocks (for per-tensor scaling, every
    other value); ``other_blocks``: the values of the remaining blocks; ``mates_zero``: the share
    of the block-mates quantised to exactly zero.
    """

    block_mates: float
    other_blocks: float
    mates_zero: float


def error_by_position(x: Tensor, fmt: BlockFormat | str, column: int) -> ErrorByPosition:
    """Error of :func:`fake_quantize` on ``x`` ``(..., n)``, split around an outlier ``column``.

    The block-mates are the columns that share ``column``'s block (``fmt.block_size`` wide);
    per-tensor scaling has one block, so its block-mates are all other columns and its other
    blocks are the same values.
    """
    fmt = BLOCK_FORMATS[fmt] if isinstance(fmt, str) else fmt
    n = x.shape[-1]
    if not 0 <= column < n:
        raise ValueError(f"Invalid column: {column} (x has {n} columns)")
    q = fake_quantize(x, fmt)
    size = fmt.block_size or n
    start = column - column % size
    mates = torch.zeros(n, dtype=torch.bool)
    mates[start : start + size] = True
    mates[column] = False
    others = ~mates if fmt.block_size else mates
    others[column] = False

    def error(columns: Tensor) -> float:
        return float((q - x)[..., columns].norm() / x[..., columns].norm())

    return ErrorByPosition(
        block_mates=error(mates),
        other_blocks=error(others),
        mates_zero=float((q[..., mates] == 0).float().mean()),
    )
