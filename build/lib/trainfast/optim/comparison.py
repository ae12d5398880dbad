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

import itertools
import math
import operator
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import torch
from torch import nn
from torch.utils.data import Dataset

from trainfast.loop import History, evaluate, train
from trainfast.records import Record
from trainfast.validation import check_flag

__all__ = [
    "Interval",
    "Run",
    "Tuned",
    "digits_mlp",
    "digits_splits",
    "mean_interval",
    "muon_vs_adamw_record",
    "paired_difference",
    "require_interior",
    "student_t_975",
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
# beyond 30, the usual table's rows (degrees of freedom, quantile), ending at the normal's 1.96
_T975_TAIL = [(30, 2.042), (40, 2.021), (60, 2.000), (120, 1.980), (math.inf, 1.960)]


def student_t_975(degrees_of_freedom: int) -> float:
    """The two-sided 95% quantile of Student's t: an interval is ``estimate ± this · SE``.

    From a table for 1 to 30 degrees of freedom; beyond, linear in ``1 / degrees_of_freedom``
    between the table's rows for 30, 40, 60, 120 and infinity (1.96), the usual way to read a t
    table: within 0.02% of the exact quantile. (t(31) is 2.04, 4% above 1.96.) The one rule
    behind every interval the chapters compute from a few repeats or a fit with few points:
    ``2 · SE`` would be an 82% interval at 2 degrees of freedom.
    """
    if isinstance(degrees_of_freedom, bool) or not isinstance(degrees_of_freedom, Integral):
        raise TypeError(f"Invalid degrees_of_freedom: {degrees_of_freedom!r} (expected an int)")
    dof = operator.index(degrees_of_freedom)
    if dof < 1:
        raise ValueError(f"Invalid degrees_of_freedom: {dof} (need at least 1)")
    if dof <= len(_T975):
        return _T975[dof - 1]
    (df0, t0), (df1, t1) = next(
        pair for pair in itertools.pairwise(_T975_TAIL) if pair[0][0] < dof <= pair[1][0]
    )
    weight = (1 / df0 - 1 / dof) / (1 / df0 - 1 / df1)  # 1/inf is 0.0
    return t0 + weight * (t1 - t0)


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
    half = student_t_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
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
    check_flag("lower_is_better", lower_is_better)
    diff = paired_difference(a, b)
    if diff.contains(0.0):
        where = f"95% interval {_two_digits(diff.low, '+')} to {_two_digits(diff.high, '+')} "
        return (
            f"the difference between {name_a} and {name_b}, {_two_digits(diff.mean, '+')} "
            f"{unit} ({where}{unit}, {diff.n} seeds), is inside the noise"
        )
    a_ahead = (diff.mean < 0) if lower_is_better else (diff.mean > 0)
    if not a_ahead:
        name_a, name_b, a, b = name_b, name_a, b, a
    advantage = paired_difference(b, a) if lower_is_better else paired_difference(a, b)
    where = f"95% interval {_two_digits(advantage.low)} to {_two_digits(advantage.high)} {unit}"
    word = "lower than" if lower_is_better else "ahead of"
    return (
        f"{name_a} is {word} {name_b} by {_two_digits(advantage.mean)} {unit} "
        f"({where}, {advantage.n} seeds)"
    )


def _two_digits(value: float, sign: str = "") -> str:
    """``value`` to two significant digits as a person writes it: ``1.0`` (not ``1``, which reads
    "+1 points"), ``7.1``, ``18``, ``0.25``; ``sign="+"`` writes the sign of a difference."""
    text = f"{value:{sign}.2g}"
    if "e" not in text and "." not in text and abs(value) < 10:
        text += ".0"
    return text


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
    widen: int = 0,
) -> Tuned:
    """Pick the lr with the best validation accuracy at ``tuning_seed``, then run it on ``seeds``.

    ``run(lr, seed)`` trains once, e.g. a ``functools.partial`` of :func:`train_and_score`.
    The repeats use seeds the tuning did not, so the reported test accuracies are not the
    selected (hence optimistic) tuning run. An optimum at the edge of a grid says only that the
    best rate may lie beyond it: with ``widen > 0`` the (geometric) grid grows by one point past
    that edge, at the grid's own ratio, up to ``widen`` times, until the best rate is interior.
    """
    if not lrs:
        raise ValueError("Invalid lrs: the grid is empty")
    if tuning_seed in seeds:
        raise ValueError(f"Invalid seeds: {list(seeds)} include the tuning seed {tuning_seed}")
    lrs = sorted(lrs)
    if widen and len(lrs) < 2:
        raise ValueError(f"Invalid lrs: widening needs at least two points, got {lrs}")
    grid = {lr: run(lr, tuning_seed) for lr in lrs}
    for _ in range(widen):
        best_lr = max(grid.values(), key=lambda r: r.validation_accuracy).lr
        low, high = min(grid), max(grid)
        if low < best_lr < high:
            break
        ratio = (high / low) ** (1 / (len(grid) - 1))
        new_lr = float(f"{(high * ratio if best_lr == high else low / ratio):.3g}")
        grid[new_lr] = run(new_lr, tuning_seed)
    runs = [grid[lr] for lr in sorted(grid)]
    best = max(runs, key=lambda r: r.validation_accuracy)
    return Tuned(runs, best.lr, [run(best.lr, seed) for seed in seeds])


def require_interior(name: str, tuned: Tuned) -> float:
    """``tuned.best_lr`` if it lies strictly inside its grid, else a ``RuntimeError``.

    A rate chosen at a grid's edge says only that the best rate may lie beyond it, so a
    comparison of two such optimizers compares the grids as much as the optimizers.
    """
    grid = [run.lr for run in tuned.grid]
    if not min(grid) < tuned.best_lr < max(grid):
        raise RuntimeError(
            f"{name}: the chosen lr {tuned.best_lr:g} is at the edge of its grid "
            f"{sorted(grid)}; widen the grid"
        )
    return tuned.best_lr


def digits_mlp(
    seed: int = 0, hidden: int = 128, device: torch.device | str | None = None
) -> nn.Module:
    """The optimizers chapter's small network: 64 → ``hidden`` → 10, ReLU between, its weights
    drawn from ``seed`` (so two calls with one seed give the same network), on ``device``.

    Every section of the chapter trains this same model, so their numbers are comparable.
    """
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    return model.to(device) if device is not None else model


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
    """Muon on the hidden weights against AdamW alone on the digits MLP, a fair comparison.

    Three arms, with the same network, steps, batches, seeds, grid size and AdamW settings
    (betas (0.9, 0.95), eps 1e-8, decoupled weight decay 0.01 everywhere, Muon's included):

    * ``AdamW``: AdamW on every parameter, lr tuned;
    * ``Muon + AdamW``: Muon (Keller Jordan's scaling) on the two hidden matrices, AdamW on the
      input and output layers and the biases at the AdamW arm's tuned lr; Muon's lr tuned,
      since it is in different units;
    * ``Muon (Moonlight) + AdamW``: the same split with ``adjust_lr_fn="match_rms_adamw"``
      (Liu et al. 2025), one lr for both kinds of group, tuned on AdamW's grid.

    Each lr is chosen by validation accuracy (seed 0) on a five-point grid widened past an edge
    optimum (:func:`tune_then_repeat`), then runs on fresh seeds; after the repeats, a rate
    still at its grid's edge stops the benchmark (:func:`require_interior`). Every row records
    the network's width, the split sizes, the numbers of Muon and AdamW parameters and the
    CPU threads torch used. On a CPU the study runs on one thread (set here, and restored after),
    so that its seconds do not depend on how many cores a shared machine leaves it; they still
    depend on the machine's load, so read them as that machine's, not as Muon's cost. Full
    size: 4 repeats of 200 steps of batch 64 on width 128 (minutes on a CPU); ``quick``: 2
    repeats of 30 steps on width 32 (a smoke test of the study, seconds on a CPU).
    """
    previous_threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        return _muon_vs_adamw(device, quick)
    finally:
        torch.set_num_threads(previous_threads)


def _muon_vs_adamw(device: torch.device, quick: bool) -> Record:
    """The study of :func:`muon_vs_adamw_record`, on the threads the caller set."""
    from functools import partial

    from trainfast.optim import AdamW, Muon, muon_param_groups
    from trainfast.records import make_record

    steps, seeds = (30, (1, 2)) if quick else (200, (1, 2, 3, 4))
    width = 32 if quick else 128
    data = digits_splits()
    names = ("train_examples", "validation_examples", "test_examples")
    split = dict(zip(names, map(len, data), strict=True))
    adamw = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01}

    def model_fn(seed: int) -> nn.Module:
        return deep_mlp(seed, width=width).to(device)

    def muon_fn(model: nn.Module, lr: float, adamw_lr: float, adjust_lr_fn: str) -> Muon:
        groups = muon_param_groups(model, input_layer=model[0])
        return Muon(
            groups,
            lr=lr,
            weight_decay=adamw["weight_decay"],
            adjust_lr_fn=adjust_lr_fn,
            adamw_lr=adamw_lr,
            adamw_betas=adamw["betas"],
            adamw_eps=adamw["eps"],
            adamw_weight_decay=adamw["weight_decay"],
        )

    adamw_grid = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
    muon_grid = (3e-3, 1e-2, 3e-2, 0.1, 0.3)
    rows = []

    def study(name: str, lrs: tuple[float, ...], optimizer_fn: Callable) -> Tuned:
        run = partial(
            train_and_score, model_fn, optimizer_fn, data=data, batch_size=64, steps=steps
        )
        tuned = tune_then_repeat(run, lrs, seeds=seeds, widen=3)
        require_interior(name, tuned)
        probe = model_fn(0)
        groups = muon_param_groups(probe, input_layer=probe[0]) if "Muon" in name else []
        muon_params = sum(p.numel() for g in groups if g["use_muon"] for p in g["params"])
        total = sum(p.numel() for p in probe.parameters())
        for role, runs in (("tuning", tuned.grid), ("repeat", tuned.repeats)):
            for r in runs:
                rows.append(
                    {
                        "optimizer": name,
                        "role": role,
                        "lr": r.lr,
                        "seed": r.seed,
                        "validation_accuracy": r.validation_accuracy,
                        "test_accuracy": r.test_accuracy,
                        "seconds": r.history.seconds[-1],
                        "muon_params": muon_params,
                        "adamw_params": total - muon_params,
                        "width": width,
                        "threads": torch.get_num_threads(),
                        **split,
                    }
                )
        return tuned

    adamw_lr = study(
        "AdamW", adamw_grid, lambda m, lr: AdamW(m.parameters(), lr=lr, **adamw)
    ).best_lr
    study(
        "Muon + AdamW",
        muon_grid,
        lambda m, lr: muon_fn(m, lr, adamw_lr=adamw_lr, adjust_lr_fn="original"),
    )
    study(
        "Muon (Moonlight) + AdamW",
        adamw_grid,
        lambda m, lr: muon_fn(m, lr, adamw_lr=lr, adjust_lr_fn="match_rms_adamw"),
    )
    return make_record(
        name="muon-vs-adamw",
        description=(
            f"Muon on the two hidden matrices (input and output layers on AdamW) against AdamW "
            f"on a 4-layer MLP (width {width}) on scikit-learn digits ({split['train_examples']} "
            f"training, {split['validation_examples']} validation, {split['test_examples']} "
            f"test examples), {steps} steps of batch 64, the same AdamW settings in every arm: "
            f"lr tuned on a five-point grid by validation accuracy (seed 0), widened past an "
            f"edge optimum, then {len(seeds)} fresh seeds at the chosen lr, scored on the test "
            "split."
        ),
        rows=rows,
        units={"validation_accuracy": "fraction", "test_accuracy": "fraction", "seconds": "s"},
        device=device,
    )
