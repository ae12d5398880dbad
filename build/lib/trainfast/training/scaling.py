"""A scaling-law study small enough for a laptop: loss against training compute.

Kaplan et al. (2020, https://arxiv.org/abs/2001.08361) found that, for language models trained
compute-efficiently, loss falls as a power of compute, ``L ≈ a · C^(-alpha)``. The recipe to see
it: train models of several widths (here in steps of √2) on several amounts of data, count each
run's training FLOPs, plot loss against FLOPs on log axes, keep the *compute-efficient
frontier* (the runs no cheaper run beats) and fit a straight line to it in log-log space. Its
slope is ``-alpha``. Hoffmann et al. (2022, https://arxiv.org/abs/2203.15556) refine the recipe
with an irreducible-loss term; at the tiny scale of this study a pure power law is the honest
summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from trainfast.accounting import counted_flops
from trainfast.optim.comparison import student_t_975
from trainfast.training.arguments import TrainingArguments
from trainfast.training.data import ImageData, load_images, take_fraction
from trainfast.training.trainer import Trainer
from trainfast.validation import check_counts, check_int, check_number

__all__ = [
    "PowerLaw",
    "ScalingCNN",
    "ScalingRun",
    "SaturatingPowerLaw",
    "compute_frontier",
    "exponent_difference",
    "fit_power_law",
    "fit_saturating_power_law",
    "scaling_study",
    "training_flops",
    "widths_by_sqrt2",
]


class ScalingCNN(nn.Module):
    """Two conv blocks (``width`` then ``2 * width`` channels) and a linear classifier.

    ``dropout`` zeroes that fraction of activations after each block during training.
    """

    def __init__(
        self,
        width: int,
        *,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 8,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_counts(width=width, num_classes=num_classes, in_channels=in_channels)
        check_int("image_size", image_size, minimum=4)  # two 2x2 poolings leave 1 pixel or more
        check_number("dropout", dropout, minimum=0.0, below=1.0)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # (batch, width, size/2, size/2)
            nn.Dropout(dropout),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # (batch, 2 * width, size/4, size/4)
            nn.Dropout(dropout),
        )
        self.classifier = nn.Linear(2 * width * (image_size // 4) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))  # (batch, num_classes)


def widths_by_sqrt2(smallest: int, count: int) -> list[int]:
    """``count`` widths from ``smallest`` up, each about √2 times the previous (rounded)."""
    check_counts(smallest=smallest, count=count)
    return [round(smallest * math.sqrt(2) ** k) for k in range(count)]


def training_flops(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
) -> float:
    """FLOPs of one forward and backward pass per example, counted by torch's
    ``FlopCounterMode`` on the batch ``inputs`` (:func:`trainfast.counters.counted_flops`:
    matrix multiplies and convolutions; element-wise work is ignored, as is customary). For a
    layer inside a network this is the familiar 6 FLOPs per weight and example: 2 forward, 2 for
    the weight gradient, 2 for the input gradient; the first layer skips the last 2, since its
    input needs no gradient."""
    was_training = model.training
    model.train()
    flops = counted_flops(lambda: loss_fn(model(inputs), targets).backward())
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return flops / len(targets)


@dataclass(frozen=True)
class ScalingRun:
    """One point of the study: a model size, an amount of data, and what it cost and reached."""

    width: int
    data_fraction: float
    dropout: float
    parameters: int
    examples: int
    flops: float  # training FLOPs: per-example forward+backward FLOPs x examples seen
    eval_loss: float  # validation loss, mean over the seeds
    eval_loss_std: float = float("nan")  # its standard deviation over the seeds
    test_loss: float = float("nan")  # test loss, mean over the seeds
    lr: float = float("nan")  # the peak learning rate of this width


def scaling_study(
    widths: Sequence[int],
    data_fractions: Sequence[float],
    *,
    dropout: float = 0.0,
    seeds: Sequence[int] = (0,),
    args: TrainingArguments | None = None,
    data: ImageData | None = None,
    lr_of_width: Callable[[int], float] | None = None,
) -> list[ScalingRun]:
    """Train a :class:`ScalingCNN` of every width on every fraction of the training data for
    one epoch (``args.epochs`` is forced to 1), and return each run's compute and validation
    loss, averaged over ``seeds`` (the seed sets the initialisation and the batch order; the
    data subset is the same for all). ``data`` defaults to the offline digits with a
    validation split; the loss is measured on ``data.validation`` (``data.test`` if there is
    none). ``lr_of_width(width)`` gives each width its own learning rate (default:
    ``args.lr`` for all), e.g. proportional to ``1 / sqrt(fan_in)``."""
    data = data or load_images("digits", validation_fraction=0.2)
    held_out = data.validation if data.validation is not None else data.test
    args = replace(args or TrainingArguments(lr=1e-2, batch_size=8), epochs=1, progress_bar=False)
    in_channels, image_size = data.shape[0], data.shape[1]
    runs = []
    for fraction in data_fractions:
        train: Dataset = take_fraction(data.train, fraction, seed=args.seed)
        sample_inputs, sample_targets = next(iter(torch.utils.data.DataLoader(train, batch_size=8)))
        for width in widths:
            losses, test_losses, flops, examples, parameters = [], [], 0.0, 0, 0
            for seed in seeds:
                torch.manual_seed(seed)
                model = ScalingCNN(
                    width,
                    num_classes=len(data.classes),
                    in_channels=in_channels,
                    image_size=image_size,
                    dropout=dropout,
                )
                per_example = training_flops(model, sample_inputs, sample_targets)
                lr = lr_of_width(width) if lr_of_width is not None else args.lr
                trainer = Trainer(model, replace(args, seed=seed, lr=lr), train, held_out)
                trainer.train()
                losses.append(trainer.history[-1]["eval/loss"])
                if data.validation is not None:
                    test_losses.append(trainer.evaluate(data.test).loss)
                flops, examples = per_example * trainer.examples_seen, trainer.examples_seen
                parameters = sum(p.numel() for p in model.parameters())
            runs.append(
                ScalingRun(
                    width=width,
                    data_fraction=fraction,
                    dropout=dropout,
                    parameters=parameters,
                    examples=examples,
                    flops=flops,
                    eval_loss=float(np.mean(losses)),
                    eval_loss_std=float(np.std(losses, ddof=1))
                    if len(losses) > 1
                    else float("nan"),
                    test_loss=float(np.mean(test_losses)) if test_losses else float("nan"),
                    lr=lr,
                )
            )
    return runs


def compute_frontier(runs: Sequence[ScalingRun]) -> list[ScalingRun]:
    """The compute-efficient frontier: in order of FLOPs, each run with a lower loss than
    every cheaper run."""
    frontier: list[ScalingRun] = []
    for run in sorted(runs, key=lambda r: r.flops):
        if not frontier or run.eval_loss < frontier[-1].eval_loss:
            frontier.append(run)
    return frontier


@dataclass(frozen=True)
class PowerLaw:
    """``loss = coefficient * compute ** (-exponent)``, fitted to ``points`` points;
    ``exponent_stderr`` is the least-squares standard error of the exponent (NaN for two
    points)."""

    coefficient: float
    exponent: float
    exponent_stderr: float = float("nan")
    points: int = 0

    def __call__(self, compute: np.ndarray | float) -> np.ndarray | float:
        return self.coefficient * np.asarray(compute, dtype=float) ** (-self.exponent)


def fit_power_law(compute: Sequence[float], loss: Sequence[float]) -> PowerLaw:
    """Least-squares fit of ``log loss = log a - alpha * log compute``; needs two or more
    points with positive compute and loss."""
    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    if c.shape != y.shape or c.size < 2:
        raise ValueError(f"Need two or more (compute, loss) pairs, got {c.size} and {y.size}")
    if (c <= 0).any() or (y <= 0).any():
        raise ValueError("A power law needs positive compute and loss")
    x, z = np.log(c), np.log(y)
    slope, intercept = np.polyfit(x, z, deg=1)
    stderr = float("nan")
    if c.size > 2:
        residuals = z - (slope * x + intercept)
        stderr = math.sqrt(residuals @ residuals / (c.size - 2) / ((x - x.mean()) ** 2).sum())
    return PowerLaw(float(np.exp(intercept)), float(-slope), stderr, int(c.size))


def exponent_difference(a: PowerLaw, b: PowerLaw) -> str:
    """``a.exponent - b.exponent`` with its 95% Student-t interval, and whether it excludes zero.

    The combined standard error is ``hypot`` of the two; the degrees of freedom are the smaller
    fit's ``points - 2`` (conservative, since the fits' residual variances need not be equal).
    A fit of two points has no standard error, so the difference is then not testable.
    """
    difference = a.exponent - b.exponent
    dof = min(a.points, b.points) - 2
    if dof < 1:
        return (
            f"{difference:+.2f}, not testable: a fit of {min(a.points, b.points)} points "
            "has no standard error"
        )
    noise = student_t_975(dof) * math.hypot(a.exponent_stderr, b.exponent_stderr)
    excludes = abs(difference) > noise
    return (
        f"{difference:+.2f} ± {noise:.2f} (95%, Student's t with {dof} degrees of freedom), "
        f"an interval that {'excludes' if excludes else 'contains'} zero"
    )


@dataclass(frozen=True)
class SaturatingPowerLaw:
    """``loss = irreducible + coefficient * compute ** (-exponent)``: a power law that levels
    off at the loss no amount of compute removes (the ``E`` of Hoffmann et al., 2022)."""

    irreducible: float
    coefficient: float
    exponent: float
    points: int = 0

    def __call__(self, compute: np.ndarray | float) -> np.ndarray | float:
        return self.irreducible + self.coefficient * np.asarray(compute, dtype=float) ** (
            -self.exponent
        )


def fit_saturating_power_law(compute: Sequence[float], loss: Sequence[float]) -> SaturatingPowerLaw:
    """Least-squares fit of ``log loss`` by ``log(E + a * C^-alpha)``, with ``0 <= E < min(loss)``
    (scipy's ``curve_fit`` in log space, started from the pure power law). Needs four or more
    points; with few points ``E`` is poorly determined, so read it with the pure fit beside it."""
    from scipy.optimize import curve_fit  # lazy: optional dependency

    c, y = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    if c.shape != y.shape or c.size < 4:
        raise ValueError(f"Need four or more (compute, loss) pairs, got {c.size} and {y.size}")
    if (c <= 0).any() or (y <= 0).any():
        raise ValueError("A power law needs positive compute and loss")
    start = fit_power_law(c, y)
    x = np.log(c / c[0])  # compute relative to the first point keeps the numbers tame

    def model(x: np.ndarray, e: float, log_a: float, alpha: float) -> np.ndarray:
        return np.log(e + np.exp(log_a - alpha * x))

    first = float(np.log(start(c[0])))
    (e, log_a, alpha), _ = curve_fit(
        model,
        x,
        np.log(y),
        p0=(0.0, first, start.exponent),
        bounds=([0.0, -np.inf, 0.0], [0.999 * y.min(), np.inf, np.inf]),
        maxfev=20000,
    )
    coefficient = float(np.exp(log_a)) * float(c[0]) ** alpha  # back to absolute compute
    return SaturatingPowerLaw(float(e), coefficient, float(alpha), int(c.size))
