"""The optimizer's curse: why the best of many noisy trials disappoints when you run it again.

Pick the configuration whose *measured* validation loss is lowest and its measurement is, on
average, too good: among many candidates, the winner is likely one whose noise happened to
flatter it. Smith and Winkler (2006, "The Optimizer's Curse", Management Science 52(3),
https://doi.org/10.1287/mnsc.1050.0451) describe it for decision analysis; in deep learning
the noise is the seed, the data order, the finite validation set. The remedies simulated here:
re-evaluate the winner on fresh seeds (the honest number), and shrink the measurement toward
the mean in proportion to how much of the spread is noise (the Bayesian estimate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trainfast.validation import check_counts, check_int, check_number

__all__ = ["CurseOutcome", "optimizers_curse", "shrink", "shrink_robust"]


@dataclass(frozen=True)
class CurseOutcome:
    """Averages over repeated sweeps of ``n_trials`` candidates (losses: lower is better)."""

    n_trials: int
    measured: float  # the winner's measured loss
    reevaluated: float  # the winner measured again, with fresh noise
    true: float  # the winner's true (noise-free) loss
    shrunk: float  # the winner's measurement shrunk toward the mean
    best_true: float  # the truly best candidate's true loss


def shrink(measured: np.ndarray, noise_std: float) -> np.ndarray:
    """Posterior means of the true losses under a normal prior fitted to ``measured``:
    ``mean + (1 - noise² / spread²) * (measured - mean)``, where ``spread²`` is the variance of
    the measurements and ``noise_std`` the measurement noise (e.g. the std over seeds).

    It assumes true losses and noise are both Gaussian. A sweep's losses are not: a few
    diverged runs inflate ``spread²``, the noise's share looks negligible and nothing shrinks.
    :func:`shrink_robust` is the version for such sweeps."""
    check_number("noise_std", noise_std, minimum=0.0)
    measured = np.asarray(measured, dtype=float)
    mean = measured.mean(axis=-1, keepdims=True)
    spread = measured.var(axis=-1, ddof=1, keepdims=True)  # unbiased: few runs are common
    weight = np.clip(1.0 - noise_std**2 / np.maximum(spread, 1e-12), 0.0, 1.0)  # signal share
    return mean + weight * (measured - mean)


def shrink_robust(measured: np.ndarray, noise_std: float) -> np.ndarray:
    """:func:`shrink` on the logarithm of the losses, with a median and a MAD spread.

    Sweep losses are positive and heavy-tailed (a diverged run sits at the chance loss, tens of
    times the best), so the logarithm is closer to Gaussian, and the median and the median
    absolute deviation (times 1.4826, a Gaussian's std) ignore the few runs that blew up.
    ``noise_std`` is the seed noise of the *log* loss (the std of ``log(loss)`` over seeds).
    Returns losses, not logarithms.
    """
    check_number("noise_std", noise_std, minimum=0.0)
    logs = np.log(np.asarray(measured, dtype=float))
    center = np.median(logs, axis=-1, keepdims=True)
    spread = 1.4826 * np.median(np.abs(logs - center), axis=-1, keepdims=True)
    weight = np.clip(1.0 - noise_std**2 / np.maximum(spread**2, 1e-12), 0.0, 1.0)
    return np.exp(center + weight * (logs - center))


def optimizers_curse(
    n_trials: Sequence[int],
    *,
    true_std: float = 0.05,
    noise_std: float = 0.05,
    mean: float = 0.5,
    repeats: int = 2000,
    seed: int = 0,
) -> list[CurseOutcome]:
    """Simulate sweeps of each size in ``n_trials``: true losses ``~ N(mean, true_std²)``,
    each measured once with noise ``~ N(0, noise_std²)``; pick the lowest measurement; measure
    it again. Returns the averages over ``repeats`` sweeps per size."""
    check_number("mean", mean)
    check_number("true_std", true_std, minimum=0.0)
    check_number("noise_std", noise_std, minimum=0.0)
    check_counts(repeats=repeats)
    check_int("seed", seed)
    rng = np.random.default_rng(seed)
    outcomes = []
    for n in n_trials:
        check_int("n_trials", n, minimum=2)  # a selection needs two candidates
        true = rng.normal(mean, true_std, size=(repeats, n))  # (repeats, n)
        measured = true + rng.normal(0.0, noise_std, size=(repeats, n))
        winner = measured.argmin(axis=1)  # (repeats,)
        rows = np.arange(repeats)
        again = true[rows, winner] + rng.normal(0.0, noise_std, size=repeats)
        outcomes.append(
            CurseOutcome(
                n_trials=n,
                measured=float(measured[rows, winner].mean()),
                reevaluated=float(again.mean()),
                true=float(true[rows, winner].mean()),
                shrunk=float(shrink(measured, noise_std)[rows, winner].mean()),
                best_true=float(true.min(axis=1).mean()),
            )
        )
    return outcomes
