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
import json
import os
import random
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainfast.files import read_json, write_json_atomically
from trainfast.sweeps.config import SweepConfigError, load_engine, validate
from trainfast.validation import check_int

__all__ = [
    "Metrics",
    "SharedSweep",
    "SweepResult",
    "run",
    "run_locally",
    "run_on_wandb",
    "sample",
]

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
    check_int("count", count, minimum=1)
    check_int("seed", seed)
    if config["method"] == "bayes":
        raise SweepConfigError(
            "A bayes sweep proposes configs from results: use run(), not sample()"
        )
    engine = load_engine()
    with _EngineRandomness(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proposals = engine.next_runs(config, [], n=count)
    return [_values(p.config) for p in proposals if p is not None]


def _check_run(function: Callable[..., Metrics], count: int, seed: int) -> None:
    """The arguments every way of running a sweep takes, each named if wrong."""
    check_int("count", count, minimum=1)
    check_int("seed", seed)
    if not callable(function):
        raise ValueError(f"Invalid function: {function!r:.80} (expected config -> metrics)")


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


def _json_metrics(metrics: Metrics, run: str) -> Metrics:
    """``metrics`` as a dict of JSON values; a value that is not (a tensor, say) raises
    ``ValueError`` naming the metric and the run, so the shared file stays readable."""
    for key, value in dict(metrics).items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"Invalid metric {key!r} of {run}: {value!r:.80} is a {type(value).__name__}, "
                "not a JSON value (return a float, e.g. loss.item())"
            ) from None
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
    _check_run(function, count, seed)
    if online is None:
        online = bool(os.environ.get("WANDB_API_KEY")) and os.environ.get("WANDB_MODE") not in (
            "offline",
            "disabled",
        )
    if online:
        return run_on_wandb(config, function, count, project=project)
    return run_locally(config, function, count, seed=seed)


class _PrivateHistory:
    """The runs of a sweep that only this process runs: a list in memory, one seeded stream."""

    def __init__(self, engine: Any, seed: int) -> None:
        self.engine, self.randomness, self.runs = engine, _EngineRandomness(seed), []

    def propose(self, config: dict[str, Any]) -> tuple[str, Any] | None:
        with self.randomness, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            proposal = self.engine.next_run(config, self.runs)
        if proposal is None:
            return None
        run = self.engine.SweepRun(
            name=f"run-{len(self.runs)}", config=proposal.config, state=self.engine.RunState.running
        )
        self.runs.append(run)
        return run.name, proposal.config

    def report(self, config: dict[str, Any], name: str, metrics: Metrics) -> bool:
        run = next(r for r in self.runs if r.name == name)
        run.history.append(dict(metrics))
        if "early_terminate" not in config:
            return False
        return any(r.name == name for r in self.engine.stop_runs(config, self.runs))

    def finish(self, name: str, metrics: Metrics) -> None:
        run = next(r for r in self.runs if r.name == name)
        run.summary_metrics, run.state = metrics, self.engine.RunState.finished

    def fail(self, name: str, error: str) -> None:
        next(r for r in self.runs if r.name == name).state = self.engine.RunState.failed


class SharedSweep:
    """A sweep's runs in a JSON file that several agents (processes, threads, machines with a
    shared disk) read and write under a file lock, as W&B's server keeps one sweep's runs for
    all its agents.

    Each agent calls :func:`run_locally` with ``shared=SharedSweep(path)``. A proposal is made
    from *every* agent's runs, finished and running, so a grid is never run twice and Bayesian
    search learns from all results; each proposal draws from a stream seeded by ``seed`` and
    the number of runs before it. The lock is ``fcntl.flock``, i.e. BSD's ``flock(2)``
    (POSIX's record locks are ``fcntl.lockf``), so it needs a Unix.
    """

    def __init__(self, path: str | Path, *, seed: int = 0) -> None:
        self.path, self.seed = Path(path), seed
        self.engine = load_engine()

    @contextmanager
    def _locked(self) -> Iterator[list[dict[str, Any]]]:
        import fcntl  # lazy: Unix only

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                records = read_json(self.path) if self.path.exists() else []
                yield records
                write_json_atomically(self.path, records)  # a killed agent leaves the old file
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _engine_runs(self, records: list[dict[str, Any]]) -> list[Any]:
        state = self.engine.RunState
        return [
            self.engine.SweepRun(
                name=r["name"],
                config=r["config"],
                state=state(r["state"]),
                history=r["history"],
                summary_metrics=r["summary"],
            )
            for r in records
        ]

    def records(self) -> list[dict[str, Any]]:
        """Every agent's runs so far: name, config, state, history, summary and agent."""
        with self._locked() as records:
            return [dict(r) for r in records]

    def propose(self, config: dict[str, Any], agent: str = "") -> tuple[str, Any] | None:
        with self._locked() as records:
            with _EngineRandomness(self.seed * 1_000_003 + len(records)), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                proposal = self.engine.next_run(config, self._engine_runs(records))
            if proposal is None:
                return None
            name = f"run-{len(records)}"
            records.append(
                {
                    "name": name,
                    "config": proposal.config,
                    "state": "running",
                    "history": [],
                    "summary": {},
                    "agent": agent,
                }
            )
        return name, proposal.config

    def report(self, config: dict[str, Any], name: str, metrics: Metrics) -> bool:
        with self._locked() as records:
            next(r for r in records if r["name"] == name)["history"].append(dict(metrics))
            if "early_terminate" not in config:
                return False
            stop = self.engine.stop_runs(config, self._engine_runs(records))
        return any(r.name == name for r in stop)

    def finish(self, name: str, metrics: Metrics) -> None:
        with self._locked() as records:
            record = next(r for r in records if r["name"] == name)
            record["state"], record["summary"] = "finished", dict(metrics)

    def fail(self, name: str, error: str) -> None:
        """Mark run ``name`` failed (with ``error``), so no one waits for it as "running"."""
        with self._locked() as records:
            record = next(r for r in records if r["name"] == name)
            record["state"], record["error"] = "failed", error


def run_locally(
    config: Mapping[str, Any],
    function: Callable[..., Metrics],
    count: int,
    *,
    seed: int = 0,
    shared: SharedSweep | None = None,
    agent: str = "",
) -> list[SweepResult]:
    """Run ``function`` on ``count`` configs proposed here by W&B's engine, seeded by ``seed``;
    Hyperband (``early_terminate``) is asked after every ``report`` whether the run should stop.

    With ``shared``, this call is one *agent* of a sweep that others run too (see
    :class:`SharedSweep`); it returns only its own runs, and ``agent`` labels them.
    """
    config = validate(config)
    _check_run(function, count, seed)
    history = shared if shared is not None else _PrivateHistory(load_engine(), seed)
    results: list[SweepResult] = []
    for _ in range(count):
        proposed = history.propose(config, agent) if shared is not None else history.propose(config)
        if proposed is None:  # a grid with every point done
            break
        name, proposal = proposed
        result = SweepResult(config=_values(proposal))

        def report(metrics: Metrics, name: str = name, result: SweepResult = result) -> bool:
            metrics = _json_metrics(metrics, name) if shared is not None else dict(metrics)
            result.history.append(metrics)
            result.stopped = history.report(config, name, metrics) or result.stopped
            return result.stopped

        try:
            result.metrics = _call(function, dict(result.config), report)
            if shared is not None:  # the shared file holds JSON: name a metric that is not
                result.metrics = _json_metrics(result.metrics, name)
        except BaseException as error:  # a failed run is marked so, never left "running"
            history.fail(name, f"{type(error).__name__}: {error}")
            raise
        history.finish(name, result.metrics)
        results.append(result)
    return results


def run_on_wandb(
    config: Mapping[str, Any],
    function: Callable[..., Metrics],
    count: int,
    *,
    project: str = "trainfast-sweeps",
    sweep_id: str | None = None,
) -> list[SweepResult]:
    """Create the sweep on W&B (or join ``sweep_id``) and run ``count`` of its configs in this
    process, as one agent.

    Other agents (``wandb agent <sweep id>``, or this function with ``sweep_id``, in other
    shells or machines) may join the same
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

    sweep_id = sweep_id or wandb.sweep(sweep=config, project=project)
    wandb.agent(sweep_id, function=trial, count=count, project=project)
    return results
