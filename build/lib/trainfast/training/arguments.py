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

from trainfast.device import parse_device
from trainfast.validation import check_flag, check_int, check_number, number_from_config

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


_INT_FIELDS = ("batch_size", "epochs", "log_every", "eval_every", "seed")
_FLOAT_FIELDS = ("lr", "momentum", "weight_decay", "warmup_fraction")


def _from_text(name: str, value: Any) -> Any:
    if name in _INT_FIELDS:
        return number_from_config(name, value, integer=True)
    if name in _FLOAT_FIELDS:
        return number_from_config(name, value)
    return value


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
        check_number("learning rate", self.lr, above=0.0)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("epochs", self.epochs, minimum=1)
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"Unknown optimizer: {self.optimizer!r} (expected one of {OPTIMIZERS})"
            )
        check_number("momentum", self.momentum, minimum=0.0, below=1.0)
        check_number("weight_decay", self.weight_decay, minimum=0.0)
        check_number("warmup_fraction", self.warmup_fraction, minimum=0.0, below=1.0)
        if self.schedule not in LR_SCHEDULES:
            raise ValueError(
                f"Unknown schedule: {self.schedule!r} (expected one of {LR_SCHEDULES})"
            )
        check_int("log_every", self.log_every, minimum=1)
        if self.eval_every is not None:
            check_int("eval_every", self.eval_every, minimum=1)
        check_int("seed", self.seed)
        if self.device is not None:
            parse_device(self.device)  # names an unknown kind; the Trainer checks availability
        check_flag("progress_bar", self.progress_bar)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, ignore: Iterable[str] = (), **defaults: Any
    ) -> TrainingArguments:
        """Arguments from a sweep's config dict; ``defaults`` fill what the config leaves out.

        A key that is neither a field nor listed in ``ignore`` (parameters the caller uses
        itself, such as a model width) raises ``ValueError`` naming it, so a typo in a sweep
        config cannot silently leave a hyperparameter at its default. A number written as text
        (YAML reads ``lr: 1e-3`` as the string ``'1e-3'``) is converted by the one rule of
        :func:`trainfast.validation.number_from_config`; other text in a numeric field raises
        ``ValueError`` naming the field and the value.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known - set(ignore))
        if unknown:
            raise ValueError(
                f"Unknown training arguments in config: {unknown} (known: {sorted(known)})"
            )
        values = {**defaults, **{k: v for k, v in config.items() if k in known}}
        return cls(**{k: _from_text(k, v) for k, v in values.items()})

    def as_dict(self) -> dict[str, Any]:
        """The arguments as a plain dict, e.g. for ``wandb.init(config=...)``."""
        return asdict(self)
