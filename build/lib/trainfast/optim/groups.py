"""Parameter groups: different settings for different parts of one model.

An optimizer takes either an iterable of tensors or a list of *groups*, dicts with a
``"params"`` key and any setting to override. A group's value wins over the constructor's
argument, which wins over the optimizer's default. Two groupings are common enough to
deserve a function:

* :func:`weight_decay_groups`: decay the weight matrices (and convolution kernels), but no
  tensor with fewer than two dimensions (biases, the gains and shifts of every normalisation
  layer, RMSNorm's included, PReLU's slopes) and no embeddings. Decaying a norm gain towards
  zero fights the very scale the layer exists to set; the rows of rare tokens would be shrunk
  on every step although they rarely receive a gradient. nanoGPT's ``configure_optimizers``
  uses the dimension rule alone: it decays every tensor with two or more dimensions,
  embeddings included, and nothing else.
* :func:`layerwise_lr_groups`: a smaller learning rate for early layers than for late ones,
  for fine-tuning a pretrained network whose early features are already good.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from trainfast.validation import check_number

__all__ = ["NO_DECAY_MODULES", "layerwise_lr_groups", "weight_decay_groups"]

#: Modules whose parameters get no weight decay, whatever their shape.
NO_DECAY_MODULES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.Embedding,
    nn.EmbeddingBag,
)


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: weights that decay, and biases/norm/embedding parameters that do not.

    A parameter decays if it has at least two dimensions, is not named like a bias and its
    module is not one of :data:`NO_DECAY_MODULES`. The dimension rule catches the gains of
    norm layers this tuple does not list (``nn.RMSNorm``, a hand-written norm) and PReLU's
    slopes. Groups that would be empty are left out. Each group carries a
    ``"name"`` key for printing; optimizers keep unknown keys and ignore them.
    """
    check_number("weight_decay value", weight_decay, minimum=0.0)
    decay, no_decay = [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            if param.ndim < 2 or isinstance(module, NO_DECAY_MODULES) or name.endswith("bias"):
                no_decay.append(param)
            else:
                decay.append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]
    return [group for group in groups if group["params"]]


def layerwise_lr_groups(layers: list[nn.Module], lr: float, decay: float) -> list[dict[str, Any]]:
    """One group per layer, the last with ``lr`` and each earlier one ``decay`` times smaller.

    ``layers`` are in forward order; layer ``i`` of ``n`` gets ``lr * decay ** (n - 1 - i)``.
    """
    check_number("learning rate", lr, above=0.0)
    check_number("decay", decay, above=0.0, maximum=1.0)
    n = len(layers)
    return [
        {"params": list(layer.parameters()), "lr": lr * decay ** (n - 1 - i), "name": f"layer {i}"}
        for i, layer in enumerate(layers)
    ]
