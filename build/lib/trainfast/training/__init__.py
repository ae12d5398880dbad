"""Organised training: typed arguments, a modular trainer, tracking, transfer, scaling.

The chapter "Hyperparameters and experiment tracking" teaches these pieces; each lives in a
module named after its concept:

* :mod:`~trainfast.training.arguments`: :class:`TrainingArguments`, one run's knobs;
* :mod:`~trainfast.training.trainer`: :class:`Trainer` (set-up, step, evaluation, loop);
* :mod:`~trainfast.training.schedules`: warmup and decay of the learning rate (the trainer's
  multiplier, cosine with warmup and WSD), and a batch-size ramp;
* :mod:`~trainfast.training.tracking`: W&B when possible, a local history always;
* :mod:`~trainfast.training.checkpoints`: checkpoints as W&B artifacts, exact resumption;
* :mod:`~trainfast.training.random_state`: every generator a run draws from, kept together;
* :mod:`~trainfast.training.data`: offline digits, CIFAR-10 one argument away;
* :mod:`~trainfast.training.transfer`: freezing, new heads, backbone learning rates;
* :mod:`~trainfast.training.selection`: the optimizer's curse;
* :mod:`~trainfast.training.scaling`: a small scaling-law study and its power-law fits;
* :mod:`~trainfast.training.noise_scale`: the gradient noise scale (critical batch size);
* :mod:`~trainfast.training.digits_sweep`: the chapter's sweep function and search space;
* :mod:`~trainfast.training.benchmarks`: the study as a ``python -m trainfast.measure`` benchmark;
* :mod:`~trainfast.training.exercises`: the chapter's exercise checks.

Sweeps are in :mod:`trainfast.sweeps`.
"""

from trainfast.training.arguments import TrainingArguments
from trainfast.training.data import ClassSubset, ImageData, load_images, take_fraction
from trainfast.training.schedules import as_lambda, cosine_with_warmup, lr_multiplier, wsd
from trainfast.training.tracking import LocalTracker, Tracker, WandbTracker, start_run
from trainfast.training.trainer import Trainer

__all__ = [
    "ClassSubset",
    "ImageData",
    "LocalTracker",
    "Tracker",
    "Trainer",
    "TrainingArguments",
    "WandbTracker",
    "as_lambda",
    "cosine_with_warmup",
    "load_images",
    "lr_multiplier",
    "start_run",
    "take_fraction",
    "wsd",
]
