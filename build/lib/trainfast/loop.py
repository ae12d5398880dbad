"""The smallest honest training loop: sample a mini-batch, forward, backward, step.

The optimizers chapter uses it to compare batch sizes and optimizers on the same model and
data. Why a second loop exists beside :class:`trainfast.training.Trainer`: this one is a
function of a model, an optimizer and a step count, with the four lines of a step spelled out
where the optimizers chapter highlights them; the trainer is an object built from a
:class:`~trainfast.training.TrainingArguments` value that adds what real runs need (epochs,
warmup and decay, evaluation every few examples, tracking, callbacks). Both report held-out
results the same way, as an :class:`Evaluation` from :func:`evaluate`. Use this one when you
want to see every line; use the trainer for real work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainfast.timing import timestamp

__all__ = ["Evaluation", "History", "evaluate", "train"]


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
    if batch_size < 1:
        raise ValueError(f"Invalid batch_size: {batch_size} (expected >= 1)")
    if steps < 0:
        raise ValueError(f"Invalid steps: {steps} (expected >= 0)")
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
    device = next(model.parameters()).device
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
