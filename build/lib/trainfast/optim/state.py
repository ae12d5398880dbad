"""How much memory an optimizer's state takes, per parameter, measured from ``optimizer.state``.

Training memory is weights + gradients + optimizer state + activations. The state is the part
the choice of optimizer decides: none for plain SGD, one copy of the weights for momentum or
Muon, two for Adam. The numbers here are measured from the real state tensors, not looked up,
so they stay true for any optimizer and configuration, ours or ``torch.optim``'s.
:func:`trainfast.accounting.bytes_per_parameter` predicts the same numbers from the number of
moments each optimizer keeps; ``tests/test_accounting.py`` checks that the two agree.

Counting: every tensor in ``optimizer.state`` counts, including Adam's and RMSprop's step
counts. Those are one 4-byte scalar per parameter *tensor*, so they add ``4 * n_tensors /
n_params`` bytes per parameter: 0.001 for the table's small model, less for a real one.
Non-tensor state (a Python ``int`` step) counts as 0 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from trainfast.optim.adam import Adam, AdamW
from trainfast.optim.muon import Muon, muon_param_groups
from trainfast.optim.rmsprop import RMSprop
from trainfast.optim.sgd import SGD

__all__ = ["state_bytes", "state_bytes_per_param", "state_bytes_table"]


def state_bytes(optimizer: Optimizer, *, scalars: bool = True) -> int:
    """Total bytes of the tensors in ``optimizer.state`` (every parameter, every kind of state).

    The package's one count of optimizer state: the tables here, and the per-rank memory of the
    sharded strategies (:func:`~trainfast.distributed.strategy.held_bytes`). A sharded tensor (a
    ``DTensor``, as PyTorch's FSDP keeps state) counts only this rank's local shard.
    ``scalars=False`` leaves out 0-dimensional state (Adam's step counts), as the ZeRO paper's
    ``K`` bytes per parameter do.
    """
    total = 0
    for per_param in optimizer.state.values():
        for value in per_param.values():
            if not isinstance(value, torch.Tensor) or (value.dim() == 0 and not scalars):
                continue
            local = value.to_local() if hasattr(value, "to_local") else value  # a DTensor's shard
            total += local.numel() * local.element_size()
    return total


def state_bytes_per_param(optimizer: Optimizer) -> float:
    """Bytes of optimizer state per parameter element: :func:`state_bytes` / parameter count.

    The parameter count is every element of every tensor in the optimizer's parameter groups.
    State is created lazily, so step the optimizer once before measuring (before that it is 0).
    """
    n_params = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    if n_params == 0:
        raise ValueError(f"{type(optimizer).__name__} has no parameters to count state against")
    return state_bytes(optimizer) / n_params


def _small_model(dtype: torch.dtype) -> nn.Module:
    return nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)
    ).to(dtype)


#: (optimizer, configuration, builder) for :func:`state_bytes_table`
_CONFIGURATIONS: list[tuple[str, str, Callable[[nn.Module], Optimizer]]] = [
    ("SGD", "momentum=0", lambda m: SGD(m.parameters(), lr=0.1)),
    ("SGD", "momentum=0.9", lambda m: SGD(m.parameters(), lr=0.1, momentum=0.9)),
    ("RMSprop", "default", lambda m: RMSprop(m.parameters(), lr=1e-3)),
    ("RMSprop", "momentum=0.9", lambda m: RMSprop(m.parameters(), lr=1e-3, momentum=0.9)),
    (
        "RMSprop",
        "centered, momentum=0.9",
        lambda m: RMSprop(m.parameters(), lr=1e-3, momentum=0.9, centered=True),
    ),
    ("Adam", "default", lambda m: Adam(m.parameters(), lr=1e-3)),
    ("Adam", "amsgrad=True", lambda m: Adam(m.parameters(), lr=1e-3, amsgrad=True)),
    ("AdamW", "default", lambda m: AdamW(m.parameters(), lr=1e-3)),
    ("Muon", "hidden weights only", lambda m: Muon(muon_param_groups(m)[:1])),
    ("Muon", "whole model: hidden weights + AdamW", lambda m: Muon(muon_param_groups(m))),
]


def state_bytes_table(dtype: torch.dtype = torch.float32, seed: int = 0) -> list[dict[str, Any]]:
    """Measured state bytes per parameter of each of our optimizers in common configurations.

    Each row builds the optimizer on a small MLP (32-128-128-10) with ``dtype`` weights, takes one
    step on random data and measures. Keys: ``optimizer`` (the class name), ``configuration`` (its
    settings, in words), ``state`` (the kinds of state kept per parameter), ``parameters`` (how many
    it optimizes), ``state_bytes_per_param`` (from :func:`state_bytes_per_param`) and
    ``copies_of_weights`` (that divided by the weights' element size). Rows of one optimizer are
    consecutive, its default configuration first. The Muon rows depend on the model: only the
    weights of the two hidden Linear layers (20,480 of the 22,026 parameters here) get Muon's single
    buffer; the output layer and the biases keep AdamW's two.
    """
    element_size = torch.empty((), dtype=dtype).element_size()
    rows = []
    for name, configuration, build in _CONFIGURATIONS:
        torch.manual_seed(seed)
        model = _small_model(dtype)
        optimizer = build(model)
        x = torch.randn(16, 32, dtype=dtype)  # (batch, features)
        model(x).square().mean().backward()
        optimizer.step()
        kinds = sorted({key for per_param in optimizer.state.values() for key in per_param})
        per_param = state_bytes_per_param(optimizer)
        n_params = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
        rows.append(
            {
                "optimizer": name,
                "configuration": configuration,
                "state": ", ".join(kinds) or "(none)",
                "parameters": n_params,
                "state_bytes_per_param": per_param,
                "copies_of_weights": per_param / element_size,
            }
        )
    return rows
