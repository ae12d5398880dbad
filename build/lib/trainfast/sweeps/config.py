"""Sweep configs in W&B's syntax, and their one validator.

A sweep config is the dict (or YAML) W&B documents at
https://docs.wandb.ai/guides/sweeps/define-sweep-configuration: a ``method`` (``grid``,
``random`` or ``bayes``), a ``metric`` with a ``goal``, ``parameters`` given as ``value``,
``values`` (with optional ``probabilities``), or ``min``/``max`` with an optional
``distribution``, and optionally ``early_terminate`` (Hyperband).

:func:`validate` is the one validator: W&B's own JSON schema first (from ``sweeps``, the
open-source engine W&B's server runs), then the few rules the schema does not know and the
engine would trip over later (probabilities outside random search, a continuous range in a
grid, Bayesian search or Hyperband without a metric).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from copy import deepcopy
from typing import Any

__all__ = [
    "LOG_DISTRIBUTIONS",
    "METHODS",
    "SweepConfigError",
    "leaf_parameters",
    "load_engine",
    "log_parameters",
    "validate",
]

METHODS = ("grid", "random", "bayes")
LOG_DISTRIBUTIONS = ("log_uniform_values", "q_log_uniform_values", "inv_log_uniform_values")


class SweepConfigError(ValueError):
    """A sweep config that W&B would reject; the message names the offending value."""


def load_engine() -> Any:
    """W&B's open-source sweep engine (``pip install sweeps``), imported quietly."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pydantic 2 deprecation warning on import
            import sweeps
    except ImportError as error:
        raise ImportError("Local sweeps need W&B's engine: pip install sweeps") from error
    return sweeps


def leaf_parameters(parameters: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf parameter as (dotted name, spec), descending into nested ``parameters``."""
    for name, spec in parameters.items():
        if isinstance(spec, Mapping) and "parameters" in spec:
            yield from leaf_parameters(spec["parameters"], f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", spec


def log_parameters(sweep_config: Mapping[str, Any] | None) -> set[str]:
    """Names of the parameters drawn log-uniformly (analysed on a log10 scale)."""
    if sweep_config is None:
        return set()
    return {
        name
        for name, spec in leaf_parameters(sweep_config.get("parameters", {}))
        if isinstance(spec, Mapping) and spec.get("distribution") in LOG_DISTRIBUTIONS
    }


def _schema_violations(config: dict[str, Any]) -> list[str]:
    """W&B's schema's messages for ``config`` (empty if it passes or the engine is absent)."""
    try:
        engine = load_engine()
    except ImportError:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(dict.fromkeys(engine.schema_violations_from_proposed_config(config)))


def _check_probabilities(name: str, spec: Mapping[str, Any], method: str) -> None:
    """``probabilities`` only in random search (W&B's bayes engine fails on them, a grid
    ignores them), one per value, non-negative and summing to one."""
    probabilities, values = spec["probabilities"], spec.get("values")
    if method != "random":
        raise SweepConfigError(
            f"Parameter {name!r}: {method} search does not take probabilities "
            f"{probabilities} (only random search does)"
        )
    if not isinstance(probabilities, list) or len(probabilities) != len(values or []):
        raise SweepConfigError(
            f"Parameter {name!r}: probabilities {probabilities!r} do not match values {values!r}"
        )
    if any(not isinstance(p, (int, float)) or p < 0 for p in probabilities) or not math.isclose(
        sum(probabilities), 1.0, abs_tol=1e-6
    ):
        raise SweepConfigError(
            f"Parameter {name!r}: probabilities {probabilities} must be >= 0 and sum to 1"
        )


def _check_grid(name: str, spec: Mapping[str, Any]) -> None:
    """A grid enumerates: it needs ``value``, ``values`` or an integer or quantised range."""
    if "value" in spec or "values" in spec:
        return
    low, high, distribution = spec.get("min"), spec.get("max"), spec.get("distribution")
    integer = distribution == "int_uniform" or (
        distribution is None and isinstance(low, int) and isinstance(high, int)
    )
    if not integer and distribution != "q_uniform":
        raise SweepConfigError(
            f"Parameter {name!r}: grid search needs 'values' or an integer range, got {dict(spec)}"
        )


def validate(sweep_config: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``sweep_config`` as W&B would; return a deep copy or raise :class:`SweepConfigError`.

    First W&B's own schema (when ``sweeps`` is installed, as it is wherever a local sweep can
    run), whose messages name the parameter; then our extra rules, for mistakes the schema
    accepts but a sweep would trip over later: probabilities outside random search or not
    summing to one, a continuous range in a grid, Bayesian search or Hyperband without a
    metric.
    """
    if not isinstance(sweep_config, Mapping):
        raise SweepConfigError(f"A sweep config is a dict, got {type(sweep_config).__name__}")
    config = deepcopy(dict(sweep_config))
    violations = _schema_violations(config)
    if violations:
        raise SweepConfigError("W&B's sweep schema rejects this config: " + "; ".join(violations))
    method = config.get("method")
    if method not in METHODS:  # the schema also knows "custom", which needs W&B's server
        raise SweepConfigError(
            f"Unknown sweep method: {method!r} (expected one of {list(METHODS)})"
        )
    parameters = config.get("parameters")
    if not isinstance(parameters, Mapping) or not parameters:
        raise SweepConfigError(f"A sweep needs a non-empty 'parameters' dict, got {parameters!r}")
    for name, spec in leaf_parameters(parameters):
        if not isinstance(spec, Mapping):
            raise SweepConfigError(f"Parameter {name!r}: expected a dict, got {spec!r}")
        if "probabilities" in spec:
            _check_probabilities(name, spec, method)
        if method == "grid":
            _check_grid(name, spec)
    metric = config.get("metric")
    if metric is None and method == "bayes":
        raise SweepConfigError(
            "Bayesian search needs a 'metric' with a 'name' and a 'goal' to model"
        )
    if metric is None and config.get("early_terminate") is not None:
        raise SweepConfigError("early_terminate needs a 'metric' to compare runs by")
    return config
