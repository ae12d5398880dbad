"""Running a sweep: on W&B when online, locally with W&B's own engine when not.

:func:`run` takes a sweep config (validated by :func:`trainfast.sweeps.config.validate`) and a
function ``config -> metrics``:

* with ``WANDB_API_KEY`` set it calls :func:`run_on_wandb`: ``wandb.sweep`` creates the sweep
  on wandb.ai and ``wandb.agent`` runs the function on the configs W&B's server proposes;
* otherwise :func:`run_locally` proposes them here with ``sweeps``, the open-source engine W&B's
  server runs (https://github.com/wandb/sweeps), so the sampling semantics are the same, with
  no server and no account. Hyperband is applied locally too, through the same engine.
"""

from __future__ import annotations

import inspect
import os
import random
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainfast.sweeps.config import SweepConfigError, load_engine, validate

__all__ = ["Metrics", "SweepResult", "run", "run_locally", "run_on_wandb", "sample"]

#: What a sweep function may return or report: metric name -> value.
Metrics = dict[str, Any]


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
    engine = load_engine()
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
        return run_on_wandb(config, function, count, project=project)
    return run_locally(config, function, count, seed=seed)


def run_locally(
    config: Mapping[str, Any], function: Callable[..., Metrics], count: int, *, seed: int = 0
) -> list[SweepResult]:
    """Run ``function`` on ``count`` configs proposed here by W&B's engine, seeded by ``seed``;
    Hyperband (``early_terminate``) is asked after every ``report`` whether the run should stop."""
    config = validate(config)
    engine = load_engine()
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


def run_on_wandb(
    config: Mapping[str, Any],
    function: Callable[..., Metrics],
    count: int,
    *,
    project: str = "trainfast-sweeps",
) -> list[SweepResult]:
    """Create the sweep on W&B and run ``count`` of its configs in this process (one agent).

    Other agents (``wandb agent <sweep id>`` in other shells or machines) may join the same
    sweep; W&B's server hands each a different config and stops runs itself."""
    config = validate(config)
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
