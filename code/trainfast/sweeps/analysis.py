"""Reading a sweep: parameter importance, correlation and parallel coordinates, as W&B's
sweep page draws them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainfast.sweeps.config import log_parameters
from trainfast.sweeps.engine import SweepResult
from trainfast.validation import check_choice, check_int

__all__ = ["ParameterImportance", "parallel_coordinates", "parameter_importance"]


@dataclass(frozen=True)
class ParameterImportance:
    """How much a hyperparameter explains the metric: a random forest's importance (the W&B
    parameter-importance panel's method) and the plain linear correlation."""

    name: str
    importance: float
    correlation: float


def _columns(
    results: Sequence[SweepResult], sweep_config: Mapping[str, Any] | None
) -> tuple[list[str], np.ndarray, dict[str, list[Any]]]:
    """The parameters that vary across ``results`` as numeric columns.

    Numbers are used as they are (log10 for log-distributed parameters); booleans as 0/1;
    anything else as the index of its value in sorted order (returned as ``categories``).
    """
    log_names = log_parameters(sweep_config)
    names = [n for n in results[0].config if len({repr(r.config.get(n)) for r in results}) > 1]
    columns, categories = [], {}
    for name in names:
        values = [r.config.get(name) for r in results]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            column = np.asarray(values, dtype=float)
            if name in log_names:
                column = np.log10(column)
        elif all(isinstance(v, bool) for v in values):
            column = np.asarray(values, dtype=float)
        else:
            levels = sorted({repr(v) for v in values})
            categories[name] = levels
            column = np.asarray([levels.index(repr(v)) for v in values], dtype=float)
        columns.append(column)
    if not columns:
        raise ValueError(
            f"Invalid results: no parameter varies across these {len(results)} runs (expected "
            "runs of a sweep that tries more than one value of something)"
        )
    return names, np.stack(columns, axis=1), categories


def _runs_reporting(results: Sequence[SweepResult], metric: str, least: int) -> list[SweepResult]:
    """The runs of ``results`` that report a finite ``metric``; fewer than ``least`` raises
    ``ValueError`` naming the metric and the metrics the runs do report (a typo in a metric's
    name otherwise reads as a sweep with no runs)."""
    if not isinstance(results, Sequence) or not all(isinstance(r, SweepResult) for r in results):
        raise ValueError(
            f"Invalid results: {results!r:.80} (expected a list of SweepResult, as run() returns)"
        )
    runs = [r for r in results if metric in r.metrics and np.isfinite(r.metrics[metric])]
    if len(runs) < least:
        reported = sorted({name for r in results for name in r.metrics})
        raise ValueError(
            f"Invalid metric: {metric!r} ({len(runs)} of {len(results)} runs report a finite "
            f"value of it, and this needs {least}; the runs report {reported})"
        )
    return runs


def parameter_importance(
    results: Sequence[SweepResult],
    metric: str,
    *,
    sweep_config: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> list[ParameterImportance]:
    """Importance and correlation of every parameter that varies, most important first.

    Importance is the impurity-based feature importance of a random forest that predicts the
    metric from the parameters, as in W&B's parameter-importance panel
    (https://docs.wandb.ai/guides/app/features/panels/parameter-importance); correlation is
    Pearson's, between the parameter (log10 of it for log-distributed ones, given
    ``sweep_config``) and the metric. With a few dozen runs both are rough guides.
    """
    from sklearn.ensemble import RandomForestRegressor  # lazy: optional dependency

    check_int("seed", seed)
    runs = _runs_reporting(results, metric, 3)
    names, x, _ = _columns(runs, sweep_config)
    y = np.asarray([r.metrics[metric] for r in runs], dtype=float)
    forest = RandomForestRegressor(n_estimators=200, random_state=seed).fit(x, y)
    found = []
    for j, name in enumerate(names):
        correlation = float(np.corrcoef(x[:, j], y)[0, 1]) if x[:, j].std() > 0 else float("nan")
        found.append(ParameterImportance(name, float(forest.feature_importances_[j]), correlation))
    return sorted(found, key=lambda p: -p.importance)


def parallel_coordinates(
    results: Sequence[SweepResult],
    metric: str,
    *,
    sweep_config: Mapping[str, Any] | None = None,
    goal: str = "minimize",
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """W&B's parallel-coordinates chart in matplotlib: one vertical axis per parameter that
    varies and one for ``metric``; each run is a line, coloured by its metric, the best run
    drawn thick. Log-distributed parameters (given ``sweep_config``) are on a log10 axis.
    Returns the matplotlib ``Axes``."""
    import matplotlib.pyplot as plt  # lazy: optional dependency

    check_choice("goal", goal, ("minimize", "maximize"))  # W&B's spellings
    runs = _runs_reporting(results, metric, 1)
    names, x, categories = _columns(runs, sweep_config)
    y = np.asarray([r.metrics[metric] for r in runs], dtype=float)
    table = np.concatenate([x, y[:, None]], axis=1)  # (runs, parameters + 1)
    low, high = table.min(axis=0), table.max(axis=0)
    scaled = (table - low) / np.where(high > low, high - low, 1.0)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4))
    cmap = plt.get_cmap("viridis_r" if goal == "minimize" else "viridis")
    colour = (y - y.min()) / max(y.max() - y.min(), 1e-12)
    positions = np.arange(table.shape[1])
    for i in np.argsort(-colour if goal == "minimize" else colour):  # best drawn last
        ax.plot(positions, scaled[i], color=cmap(colour[i]), alpha=0.8, linewidth=1.2)
    best = int(np.argmin(y) if goal == "minimize" else np.argmax(y))
    ax.plot(
        positions,
        scaled[best],
        color="crimson",
        linewidth=3,
        label=f"best run ({metric} {y[best]:.3g})",
    )
    log_names = log_parameters(sweep_config)
    labels = [f"log10 {n}" if n in log_names else n for n in names] + [metric]
    for j, position in enumerate(positions):
        ax.axvline(position, color="black", linewidth=0.8)
        name = (names + [metric])[j]
        if name in categories:
            levels = categories[name]
            for k, level in enumerate(levels):
                text = level.strip("'\"")  # repr of a string -> the string
                ax.text(
                    position + 0.03, k / max(len(levels) - 1, 1), text, fontsize=11, va="center"
                )
        else:
            ax.text(position + 0.03, 0.0, f"{low[j]:.3g}", fontsize=11, va="top")
            ax.text(position + 0.03, 1.0, f"{high[j]:.3g}", fontsize=11, va="bottom")
    ax.set_xticks(
        positions, labels, rotation=45, ha="right", rotation_mode="anchor", fontsize=11
    )  # steep enough that long names ("warmup_fraction") do not run into their neighbours
    ax.set_yticks([])  # each axis runs from its own minimum (bottom) to its maximum (top)
    ax.set_xlim(-0.2, positions[-1] + 0.5)
    ax.set_ylim(-0.08, 1.08)
    ax.set_title(title or f"Parallel coordinates of {len(runs)} runs, coloured by {metric}")
    norm = plt.Normalize(y.min(), y.max())
    ax.figure.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=metric)
    # the legend hangs below the slanted names, measured in points so that a later
    # tight_layout (which resizes the axes) cannot slide it up into them
    from matplotlib.transforms import offset_copy

    names_height = max(text.get_window_extent().height for text in ax.get_xticklabels())
    below = names_height * 72 / ax.figure.dpi + 12  # + tick length and padding
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(0.0, 0.0),
        bbox_transform=offset_copy(ax.transAxes, fig=ax.figure, y=-below, units="points"),
        fontsize=11,
        frameon=False,
    )
    return ax
