"""Model FLOPs utilisation (MFU), the book's one convention, and the length of a training run.

**The convention.** MFU is the model's FLOPs per second
(:func:`~trainfast.accounting.training_flops`, recomputation not counted) over the chip's
*dense bf16* peak (:func:`~trainfast.utilization.mfu_peak_flops`), whatever format the run
computes in (Chowdhery et al. 2022, "PaLM", Section 4.1 and Appendix B, divide by one
theoretical peak per system; nanoGPT's ``estimate_mfu`` takes the A100's bf16 312 TFLOP/s). One
denominator per chip lets a change of format show as what it is: a float32 step cannot reach
100 %, and moving its matmuls to bf16 raises the MFU. The efficiency of the format the matmuls
actually run in is a different quantity, which the step-time model calls *matmul efficiency*
(:class:`~trainfast.distributed.step_time.StepAssumptions`), never MFU. Every MFU in the
package is :func:`~trainfast.utilization.model_flops_utilization` (a test scans the package for
others).
"""

from __future__ import annotations

from trainfast.gpus import GPUSpec
from trainfast.validation import (
    check_flag,
    check_instance,
    check_number,
    check_positive,
    check_positive_number,
)

__all__ = ["mfu_peak_flops", "model_flops_utilization", "training_run_seconds"]


def mfu_peak_flops(gpu: GPUSpec, n_devices: int = 1) -> float:
    """MFU's denominator: ``n_devices`` times the GPU's dense bf16 peak (:mod:`trainfast.gpus`).

    A GPU without bf16 tensor cores (the T4) has no bf16 peak; its 16-bit rate is fp16's, the
    format a mixed-precision run on it uses, so that is its denominator."""
    check_instance("gpu", gpu, GPUSpec, hint="trainfast.gpus.GPUS holds one per GPU")
    check_positive("n_devices", n_devices)
    peak = gpu.peak_flops.get("bf16", gpu.peak_flops.get("fp16"))
    if peak is None:
        raise ValueError(f"Invalid gpu: {gpu.name!r} has no 16-bit tensor-core peak")
    return n_devices * peak


def model_flops_utilization(
    flops_per_step: float,
    seconds_per_step: float,
    peak_flops: float,
    *,
    faster_than_bf16: bool = False,
) -> float:
    """Model FLOPs utilisation: the model's FLOPs per second
    (:func:`~trainfast.accounting.training_flops`, no recomputation) over ``peak_flops``, which
    for a GPU is :func:`~trainfast.utilization.mfu_peak_flops` (the module's convention; for a
    step on several devices, the peak of all of them together).

    A result above 1 cannot be, unless the matmuls ran in a format faster than dense bf16
    (fp8, or sparse): it raises ``ValueError`` naming the three figures (swapped, in the wrong
    units, one device's peak for a step on several, recomputation counted). Pass
    ``faster_than_bf16=True`` for such a run to get its MFU above 1."""
    check_positive_number("flops_per_step", flops_per_step)
    check_positive_number("seconds_per_step", seconds_per_step)
    check_positive_number("peak_flops", peak_flops)
    check_flag("faster_than_bf16", faster_than_bf16)
    mfu = flops_per_step / seconds_per_step / peak_flops
    if mfu > 1 and not faster_than_bf16:  # more than the chip's bf16 peak: a figure is wrong
        shown = f"{mfu:.0%}" if mfu < 100 else f"{mfu:.3g} times the peak"
        raise ValueError(
            f"Invalid MFU of {shown}, above 100%: flops_per_step={flops_per_step:g}, "
            f"seconds_per_step={seconds_per_step:g}, peak_flops={peak_flops:g} (are they "
            "swapped or in other units? Is the peak that of every device, and the FLOP count "
            "without recomputation? Only fp8 or sparse matmuls can beat the dense bf16 peak: "
            "for those, pass faster_than_bf16=True)"
        )
    return mfu


def training_run_seconds(
    flops_per_token: float, tokens: float, *, n_gpus: int, peak_flops: float, mfu: float
) -> float:
    """Seconds to train on ``tokens`` tokens with ``n_gpus`` devices of ``peak_flops`` each,
    running at model FLOPs utilisation ``mfu``: ``flops_per_token * tokens / (n_gpus * peak *
    mfu)``. ``flops_per_token`` is ``training_flops(shape) / shape.tokens`` (about 6 N)."""
    check_positive_number("flops_per_token", flops_per_token)
    check_positive_number("tokens", tokens)
    check_positive("n_gpus", n_gpus)
    check_positive_number("peak_flops", peak_flops)
    check_number("mfu", mfu, above=0.0, maximum=1.0)
    return flops_per_token * tokens / (n_gpus * peak_flops * mfu)
