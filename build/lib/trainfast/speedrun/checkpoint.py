"""Stop a speedrun run and resume it exactly, as a time-limited job must.

A resumed run must continue as if it had never stopped: the same batches in the same order,
the same updates, the same losses, bit for bit. That needs everything the next step reads:

* the model's weights and the optimizer's state (AdamW's moments and step counts, Muon's
  momentum buffers), with each group's learning rate;
* the step to continue from, the clock and evaluations so far (the run's partial result);
* the batch source's position (the stream's next window, or the random windows' generator);
* every random generator: torch's CPU generator (and each GPU's), NumPy's and Python's global
  ones (the run itself draws only from torch's and the batch source's, but code it calls may
  draw from the others).

:func:`save_run` writes them to one file, atomically (a temporary name, then a rename, so a
job killed while saving leaves the previous checkpoint whole); :func:`load_run` restores them
into a freshly built run of the same configuration and seed, and refuses a checkpoint of
another configuration, seed or split, naming the difference. torch.compile's compiled code is
not saved: a resumed run compiles again (on the clock, as every run does).

When not to use it: across torch versions (a generator's state need not carry over), or to
resume with a changed configuration (that is a new run).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainfast.validation import check_int

__all__ = ["Checkpointing", "load_run", "random_states", "restore_random_states", "save_run"]


@dataclass(frozen=True)
class Checkpointing:
    """Save a run's state to ``path`` every ``every`` steps; with ``stop_after``, also stop the
    run after that step (saved), as a job's time limit would."""

    path: Path
    every: int
    stop_after: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        check_int("every", self.every, minimum=1)
        if self.stop_after is not None:
            check_int("stop_after", self.stop_after, minimum=1)

    def due(self, steps_done: int) -> bool:
        """Whether a checkpoint is saved after ``steps_done`` steps."""
        return steps_done % self.every == 0 or steps_done == self.stop_after


def random_states() -> dict[str, Any]:
    """Every global random generator's state: torch's CPU (and each GPU's), NumPy's, Python's."""
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_random_states(states: dict[str, Any]) -> None:
    """Put back what :func:`random_states` saved."""
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def save_run(path: Path, config, run, result, steps_done: int) -> Path:
    """Write the state of ``run`` (the harness's loop state) after ``steps_done`` steps."""
    state = {
        "config": repr(config),
        "seed": result.seed,
        "split": result.split,
        "steps_done": steps_done,
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "batches": run.stream.state_dict(),
        "random": random_states(),
        "result": {
            "train_seconds": result.train_seconds,
            "eval_seconds": result.eval_seconds,
            "steps": result.steps,
            "tokens": result.tokens,
            "final_loss": result.final_loss,
            "history": list(result.history),
        },
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    partial.replace(path)
    return path


def load_run(path, config, seed: int, split: str, model, optimizer, source, result) -> int:
    """Restore a run saved by :func:`save_run` into a new run of the same ``config``, ``seed``
    and ``split``; returns the steps done. ``ValueError`` naming what differs."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Invalid resume: {str(path)!r} (no such checkpoint)")
    # our own file, with NumPy's and Python's generator states in it: not weights-only
    state = torch.load(path, map_location="cpu", weights_only=False)
    for key, mine in (("config", repr(config)), ("seed", seed), ("split", split)):
        if state[key] != mine:
            raise ValueError(
                f"Invalid resume: {str(path)!r} holds a run of another {key} "
                f"({state[key]!r:.120}, this run: {mine!r:.120})"
            )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    source.load_state_dict(state["batches"])
    restore_random_states(state["random"])
    saved = state["result"]
    result.train_seconds, result.eval_seconds = saved["train_seconds"], saved["eval_seconds"]
    result.steps, result.tokens = saved["steps"], saved["tokens"]
    result.final_loss, result.history = saved["final_loss"], [tuple(h) for h in saved["history"]]
    return int(state["steps_done"])
