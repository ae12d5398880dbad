"""Compare optimizers honestly: tune each one's learning rate, then repeat over fresh seeds.

One training run is one sample. Whether optimizer A beats optimizer B on a small problem can
flip with the seed, and a comparison at one learning rate each compares the learning rates as
much as the optimizers. The protocol here:

1. :func:`tune_then_repeat` tunes the learning rate on a small grid, choosing by *validation*
   accuracy with one seed, then trains with the chosen rate on *fresh* seeds and reports their
   *test* accuracies (re-using the tuning run would carry its lucky draw into the report:
   the optimizer's curse).
2. :func:`mean_interval` turns the repeats into a mean with a Student-t interval, and
   :func:`verdict` compares two optimizers by the interval of their paired differences (the
   same seed gives both the same initial weights and batch order) and says so when the
   difference is inside the noise.

:func:`muon_vs_adamw_record` runs the chapter's Muon-against-AdamW study as a
``python -m trainfast.measure`` benchmark, since it is too slow to run in the book build on a CPU.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import Dataset

from trainfast.loop import History, evaluate, train
from trainfast.records import Record

__all__ = [
    "Interval",
    "Run",
    "Tuned",
    "digits_splits",
    "mean_interval",
    "muon_vs_adamw_record",
    "paired_difference",
    "train_and_score",
    "tune_then_repeat",
    "verdict",
]

# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom
_T975 = [
    *(12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228),  # 1..10
    *(2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086),  # 11..20
    *(2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042),  # 21..30
]


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` repeats with a 95% Student-t confidence interval ``[low, high]``."""

    mean: float
    low: float
    high: float
    n: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __format__(self, spec: str) -> str:
        spec = spec or ".3g"
        return f"{self.mean:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def mean_interval(values: Sequence[float]) -> Interval:
    """The mean of ``values`` and its 95% interval, ``mean ± t · sd / √n`` (Student's t).

    Needs at least two values: one run has no spread to estimate.
    """
    n = len(values)
    if n < 2:
        raise ValueError(f"Invalid values: {list(values)} (need at least 2 repeats for a spread)")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"Invalid values: {list(values)} (not all finite)")
    mean = statistics.fmean(values)
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    half = t * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Interval:
    """The 95% interval of the mean of ``a[i] - b[i]``: repeat ``i`` of both used seed ``i``."""
    if len(a) != len(b):
        raise ValueError(f"Invalid pairs: {len(a)} values against {len(b)}")
    return mean_interval([x - y for x, y in zip(a, b, strict=True)])


def verdict(
    name_a: str,
    a: Sequence[float],
    name_b: str,
    b: Sequence[float],
    unit: str,
    *,
    lower_is_better: bool = False,
) -> str:
    """A sentence comparing paired results ``a`` and ``b``, computed from their interval.

    If the 95% interval of the paired difference contains zero, the sentence says the
    difference is inside the noise of the repeats; otherwise it names the one ahead (the higher,
    or with ``lower_is_better`` the lower, as for a loss) and the interval of its advantage.
    """
    diff = paired_difference(a, b)
    if diff.contains(0.0):
        where = f"95% interval {diff.low:+.2g} to {diff.high:+.2g} {unit}, {diff.n} seeds"
        return (
            f"the difference between {name_a} and {name_b}, {diff.mean:+.2g} {unit} ({where}), "
            "is inside the noise"
        )
    a_ahead = (diff.mean < 0) if lower_is_better else (diff.mean > 0)
    if not a_ahead:
        name_a, name_b, a, b = name_b, name_a, b, a
    advantage = paired_difference(b, a) if lower_is_better else paired_difference(a, b)
    where = f"95% interval {advantage.low:.2g} to {advantage.high:.2g} {unit}, {advantage.n} seeds"
    word = "lower than" if lower_is_better else "ahead of"
    return f"{name_a} is {word} {name_b} by {advantage.mean:.2g} {unit} ({where})"


@dataclass
class Run:
    """One training run: validation and test accuracy (fractions) and its loss history."""

    lr: float
    seed: int
    validation_accuracy: float
    test_accuracy: float
    history: History


@dataclass
class Tuned:
    """:func:`tune_then_repeat`'s result: the grid's tuning runs, the choice, the repeats."""

    grid: list[Run]
    best_lr: float
    repeats: list[Run] = field(default_factory=list)

    @property
    def test_accuracies(self) -> list[float]:
        return [run.test_accuracy for run in self.repeats]


def digits_splits(validation_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, ...]:
    """The digits data as ``(train, validation, test)``, from :func:`trainfast.datasets.digits`.

    ``validation_fraction`` of the whole data set is held out of training for selection, so
    selection never looks at the test set; the test split is the one every chapter uses.
    """
    from trainfast.datasets import digits

    return tuple(
        digits(split, validation_fraction=validation_fraction, seed=seed)
        for split in ("train", "validation", "test")
    )


def train_and_score(
    model_fn: Callable[[int], nn.Module],
    optimizer_fn: Callable[[nn.Module, float], torch.optim.Optimizer],
    lr: float,
    seed: int,
    data: tuple[Dataset, ...],
    *,
    batch_size: int,
    steps: int,
) -> Run:
    """Train ``model_fn(seed)`` with ``optimizer_fn(model, lr)``, score it on validation and test.

    ``seed`` fixes both the initial weights and the batch order. A run whose loss diverged
    scores whatever its (non-finite) weights predict, usually chance.
    """
    train_set, validation, test = data
    model = model_fn(seed)
    history = train(
        model, optimizer_fn(model, lr), train_set, batch_size=batch_size, steps=steps, seed=seed
    )
    _, validation_accuracy = evaluate(model, validation)
    _, test_accuracy = evaluate(model, test)
    return Run(lr, seed, validation_accuracy, test_accuracy, history)


def tune_then_repeat(
    run: Callable[[float, int], Run],
    lrs: Sequence[float],
    *,
    tuning_seed: int = 0,
    seeds: Sequence[int] = (1, 2, 3),
) -> Tuned:
    """Pick the lr with the best validation accuracy at ``tuning_seed``, then run it on ``seeds``.

    ``run(lr, seed)`` trains once, e.g. a ``functools.partial`` of :func:`train_and_score`.
    The repeats use seeds the tuning did not, so the reported test accuracies are not the
    selected (hence optimistic) tuning run.
    """
    if not lrs:
        raise ValueError("Invalid lrs: the grid is empty")
    if tuning_seed in seeds:
        raise ValueError(f"Invalid seeds: {list(seeds)} include the tuning seed {tuning_seed}")
    grid = [run(lr, tuning_seed) for lr in lrs]
    best = max(grid, key=lambda r: r.validation_accuracy)
    return Tuned(grid, best.lr, [run(best.lr, seed) for seed in seeds])


def deep_mlp(seed: int, width: int = 256) -> nn.Module:
    """The Muon study's network: 64 → width → width → width → 10, ReLU between."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(64, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 10),
    )


def muon_vs_adamw_record(device: torch.device, quick: bool) -> Record:
    """Muon (hidden weights) + AdamW (the rest) against AdamW alone on the digits MLP.

    Each optimizer's lr is tuned on a small grid by validation accuracy (seed 0), then run on
    fresh seeds; the rows hold every run. Full size: 4 repeats of 300 steps of batch 64;
    ``quick``: 2 repeats of 30 steps.
    """
    from functools import partial

    from trainfast.optim import AdamW, Muon, muon_param_groups
    from trainfast.records import make_record

    steps, seeds = (30, (1, 2)) if quick else (300, (1, 2, 3, 4))
    data = digits_splits()
    model_fn = partial(lambda seed, d: deep_mlp(seed).to(d), d=device)
    contenders = {
        "AdamW": (
            (1e-3, 3e-3, 1e-2),
            lambda m, lr: AdamW(m.parameters(), lr=lr, weight_decay=0.01),
        ),
        "Muon + AdamW": (
            (0.001, 0.003, 0.01, 0.03),
            lambda m, lr: Muon(muon_param_groups(m), lr=lr, adamw_lr=3e-3),
        ),
    }
    rows = []
    for name, (lrs, optimizer_fn) in contenders.items():
        run = partial(
            train_and_score, model_fn, optimizer_fn, data=data, batch_size=64, steps=steps
        )
        tuned = tune_then_repeat(run, lrs, seeds=seeds)
        for role, runs in (("tuning", tuned.grid), ("repeat", tuned.repeats)):
            for r in runs:
                row = {
                    "optimizer": name,
                    "role": role,
                    "lr": r.lr,
                    "seed": r.seed,
                    "validation_accuracy": r.validation_accuracy,
                    "test_accuracy": r.test_accuracy,
                    "seconds": r.history.seconds[-1],
                }
                rows.append(row)
    return make_record(
        name="muon-vs-adamw",
        description=(
            f"Muon + AdamW against AdamW on a 4-layer MLP (width 256) on scikit-learn digits, "
            f"{steps} steps of batch 64: lr tuned on a small grid by validation accuracy "
            f"(seed 0), then {len(seeds)} fresh seeds at the chosen lr, scored on the test split."
        ),
        rows=rows,
        units={"validation_accuracy": "fraction", "test_accuracy": "fraction", "seconds": "s"},
        device=device,
    )
