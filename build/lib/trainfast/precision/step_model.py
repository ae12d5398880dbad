"""Amdahl's law for a training step whose matrix products change precision.

A step's time is its matrix products plus everything else: elementwise ops, norms, softmax, the
loss, the optimizer's passes over its state and the gaps between kernels. Lower precision speeds
the two parts up by different factors: the products by the ratio of the tensor cores' rates
(about 15 on an H100's datasheet from float32 to bf16), the rest at most by the ratio of the bytes
it moves (2 from float32 to 16 bits, 1 where a recipe keeps it in float32, as autocast keeps its
norms, softmax and residual stream). :func:`split_step` splits a measured float32 step at the
rate a large float32 product reaches; :func:`amdahl_step_seconds` puts the split back together
at other rates. The chapter brackets a 16-bit step between "the rest unchanged" and "the rest
twice as fast" and reads the record against the bracket.

When not to use it: the split assumes the step's products run at the rate of a large square
product, so it overstates their speed for thin shapes and hides launch-bound phases in "the rest".
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfast.validation import check_number

__all__ = ["StepSplit", "amdahl_step_seconds", "split_step"]


@dataclass(frozen=True)
class StepSplit:
    """A measured step's seconds in its matrix products and in everything else."""

    matmul_seconds: float
    other_seconds: float

    @property
    def total_seconds(self) -> float:
        return self.matmul_seconds + self.other_seconds


def split_step(step_seconds: float, matmul_flops: float, matmul_flops_per_s: float) -> StepSplit:
    """Split ``step_seconds`` into ``matmul_flops`` at ``matmul_flops_per_s`` and the rest.

    ``matmul_flops`` is the step's matrix-product FLOPs
    (:func:`~trainfast.accounting.training_flops`); ``matmul_flops_per_s`` the rate the products
    reach, e.g. a large square product's from the ``matmul-throughput`` record. A rate at which
    the products alone would outlast the step raises ``ValueError``: it is too low for them.
    """
    check_number("step_seconds", step_seconds, above=0.0)
    check_number("matmul_flops", matmul_flops, above=0.0)
    check_number("matmul_flops_per_s", matmul_flops_per_s, above=0.0)
    matmul = matmul_flops / matmul_flops_per_s
    if matmul > step_seconds:
        raise ValueError(
            f"Invalid matmul_flops_per_s: {matmul_flops_per_s!r} (the products alone would take "
            f"{matmul:.4g} s, longer than the step's {step_seconds:.4g} s)"
        )
    return StepSplit(matmul, step_seconds - matmul)


def amdahl_step_seconds(
    split: StepSplit, matmul_flops: float, matmul_flops_per_s: float, other_speedup: float
) -> float:
    """The step's seconds with its products at ``matmul_flops_per_s`` and the rest of ``split``
    ``other_speedup`` times as fast (1: unchanged; 2: half the bytes, if bandwidth bound it)."""
    check_number("matmul_flops", matmul_flops, above=0.0)
    check_number("matmul_flops_per_s", matmul_flops_per_s, above=0.0)
    check_number("other_speedup", other_speedup, above=0.0)
    return matmul_flops / matmul_flops_per_s + split.other_seconds / other_speedup
