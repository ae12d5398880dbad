"""The hyperparameters chapter's sweep function and search space: a small CNN on the digits.

A sweep calls a function with one config (a plain dict) and reads the metrics it returns; if the
function takes a ``report`` argument, it also gets a callback for intermediate metrics, which
Hyperband reads to stop a run early (:func:`trainfast.sweeps.run`). :func:`train_digits` is that
function for the chapter's pages: the config's training keys become a
:class:`~trainfast.training.arguments.TrainingArguments` (a misspelt key is an error, not a
silently ignored setting), ``width`` and ``dropout`` shape the
:class:`~trainfast.training.scaling.ScalingCNN`, and the metric sweeps select on is the
validation loss. :data:`DIGITS_SWEEP` is the six-parameter random search the chapter runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import torch

from trainfast.training.arguments import TrainingArguments
from trainfast.training.data import ImageData, load_images
from trainfast.training.scaling import ScalingCNN
from trainfast.training.trainer import Trainer

__all__ = ["DIGITS_SWEEP", "digits_data", "train_digits"]

#: A random search over six hyperparameters of :func:`train_digits`, two epochs a run, in W&B's
#: sweep syntax: log-uniform learning rate, a few batch sizes, weight decays and widths, a
#: uniform warmup fraction, and a schedule drawn with probabilities.
DIGITS_SWEEP: dict[str, Any] = {
    "method": "random",
    "metric": {"name": "eval/loss", "goal": "minimize"},
    "parameters": {
        "lr": {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-1},
        "batch_size": {"values": [16, 32, 64, 128]},
        "weight_decay": {"values": [0.0, 0.01, 0.1]},
        "warmup_fraction": {"min": 0.0, "max": 0.2},
        "schedule": {"values": ["constant", "cosine"], "probabilities": [0.25, 0.75]},
        "width": {"values": [8, 16, 32]},
        "epochs": {"value": 2},
    },
}


@cache
def digits_data() -> ImageData:
    """The digits as images with a validation split of a fifth of the data, loaded once."""
    return load_images("digits", validation_fraction=0.2)


def train_digits(
    config: Mapping[str, Any],
    report: Callable[[dict[str, float]], bool] | None = None,
    *,
    device: str = "cpu",
    epochs: int = 2,
) -> dict[str, float]:
    """One run of a sweep: a ScalingCNN on the digits, with hyperparameters from ``config``.

    Reports ``{"eval/loss", "epoch"}`` after every epoch when ``report`` is given (and stops when
    it returns True); returns the last validation loss and accuracy and the epochs trained.
    ``epochs`` is the default a config's own ``epochs`` overrides.
    """
    base = TrainingArguments(epochs=epochs, device=device, progress_bar=False)
    args = TrainingArguments.from_config(config, ignore=("width", "dropout"), **base.as_dict())
    torch.manual_seed(args.seed)
    model = ScalingCNN(width=config.get("width", 16), dropout=config.get("dropout", 0.0))
    callbacks = []
    if report is not None:
        callbacks.append(lambda row: report({"eval/loss": row["eval/loss"], "epoch": row["epoch"]}))
    data = digits_data()
    trainer = Trainer(  # a sweep runs past the stable edge: a diverged run is a result
        model, args, data.train, data.validation, callbacks=callbacks, allow_divergence=True
    )
    trainer.train()
    last = trainer.history[-1]
    return {
        "eval/loss": last["eval/loss"],
        "eval/accuracy": last["eval/accuracy"],
        "epochs": last["epoch"],
    }
