"""The typed arguments of a training run: every knob a sweep may turn, in one dataclass.

A run is described by one :class:`TrainingArguments` value, passed explicitly to the
:class:`~trainfast.training.trainer.Trainer` and logged as the run's config to Weights & Biases,
so that a run page (or a sweep's table) shows exactly what produced a curve. The fields are
the hyperparameters this chapter searches over; the model's own shape (width, dropout) belongs to
the model, not here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import torch

__all__ = ["LR_SCHEDULES", "OPTIMIZERS", "TrainingArguments", "build_optimizer"]

#: The optimizers a run may name; :func:`build_optimizer` turns a name into one.
OPTIMIZERS = ("adamw", "adam", "sgd")
#: The learning-rate decays after warmup (:func:`~trainfast.training.schedules.lr_multiplier`).
LR_SCHEDULES = ("constant", "linear", "cosine")


def build_optimizer(
    name: str,
    parameters: Any,
    *,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float | None = None,
) -> torch.optim.Optimizer:
    """``torch.optim.AdamW``, ``torch.optim.Adam`` or ``torch.optim.SGD`` from its name: the
    package's one place that turns a name into an optimizer (the trainer, the data-parallel
    strategies and the mixture-of-experts demonstration call it).

    ``parameters`` is an iterable of tensors or of parameter groups; a group's own ``"lr"``
    wins over ``lr``. ``momentum`` is SGD's. ``weight_decay=None`` keeps torch's default for
    that optimizer (0 for SGD and Adam, 0.01 for AdamW); note that torch multiplies the decay by the
    learning rate in both, so it must be retuned when ``lr`` changes.
    """
    if name in ("adamw", "adam"):
        if momentum:
            raise ValueError(f"Invalid momentum: {momentum} ({name} has betas, not momentum)")
        extra = {} if weight_decay is None else {"weight_decay": weight_decay}
        adam = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
        return adam(parameters, lr=lr, **extra)
    if name == "sgd":
        return torch.optim.SGD(
            parameters, lr=lr, momentum=momentum, weight_decay=weight_decay or 0.0
        )
    raise ValueError(f"Unknown optimizer: {name!r} (expected one of {OPTIMIZERS})")


@dataclass(frozen=True)
class TrainingArguments:
    """What a :class:`~trainfast.training.trainer.Trainer` needs to know about one run.

    ``lr`` is the peak learning rate: a linear warmup over the first ``warmup_fraction`` of the
    optimizer steps reaches it, then ``schedule`` decays it (see
    :func:`~trainfast.training.schedules.lr_multiplier`). Progress is counted in *examples seen*,
    not steps, so runs with different ``batch_size`` share an x axis: ``log_every`` and
    ``eval_every`` are numbers of examples (``eval_every=None`` evaluates after each epoch).

    Invalid values fail here, naming the value, rather than deep inside the first step.
    """

    lr: float = 1e-3
    batch_size: int = 32
    epochs: int = 1
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    momentum: float = 0.9  # SGD only
    weight_decay: float = 0.0
    warmup_fraction: float = 0.0
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    log_every: int = 256  # examples between two logged training losses
    eval_every: int | None = None  # examples between evaluations; None: after every epoch
    seed: int = 0
    device: str | None = None  # "cuda", "mps", "cpu"; None picks the best available
    progress_bar: bool = True

    def __post_init__(self) -> None:
        if not self.lr > 0.0:
            raise ValueError(f"Invalid learning rate: {self.lr}")
        if self.batch_size < 1:
            raise ValueError(f"Invalid batch_size: {self.batch_size} (expected >= 1)")
        if self.epochs < 1:
            raise ValueError(f"Invalid epochs: {self.epochs} (expected >= 1)")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"Unknown optimizer: {self.optimizer!r} (expected one of {OPTIMIZERS})"
            )
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"Invalid momentum: {self.momentum} (expected 0 <= momentum < 1)")
        if self.weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay: {self.weight_decay} (expected >= 0)")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(
                f"Invalid warmup_fraction: {self.warmup_fraction} (expected 0 <= fraction < 1)"
            )
        if self.schedule not in LR_SCHEDULES:
            raise ValueError(
                f"Unknown schedule: {self.schedule!r} (expected one of {LR_SCHEDULES})"
            )
        if self.log_every < 1:
            raise ValueError(f"Invalid log_every: {self.log_every} (expected >= 1 example)")
        if self.eval_every is not None and self.eval_every < 1:
            raise ValueError(f"Invalid eval_every: {self.eval_every} (expected >= 1 or None)")

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, ignore: Iterable[str] = (), **defaults: Any
    ) -> TrainingArguments:
        """Arguments from a sweep's config dict; ``defaults`` fill what the config leaves out.

        A key that is neither a field nor listed in ``ignore`` (parameters the caller uses
        itself, such as a model width) raises ``ValueError`` naming it, so a typo in a sweep
        config cannot silently leave a hyperparameter at its default.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known - set(ignore))
        if unknown:
            raise ValueError(
                f"Unknown training arguments in config: {unknown} (known: {sorted(known)})"
            )
        return cls(**{**defaults, **{k: v for k, v in config.items() if k in known}})

    def as_dict(self) -> dict[str, Any]:
        """The arguments as a plain dict, e.g. for ``wandb.init(config=...)``."""
        return asdict(self)
