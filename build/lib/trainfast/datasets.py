"""Offline-first data sets: real data that ships with a package, at sizes a laptop CPU affords.

The book builds without internet, so the default data set of every chapter must already be on
disk. scikit-learn's bundled *digits* are real handwritten digits (1,797 images of 8x8 pixels,
10 classes) and need no download. :func:`digits` is the book's one digits loader; the
hyperparameters chapter's ``trainfast.training.load_images("digits")`` calls it and only adds
resizing and an :class:`~trainfast.training.data.ImageData` wrapper.
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from trainfast.validation import check_flag, check_int, check_number

__all__ = ["SPLITS", "digits"]

#: The splits :func:`digits` knows; "validation" exists only when ``validation_fraction > 0``.
SPLITS = ("train", "validation", "test")


def digits(
    split: str = "train",
    *,
    test_fraction: float = 0.2,
    validation_fraction: float = 0.0,
    images: bool = False,
    seed: int = 0,
) -> TensorDataset:
    """scikit-learn's handwritten digits as a ``TensorDataset`` of (inputs, labels).

    Pixels are scaled to [0, 1]. ``images=False`` gives flat vectors ``(n, 64)``; ``images=True``
    gives ``(n, 1, 8, 8)`` for convolutional models. The splits are a fixed shuffle by ``seed``:
    the first ``test_fraction`` of it is the test split, the next ``validation_fraction`` (of
    the whole data set) the validation split, the rest the training split. With the default
    ``validation_fraction=0`` there is no validation split and the training split is everything
    that is not test, so every chapter and test that does not ask for validation data sees the
    same examples as before. Select hyperparameters on "validation", report on "test".
    """
    if split not in SPLITS:
        raise ValueError(f"Unknown split: {split!r} (expected one of {SPLITS})")
    check_number("test_fraction", test_fraction, above=0.0, below=1.0)
    check_number("validation_fraction", validation_fraction, minimum=0.0)
    check_flag("images", images)
    check_int("seed", seed)
    if not validation_fraction < 1.0 - test_fraction:
        raise ValueError(
            f"Invalid validation_fraction: {validation_fraction} "
            f"(expected 0 <= validation_fraction < 1 - test_fraction = {1.0 - test_fraction:g})"
        )
    if split == "validation" and validation_fraction == 0.0:
        raise ValueError(
            f"No {split!r} split: pass validation_fraction > 0 (got {validation_fraction})"
        )
    from sklearn.datasets import load_digits  # lazy: scikit-learn is an optional dependency

    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0  # (n, 64), pixel values 0..16
    y = torch.tensor(bunch.target, dtype=torch.long)  # (n,)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(len(y) * test_fraction))
    n_validation = int(round(len(y) * validation_fraction))
    index = {
        "test": order[:n_test],
        "validation": order[n_test : n_test + n_validation],
        "train": order[n_test + n_validation :],
    }[split]
    x, y = x[index], y[index]
    if images:
        x = x.reshape(-1, 1, 8, 8)  # (n, channels, height, width)
    return TensorDataset(x, y)
