"""Data loading measured: worker processes, persistent workers, pinned memory.

A ``DataLoader`` with ``num_workers=0`` reads and collates every batch on the training thread,
between two steps. With ``num_workers=k`` it starts ``k`` processes that prepare batches ahead
(``prefetch_factor`` each) while the main process trains; ``persistent_workers=True`` keeps those
processes from one epoch to the next instead of starting new ones each epoch; ``pin_memory=True``
copies each batch into page-locked memory (on a background thread), from which a GPU copies
faster and, with ``non_blocking=True``, without making the host wait.

:func:`loader_seconds` times whole passes over a dataset, so that starting workers counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from trainfast.timing import Timing, benchmark

__all__ = ["loader_seconds"]


def loader_seconds(
    dataset: Dataset,
    *,
    batch_size: int,
    num_workers: int = 0,
    persistent_workers: bool = False,
    pin_memory: bool = False,
    epochs: int = 1,
    repeats: int = 3,
    consume: Callable[[Any], object] | None = None,
) -> Timing:
    """Time a new ``DataLoader`` reading ``epochs`` passes over ``dataset`` (workers started
    included), ``repeats`` times, on the host clock.

    ``consume(batch)``, if given, runs on every batch in the main process, standing in for the
    training step that the workers' loading can overlap with.
    """
    if pin_memory and not torch.cuda.is_available():
        raise ValueError(
            "Invalid pin_memory: True needs CUDA (page-locked memory is for GPU copies)"
        )

    def passes() -> None:
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers and num_workers > 0,
        )
        for _ in range(epochs):
            for batch in loader:
                if consume is not None:
                    consume(batch)

    return benchmark(passes, warmup=0, repeats=repeats, device="cpu")
