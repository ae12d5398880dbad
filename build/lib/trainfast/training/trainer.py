"""A small, modular trainer: set-up, one training step, evaluation, and the loop around them.

Each piece is a method you can read (and override) on its own, in the spirit of minGPT's
``Trainer`` and the Hugging Face ``Trainer``'s ``training_step``/``evaluate`` split:

* :meth:`Trainer.setup` builds loaders, optimizer and learning-rate schedule from the
  :class:`~trainfast.training.arguments.TrainingArguments`;
* :meth:`Trainer.training_step` is forward, backward and update on one batch, in train mode;
* :meth:`Trainer.evaluate` runs the held-out data in eval mode under ``torch.inference_mode()``;
* :meth:`Trainer.train` loops over epochs, logs against *examples seen*, and evaluates.

Side effects are switchable: the progress bar by ``args.progress_bar``, tracking by the
``tracker`` you pass (see :mod:`trainfast.training.tracking`), early stopping by callbacks.

Bad input fails before the first step: the data are checked against the model
(:func:`trainfast.loop.check_data`). A loss that turns NaN or infinite stops training with a
``ValueError`` naming the first step that had it (checked where the loss is logged anyway, so
no step waits for the device); ``allow_divergence=True`` trains on instead, for a run whose
divergence is the result (a learning-rate sweep past the stable edge).

Why this exists beside :func:`trainfast.loop.train`: that function is the smallest loop, a
fixed number of steps of a given optimizer, written out line by line for the optimizers
chapter. The trainer is what a run described by :class:`TrainingArguments` needs on top of it:
the optimizer built from a name (:func:`~trainfast.training.arguments.build_optimizer`),
warmup and decay, epochs, evaluation every few examples, a tracker and callbacks. Its
evaluation *is* :func:`trainfast.loop.evaluate`, so both return the same
:class:`~trainfast.loop.Evaluation`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainfast.device import pick_device
from trainfast.loop import Evaluation, check_data, evaluate
from trainfast.training.arguments import TrainingArguments, build_optimizer
from trainfast.training.random_state import random_states, restore_random_states
from trainfast.training.schedules import lr_multiplier
from trainfast.training.tracking import LocalTracker, Tracker
from trainfast.validation import check_flag, check_instance

__all__ = ["EvalCallback", "Trainer"]

#: Called with each evaluation's record; returning True stops training (early termination).
EvalCallback = Callable[[dict[str, float]], bool]


class Trainer:
    """Train ``model`` on ``train_data`` following ``args``; evaluate on ``eval_data``.

    ``parameter_groups`` are torch optimizer groups (dicts with ``"params"``); a group's own
    ``"lr"`` is its peak learning rate (``args.lr`` otherwise), which is how a pretrained
    backbone gets a smaller learning rate than a new head
    (:func:`trainfast.training.transfer.parameter_groups`); the schedule scales every group's
    peak alike. By default all parameters that require gradients form one group. ``loss_fn`` maps
    ``(outputs, targets)`` to a mean loss. ``generators`` names any generators of the run's own
    (an augmentation's, a noise layer's), which checkpoints save and restore with the data
    order's, the CPU's and the accelerator's. The history of logged records is in
    :attr:`history` (and in ``tracker.history``). A non-finite loss raises ``ValueError``
    naming its step unless ``allow_divergence`` (module docstring).
    """

    def __init__(
        self,
        model: nn.Module,
        args: TrainingArguments,
        train_data: Dataset,
        eval_data: Dataset | None = None,
        *,
        parameter_groups: Sequence[dict[str, Any]] | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
        tracker: Tracker | None = None,
        callbacks: Sequence[EvalCallback] = (),
        generators: dict[str, torch.Generator] | None = None,
        allow_divergence: bool = False,
    ) -> None:
        check_instance("model", model, nn.Module)
        check_instance("args", args, TrainingArguments)
        check_flag("allow_divergence", allow_divergence)
        if not callable(loss_fn):
            raise ValueError(f"Invalid loss_fn: {loss_fn!r:.80} (expected a function)")
        self.allow_divergence = allow_divergence
        self.model = model
        self.args = args
        self.train_data = train_data
        self.eval_data = eval_data
        self.loss_fn = loss_fn
        self.tracker = tracker if tracker is not None else LocalTracker(args.as_dict())
        self.callbacks = list(callbacks)
        self.generators = dict(generators or {})
        for name, generator in self.generators.items():
            check_instance(f"generators[{name!r}]", generator, torch.Generator)
        if "data_order" in self.generators:
            raise ValueError("Invalid generators: 'data_order' is the name of the loader's own")
        self.examples_seen = 0
        self.steps = 0
        self.setup(parameter_groups)

    def setup(self, parameter_groups: Sequence[dict[str, Any]] | None = None) -> None:
        """Device, training data loader, optimizer (with per-group learning rates) and schedule."""
        args = self.args
        torch.manual_seed(args.seed)
        self.device = pick_device(args.device)
        self.model.to(self.device)
        check_data(self.model, self.train_data, self.loss_fn, name="train_data")
        if self.eval_data is not None:
            check_data(self.model, self.eval_data, self.loss_fn, name="eval_data")
        self.train_loader = DataLoader(
            self.train_data,
            batch_size=args.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(args.seed),
        )
        if parameter_groups is None:
            parameter_groups = [{"params": [p for p in self.model.parameters() if p.requires_grad]}]
        self.optimizer = build_optimizer(
            args.optimizer,
            [dict(group) for group in parameter_groups],
            lr=args.lr,
            momentum=args.momentum if args.optimizer == "sgd" else 0.0,
            weight_decay=args.weight_decay,
        )
        self.total_steps = args.epochs * len(self.train_loader)
        warmup_steps = int(args.warmup_fraction * self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            partial(
                lr_multiplier,
                total_steps=self.total_steps,
                warmup_steps=warmup_steps,
                schedule=args.schedule,
            ),
        )

    def training_step(self, batch: Sequence[torch.Tensor]) -> torch.Tensor:
        """One update on ``batch``; returns the batch's mean loss, detached, on the device.

        The loss stays a tensor so that the loop does not wait for the device at every step;
        it is turned into a Python number only when it is logged.
        """
        self.model.train()
        inputs, targets = (t.to(self.device, non_blocking=True) for t in batch)
        loss = self.loss_fn(self.model(inputs), targets)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1
        self.examples_seen += len(targets)
        return loss.detach()

    def _check_finite(self, losses: list[torch.Tensor]) -> None:
        """Raise ``ValueError`` naming the first of the last ``len(losses)`` steps whose loss is
        NaN or infinite, unless ``allow_divergence``; else empty ``losses``. Called where the
        loop reads the losses anyway (to log them, or before an evaluation), so it costs no
        wait for the device."""
        if self.allow_divergence or not losses:
            losses.clear()
            return
        finite = torch.isfinite(torch.stack(losses)).tolist()
        if all(finite):
            losses.clear()
            return
        first = finite.index(False)
        step = self.steps - len(losses) + first + 1  # steps count from 1 here, as logged
        raise ValueError(
            f"Training diverged: the loss is {float(losses[first])} at step {step} of "
            f"{self.total_steps} (lr {self.args.lr:g}, {self.args.optimizer}); a lower learning "
            "rate, or finite inputs, would fix it. torch's optimizers would step on its NaN "
            "gradients without a word; Trainer(..., allow_divergence=True) trains on, for a run "
            "whose divergence is the result."
        )

    def evaluate(self, dataset: Dataset | None = None) -> Evaluation | None:
        """Mean loss and accuracy on ``dataset`` (default: the evaluation data), in eval mode,
        under ``torch.inference_mode()``: :func:`trainfast.loop.evaluate`, the same function
        the smallest loop uses. None when there is nothing to evaluate on."""
        dataset = self.eval_data if dataset is None else dataset
        if dataset is None:
            return None
        batch_size = max(self.args.batch_size, 256)
        return evaluate(self.model, dataset, batch_size=batch_size, loss_fn=self.loss_fn)

    def log(self, metrics: dict[str, Any]) -> None:
        """Send ``metrics`` to the tracker, stamped with the examples seen and steps taken."""
        self.tracker.log({"examples": self.examples_seen, "step": self.steps, **metrics})

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.tracker.history

    def _all_generators(self) -> dict[str, torch.Generator]:
        return {"data_order": self.train_loader.generator, **self.generators}  # type: ignore[dict-item]

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue exactly: model, optimizer, schedule,
        progress, and every generator it draws from (:mod:`trainfast.training.random_state`:
        the data order's, the CPU's, the CUDA devices' for dropout on a GPU, the run's own)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "examples_seen": self.examples_seen,
            "steps": self.steps,
            "random_states": random_states(self.device, self._all_generators()),
            "args": self.args.as_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: :meth:`train` then runs the remaining epochs.
        A dict that is not a trainer's checkpoint (a model's own ``state_dict()``, say) raises
        ``ValueError`` naming the keys it lacks."""
        keys = ("model", "optimizer", "scheduler", "examples_seen", "steps", "args")
        missing = [key for key in keys if key not in state] if isinstance(state, dict) else keys
        if not missing and "random_states" not in state:  # a checkpoint from before: both RNGs
            missing = [key for key in ("torch_rng", "data_order") if key not in state]
        if missing:
            raise ValueError(
                f"Invalid state: not a Trainer checkpoint (it lacks {list(missing)}; expected "
                "what Trainer.state_dict() returns, as save_checkpoint writes it)"
            )
        if state["args"] != self.args.as_dict():
            changed = sorted(k for k, v in state["args"].items() if self.args.as_dict().get(k) != v)
            raise ValueError(f"The checkpoint was made with other arguments: {changed}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.examples_seen, self.steps = state["examples_seen"], state["steps"]
        saved = state.get("random_states") or {  # a checkpoint from before every generator was kept
            "cpu": state["torch_rng"],
            "generators": {"data_order": state["data_order"]},
        }
        restore_random_states(saved, self._all_generators())

    def learning_rates(self) -> dict[str, float]:
        """The current learning rate of each parameter group (``lr/<name>`` for named groups)."""
        groups = self.optimizer.param_groups
        if len(groups) == 1:
            return {"lr": groups[0]["lr"]}
        return {f"lr/{g.get('name', i)}": g["lr"] for i, g in enumerate(groups)}

    def train(self) -> list[dict[str, Any]]:
        """Run ``args.epochs`` epochs; return the history of logged records.

        The training loss logged every ``args.log_every`` examples is the mean over the batches
        since the previous log; it is also shown on the progress bar. Evaluation happens every
        ``args.eval_every`` examples (or after each epoch) and always after the last step; a
        callback that returns True stops training there.
        """
        from tqdm import tqdm  # lazy: only the loop needs it

        args = self.args
        epoch_size = len(self.train_loader.dataset)  # type: ignore[arg-type]
        eval_every = args.eval_every or epoch_size
        if self.examples_seen % epoch_size:
            raise ValueError(
                f"Cannot resume at {self.examples_seen} examples: training resumes only at an "
                f"epoch boundary (a multiple of {epoch_size})"
            )
        next_log = (self.examples_seen // args.log_every + 1) * args.log_every
        next_eval = (self.examples_seen // eval_every + 1) * eval_every
        running, batches = torch.zeros((), device=self.device), 0
        unchecked: list[torch.Tensor] = []  # the losses since the last check for NaN and inf
        evaluated_at = -1
        bar = tqdm(
            total=epoch_size * args.epochs,
            unit="ex",
            disable=not args.progress_bar,
            mininterval=2.0,
        )
        for _ in range(self.examples_seen // epoch_size, args.epochs):  # resumes where it was
            for batch in self.train_loader:
                unchecked.append(self.training_step(batch))
                running += unchecked[-1]
                batches += 1
                bar.update(len(batch[1]))
                if self.examples_seen >= next_log:
                    self._check_finite(unchecked)
                    loss = running.item() / batches
                    self.log({"train/loss": loss, **self.learning_rates()})
                    bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
                    running, batches = torch.zeros((), device=self.device), 0
                    next_log += args.log_every
                if self.examples_seen >= next_eval:
                    self._check_finite(unchecked)
                    next_eval += eval_every
                    evaluated_at = self.examples_seen
                    if self._evaluate_and_log(epoch_size):
                        bar.close()
                        return self.history
        self._check_finite(unchecked)
        if evaluated_at != self.examples_seen:
            self._evaluate_and_log(epoch_size)
        bar.close()
        return self.history

    def _evaluate_and_log(self, epoch_size: int) -> bool:
        """Evaluate, log, and ask the callbacks whether to stop."""
        evaluation = self.evaluate()
        if evaluation is None:
            return False
        record = {**evaluation.as_metrics(), "epoch": self.examples_seen / epoch_size}
        self.log(record)
        record["examples"] = self.examples_seen
        stops = [callback(record) for callback in self.callbacks]  # every callback sees it
        return any(stops)
