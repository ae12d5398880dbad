"""Checks for the hyperparameters chapter's exercises, in the book's one convention.

Each check runs the reader's function against the package's reference, prints one line per
case (:func:`trainfast.checks.report`) and raises ``AssertionError`` naming the first case that
failed. The chapter's hidden solution cells call the same checks during the build, so a broken
solution fails the build.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from trainfast.checks import Case, report
from trainfast.loop import train
from trainfast.sweeps import SweepConfigError, sample, validate
from trainfast.training.scaling import fit_power_law
from trainfast.training.schedules import cosine_with_warmup, wsd
from trainfast.training.tracking import LocalTracker, Tracker
from trainfast.training.transfer import NarrowResNet

__all__ = [
    "check_cosine_schedule",
    "check_logged_loop",
    "check_parameter_groups",
    "check_power_law_fit",
    "check_refit",
    "check_weight_decay_sweep",
    "check_wsd_schedule",
]


def check_weight_decay_sweep(
    sweep_config: Mapping[str, Any],
    weight_decay_of: Callable[[dict[str, Any]], float],
    *,
    low: float = 1e-5,
    high: float = 1e-1,
    samples: int = 4000,
) -> None:
    """Check a ``random`` sweep whose configs, mapped by ``weight_decay_of``, give a weight
    decay of exactly zero half the time and otherwise one drawn log-uniformly between ``low``
    and ``high``; ``samples`` configs are drawn with W&B's engine."""
    from scipy import stats  # lazy: optional dependency

    try:
        config = validate(sweep_config)
    except SweepConfigError as error:
        report([("the sweep config is valid", str(error))])
        return
    results: list[Case] = [
        (
            "the sweep is a random search",
            None if config["method"] == "random" else f"method is {config['method']!r}",
        )
    ]
    if config["method"] == "random":
        decays = np.asarray(
            [weight_decay_of(c) for c in sample(config, samples, seed=1)], dtype=float
        )
        zero = decays == 0.0
        nonzero = decays[~zero]
        results.append(
            (
                f"zero in half of {samples} samples (+- 4%)",
                None if abs(zero.mean() - 0.5) < 0.04 else f"zero in {zero.mean():.1%}",
            )
        )
        inside = nonzero.size > 0 and bool(((nonzero >= low) & (nonzero <= high)).all())
        results.append(
            (f"non-zero values lie in [{low:g}, {high:g}]", None if inside else "some do not")
        )
        if inside:
            ks = stats.kstest(
                np.log10(nonzero), "uniform", args=(math.log10(low), math.log10(high / low))
            )
            results.append(
                (
                    "log10 of the non-zero values is uniform (KS p-value > 0.001)",
                    None if ks.pvalue > 1e-3 else f"KS p-value {ks.pvalue:.2g}",
                )
            )
    report(results)


def check_parameter_groups(
    function: Callable[[nn.Module, float], list[dict[str, Any]]], *, lr: float = 1e-2
) -> None:
    """Check ``function(model, lr)``: torch optimizer groups giving the backbone ``lr / 10``,
    the head (``model.fc``) ``lr``, and leaving out frozen parameters. Run on a
    :class:`~trainfast.training.transfer.NarrowResNet`, fully trainable and with its first
    stage frozen; the groups go to ``torch.optim.SGD`` with a default ``lr`` that must not leak.
    """
    results: list[Case] = []
    for frozen_stage in (False, True):
        model = NarrowResNet(5)
        if frozen_stage:
            for module in (model.conv1, model.bn1, model.layer1):
                module.requires_grad_(False)
        optimizer = torch.optim.SGD(function(model, lr), lr=123.0)  # 123: a default must not leak
        rate = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
        head = {id(p) for p in model.fc.parameters()}
        trainable = [p for p in model.parameters() if p.requires_grad]
        frozen = [p for p in model.parameters() if not p.requires_grad]
        backbone = [p for p in trainable if id(p) not in head]
        label = "first stage frozen" if frozen_stage else "all trainable"
        missing = sum(id(p) not in rate for p in trainable)
        results.append(
            (
                f"{label}: every trainable parameter is in a group",
                None if missing == 0 else f"{missing} are not",
            )
        )
        leaked = sum(id(p) in rate for p in frozen)
        results.append(
            (
                f"{label}: no frozen parameter is in a group",
                None if leaked == 0 else f"{leaked} are",
            )
        )
        wrong_head = [rate.get(i) for i in head if not math.isclose(rate.get(i, -1.0), lr)]
        results.append(
            (
                f"{label}: the head gets lr = {lr:g}",
                f"it gets {wrong_head[0]}" if wrong_head else None,
            )
        )
        wrong = [
            rate.get(id(p)) for p in backbone if not math.isclose(rate.get(id(p), -1.0), lr / 10)
        ]
        results.append(
            (f"{label}: the backbone gets lr / 10", f"it gets {wrong[0]}" if wrong else None)
        )
    report(results)


def check_power_law_fit(function: Callable[[np.ndarray, np.ndarray], tuple[float, float]]) -> None:
    """Check ``function(compute, loss) -> (coefficient, exponent)`` of ``loss = coefficient *
    compute ** -exponent`` against :func:`~trainfast.training.scaling.fit_power_law` on noisy
    synthetic data with known exponents."""
    rng = np.random.default_rng(0)
    results: list[Case] = []
    for exponent in (0.05, 0.3):
        compute = np.logspace(6, 12, 15)
        loss = 40.0 * compute ** (-exponent) * np.exp(rng.normal(0.0, 0.02, compute.size))
        reference = fit_power_law(compute, loss)
        coefficient, found = function(compute, loss)
        ok = math.isclose(found, reference.exponent, rel_tol=1e-6) and math.isclose(
            coefficient, reference.coefficient, rel_tol=1e-4
        )
        case = f"true exponent {exponent}: least squares gives {reference.exponent:.4f}"
        problem = f"yours {found:.4f}, coefficient {coefficient:.3g} vs {reference.coefficient:.3g}"
        results.append((case, None if ok else problem))
    report(results)


def check_refit(function: Callable[[np.ndarray, np.ndarray, int], float]) -> None:
    """Check ``function(compute, loss, drop) -> exponent``: the power-law exponent fitted
    without the ``drop`` cheapest points (the answer to "refit with and without the first
    points"). Synthetic losses with an irreducible term bend the log-log line, so dropping
    points moves the exponent, and only a fit on exactly the remaining points matches."""
    compute = np.logspace(6, 12, 12)
    loss = 0.3 + 40.0 * compute**-0.25  # curved in log-log: an irreducible loss of 0.3
    order = np.random.default_rng(1).permutation(compute.size)  # unsorted input
    results: list[Case] = []
    for drop in (0, 2, 4):
        expected = fit_power_law(compute[drop:], loss[drop:]).exponent
        found = function(compute[order], loss[order], drop)
        results.append(
            (
                f"without the {drop} cheapest points: exponent {expected:.4f}",
                None if math.isclose(found, expected, rel_tol=1e-6) else f"yours {found:.4f}",
            )
        )
    report(results)


def _schedule_cases(
    function: Callable[..., float],
    reference: Callable[..., float],
    settings: list[dict[str, Any]],
    points: Callable[[dict[str, Any]], list[int]],
) -> list[Case]:
    results: list[Case] = []
    for kw in settings:
        for it in points(kw):
            expected, found = reference(it, **kw), function(it, **kw)
            results.append(
                (
                    f"it={it}, "
                    + ", ".join(f"{k}={v}" for k, v in kw.items())
                    + f": {expected:.6g}",
                    None
                    if math.isclose(found, expected, rel_tol=1e-9, abs_tol=1e-12)
                    else f"yours {found:.6g}",
                )
            )
    return results


def check_cosine_schedule(function: Callable[..., float]) -> None:
    """Check ``function(it, *, max_lr, min_lr, warmup_iters, cosine_cycle_iters)`` against
    :func:`~trainfast.training.schedules.cosine_with_warmup` at the start, inside and at the
    ends of warmup, in the middle and at the end of the cosine, and after it."""
    settings = [
        {"max_lr": 1.0, "min_lr": 0.1, "warmup_iters": 7, "cosine_cycle_iters": 21},
        {"max_lr": 3e-4, "min_lr": 3e-5, "warmup_iters": 100, "cosine_cycle_iters": 1000},
    ]

    def points(kw: dict[str, Any]) -> list[int]:
        w, c = kw["warmup_iters"], kw["cosine_cycle_iters"]
        return [0, 1, w - 1, w, (w + c) // 2, c - 1, c, c + 1, 2 * c]

    report(_schedule_cases(function, cosine_with_warmup, settings, points))


def check_wsd_schedule(function: Callable[..., float]) -> None:
    """Check ``function(it, *, max_lr, min_lr, warmup_iters, stable_iters, decay_iters)``
    against :func:`~trainfast.training.schedules.wsd` at every phase boundary."""
    settings = [
        {"max_lr": 1.0, "min_lr": 0.0, "warmup_iters": 5, "stable_iters": 20, "decay_iters": 10},
        {
            "max_lr": 2e-3,
            "min_lr": 2e-4,
            "warmup_iters": 50,
            "stable_iters": 800,
            "decay_iters": 150,
        },
    ]

    def points(kw: dict[str, Any]) -> list[int]:
        w, s, d = kw["warmup_iters"], kw["stable_iters"], kw["decay_iters"]
        return [
            0,
            w - 1,
            w,
            w + s - 1,
            w + s,
            w + s + d // 2,
            w + s + d - 1,
            w + s + d,
            w + s + d + 5,
        ]

    report(_schedule_cases(function, wsd, settings, points))


LoggedLoop = Callable[..., None]


def check_logged_loop(function: LoggedLoop, *, steps: int = 12, batch_size: int = 16) -> None:
    """Check ARENA's exercise, the smallest loop rewritten to log to a tracker:
    ``function(model, optimizer, dataset, *, batch_size, steps, tracker)`` must train like
    :func:`trainfast.loop.train` (shuffling with ``torch.Generator().manual_seed(0)``) and call
    ``tracker.log({"train/loss": float, "examples": int})`` once per step. The check runs it
    with a :class:`~trainfast.training.tracking.LocalTracker` (``start_run`` gives a W&B one)
    beside ``train`` on a copy of the same model and compares what was logged."""
    generator = torch.Generator().manual_seed(0)
    dataset: Dataset = TensorDataset(
        torch.randn(40, 6, generator=generator), torch.randint(0, 3, (40,), generator=generator)
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    reference_model = copy.deepcopy(model)
    tracker: Tracker = LocalTracker({"batch_size": batch_size, "steps": steps})
    function(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        dataset,
        batch_size=batch_size,
        steps=steps,
        tracker=tracker,
    )
    reference = train(
        reference_model,
        torch.optim.SGD(reference_model.parameters(), lr=0.1),
        dataset,
        batch_size=batch_size,
        steps=steps,
    )
    rows = [row for row in tracker.history if "train/loss" in row]
    results: list[Case] = [
        (f"one logged row per step ({steps})", None if len(rows) == steps else f"{len(rows)} rows")
    ]
    examples = [row.get("examples") for row in rows]
    results.append(
        (
            "each row has the examples seen so far (the x axis)",
            None
            if examples == reference.examples[: len(rows)] and rows
            else f"got {examples[:4]}...",
        )
    )
    losses = [row["train/loss"] for row in rows]
    same = (
        len(losses) == steps
        and all(isinstance(x, float) for x in losses)
        and np.allclose(losses, reference.loss, rtol=1e-5, atol=1e-7)
    )
    results.append(
        (
            "the logged losses are Python floats equal to trainfast.loop.train's",
            None if same else f"first {losses[:2]} vs {reference.loss[:2]}",
        )
    )
    moved = all(
        torch.allclose(a, b, atol=1e-6)
        for a, b in zip(model.parameters(), reference_model.parameters(), strict=True)
    )
    results.append(
        ("the model ends where train's does", None if moved else "its parameters differ")
    )
    report(results)


def check_next_range(next_range: Callable[[float, float, float], tuple[float, float]]) -> None:
    """Check ``next_range(low, high, best)``: the log-uniform range for the next sweep.

    A best value in the outer quarter of the range (on a log scale) at either end is a bound,
    not an optimum: the next range keeps its width in decades and is centred on ``best``. A
    best value inside the middle half leaves the range as it was.
    """

    def reference(low: float, high: float, best: float) -> tuple[float, float]:
        position = math.log(best / low) / math.log(high / low)  # 0 at low, 1 at high
        if 0.25 <= position <= 0.75:
            return low, high
        half = math.sqrt(high / low)
        return best / half, best * half

    cases = [
        (1e-4, 1e-2, 1e-2),
        (1e-4, 1e-2, 9e-3),
        (1e-4, 1e-2, 1e-3),
        (1e-4, 1e-2, 1e-4),
        (1e-5, 1e-1, 3e-4),
        (0.1, 10.0, 2.0),
    ]
    results: list[Case] = []
    for low, high, best in cases:
        expected = reference(low, high, best)
        answer = next_range(low, high, best)
        ok = len(answer) == 2 and all(
            math.isclose(a, e, rel_tol=1e-6) for a, e in zip(answer, expected, strict=True)
        )
        problem = None if ok else f"got {answer}, expected ({expected[0]:.3g}, {expected[1]:.3g})"
        results.append((f"range [{low:g}, {high:g}], best {best:g}", problem))
    report(results)


def check_choose_batch(choose_batch: Callable[[Mapping[int, float], float], int]) -> None:
    """Check ``choose_batch(throughput, b_simple)``: the batch size to train with.

    ``throughput`` maps batch sizes to examples per second; ``b_simple`` is the measured simple
    noise scale. Batches above ``b_simple`` mostly waste examples, so only sizes up to it are
    candidates (the smallest size if none is); among them, the highest throughput wins, and
    of sizes within 5 % of that throughput the smallest (it takes more steps per example).
    """

    def reference(throughput: Mapping[int, float], b_simple: float) -> int:
        sizes = sorted(throughput)
        candidates = [b for b in sizes if b <= b_simple] or sizes[:1]
        best = max(throughput[b] for b in candidates)
        return min(b for b in candidates if throughput[b] >= 0.95 * best)

    curve = {1: 800.0, 16: 9_000.0, 64: 20_000.0, 256: 30_000.0, 1024: 24_000.0}
    flat = {32: 10_000.0, 64: 19_600.0, 128: 20_000.0, 256: 20_100.0}
    cases = [(curve, 2_000.0), (curve, 100.0), (curve, 10.0), (curve, 0.5), (flat, 1e4)]
    cases.append((curve, 256.0))  # B_simple on a listed size: "up to" includes it
    results: list[Case] = []
    for throughput, b_simple in cases:
        expected, answer = reference(throughput, b_simple), choose_batch(throughput, b_simple)
        problem = None if answer == expected else f"got {answer}, expected {expected}"
        name = "falling curve" if throughput is curve else "flat curve"
        results.append((f"{name}, B_simple {b_simple:g}: batch {expected}", problem))
    report(results)


def check_rerun_plan(rerun_plan: Callable[[list[float], float, float], tuple[int, int]]) -> None:
    """Check ``rerun_plan(losses, seed_std, target_se)``: ``(finalists, seeds each)``.

    Every config whose sweep loss is within two seed standard deviations of the best cannot be
    told apart from it by one run, so all of them are finalists. Each is re-run on enough fresh
    seeds that the standard error of its mean, ``seed_std / sqrt(seeds)``, is at most
    ``target_se``, and on at least two.
    """

    def reference(losses: list[float], seed_std: float, target_se: float) -> tuple[int, int]:
        best = min(losses)
        finalists = sum(loss <= best + 2 * seed_std for loss in losses)
        return finalists, max(2, math.ceil((seed_std / target_se) ** 2))

    sweep = [0.30, 0.064, 0.071, 0.09, 2.30, 0.066, 0.12, 0.080]
    cases = [(sweep, 0.005, 0.002), (sweep, 0.01, 0.005), (sweep, 0.001, 0.01), ([0.5], 0.1, 0.1)]
    results: list[Case] = []
    for losses, seed_std, target_se in cases:
        expected = reference(losses, seed_std, target_se)
        answer = tuple(rerun_plan(losses, seed_std, target_se))
        problem = None if answer == expected else f"got {answer}, expected {expected}"
        results.append(
            (
                f"{len(losses)} runs, seed std {seed_std:g}, target {target_se:g}: {expected}",
                problem,
            )
        )
    report(results)
