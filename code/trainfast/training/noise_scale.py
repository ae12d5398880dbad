"""The gradient noise scale: how large a batch still buys a proportionally better step.

McCandlish et al. (2018, "An Empirical Model of Large-Batch Training",
https://arxiv.org/abs/1812.06162) model a mini-batch gradient as the true gradient ``G`` plus
noise whose covariance is ``Σ / B``. Up to a batch of about the *simple noise scale*::

    B_simple = tr(Σ) / |G|²

doubling the batch nearly halves the number of steps a run needs (the noise dominates); well
beyond it, a larger batch only wastes examples. ``B_simple`` estimates the *critical batch
size*, and it grows as training proceeds and ``|G|`` shrinks, which is why large runs ramp the
batch size up.

The unbiased estimator of their Appendix A needs only the squared norms of gradients at two
batch sizes ``b < B``: ``E|G_b|² = |G|² + tr(Σ)/b``, so::

    |G|²  ≈ (B |G_B|² - b |G_b|²) / (B - b),
    tr(Σ) ≈ (|G_b|² - |G_B|²) / (1/b - 1/B),

each averaged over many batches before the ratio is taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset

from trainfast.validation import check_counts, check_int

__all__ = ["NoiseScale", "gradient_noise_scale"]


@dataclass(frozen=True)
class NoiseScale:
    """The estimates at one point of training; ``simple`` is ``B_simple`` in examples."""

    gradient_norm_sq: float  # |G|^2
    trace_covariance: float  # tr(Σ), per example
    small: int
    big: int
    batches: int

    @property
    def simple(self) -> float:
        return self.trace_covariance / self.gradient_norm_sq


def _gradient(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn
) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss_fn(model(inputs), targets).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def gradient_noise_scale(
    model: nn.Module,
    dataset: Dataset,
    *,
    small: int = 8,
    big: int = 256,
    batches: int = 32,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
    seed: int = 0,
) -> NoiseScale:
    """Estimate ``B_simple`` of ``model`` on ``dataset`` at its current weights from
    ``batches`` pairs of gradients: one on a random batch of ``big`` examples, one on the first
    ``small`` of them (McCandlish et al., 2018, Appendix A). The model is left unchanged, in
    eval mode for the estimate (no dropout noise) and then restored; gradients are cleared."""
    check_counts(small=small, batches=batches)
    check_int("big", big, minimum=small + 1)  # the two batch sizes must differ
    n_examples = len(dataset)  # type: ignore[arg-type]
    if big > n_examples:
        raise ValueError(f"Invalid big={big}: the data set has only {n_examples} examples")
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    small_sq, big_sq = 0.0, 0.0
    for _ in range(batches):
        index = torch.randperm(n_examples, generator=generator)[:big].tolist()
        inputs = torch.stack([dataset[i][0] for i in index]).to(device)
        targets = torch.stack([torch.as_tensor(dataset[i][1]) for i in index]).to(device)
        big_sq += _gradient(model, inputs, targets, loss_fn).square().sum().item()
        small_sq += _gradient(model, inputs[:small], targets[:small], loss_fn).square().sum().item()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    small_sq, big_sq = small_sq / batches, big_sq / batches
    gradient_norm_sq = (big * big_sq - small * small_sq) / (big - small)
    trace = (small_sq - big_sq) / (1 / small - 1 / big)
    return NoiseScale(gradient_norm_sq, trace, small, big, batches)
