"""Hyperparameter sweeps in W&B's sweep-config syntax, on W&B when online, locally when not.

A sweep config is the dict (or YAML) W&B documents at
https://docs.wandb.ai/guides/sweeps/define-sweep-configuration: a ``method`` (``grid``,
``random`` or ``bayes``), a ``metric`` with a ``goal``, ``parameters`` given as ``value``,
``values`` (with optional ``probabilities``), or ``min``/``max`` with an optional
``distribution``, and optionally ``early_terminate`` (Hyperband). :func:`run` takes such a
config and a function ``config -> metrics``:

* with ``WANDB_API_KEY`` set it calls ``wandb.sweep`` and ``wandb.agent``: the sweep appears
  on wandb.ai, and W&B's server proposes the configs;
* otherwise it proposes them here with ``sweeps``, the open-source engine W&B's server runs
  (https://github.com/wandb/sweeps), so the sampling semantics are the same, with no server
  and no account. Hyperband is applied locally too, through the same engine.

A config W&B would reject raises :class:`SweepConfigError`, naming the bad value, before any
run starts.
"""

from __future__ import annotations

import inspect
import math
import os
import random
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "METHODS",
    "ParameterImportance",
    "SweepConfigError",
    "SweepResult",
    "check_weight_decay_sweep",
    "parallel_coordinates",
    "parameter_importance",
    "run",
    "sample",
    "validate",
]

METHODS = ("grid", "random", "bayes")
_LOG_DISTRIBUTIONS = ("log_uniform_values", "q_log_uniform_values", "inv_log_uniform_values")
_RANGE_DISTRIBUTIONS = ("int_uniform", "uniform", "q_uniform", *_LOG_DISTRIBUTIONS)
_DEFAULTED_DISTRIBUTIONS = ("normal", "q_normal", "log_normal", "q_log_normal", "beta", "q_beta")
_OLD_LOG_DISTRIBUTIONS = ("log_uniform", "q_log_uniform", "inv_log_uniform")  # min/max are logs

#: What a sweep function may return or report: metric name -> value.
Metrics = dict[str, Any]


class SweepConfigError(ValueError):
    """A sweep config that W&B would reject; the message names the offending value."""


# --------------------------------------------------------------------------- validation


def _parameters(parameters: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf parameter as (dotted name, spec), descending into nested ``parameters``."""
    for name, spec in parameters.items():
        if isinstance(spec, Mapping) and "parameters" in spec:
            yield from _parameters(spec["parameters"], f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", spec


def _check_parameter(name: str, spec: Any, method: str) -> None:
    if not isinstance(spec, Mapping):
        raise SweepConfigError(
            f"Parameter {name!r}: expected a dict such as {{'values': [...]}}, got {spec!r}"
        )
    distribution = spec.get("distribution")
    if "value" in spec:
        return
    if "values" in spec:
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise SweepConfigError(
                f"Parameter {name!r}: 'values' must be a non-empty list, got {values!r}"
            )
        if "probabilities" in spec:
            probabilities = spec["probabilities"]
            if method != "random":  # W&B's bayes engine fails on them; a grid ignores them
                raise SweepConfigError(
                    f"Parameter {name!r}: {method} search does not take probabilities "
                    f"{probabilities} (only random search does)"
                )
            if not isinstance(probabilities, list) or len(probabilities) != len(values):
                raise SweepConfigError(
                    f"Parameter {name!r}: probabilities {probabilities!r} do not match values {values!r}"
                )
            if any(
                not isinstance(p, (int, float)) or p < 0 for p in probabilities
            ) or not math.isclose(sum(probabilities), 1.0, abs_tol=1e-6):
                raise SweepConfigError(
                    f"Parameter {name!r}: probabilities {probabilities} must be >= 0 and sum to 1"
                )
        return
    if "min" in spec or "max" in spec:
        low, high = spec.get("min"), spec.get("max")
        if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
            raise SweepConfigError(
                f"Parameter {name!r}: needs numeric 'min' and 'max', got min={low!r}, max={high!r}"
            )
        if low >= high:
            raise SweepConfigError(f"Parameter {name!r}: min {low} is not less than max {high}")
        if distribution in _LOG_DISTRIBUTIONS and low <= 0:
            raise SweepConfigError(
                f"Parameter {name!r}: {distribution} needs min > 0, got min={low}"
            )
        if (
            distribution is not None
            and distribution not in _RANGE_DISTRIBUTIONS + _OLD_LOG_DISTRIBUTIONS
        ):
            raise SweepConfigError(
                f"Parameter {name!r}: unknown distribution {distribution!r} for a min/max range"
            )
        integer = distribution == "int_uniform" or (
            distribution is None and isinstance(low, int) and isinstance(high, int)
        )
        if method == "grid" and not integer and distribution != "q_uniform":
            raise SweepConfigError(
                f"Parameter {name!r}: grid search needs 'values' or an integer range, got {dict(spec)}"
            )
        return
    if distribution in _DEFAULTED_DISTRIBUTIONS:
        if method == "grid":
            raise SweepConfigError(
                f"Parameter {name!r}: grid search cannot enumerate a {distribution} distribution"
            )
        return
    raise SweepConfigError(
        f"Parameter {name!r} has neither 'value', 'values' nor a range ('min' and 'max'): {dict(spec)}"
    )


def validate(sweep_config: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``sweep_config`` as W&B would; return a deep copy or raise :class:`SweepConfigError`.

    The common mistakes get a message naming the value (unknown method, a parameter with
    neither values nor range, ``min`` not below ``max``, probabilities that do not sum to one,
    a continuous parameter in a grid, ``bayes`` without a metric); anything else the W&B
    schema rejects is reported with the schema's own messages (when ``sweeps`` is installed).
    """
    if not isinstance(sweep_config, Mapping):
        raise SweepConfigError(f"A sweep config is a dict, got {type(sweep_config).__name__}")
    config = deepcopy(dict(sweep_config))
    method = config.get("method")
    if method not in METHODS:
        raise SweepConfigError(
            f"Unknown sweep method: {method!r} (expected one of {list(METHODS)})"
        )
    parameters = config.get("parameters")
    if not isinstance(parameters, Mapping) or not parameters:
        raise SweepConfigError(f"A sweep needs a non-empty 'parameters' dict, got {parameters!r}")
    for name, spec in _parameters(parameters):
        _check_parameter(name, spec, method)
    metric = config.get("metric")
    if metric is not None:
        if not isinstance(metric, Mapping) or not isinstance(metric.get("name"), str):
            raise SweepConfigError(f"'metric' needs a 'name', got {metric!r}")
        if metric.get("goal", "minimize") not in ("minimize", "maximize"):
            raise SweepConfigError(
                f"Unknown metric goal: {metric['goal']!r} (expected 'minimize' or 'maximize')"
            )
    elif method == "bayes":
        raise SweepConfigError(
            "Bayesian search needs a 'metric' with a 'name' and a 'goal' to model"
        )
    early = config.get("early_terminate")
    if early is not None:
        if not isinstance(early, Mapping) or early.get("type") != "hyperband":
            raise SweepConfigError(
                f"Unknown early_terminate: {early!r} (expected type 'hyperband')"
            )
        if "min_iter" not in early and "max_iter" not in early:
            raise SweepConfigError(f"Hyperband needs 'min_iter' or 'max_iter', got {dict(early)}")
        if metric is None:
            raise SweepConfigError("early_terminate needs a 'metric' to compare runs by")
    try:
        engine = _engine()
    except ImportError:
        return config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        violations = list(dict.fromkeys(engine.schema_violations_from_proposed_config(config)))
    if violations:
        raise SweepConfigError("W&B's sweep schema rejects this config: " + "; ".join(violations))
    return config


# --------------------------------------------------------------------------- running


@dataclass
class SweepResult:
    """One run of a sweep: the config it was given, the metrics it returned, what it reported
    along the way, and whether Hyperband stopped it early."""

    config: dict[str, Any]
    metrics: Metrics = field(default_factory=dict)
    history: list[Metrics] = field(default_factory=list)
    stopped: bool = False


class _EngineRandomness:
    """The engine samples with the global ``random`` and ``numpy.random`` generators; this
    gives it a private, seeded stream and leaves the caller's generators untouched."""

    def __init__(self, seed: int) -> None:
        saved = random.getstate(), np.random.get_state()
        random.seed(seed)
        np.random.seed(seed)
        self.state = random.getstate(), np.random.get_state()
        random.setstate(saved[0])
        np.random.set_state(saved[1])

    def __enter__(self) -> None:
        self.saved = random.getstate(), np.random.get_state()
        random.setstate(self.state[0])
        np.random.set_state(self.state[1])

    def __exit__(self, *exc: object) -> None:
        self.state = random.getstate(), np.random.get_state()
        random.setstate(self.saved[0])
        np.random.set_state(self.saved[1])


def _engine() -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pydantic 2 deprecation warning on import
            import sweeps
    except ImportError as error:
        raise ImportError("Local sweeps need W&B's engine: pip install sweeps") from error
    return sweeps


def _values(proposal_config: Mapping[str, Any]) -> dict[str, Any]:
    return {name: entry["value"] for name, entry in proposal_config.items()}


def sample(sweep_config: Mapping[str, Any], count: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """The first ``count`` configs a ``grid`` or ``random`` sweep would propose (fewer if a
    grid has fewer points), without running anything; the engine is seeded with ``seed``."""
    config = validate(sweep_config)
    if config["method"] == "bayes":
        raise SweepConfigError(
            "A bayes sweep proposes configs from results: use run(), not sample()"
        )
    engine = _engine()
    with _EngineRandomness(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proposals = engine.next_runs(config, [], n=count)
    return [_values(p.config) for p in proposals if p is not None]


def _call(
    function: Callable[..., Metrics], config: dict[str, Any], report: Callable[[Metrics], bool]
) -> Metrics:
    """``function(config)``, or ``function(config, report=report)`` if it takes ``report``."""
    if "report" in inspect.signature(function).parameters:
        metrics = function(config, report=report)
    else:
        metrics = function(config)
    if not isinstance(metrics, Mapping):
        raise TypeError(f"A sweep function returns a dict of metrics, got {type(metrics).__name__}")
    return dict(metrics)


def run(
    sweep_config: Mapping[str, Any],
    function: Callable[..., Metrics],
    count: int,
    *,
    seed: int = 0,
    online: bool | None = None,
    project: str = "trainfast-sweeps",
) -> list[SweepResult]:
    """Run ``function(config) -> metrics`` ``count`` times on configs the sweep proposes.

    A grid sweep stops early once every combination has run. If ``function`` has a parameter
    named ``report``, it is called as ``function(config, report=report)``: ``report(metrics)``
    records intermediate metrics (e.g. after each epoch; W&B's ``wandb.log``) and returns True
    when Hyperband (``early_terminate``) says this run should stop, so the function can
    return at once. ``online`` defaults to "is ``WANDB_API_KEY`` set"; online, W&B's server
    proposes configs and stops runs itself, and ``seed`` has no effect.
    """
    config = validate(sweep_config)
    if count < 1:
        raise ValueError(f"Invalid count: {count} (expected >= 1)")
    if online is None:
        online = bool(os.environ.get("WANDB_API_KEY")) and os.environ.get("WANDB_MODE") not in (
            "offline",
            "disabled",
        )
    if online:
        return _run_on_wandb(config, function, count, project)
    return _run_locally(config, function, count, seed)


def _run_locally(
    config: dict[str, Any], function: Callable[..., Metrics], count: int, seed: int
) -> list[SweepResult]:
    engine = _engine()
    randomness = _EngineRandomness(seed)
    finished: list[Any] = []  # the engine's SweepRun records of the runs so far
    results: list[SweepResult] = []
    for i in range(count):
        with randomness, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            proposal = engine.next_run(config, finished)
        if proposal is None:  # a grid with every point done
            break
        current = engine.SweepRun(
            name=f"run-{i}", config=proposal.config, state=engine.RunState.running
        )
        result = SweepResult(config=_values(proposal.config))

        def report(metrics: Metrics, current: Any = current, result: SweepResult = result) -> bool:
            result.history.append(dict(metrics))
            current.history.append(dict(metrics))
            if "early_terminate" not in config:
                return False
            stop = engine.stop_runs(config, [*finished, current])
            result.stopped = result.stopped or any(r.name == current.name for r in stop)
            return result.stopped

        result.metrics = _call(function, dict(result.config), report)
        current.summary_metrics = result.metrics
        current.state = engine.RunState.finished
        finished.append(current)
        results.append(result)
    return results


def _run_on_wandb(
    config: dict[str, Any], function: Callable[..., Metrics], count: int, project: str
) -> list[SweepResult]:
    import wandb

    results: list[SweepResult] = []

    def trial() -> None:
        with wandb.init() as wandb_run:
            result = SweepResult(config=dict(wandb_run.config))

            def report(metrics: Metrics) -> bool:
                result.history.append(dict(metrics))
                wandb_run.log(metrics)
                return False  # online, W&B's controller stops the run itself

            result.metrics = _call(function, dict(result.config), report)
            if not result.history:
                wandb_run.log(result.metrics)
            wandb_run.summary.update(result.metrics)
            results.append(result)

    sweep_id = wandb.sweep(sweep=config, project=project)
    wandb.agent(sweep_id, function=trial, count=count, project=project)
    return results


# --------------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class ParameterImportance:
    """How much a hyperparameter explains the metric: a random forest's importance (the W&B
    parameter-importance panel's method) and the plain linear correlation."""

    name: str
    importance: float
    correlation: float


def _log_parameters(sweep_config: Mapping[str, Any] | None) -> set[str]:
    if sweep_config is None:
        return set()
    return {
        name
        for name, spec in _parameters(sweep_config.get("parameters", {}))
        if isinstance(spec, Mapping) and spec.get("distribution") in _LOG_DISTRIBUTIONS
    }


def _columns(
    results: Sequence[SweepResult], sweep_config: Mapping[str, Any] | None
) -> tuple[list[str], np.ndarray, dict[str, list[Any]]]:
    """The parameters that vary across ``results`` as numeric columns.

    Numbers are used as they are (log10 for log-distributed parameters); booleans as 0/1;
    anything else as the index of its value in sorted order (returned as ``categories``).
    """
    log_names = _log_parameters(sweep_config)
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
    return names, np.stack(columns, axis=1), categories


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

    runs = [r for r in results if metric in r.metrics and np.isfinite(r.metrics[metric])]
    if len(runs) < 3:
        raise ValueError(f"Need at least 3 runs that report {metric!r}, got {len(runs)}")
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

    runs = [r for r in results if metric in r.metrics and np.isfinite(r.metrics[metric])]
    names, x, categories = _columns(runs, sweep_config)
    y = np.asarray([r.metrics[metric] for r in runs], dtype=float)
    table = np.concatenate([x, y[:, None]], axis=1)  # (runs, parameters + 1)
    low, high = table.min(axis=0), table.max(axis=0)
    scaled = (table - low) / np.where(high > low, high - low, 1.0)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
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
    log_names = _log_parameters(sweep_config)
    labels = [f"log10 {n}" if n in log_names else n for n in names] + [metric]
    for j, position in enumerate(positions):
        ax.axvline(position, color="black", linewidth=0.8)
        name = (names + [metric])[j]
        if name in categories:
            levels = categories[name]
            for k, level in enumerate(levels):
                text = level.strip("'\"")  # repr of a string -> the string
                ax.text(position + 0.03, k / max(len(levels) - 1, 1), text, fontsize=7, va="center")
        else:
            ax.text(position + 0.03, 0.0, f"{low[j]:.3g}", fontsize=7, va="top")
            ax.text(position + 0.03, 1.0, f"{high[j]:.3g}", fontsize=7, va="bottom")
    ax.set_xticks(positions, labels, rotation=20, ha="right")
    ax.set_yticks([])
    ax.set_ylabel("position between each axis' min and max")
    ax.set_xlim(-0.2, positions[-1] + 0.5)
    ax.set_ylim(-0.08, 1.08)
    ax.set_title(title or f"Parallel coordinates of {len(runs)} runs, coloured by {metric}")
    norm = plt.Normalize(y.min(), y.max())
    ax.figure.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=metric)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.22), fontsize=8, frameon=False)
    return ax


# --------------------------------------------------------------------------- exercise


def check_weight_decay_sweep(
    sweep_config: Mapping[str, Any],
    weight_decay_of: Callable[[dict[str, Any]], float],
    *,
    low: float = 1e-5,
    high: float = 1e-1,
    samples: int = 4000,
) -> bool:
    """Exercise check: a ``random`` sweep whose configs, mapped by ``weight_decay_of``, give a
    weight decay of exactly zero half the time and otherwise one drawn log-uniformly between
    ``low`` and ``high``. Samples ``samples`` configs with the engine; prints what passed."""
    from scipy import stats  # lazy: optional dependency

    try:
        config = validate(sweep_config)
    except SweepConfigError as error:
        print(f"FAILED: the sweep config is invalid: {error}")
        return False
    if config["method"] != "random":
        print(f"FAILED: use method 'random' (got {config['method']!r})")
        return False
    decays = np.asarray([weight_decay_of(c) for c in sample(config, samples, seed=1)], dtype=float)
    zero = decays == 0.0
    nonzero = decays[~zero]
    checks = [
        (
            f"zero in {zero.mean():.1%} of {samples} samples (want 50% +- 4%)",
            abs(zero.mean() - 0.5) < 0.04,
        ),
        (
            f"non-zero values lie in [{low:g}, {high:g}]",
            nonzero.size > 0 and bool(((nonzero >= low) & (nonzero <= high)).all()),
        ),
    ]
    if nonzero.size > 0 and nonzero.min() > 0:
        ks = stats.kstest(
            np.log10(nonzero), "uniform", args=(math.log10(low), math.log10(high / low))
        )
        checks.append(
            (
                f"log10 of the non-zero values is uniform (KS p-value {ks.pvalue:.2g} > 0.001)",
                ks.pvalue > 1e-3,
            )
        )
    for message, ok in checks:
        print(("passed: " if ok else "FAILED: ") + message)
    return all(ok for _, ok in checks)
