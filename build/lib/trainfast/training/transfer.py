"""Transfer learning with a torchvision ResNet: replace the head, freeze, or fine-tune gently.

Two ways to reuse a network trained on another task (Yosinski et al., 2014,
https://arxiv.org/abs/1411.1792):

* **feature extraction**: freeze the backbone (:func:`freeze`) and train only a new head
  (:func:`replace_head`); cheap, and safe when the new data set is tiny;
* **fine-tuning**: train everything, the backbone with a smaller learning rate than the new
  head (:func:`parameter_groups`), so that the features move but are not wrecked by the large
  early gradients of a randomly initialised head.

The book cannot download ImageNet weights while it builds, so it pretrains a
:class:`NarrowResNet` itself; ``backbone("resnet18", weights="DEFAULT")`` is the online path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet
from torchvision.ops import FrozenBatchNorm2d

from trainfast.validation import check_counts, check_int, check_number

__all__ = [
    "NarrowResNet",
    "backbone",
    "freeze",
    "parameter_groups",
    "replace_head",
]


class NarrowResNet(ResNet):
    """torchvision's ResNet with narrow stages and a small-image stem, for CPU-sized inputs.

    torchvision's ``ResNet`` fixes the stage widths at 64-128-256-512 and starts with a 7x7
    stride-2 convolution and a max-pool, which together shrink an 8x8 digit to 2x2 before the
    first residual block. This subclass keeps torchvision's blocks, ``_make_layer`` and
    ``forward`` (so it *is* a ``ResNet``: same ``fc`` head, same code path as ``resnet18``) and
    changes only the widths and the stem (a 3x3 stride-1 convolution, no pooling), as ResNets for
    CIFAR do (He et al., 2016, https://arxiv.org/abs/1512.03385, section 4.2).
    """

    def __init__(
        self,
        num_classes: int = 10,
        *,
        in_channels: int = 1,
        widths: Sequence[int] = (16, 32, 64, 128),
        blocks: Sequence[int] = (1, 1, 1, 1),
    ) -> None:
        if len(widths) != 4 or len(blocks) != 4:
            raise ValueError(f"Expected 4 stage widths and block counts, got {widths} and {blocks}")
        nn.Module.__init__(self)  # ResNet.__init__ would build the 64-wide stages we replace
        self._norm_layer = nn.BatchNorm2d
        self.inplanes, self.dilation, self.groups, self.base_width = widths[0], 1, 1, 64
        self.conv1 = nn.Conv2d(in_channels, widths[0], kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()
        self.layer1 = self._make_layer(BasicBlock, widths[0], blocks[0])
        self.layer2 = self._make_layer(BasicBlock, widths[1], blocks[1], stride=2)
        self.layer3 = self._make_layer(BasicBlock, widths[2], blocks[2], stride=2)
        self.layer4 = self._make_layer(BasicBlock, widths[3], blocks[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3], num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)


def backbone(
    name: str = "narrow", *, num_classes: int = 10, in_channels: int = 1, weights: str | None = None
) -> ResNet:
    """A ResNet to transfer from: ``"narrow"`` (:class:`NarrowResNet`) or a torchvision name
    such as ``"resnet18"``, whose ``weights="DEFAULT"`` downloads ImageNet weights (online)."""
    check_counts(num_classes=num_classes, in_channels=in_channels)
    if name == "narrow":
        if weights is not None:
            raise ValueError(f"NarrowResNet has no published weights (got weights={weights!r})")
        return NarrowResNet(num_classes, in_channels=in_channels)
    import torchvision

    if name not in torchvision.models.list_models(module=torchvision.models):  # classifiers
        raise ValueError(
            f"Invalid name: {name!r} (expected 'narrow' or a torchvision classifier such as "
            "'resnet18': torchvision.models.list_models() lists them)"
        )
    if in_channels != 3:
        raise ValueError(f"torchvision's {name} expects in_channels=3, got {in_channels}")
    model = torchvision.models.get_model(name, weights=weights)
    return replace_head(model, num_classes)  # ImageNet's 1,000 classes -> ours


def replace_head(model: nn.Module, num_classes: int, *, head: str = "fc") -> nn.Module:
    """Swap ``model.<head>`` (a ``Linear``) for a freshly initialised one with ``num_classes``
    outputs; returns ``model``. The new head's parameters require gradients."""
    check_int("num_classes", num_classes, minimum=1)
    old = getattr(model, head, None)
    if not isinstance(old, nn.Linear):
        raise ValueError(f"model.{head} is {type(old).__name__}, expected a Linear head")
    setattr(model, head, nn.Linear(old.in_features, num_classes).to(old.weight.device))
    return model


def freeze(model: nn.Module, *, keep: Sequence[str] = ("fc",)) -> nn.Module:
    """Freeze every parameter of ``model`` except those of the submodules named in ``keep``.

    ``keep=("fc",)`` is feature extraction with a ResNet (only the head learns);
    ``keep=("layer4", "fc")`` also fine-tunes the last stage. Setting ``requires_grad=False``
    is not enough for a ResNet: a BatchNorm layer in train mode still updates its running
    statistics, so the "frozen" features would drift. Each ``BatchNorm2d`` outside ``keep``
    therefore becomes torchvision's ``FrozenBatchNorm2d``, which holds the same statistics and
    affine weights as constants (as torchvision's detection models do). Returns ``model``,
    changed in place.
    """
    kept = [model.get_submodule(name) for name in keep]  # raises naming a missing submodule
    kept_params = {id(p) for module in kept for p in module.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in kept_params)
    _freeze_batch_norms(model, skip=kept)
    return model


def _freeze_batch_norms(module: nn.Module, skip: Sequence[nn.Module]) -> None:
    for name, child in module.named_children():
        if any(child is kept for kept in skip):
            continue
        if isinstance(child, nn.BatchNorm2d):
            frozen = FrozenBatchNorm2d(child.num_features, eps=child.eps)
            with torch.no_grad():
                frozen.weight.copy_(child.weight)
                frozen.bias.copy_(child.bias)
                frozen.running_mean.copy_(child.running_mean)
                frozen.running_var.copy_(child.running_var)
            setattr(module, name, frozen.to(child.weight.device))
        else:
            _freeze_batch_norms(child, skip)


def parameter_groups(
    model: nn.Module,
    *,
    lr: float,
    head: str = "fc",
    backbone_lr_scale: float = 0.1,
    weight_decay: float | None = None,
) -> list[dict[str, Any]]:
    """Two torch optimizer groups: the backbone at ``lr * backbone_lr_scale`` and the head at
    ``lr``. Frozen parameters are left out (the optimizer need not carry them).

    Each group carries its own ``"lr"``, the key every ``torch.optim`` optimizer reads, so the
    groups work as they are with ``torch.optim.AdamW(groups)`` as with the
    :class:`~trainfast.training.trainer.Trainer` (whose schedule scales both alike).
    ``weight_decay``, if given, is put in both groups.
    """
    check_number("learning rate", lr, above=0.0)
    check_number("backbone_lr_scale", backbone_lr_scale, minimum=0.0)
    if weight_decay is not None:
        check_number("weight_decay", weight_decay, minimum=0.0)
    head_module = getattr(model, head, None)
    if not isinstance(head_module, nn.Module):
        raise ValueError(f"Invalid head: {head!r} (the model has no submodule of that name)")
    head_ids = {id(p) for p in head_module.parameters()}
    backbone_params = [p for p in model.parameters() if p.requires_grad and id(p) not in head_ids]
    head_params = [p for p in head_module.parameters() if p.requires_grad]
    groups = [
        {"name": "backbone", "params": backbone_params, "lr": lr * backbone_lr_scale},
        {"name": "head", "params": head_params, "lr": lr},
    ]
    if weight_decay is not None:
        for group in groups:
            group["weight_decay"] = weight_decay
    return [g for g in groups if g["params"]]
