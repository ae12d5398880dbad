"""AdamW on bfloat16 weights without float32 master weights: Kahan-compensated updates.

A pure-bf16 run adds each update to a bfloat16 weight, and an update smaller than half the
weight's spacing is rounded away (the chapter measures how many). Float32 master weights keep
those updates at 4 extra bytes per parameter. *Kahan summation* keeps them at 2: a second bf16
buffer, the *compensation*, holds what the last rounding lost, and the next update adds it back
(Kahan 1965, "Further remarks on reducing truncation errors"; applied to bf16 training by
Zamirai et al. 2020, "Revisiting BFloat16 Training", who also study stochastic rounding).

:func:`kahan_add_` is the compensated addition, :func:`kahan_adamw_step_` one AdamW step on one
tensor (moments in float32, the update added with :func:`kahan_add_`), and :class:`KahanAdamW`
keeps the state. On float32 weights the compensation stays near zero and the optimizer matches
``torch.optim.AdamW`` (the tests check it); on bf16 weights it keeps the updates that plain
AdamW rounds away. When not to use it: if 4 bytes per parameter for master weights fit, they
are simpler and exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from trainfast.optim._validate import check_hyperparameters

__all__ = ["KahanAdamW", "kahan_add_", "kahan_adamw_step_"]


def kahan_add_(param: Tensor, update: Tensor, compensation: Tensor) -> None:
    """``param += update`` in ``param``'s dtype, carrying the rounding error in ``compensation``.

    The sum is formed in float32: ``total = update + compensation``; ``param`` becomes
    ``round(param + total)``; ``compensation`` becomes ``total - (new param - old param)``, the
    part of ``total`` the rounding dropped (the difference of two nearby bf16 values is exact in
    float32). ``compensation`` has ``param``'s shape; any float dtype.
    """
    total = update.float() + compensation.float()
    before = param.to(torch.float32, copy=True)  # a copy even when param is float32
    param.copy_(before + total)
    compensation.copy_(total - (param.float() - before))


def kahan_adamw_step_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    compensation: Tensor,
    step: int,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    compensated: bool = True,
) -> None:
    """One AdamW step on one tensor, in place; the moments are float32, the update compensated.

    ``m_t = β1 m + (1-β1) g``, ``v_t = β2 v + (1-β2) g²``, and the update
    ``-γ λ θ - γ m̂_t / (√v̂_t + ε)`` (decoupled weight decay, as ``torch.optim.AdamW``) is
    added to ``param`` with :func:`kahan_add_`. ``step`` counts from 1. ``compensated=False``
    adds it plainly, rounded to ``param``'s dtype, and leaves ``compensation`` alone: the
    control that has the float32 moments without the compensation.
    """
    g = grad.float()
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)  # √v̂_t + ε
    update = exp_avg / denom * (-lr / bias_correction1)
    if weight_decay != 0:
        update.add_(param.float(), alpha=-lr * weight_decay)
    if compensated:
        kahan_add_(param, update, compensation)
    else:
        param.copy_(param.float() + update)


class KahanAdamW(Optimizer):
    """AdamW whose updates are added with Kahan compensation (see the module docstring).

    State per parameter: ``step``, ``exp_avg`` and ``exp_avg_sq`` (float32) and
    ``compensation`` (the parameter's dtype). Same hyperparameters and defaults as
    ``torch.optim.AdamW``; no amsgrad, no sparse gradients. ``compensated=False`` is the
    control: float32 moments, updates added plainly (``torch.optim.AdamW`` on bf16 weights keeps
    bf16 moments, so it differs from this optimizer in two ways, not one).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        compensated: bool = True,
    ) -> None:
        if not isinstance(compensated, bool):
            raise ValueError(f"Invalid compensated: {compensated!r} (expected True or False)")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        check_hyperparameters(defaults)  # the book's optimizers' one check
        super().__init__(params, defaults)
        self.compensated = compensated

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One step for every parameter with a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
                    state["compensation"] = torch.zeros_like(param)
                state["step"] += 1
                kahan_adamw_step_(
                    param,
                    param.grad,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    state["compensation"],
                    state["step"],
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    compensated=self.compensated,
                )
        return loss
