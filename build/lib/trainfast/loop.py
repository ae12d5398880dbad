"""The smallest honest training loop: sample a mini-batch, forward, backward, step.

The optimizers chapter uses it to compare batch sizes and optimizers on the same model and
data. Why a second loop exists beside :class:`trainfast.training.Trainer`: this one is a
function of a model, an optimizer and a step count, with the four lines of a step spelled out
where the optimizers chapter highlights them; the trainer is an object built from a
:class:`~trainfast.training.TrainingArguments` value that adds what real runs need (epochs,
warmup and decay, evaluation every few examples, tracking, callbacks). Both report held-out
results the same way, as an :class:`Evaluation` from :func:`evaluate`, and check their data
the same way before the first step, with :func:`check_data`. Use this one when you want to see
every line; use the trainer for real work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainfast.timing import timestamp
from trainfast.validation import check_int

__all__ = ["Evaluation", "History", "check_data", "evaluate", "train"]


class Evaluation(NamedTuple):
    """Mean loss and accuracy on held-out data; unpacks as ``loss, accuracy = ...``."""

    loss: float
    accuracy: float

    def as_metrics(self, prefix: str = "eval") -> dict[str, float]:
        """``{"<prefix>/loss": ..., "<prefix>/accuracy": ...}``, the keys a tracker logs."""
        return {f"{prefix}/loss": self.loss, f"{prefix}/accuracy": self.accuracy}


@dataclass
class History:
    """What :func:`train` saw: one entry per optimizer step."""

    loss: list[float] = field(default_factory=list)  # mini-batch loss before the step
    examples: list[int] = field(default_factory=list)  # examples seen after the step
    seconds: list[float] = field(default_factory=list)  # wall time since the start (device idle)

    @property
    def steps(self) -> int:
        return len(self.loss)


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    *,
    batch_size: int,
    steps: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
    seed: int = 0,
    device: torch.device | None = None,
) -> History:
    """Train ``model`` for ``steps`` optimizer steps on shuffled mini-batches of ``dataset``.

    The data are reshuffled every epoch (sampling without replacement, as a ``DataLoader``
    with ``shuffle=True`` does); ``batch_size=len(dataset)`` is full-batch gradient descent
    and ``batch_size=1`` is stochastic gradient descent in its original sense.
    """
    check_int("batch_size", batch_size, minimum=1)
    check_int("steps", steps, minimum=0)
    check_int("seed", seed)
    check_data(model, dataset, loss_fn)
    device = device or next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator)
    history = History()
    model.train()
    start, seen = timestamp(device), 0
    while history.steps < steps:
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            seen += len(targets)
            history.loss.append(loss.item())
            history.examples.append(seen)
            history.seconds.append(timestamp(device) - start)
            if history.steps == steps:
                break
    return history


def check_data(
    model: nn.Module,
    dataset: Dataset,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
    *,
    name: str = "dataset",
) -> None:
    """Raise ``ValueError`` naming ``name`` if ``dataset`` cannot train ``model`` with ``loss_fn``:
    what torch would otherwise report deep inside the first step, or not at all.

    Checked once, before training: the set is not empty and holds ``(input, target)`` pairs;
    its inputs are finite (every one where the set keeps them in one tensor, else the first
    batch) and fit the model (a forward pass of two examples, in eval mode and without
    gradients, so no statistic, weight or random stream changes); for cross-entropy, the
    targets are class indices (an integer dtype; float targets must be class probabilities
    of the outputs' shape) within the model's outputs (every label where the set keeps them
    apart, :func:`~trainfast.training.data.known_labels`); and ``loss_fn`` takes the outputs
    and targets. Nothing here runs per step.
    """
    with torch.random.fork_rng(devices=[]):  # a DataLoader draws its seed from torch's stream
        _check_data(model, dataset, loss_fn, name)


def _check_data(
    model: nn.Module,
    dataset: Dataset,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    name: str,
) -> None:
    from trainfast.training.data import known_labels  # lazy: the training package imports this

    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            f"Invalid {name}: {dataset!r:.80} (expected a data set with a length)"
        ) from None
    if size == 0:
        raise ValueError(f"Invalid {name}: an empty data set (expected at least one example)")
    batch = next(iter(DataLoader(dataset, batch_size=min(size, 2))))
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        raise ValueError(
            f"Invalid {name}: its examples are not (input, target) pairs (a batch of them is a "
            f"{type(batch).__name__} of {len(batch) if isinstance(batch, (list, tuple)) else 1})"
        )
    inputs, targets = batch
    if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise ValueError(
            f"Invalid {name}: examples of ({type(inputs).__name__}, {type(targets).__name__}) "
            "(expected (tensor, tensor) pairs)"
        )
    every_input = dataset.tensors[0] if isinstance(dataset, TensorDataset) else inputs
    if every_input.is_floating_point() and not torch.isfinite(every_input).all():
        raise ValueError(f"Invalid {name}: its inputs hold NaN or inf (expected finite inputs)")
    parameter = next(iter(model.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    was_training = model.training
    with torch.no_grad():
        model.eval()
        try:
            outputs = model(inputs.to(device))
        except Exception as error:  # whatever the model raises for inputs that do not fit
            raise ValueError(
                f"Invalid {name}: inputs of shape {tuple(inputs.shape[1:])} per example do not "
                f"fit the model ({type(error).__name__}: {error})"
            ) from error
        finally:
            model.train(was_training)
        if loss_fn is nn.functional.cross_entropy or isinstance(loss_fn, nn.CrossEntropyLoss):
            _check_classes(name, outputs, targets, known_labels(dataset))
        try:
            loss_fn(outputs, targets.to(device))
        except Exception as error:
            raise ValueError(
                f"Invalid {name}: loss_fn cannot take the model's outputs of shape "
                f"{tuple(outputs.shape)} with targets of shape {tuple(targets.shape)}, "
                f"{targets.dtype} ({type(error).__name__}: {error})"
            ) from error


def _check_classes(
    name: str, outputs: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor | None
) -> None:
    """Cross-entropy's targets: class indices below the number of outputs, or probabilities."""
    if targets.is_floating_point():
        if targets.shape != outputs.shape:
            raise ValueError(
                f"Invalid {name}: float targets of shape {tuple(targets.shape)} (expected class "
                "indices of an integer dtype for cross-entropy, or class probabilities of the "
                f"outputs' shape, {tuple(outputs.shape)}; indices stored as floats need .long())"
            )
        return
    classes = outputs.shape[1] if outputs.ndim > 1 else 0  # cross-entropy's class dimension
    labels = targets if labels is None else labels
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        raise ValueError(
            f"Invalid {name}: label {low if low < 0 else high} (expected labels from 0 to "
            f"{classes - 1}: the model has {classes} outputs)"
        )


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    dataset: Dataset,
    *,
    batch_size: int = 1024,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
) -> Evaluation:
    """Mean loss and accuracy of a classifier on ``dataset``, in eval mode, without autograd.

    ``loss_fn(outputs, targets)`` returns the batch's mean loss (as
    ``nn.functional.cross_entropy`` does); the result weights each batch by its size. The
    model's training mode is restored afterwards.
    """
    parameter = next(iter(model.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for inputs, targets in DataLoader(dataset, batch_size=batch_size):
        inputs, targets = inputs.to(device), targets.to(device)
        logits = model(inputs)
        total_loss += loss_fn(logits, targets).item() * len(targets)
        correct += (logits.argmax(dim=-1) == targets).sum().item()
        count += len(targets)
    model.train(was_training)
    return Evaluation(total_loss / count, correct / count)
