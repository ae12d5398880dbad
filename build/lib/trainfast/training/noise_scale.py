"""The gradient noise scale: how large a batch still buys a proportionally better step.

McCandlish et al. (2018, "An Empirical Model of Large-Batch Training",
https://arxiv.org/abs/1812.06162) model a mini-batch gradient as the true gradient ``G`` plus
noise whose covariance is ``Σ / B``. Up to a batch of about the *simple noise scale*::

    B_simple = tr(Σ) / |G|²

doubling the batch nearly halves the number of steps a run needs (the noise dominates); well
beyond it, a larger batch only wastes examples. ``B_simple`` estimates the *critical batch
size*, and it grows as training proceeds and ``|G|`` shrinks, which is why large runs ramp the
batch size up.

Their Appendix A estimates it from the squared norms of gradients at two batch sizes
``b < B``, using ``E|G_b|² = |G|² + tr(Σ)/b``. That identity assumes the examples of a batch
are drawn independently (with replacement). A training loop, and this estimator by default,
draws a batch *without* replacement from a finite set of ``N`` examples; then the noise term
carries the finite-population factor ``(N - b)/(N - 1)``::

    E|G_b|² = |G|² + tr(Σ) · u(b),    u(b) = (N - b) / ((N - 1) b),

where ``Σ`` is the covariance of the ``N`` per-example gradients (divided by ``N``). Solving
the two equations for the two unknowns gives::

    tr(Σ) ≈ (|G_b|² - |G_B|²) / (u(b) - u(B)),
    |G|²  ≈ |G_B|² - tr(Σ) · u(B),

each norm averaged over many batch pairs before the ratio is taken. With ``u(b) = 1/b`` (an
infinite data set, or sampling with replacement) these are McCandlish et al.'s formulas; used
on batches drawn without replacement, those underestimate ``|G|²`` by ``tr(Σ)/(N - 1)`` and
overestimate ``B_simple`` by a factor of about ``1/(1 - B_simple/N)``.

The ratio of two noisy means is itself noisy: :attr:`NoiseScale.simple_stderr` is its
jackknife standard error over the batch pairs, and :meth:`NoiseScale.pairs_for` says how many
pairs a wanted precision needs. When the ``|G|²`` estimate comes out at or below zero (the
gradient is smaller than its noise can resolve with the pairs drawn), the estimate warns, and
:attr:`NoiseScale.simple` raises instead of returning a negative or infinite batch size.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset

from trainfast.validation import check_int

__all__ = ["NoiseScale", "exact_noise_scale", "gradient_noise_scale", "noise_scale_from_norms"]


def _u(batch: int, population: int | None) -> float:
    """The noise term's factor for a batch of ``batch`` examples: ``1/batch`` for independent
    draws, ``(N - batch) / ((N - 1) batch)`` without replacement from ``population = N``."""
    if population is None:
        return 1.0 / batch
    return (population - batch) / ((population - 1) * batch)


def _estimates(
    small_mean: float, big_mean: float, small: int, big: int, population: int | None
) -> tuple[float, float]:
    """``(|G|², tr(Σ))`` from the mean squared norms at the two batch sizes."""
    u_small, u_big = _u(small, population), _u(big, population)
    trace = (small_mean - big_mean) / (u_small - u_big)
    return big_mean - trace * u_big, trace


@dataclass(frozen=True)
class NoiseScale:
    """The estimates at one point of training, from ``batches`` pairs of squared gradient norms.

    ``simple`` is ``B_simple`` in examples. ``population`` is the number of examples the
    batches were drawn from without replacement, or None for independent draws (with
    replacement). The per-pair norms are kept, so that the precision can be read from them.
    """

    small: int
    big: int
    population: int | None
    small_norms_sq: tuple[float, ...]  # |G_b|^2, one per pair
    big_norms_sq: tuple[float, ...]  # |G_B|^2, one per pair

    @property
    def batches(self) -> int:
        return len(self.big_norms_sq)

    @property
    def gradient_norm_sq(self) -> float:
        """The estimate of ``|G|²``, the squared norm of the full-data gradient."""
        return self._estimate(self.small_norms_sq, self.big_norms_sq)[0]

    @property
    def trace_covariance(self) -> float:
        """The estimate of ``tr(Σ)``, the per-example gradient variance summed over parameters."""
        return self._estimate(self.small_norms_sq, self.big_norms_sq)[1]

    def _estimate(self, small: Sequence[float], big: Sequence[float]) -> tuple[float, float]:
        return _estimates(
            statistics.fmean(small), statistics.fmean(big), self.small, self.big, self.population
        )

    @property
    def resolved(self) -> bool:
        """Whether the ``|G|²`` estimate is positive, so that ``B_simple`` exists."""
        return self.gradient_norm_sq > 0

    @property
    def simple(self) -> float:
        """``B_simple = tr(Σ) / |G|²``, in examples; a ``ValueError`` when ``|G|² <= 0``."""
        gradient_norm_sq = self.gradient_norm_sq
        if gradient_norm_sq <= 0:
            raise ValueError(
                f"No B_simple: the |G|^2 estimate is {gradient_norm_sq:.3g} <= 0 after "
                f"{self.batches} batch pairs (the gradient is below the noise these pairs "
                "resolve); draw more pairs or a larger big batch"
            )
        return self.trace_covariance / gradient_norm_sq

    @property
    def simple_stderr(self) -> float:
        """The jackknife standard error of :attr:`simple` over the batch pairs (``inf`` when a
        leave-one-out estimate has no positive ``|G|²``)."""
        n = self.batches
        if n < 2:
            raise ValueError(f"A standard error needs at least 2 batch pairs, got {n}")
        small, big = list(self.small_norms_sq), list(self.big_norms_sq)
        small_sum, big_sum = math.fsum(small), math.fsum(big)
        leave_one_out = []
        for s, b in zip(small, big, strict=True):
            g2, trace = _estimates(
                (small_sum - s) / (n - 1),
                (big_sum - b) / (n - 1),
                self.small,
                self.big,
                self.population,
            )
            if g2 <= 0:
                return math.inf
            leave_one_out.append(trace / g2)
        mean = statistics.fmean(leave_one_out)
        return math.sqrt((n - 1) / n * math.fsum((x - mean) ** 2 for x in leave_one_out))

    @property
    def relative_error(self) -> float:
        """:attr:`simple_stderr` as a fraction of :attr:`simple`."""
        return self.simple_stderr / self.simple

    def interval(self) -> tuple[float, float]:
        """An approximate 95% interval for ``B_simple``: ``simple ± 1.96 · simple_stderr``."""
        half = 1.96 * self.simple_stderr
        return self.simple - half, self.simple + half

    def pairs_for(self, relative_error: float) -> int:
        """How many batch pairs would bring :attr:`relative_error` down to ``relative_error``,
        since a standard error falls as one over the square root of the number of pairs."""
        if relative_error <= 0:
            raise ValueError(f"Invalid relative_error: {relative_error} (expected > 0)")
        return math.ceil(self.batches * (self.relative_error / relative_error) ** 2)


def noise_scale_from_norms(
    small_norms_sq: Sequence[float],
    big_norms_sq: Sequence[float],
    *,
    small: int,
    big: int,
    population: int | None,
) -> NoiseScale:
    """A :class:`NoiseScale` from squared gradient norms measured elsewhere (for instance each
    data-parallel rank's local gradient against the all-reduced one), with a warning when the
    ``|G|²`` estimate is not positive."""
    check_int("small", small, minimum=1)
    check_int("big", big, minimum=1)
    if not small < big:
        raise ValueError(
            f"Invalid batch sizes: small={small}, big={big} (expected 1 <= small < big)"
        )
    if population is not None and big > population:
        raise ValueError(f"Invalid big={big}: the data set has only {population} examples")
    if len(small_norms_sq) != len(big_norms_sq) or len(big_norms_sq) == 0:
        raise ValueError(
            f"Invalid norms: {len(small_norms_sq)} small against {len(big_norms_sq)} big "
            "(expected the same number of pairs, at least one)"
        )
    estimate = NoiseScale(
        small, big, population, tuple(map(float, small_norms_sq)), tuple(map(float, big_norms_sq))
    )
    if not estimate.resolved:
        warnings.warn(
            f"The |G|^2 estimate is {estimate.gradient_norm_sq:.3g} <= 0 after "
            f"{estimate.batches} batch pairs: B_simple is not resolved; draw more pairs",
            RuntimeWarning,
            stacklevel=2,
        )
    return estimate


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
    batches: int = 128,
    replacement: bool = False,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
    seed: int = 0,
) -> NoiseScale:
    """Estimate ``B_simple`` of ``model`` on ``dataset`` at its current weights from
    ``batches`` pairs of gradients: one on a random batch of ``big`` examples, one on the first
    ``small`` of them (McCandlish et al., 2018, Appendix A).

    Batches are drawn without replacement, as a training loop draws them, and the estimate is
    corrected for the finite data set (the module's docstring); ``replacement=True`` draws
    independent examples and uses the uncorrected formulas, which are then exact in
    expectation. The model is left unchanged, in eval mode for the estimate (no dropout noise)
    and then restored; gradients are cleared. Read :attr:`NoiseScale.simple_stderr` before
    trusting a value: with a few dozen pairs it is often ten percent or more.
    """
    check_int("small", small, minimum=1)
    check_int("big", big, minimum=1)
    if not small < big:
        raise ValueError(
            f"Invalid batch sizes: small={small}, big={big} (expected 1 <= small < big)"
        )
    check_int("batches", batches, minimum=2)  # a standard error needs two pairs
    n_examples = len(dataset)  # type: ignore[arg-type]
    if big > n_examples:
        raise ValueError(f"Invalid big={big}: the data set has only {n_examples} examples")
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    small_norms, big_norms = [], []
    for _ in range(batches):
        if replacement:
            index = torch.randint(n_examples, (big,), generator=generator).tolist()
        else:
            index = torch.randperm(n_examples, generator=generator)[:big].tolist()
        inputs = torch.stack([dataset[i][0] for i in index]).to(device)
        targets = torch.stack([torch.as_tensor(dataset[i][1]) for i in index]).to(device)
        big_norms.append(_gradient(model, inputs, targets, loss_fn).square().sum().item())
        small_norms.append(
            _gradient(model, inputs[:small], targets[:small], loss_fn).square().sum().item()
        )
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return noise_scale_from_norms(
        small_norms,
        big_norms,
        small=small,
        big=big,
        population=None if replacement else n_examples,
    )


def exact_noise_scale(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
) -> tuple[float, float]:
    """``(|G|², tr(Σ))`` of ``model`` on the examples ``inputs`` from every per-example gradient
    (``torch.func``: ``vmap`` of ``grad``), ``Σ`` their covariance divided by ``N``: the values
    :func:`gradient_noise_scale` estimates. Memory grows as examples times parameters, so this
    is for small models and data sets, to check the estimator, not to replace it. The model is
    evaluated in its current mode."""
    from torch.func import functional_call, grad, vmap

    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss_fn(functional_call(model, p, (x[None],)), y[None])  # one example

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, inputs, targets)
    flat = torch.cat([g.reshape(len(targets), -1) for g in per_example.values()], 1).double()
    mean = flat.mean(0)  # G, the full-data gradient
    return mean.square().sum().item(), (flat - mean).square().sum(1).mean().item()
