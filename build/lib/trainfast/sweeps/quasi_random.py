"""Quasi-random search: a sweep's configs from a scrambled Halton sequence instead of random draws.

Google's Deep Learning Tuning Playbook (Godbole et al., 2023,
https://github.com/google-research/tuning_playbook, "Why use quasi-random search instead of more
sophisticated black box optimization algorithms during the exploration phase of tuning?")
prefers quasi-random search, "based on randomly shifted low-discrepancy sequences", while a
study is still exploring: like random search it is non-adaptive (any metric can be chosen
afterwards, runs can go in parallel), and like a grid it spreads its points evenly, "jittered,
shuffled grid search". W&B's sweep engine has no such method, so this module proposes the
configs itself, in W&B's syntax, for :func:`trainfast.sweeps.run`'s functions to run.

Each parameter takes one dimension of a scrambled Halton sequence (``scipy.stats.qmc``): a
``value`` stays fixed; ``values`` are chosen by the coordinate (with ``probabilities`` as
their weights); a ``min``/``max`` range maps it uniformly, uniformly in the logarithm for
``log_uniform_values``, or to an integer for ``int_uniform``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainfast.sweeps.config import SweepConfigError, leaf_parameters, validate

__all__ = ["quasi_random"]

_RANGES = ("uniform", "int_uniform", "log_uniform_values")


def _distribution(spec: Mapping[str, Any]) -> str:
    """The range's distribution, inferred from the bounds' types when not given, as W&B does."""
    if "distribution" in spec:
        return spec["distribution"]
    integers = all(
        isinstance(spec[k], int) and not isinstance(spec[k], bool) for k in ("min", "max")
    )
    return "int_uniform" if integers else "uniform"


def _value(name: str, spec: Mapping[str, Any], u: float) -> Any:
    """The value of parameter ``name`` at the coordinate ``u`` in [0, 1)."""
    if "value" in spec:
        return spec["value"]
    if "values" in spec:
        values = list(spec["values"])
        weights = spec.get("probabilities") or [1.0] * len(values)
        total, cumulative = math.fsum(weights), 0.0
        for value, weight in zip(values, weights, strict=True):
            cumulative += weight / total
            if u < cumulative:
                return value
        return values[-1]
    distribution = _distribution(spec)
    low, high = spec["min"], spec["max"]
    if distribution == "uniform":
        return low + u * (high - low)
    if distribution == "int_uniform":
        return min(high, low + math.floor(u * (high - low + 1)))
    if distribution == "log_uniform_values":
        return math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    raise SweepConfigError(
        f"{name}: quasi-random search knows value, values and the distributions {_RANGES}, "
        f"not {distribution!r}"
    )


def quasi_random(
    sweep_config: Mapping[str, Any], count: int, *, seed: int = 0
) -> list[dict[str, Any]]:
    """``count`` configs of ``sweep_config``'s parameters (validated as W&B would) at the first
    ``count`` points of a Halton sequence scrambled by ``seed``, one dimension per parameter
    that varies; a nested parameter's name is dotted (``"optimizer.lr"``)."""
    from scipy.stats import qmc  # lazy: only quasi-random search needs SciPy

    config = validate(sweep_config)
    if count < 1:
        raise ValueError(f"Invalid count: {count} (expected at least 1)")
    parameters = list(leaf_parameters(config["parameters"]))
    varied = [(name, spec) for name, spec in parameters if "value" not in spec]  # a dimension each
    points = qmc.Halton(d=max(1, len(varied)), scramble=True, seed=seed).random(count)
    configs = []
    for point in points:
        coordinate = {name: float(u) for (name, _), u in zip(varied, point, strict=False)}
        configs.append(
            {name: _value(name, spec, coordinate.get(name, 0.0)) for name, spec in parameters}
        )
    return configs
