r"""Stochastic gradient descent with momentum, Nesterov momentum and weight decay.

The update, for learning rate :math:`\gamma`, momentum :math:`\mu`, dampening :math:`\tau` and
weight decay :math:`\lambda` (torch's ``SGD`` documents the same algorithm):

.. math::

    g_t &= \nabla f(\theta_{t-1}) + \lambda \theta_{t-1} \\
    b_t &= \mu b_{t-1} + (1 - \tau) g_t \qquad (b_1 = g_1) \\
    \theta_t &= \theta_{t-1} - \gamma \, (g_t + \mu b_t \text{ if Nesterov, else } b_t)

:func:`sgd` is the math, in two interchangeable implementations; :class:`SGD` keeps the momentum
buffers between steps. The results match ``torch.optim.SGD`` to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT, required

from trainfast.optim._foreach import group_by_device_and_dtype
from trainfast.optim._validate import CheckedOptimizer, check_hyperparameters

__all__ = ["multi_tensor_sgd", "SGD", "sgd", "single_tensor_sgd"]


def sgd(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffer_list: list[Tensor | None],
    *,
    lr: float,
    weight_decay: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    maximize: bool,
    foreach: bool = False,
) -> None:
    """One SGD step on ``params`` in place.

    ``momentum_buffer_list`` holds each parameter's buffer, ``None`` before its first step: the
    step fills those entries in (the buffer starts as the first gradient) and the caller keeps
    them. ``foreach=True`` runs the same math with ``torch._foreach_*`` ops, on a GPU one kernel
    per list instead of one per tensor; the results are the same.
    """
    implementation = multi_tensor_sgd if foreach else single_tensor_sgd
    implementation(
        params,
        grads,
        momentum_buffer_list,
        lr=lr,
        weight_decay=weight_decay,
        momentum=momentum,
        dampening=dampening,
        nesterov=nesterov,
        maximize=maximize,
    )


def single_tensor_sgd(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffer_list: list[Tensor | None],
    *,
    lr: float,
    weight_decay: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    maximize: bool,
) -> None:
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]  # g_t, never modified in place
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)  # g_t + λ θ_{t-1}: an L2 penalty's gradient
        if momentum != 0:
            buf = momentum_buffer_list[i]
            if buf is None:  # first step: b_1 = g_1
                buf = grad.detach().clone()
                momentum_buffer_list[i] = buf
            else:  # b_t = μ b_{t-1} + (1 - τ) g_t
                buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            # Nesterov looks ahead: step along g_t + μ b_t instead of b_t
            grad = grad.add(buf, alpha=momentum) if nesterov else buf
        param.add_(grad, alpha=-lr)  # θ_t = θ_{t-1} - γ · direction


def multi_tensor_sgd(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffer_list: list[Tensor | None],
    *,
    lr: float,
    weight_decay: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    maximize: bool,
) -> None:
    if len(params) == 0:
        return
    buckets = group_by_device_and_dtype(params, grads, momentum_buffer_list)
    for (device_params_, device_grads_, device_bufs), indices in buckets:
        device_params = cast(list[Tensor], device_params_)
        device_grads = cast(list[Tensor], device_grads_)
        if maximize:
            device_grads = torch._foreach_neg(device_grads)
        if weight_decay != 0:
            if maximize:  # the negated grads are our own copies: update them in place
                torch._foreach_add_(device_grads, device_params, alpha=weight_decay)
            else:
                device_grads = torch._foreach_add(device_grads, device_params, alpha=weight_decay)
        if momentum != 0:
            if all(buf is not None for buf in device_bufs):
                bufs = cast(list[Tensor], device_bufs)
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, device_grads, alpha=1 - dampening)
            else:  # some parameter takes its first step: its buffer starts as its gradient
                bufs = []
                for j, i in enumerate(indices):
                    buf = device_bufs[j]
                    if buf is None:
                        buf = momentum_buffer_list[i] = device_grads[j].detach().clone()
                    else:
                        buf.mul_(momentum).add_(device_grads[j], alpha=1 - dampening)
                    bufs.append(buf)
            if nesterov:  # out of place: the grads may still be the parameters' .grad
                device_grads = torch._foreach_add(device_grads, bufs, alpha=momentum)
            else:
                device_grads = bufs
        torch._foreach_add_(device_params, device_grads, alpha=-lr)


class SGD(CheckedOptimizer):
    """Stochastic gradient descent, optionally with (Nesterov) momentum: ``torch.optim.SGD``'s
    algorithm, arguments and defaults, written out in :func:`sgd`.

    Why: plain SGD keeps no state (0 bytes per parameter), momentum keeps one buffer (one copy of
    the weights). It remains the default for convolutional nets trained with a tuned schedule;
    for transformers prefer :class:`~trainfast.optim.AdamW`.

    ``lr`` has no default: give it here or in every parameter group. ``foreach=True`` selects
    the ``torch._foreach_*`` implementation (same numbers, fewer kernel launches on a GPU). torch's
    ``fused`` and ``differentiable`` switches are left out; use ``torch.optim.SGD`` for them.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = required,  # type: ignore[assignment]  # torch's "must be given" sentinel
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "foreach": foreach,
        }
        check_hyperparameters(defaults)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Take one step for every parameter that has a gradient; return ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            params, grads, states = self.gather_group(group)  # SGD's state starts empty
            momentum_buffer_list: list[Tensor | None] = (
                [state.get("momentum_buffer") for state in states] if group["momentum"] != 0 else []
            )
            sgd(
                params,
                grads,
                momentum_buffer_list,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                momentum=group["momentum"],
                dampening=group["dampening"],
                nesterov=group["nesterov"],
                maximize=group["maximize"],
                foreach=group["foreach"],
            )

            if group["momentum"] != 0:  # keep the buffers the first step created
                for p, buf in zip(params, momentum_buffer_list, strict=True):
                    self.state[p]["momentum_buffer"] = buf
        return loss
