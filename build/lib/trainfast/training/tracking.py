"""Experiment tracking with Weights & Biases that never stops a build.

:func:`start_run` returns a :class:`Tracker`. With W&B installed it is a :class:`WandbTracker`:
*online* when ``WANDB_API_KEY`` is set (the run appears at wandb.ai), *offline* otherwise (the
run is written to disk and can be uploaded later with ``wandb sync``); it never asks for a
login. Without W&B, on a rank other than 0, with ``enabled=False``, or when W&B fails to start,
it is a :class:`LocalTracker`, which keeps the same history in memory and does nothing else.
Either way ``tracker.history`` holds every dict that was logged, so a chapter can plot the
curves itself. The pattern is nanoGPT's ``if wandb_log and master_process``, made a type.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["LocalTracker", "Tracker", "WandbTracker", "start_run", "wandb_mode"]


class Tracker:
    """What a trainer needs from experiment tracking: log a dict, watch a model, finish.

    This base class is the local, do-nothing-else tracker: it records ``config`` and every
    logged dict in :attr:`history`. Use it as a context manager to finish the run on exit.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.history: list[dict[str, Any]] = []

    def log(self, metrics: dict[str, Any]) -> None:
        """Record ``metrics`` (one row of the history; the ``examples`` key is the x axis)."""
        self.history.append(dict(metrics))

    def watch(self, model: nn.Module, log_freq: int = 100) -> None:  # noqa: B027
        """Ask for histograms of ``model``'s gradients and parameters (W&B only)."""

    def finish(self) -> None:  # noqa: B027
        """End the run (W&B uploads or closes its files)."""

    @property
    def kind(self) -> str:
        return "local"

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


class LocalTracker(Tracker):
    """Keeps the history in memory; used when W&B is absent, disabled, or not rank 0."""


class WandbTracker(Tracker):
    """A :class:`Tracker` that also sends everything to a W&B run."""

    def __init__(self, run: Any, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.run = run
        # Plot every metric against examples seen, not W&B's internal step counter, so runs
        # with different batch sizes line up on the run page.
        run.define_metric("examples")
        run.define_metric("*", step_metric="examples")

    def log(self, metrics: dict[str, Any]) -> None:
        super().log(metrics)
        self.run.log(metrics)

    def watch(self, model: nn.Module, log_freq: int = 100) -> None:
        self.run.watch(model, log="all", log_freq=log_freq)

    def finish(self) -> None:
        self.run.finish()

    @property
    def kind(self) -> str:
        return f"wandb ({self.run.settings.mode})"

    @property
    def id(self) -> str:
        """The run's id: pass it to ``start_run(..., run_id=...)`` to resume this run."""
        return self.run.id

    @property
    def directory(self) -> Path:
        """Where W&B wrote this run's files (``wandb sync <directory>`` uploads an offline run)."""
        return Path(self.run.dir).parent


def wandb_mode() -> str:
    """``"online"`` if ``WANDB_API_KEY`` is set, else ``"offline"``; ``WANDB_MODE`` can only
    turn it down (to ``"offline"`` or ``"disabled"``), never make a keyless run ask for a login."""
    requested = os.environ.get("WANDB_MODE", "").lower()
    if requested in ("offline", "disabled", "dryrun"):
        return "disabled" if requested == "disabled" else "offline"
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def _is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def start_run(
    project: str,
    config: dict[str, Any],
    *,
    name: str | None = None,
    group: str | None = None,
    enabled: bool = True,
    directory: str | Path | None = None,
    quiet: bool = True,
    run_id: str | None = None,
) -> Tracker:
    """Start a tracked run: W&B if it can, the local tracker if not. Never raises for W&B.

    ``directory`` is where W&B writes its files; by default ``$WANDB_DIR`` or a folder in the
    system's temporary directory, so a run never litters the working tree. ``quiet`` hides
    W&B's console banner. Only rank 0 (environment variable ``RANK``) tracks. ``run_id``
    resumes the W&B run with that id (``resume="allow"``: a new run if none exists); offline,
    the resumed part is a second folder that ``wandb sync`` uploads into the same run.
    """
    if not enabled or not _is_rank_zero():
        return LocalTracker(config)
    try:
        import wandb  # lazy: W&B is an optional dependency
    except ImportError:
        return LocalTracker(config)
    mode = wandb_mode()
    if mode == "disabled":
        return LocalTracker(config)
    directory = Path(
        directory or os.environ.get("WANDB_DIR") or Path(tempfile.gettempdir()) / "trainfast-wandb"
    )
    directory.mkdir(parents=True, exist_ok=True)
    try:
        run = wandb.init(
            project=project,
            config=config,
            name=name,
            group=group,
            dir=str(directory),
            mode=mode,
            reinit="finish_previous",  # one run at a time; wandb.watch uses the global run
            id=run_id,
            resume="allow" if run_id is not None else None,
            settings=wandb.Settings(silent=quiet, console="off"),
        )
    except Exception as error:  # W&B unreachable, bad key, ...: train anyway, say so
        warnings.warn(f"W&B did not start ({error!r}); keeping the history locally", stacklevel=2)
        return LocalTracker(config)
    return WandbTracker(run, config)
