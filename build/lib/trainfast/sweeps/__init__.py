"""Hyperparameter sweeps in W&B's sweep-config syntax, on W&B when online, locally when not.

Three modules, one concept each:

* :mod:`~trainfast.sweeps.config`: the config syntax and its one validator, :func:`validate`;
* :mod:`~trainfast.sweeps.engine`: :func:`run` (and its two halves, :func:`run_locally` and
  :func:`run_on_wandb`), :func:`sample`;
* :mod:`~trainfast.sweeps.analysis`: parameter importance and parallel coordinates;
* :mod:`~trainfast.sweeps.quasi_random`: :func:`quasi_random`, configs from a scrambled Halton
  sequence (the Tuning Playbook's choice for exploring).

A config W&B would reject raises :class:`SweepConfigError`, naming the bad value, before any
run starts.
"""

from trainfast.sweeps.analysis import (
    ParameterImportance,
    parallel_coordinates,
    parameter_importance,
)
from trainfast.sweeps.config import METHODS, SweepConfigError, validate
from trainfast.sweeps.engine import (
    Metrics,
    SharedSweep,
    SweepResult,
    run,
    run_locally,
    run_on_wandb,
    sample,
)
from trainfast.sweeps.quasi_random import quasi_random

__all__ = [
    "METHODS",
    "Metrics",
    "ParameterImportance",
    "SharedSweep",
    "SweepConfigError",
    "SweepResult",
    "parallel_coordinates",
    "parameter_importance",
    "quasi_random",
    "run",
    "run_locally",
    "run_on_wandb",
    "sample",
    "validate",
]
