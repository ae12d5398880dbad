"""Checkpoints: save a trainer's state, as a W&B artifact when tracked, and resume from it.

A checkpoint is :meth:`Trainer.state_dict <trainfast.training.trainer.Trainer.state_dict>`
written with ``torch.save``. When the run is tracked by W&B, :func:`save_checkpoint` also logs
the file as an *artifact* of type ``"model"``: a versioned file attached to the run, named by
its ``name`` argument (``checkpoint:v0``, ``:v1``, ... under the default name, and the alias
``latest``), with the progress as metadata, so that any later run, on any machine, can fetch
exactly that checkpoint with ``run.use_artifact(name).download()``. Offline, the artifact is
recorded in the run's folder and uploaded by ``wandb sync``; W&B cannot *fetch* an artifact
offline ("Cannot use artifact when in offline mode"), so :func:`load_checkpoint` then reads the
file itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainfast.training.tracking import Tracker, WandbTracker
from trainfast.training.trainer import Trainer
from trainfast.validation import output_folder

__all__ = ["load_checkpoint", "save_checkpoint"]


def save_checkpoint(
    trainer: Trainer, path: str | Path, *, tracker: Tracker | None = None, name: str = "checkpoint"
) -> Path:
    """Write ``trainer.state_dict()`` to ``path``; with a W&B ``tracker``, also log it as the
    artifact ``name`` (type ``"model"``) with the examples seen and steps as metadata."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"Invalid path: {str(path)!r} (expected a file to write; it is a folder)")
    output_folder("path's folder", path.parent)
    torch.save(trainer.state_dict(), path)
    if isinstance(tracker, WandbTracker):
        import wandb  # lazy: only a W&B tracker gets here

        artifact = wandb.Artifact(
            name,
            type="model",
            metadata={"examples_seen": trainer.examples_seen, "steps": trainer.steps},
        )
        artifact.add_file(str(path))
        tracker.run.log_artifact(artifact)
    return path


def load_checkpoint(
    trainer: Trainer, source: str | Path, *, tracker: Tracker | None = None
) -> dict[str, Any]:
    """Resume ``trainer`` from ``source``: a file, or (with an online W&B ``tracker``) an
    artifact name such as ``"checkpoint:latest"``, which is downloaded first. Returns the
    state that was loaded."""
    path = Path(source)
    online = isinstance(tracker, WandbTracker) and tracker.run.settings.mode == "online"
    if not path.exists():
        if not online:
            raise ValueError(
                f"No checkpoint file {str(source)!r}, and artifacts can be fetched only online"
            )
        directory = tracker.run.use_artifact(str(source)).download()  # type: ignore[union-attr]
        files = sorted(Path(directory).glob("*"))
        if len(files) != 1:
            raise ValueError(f"Artifact {source!r} holds {len(files)} files, expected one")
        path = files[0]
    try:
        state = torch.load(path, weights_only=False)  # our own file: it holds RNG states
    except Exception as error:  # not a torch file at all: pickle's or zipfile's own error
        raise ValueError(
            f"Invalid checkpoint file {str(path)!r}: torch.load cannot read it "
            f"({type(error).__name__}: {error}; expected a file save_checkpoint wrote)"
        ) from error
    try:
        trainer.load_state_dict(state)
    except ValueError as error:
        raise ValueError(f"{str(path)!r}: {error}") from error
    return state
