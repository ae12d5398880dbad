"""Offline-first data sets: real data that ships with a package, at sizes a laptop CPU affords.

The book builds without internet, so the default data set of every chapter must already be on
disk. scikit-learn's bundled *digits* are real handwritten digits (1,797 images of 8x8 pixels,
10 classes) and need no download.
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

__all__ = ["digits"]


def digits(
    split: str = "train",
    *,
    test_fraction: float = 0.2,
    images: bool = False,
    seed: int = 0,
) -> TensorDataset:
    """scikit-learn's handwritten digits as a ``TensorDataset`` of (inputs, labels).

    Pixels are scaled to [0, 1]. ``images=False`` gives flat vectors ``(n, 64)``; ``images=True``
    gives ``(n, 1, 8, 8)`` for convolutional models. The train/test split is a fixed shuffle by
    ``seed``, so every chapter and test sees the same examples.
    """
    if split not in ("train", "test"):
        raise ValueError(f"Unknown split: {split!r} (expected 'train' or 'test')")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"Invalid test_fraction: {test_fraction} (expected 0 < test_fraction < 1)")
    from sklearn.datasets import load_digits  # lazy: scikit-learn is an optional dependency

    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32) / 16.0  # (n, 64), pixel values 0..16
    y = torch.tensor(bunch.target, dtype=torch.long)  # (n,)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(len(y) * test_fraction))
    index = order[n_test:] if split == "train" else order[:n_test]
    x, y = x[index], y[index]
    if images:
        x = x.reshape(-1, 1, 8, 8)  # (n, channels, height, width)
    return TensorDataset(x, y)
