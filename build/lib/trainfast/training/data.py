"""Image-classification data, offline first, with CIFAR-10 one argument away.

``load_images("digits")`` gives scikit-learn's bundled handwritten digits (real data, on disk
with the package, 8x8 grey pixels), so the book builds without internet. ``load_images(
"cifar10", download=True)`` gives CIFAR-10 through torchvision for a reader who is online;
both return the same :class:`ImageData`, so the rest of the code path is the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.utils.data import Dataset, TensorDataset

from trainfast.datasets import digits
from trainfast.validation import check_flag, check_int, check_number

__all__ = [
    "ClassSubset",
    "ImageData",
    "known_labels",
    "labels_of",
    "load_images",
    "take_fraction",
]

_CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR10_STD = (0.2470, 0.2435, 0.2616)


@dataclass
class ImageData:
    """Train, test and (optionally) validation splits of ``(image, label)`` pairs, and the class
    names. Select hyperparameters on ``validation``; report the winner on ``test`` once."""

    train: Dataset
    test: Dataset
    classes: list[str]
    shape: tuple[int, int, int]  # (channels, height, width) of one image
    validation: Dataset | None = None


def load_images(
    name: str = "digits",
    *,
    root: str | Path | None = None,
    download: bool = False,
    channels: int | None = None,
    size: int | None = None,
    validation_fraction: float = 0.0,
) -> ImageData:
    """The data set ``name``: ``"digits"`` (offline) or ``"cifar10"`` (torchvision).

    ``channels=3`` repeats grey digits over three channels and ``size`` resizes them
    (bilinear), e.g. to feed an ImageNet-pretrained ResNet. CIFAR-10 is read from ``root``
    (default ``~/.cache/trainfast/cifar10``) and fetched only if ``download=True``.
    ``validation_fraction`` of the data (digits: of the whole set, taken from what is not
    test, by :func:`trainfast.datasets.digits`, the one digits loader; CIFAR-10: of its
    training split) becomes ``ImageData.validation``.
    """
    if channels is not None:
        check_int("channels", channels, minimum=1)
    if size is not None:
        check_int("size", size, minimum=1)
    check_number("validation_fraction", validation_fraction, minimum=0.0, below=1.0)
    check_flag("download", download)
    if name == "digits":
        splits = {}
        for split in ("train", "validation", "test"):
            if split == "validation" and validation_fraction == 0.0:
                continue
            x, y = digits(split, images=True, validation_fraction=validation_fraction).tensors
            if size is not None:  # x: (n, 1, 8, 8)
                x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
            if channels is not None:
                x = x.expand(-1, channels, -1, -1).contiguous()  # (n, channels, h, w)
            splits[split] = TensorDataset(x, y)
        return ImageData(
            splits["train"],
            splits["test"],
            [str(d) for d in range(10)],
            tuple(splits["train"][0][0].shape),
            splits.get("validation"),
        )
    if name == "cifar10":
        from torchvision import datasets, transforms  # lazy: only this branch needs it

        steps = [transforms.ToTensor(), transforms.Normalize(_CIFAR10_MEAN, _CIFAR10_STD)]
        if size is not None:
            steps.insert(1, transforms.Resize(size, antialias=True))
        transform = transforms.Compose(steps)
        root = Path(root or Path.home() / ".cache" / "trainfast" / "cifar10")
        train = datasets.CIFAR10(str(root), train=True, download=download, transform=transform)
        test = datasets.CIFAR10(str(root), train=False, download=download, transform=transform)
        validation = None
        if validation_fraction > 0.0:
            order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
            n = round(len(train) * validation_fraction)
            validation = torch.utils.data.Subset(train, order[:n].tolist())
            train = torch.utils.data.Subset(train, order[n:].tolist())  # type: ignore[assignment]
        classes = list(datasets.CIFAR10.classes) if hasattr(datasets.CIFAR10, "classes") else []
        return ImageData(
            train, test, classes or list(test.classes), (3, size or 32, size or 32), validation
        )
    raise ValueError(f"Unknown data set: {name!r} (expected 'digits' or 'cifar10')")


def known_labels(dataset: Dataset) -> torch.Tensor | None:
    """Every label of ``dataset`` where it keeps them apart from its inputs (a
    ``TensorDataset``, a :class:`ClassSubset`, torchvision's ``targets``, a ``Subset`` of
    these), else None: reading them would mean loading every example."""
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return dataset.tensors[1]
    if isinstance(dataset, ClassSubset):
        return dataset.labels
    if isinstance(dataset, torch.utils.data.Subset):
        labels = known_labels(dataset.dataset)
        return (
            None if labels is None else labels[torch.as_tensor(dataset.indices, dtype=torch.long)]
        )
    targets = getattr(dataset, "targets", None)  # torchvision's folder and CIFAR data sets
    return None if targets is None else torch.as_tensor(targets)


def labels_of(dataset: Dataset) -> torch.Tensor:
    """Every label of ``dataset`` as a tensor, without loading images where possible
    (:func:`known_labels`)."""
    labels = known_labels(dataset)
    if labels is not None:
        return labels
    return torch.tensor([int(dataset[i][1]) for i in range(len(dataset))])  # type: ignore[arg-type]


class ClassSubset(Dataset):
    """The examples of ``dataset`` whose label is in ``classes``, relabelled ``0..k-1``.

    ``per_class`` keeps at most that many examples of each class (a fixed shuffle by ``seed``),
    which is how a transfer-learning experiment gets a small target data set.
    """

    def __init__(
        self,
        dataset: Dataset,
        classes: Sequence[int],
        *,
        per_class: int | None = None,
        seed: int = 0,
    ) -> None:
        if per_class is not None:  # 0 would give an empty set, -1 drop one example per class
            check_int("per_class", per_class, minimum=1)
        check_int("seed", seed)
        if len(classes) == 0:
            raise ValueError("Invalid classes: [] (expected at least one class)")
        for c in classes:
            check_int("class", c, minimum=0)
        if len(set(classes)) != len(classes):
            raise ValueError(f"Repeated classes: {list(classes)}")
        self.dataset = dataset
        self.classes = list(classes)
        all_labels = labels_of(dataset)
        generator = torch.Generator().manual_seed(seed)
        keep = []
        for c in self.classes:
            index = torch.nonzero(all_labels == c).flatten()
            if len(index) == 0:
                raise ValueError(f"Class {c} has no examples in this data set")
            index = index[torch.randperm(len(index), generator=generator)]
            keep.append(index[:per_class] if per_class is not None else index)
        self.indices = torch.cat(keep).sort().values
        relabel = {c: i for i, c in enumerate(self.classes)}
        self.labels = torch.tensor([relabel[int(all_labels[i])] for i in self.indices])

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, _ = self.dataset[int(self.indices[i])]
        return image, self.labels[i]


def take_fraction(dataset: Dataset, fraction: float, *, seed: int = 0) -> Dataset:
    """A random ``fraction`` of ``dataset`` (at least one example), fixed by ``seed``."""
    check_number("fraction", fraction, above=0.0, maximum=1.0)
    check_int("seed", seed)
    n = max(1, round(len(dataset) * fraction))  # type: ignore[arg-type]
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))  # type: ignore[arg-type]
    return torch.utils.data.Subset(dataset, order[:n].tolist())
