r"""RMSprop: divide each gradient by a running root mean square of its recent values.

Hinton's lecture 6e (2012) proposed it; torch's ``RMSprop`` adds centring (Graves, 2013),
momentum and weight decay. For smoothing constant :math:`\alpha`:

.. math::

    g_t &= \nabla f(\theta_{t-1}) + \lambda \theta_{t-1} \\
    v_t &= \alpha v_{t-1} + (1 - \alpha) g_t^2 \\
    \bar g_t &= \alpha \bar g_{t-1} + (1 - \alpha) g_t \quad \text{(centred only)} \\
    d_t &= g_t / (\sqrt{v_t - \bar g_t^2} + \epsilon) \quad (\bar g_t = 0 \text{ if not centred}) \\
    \theta_t &= \theta_{t-1} - \gamma \, (b_t = \mu b_{t-1} + d_t \text{ with momentum, else } d_t)

Note :math:`\epsilon` is added outside the square root (Adam does the same, outside
:math:`\sqrt{\hat v_t}`), and there is no bias correction: :math:`v_0 = 0`, so the first
steps divide by a small :math:`\sqrt{v_t}` and are large. Adam adds the bias correction (and
momentum on the gradient itself); where :math:`\epsilon` sits it leaves as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT, required

from trainfast.optim._foreach import group_by_device_and_dtype
from trainfast.optim._validate import CheckedOptimizer, check_hyperparameters

__all__ = [
    "init_rmsprop_state",
    "multi_tensor_rmsprop",
    "RMSprop",
    "rmsprop",
    "single_tensor_rmsprop",
]


def rmsprop(
    params: list[Tensor],
    grads: list[Tensor],
    square_avgs: list[Tensor],
    grad_avgs: list[Tensor],
    momentum_buffer_list: list[Tensor],
    state_steps: list[Tensor],
    *,
    lr: float,
    alpha: float,
    eps: float,
    weight_decay: float,
    momentum: float,
    centered: bool,
    maximize: bool,
    foreach: bool = False,
) -> None:
    """One RMSprop step on ``params`` in place, updating the state lists in place.

    ``grad_avgs`` is used only if ``centered`` and ``momentum_buffer_list`` only if
    ``momentum > 0`` (pass empty lists otherwise); ``state_steps`` are scalar tensors counting
    steps, kept for ``state_dict`` compatibility with ``torch.optim.RMSprop``. ``foreach=True``
    runs the same math with ``torch._foreach_*`` ops.
    """
    implementation = multi_tensor_rmsprop if foreach else single_tensor_rmsprop
    implementation(
        params,
        grads,
        square_avgs,
        grad_avgs,
        momentum_buffer_list,
        state_steps,
        lr=lr,
        alpha=alpha,
        eps=eps,
        weight_decay=weight_decay,
        momentum=momentum,
        centered=centered,
        maximize=maximize,
    )


def single_tensor_rmsprop(
    params: list[Tensor],
    grads: list[Tensor],
    square_avgs: list[Tensor],
    grad_avgs: list[Tensor],
    momentum_buffer_list: list[Tensor],
    state_steps: list[Tensor],
    *,
    lr: float,
    alpha: float,
    eps: float,
    weight_decay: float,
    momentum: float,
    centered: bool,
    maximize: bool,
) -> None:
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        square_avg = square_avgs[i]
        state_steps[i] += 1
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)  # g_t + λ θ_{t-1}
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)  # v_t = α v + (1-α) g²
        if centered:  # subtract the squared mean: divide by a running standard deviation
            grad_avg = grad_avgs[i]
            grad_avg.lerp_(grad, 1 - alpha)  # ḡ_t = α ḡ + (1-α) g
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()  # √(v_t - ḡ_t²)
        else:
            avg = square_avg.sqrt()  # √v_t
        avg = avg.add_(eps)
        if momentum > 0:
            buf = momentum_buffer_list[i]
            buf.mul_(momentum).addcdiv_(grad, avg)  # b_t = μ b + g / (√v + ε)
            param.add_(buf, alpha=-lr)
        else:
            param.addcdiv_(grad, avg, value=-lr)  # θ_t = θ - γ g / (√v + ε)


def multi_tensor_rmsprop(
    params: list[Tensor],
    grads: list[Tensor],
    square_avgs: list[Tensor],
    grad_avgs: list[Tensor],
    momentum_buffer_list: list[Tensor],
    state_steps: list[Tensor],
    *,
    lr: float,
    alpha: float,
    eps: float,
    weight_decay: float,
    momentum: float,
    centered: bool,
    maximize: bool,
) -> None:
    if len(params) == 0:
        return
    buckets = group_by_device_and_dtype(
        params, grads, square_avgs, grad_avgs, momentum_buffer_list, state_steps
    )
    for lists, _ in buckets:
        device_params, device_grads, device_square_avgs, device_grad_avgs, device_bufs, steps = (
            cast(list[Tensor], tensors) for tensors in lists
        )
        if maximize:
            device_grads = torch._foreach_neg(device_grads)
        # steps live on the CPU; adding a CPU tensor (not the number 1) avoids wrapping 1 afresh
        # for every tensor (the trick torch.optim uses)
        torch._foreach_add_(steps, torch.tensor(1.0), alpha=1.0)
        if weight_decay != 0:
            if maximize:  # the negated grads are our own copies: update them in place
                torch._foreach_add_(device_grads, device_params, alpha=weight_decay)
            else:
                device_grads = torch._foreach_add(device_grads, device_params, alpha=weight_decay)
        torch._foreach_mul_(device_square_avgs, alpha)
        torch._foreach_addcmul_(device_square_avgs, device_grads, device_grads, value=1 - alpha)
        if centered:
            torch._foreach_lerp_(device_grad_avgs, device_grads, 1 - alpha)
            avg = torch._foreach_addcmul(
                device_square_avgs, device_grad_avgs, device_grad_avgs, value=-1
            )
            torch._foreach_sqrt_(avg)
        else:
            avg = torch._foreach_sqrt(device_square_avgs)
        torch._foreach_add_(avg, eps)
        if momentum > 0:
            torch._foreach_mul_(device_bufs, momentum)
            torch._foreach_addcdiv_(device_bufs, device_grads, avg)
            torch._foreach_add_(device_params, device_bufs, alpha=-lr)
        else:
            torch._foreach_addcdiv_(device_params, device_grads, avg, value=-lr)


def init_rmsprop_state(
    state: dict[str, Any], param: Tensor, *, momentum: bool, centered: bool
) -> None:
    """Create RMSprop's state for ``param`` in ``state`` (once: before its first step).

    The step count is a scalar on the CPU (read as a number, not a kernel), as in
    ``torch.optim.RMSprop``; the averages have the parameter's shape, dtype, device and layout.
    """
    state["step"] = torch.tensor(0.0)
    state["square_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)  # v_0
    if momentum:
        state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    if centered:
        state["grad_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)  # ḡ_0


class RMSprop(CheckedOptimizer):
    """RMSprop: ``torch.optim.RMSprop``'s algorithm, written out in :func:`rmsprop`.

    Why: per-parameter step sizes from one running average (one copy of the weights, two with
    momentum, three centred). It predates Adam and is still used in reinforcement learning; for
    new work Adam/AdamW, which add bias correction and momentum on the gradient, are the usual
    choice.

    The arguments are torch's, with three differences in the defaults and the order. ``lr``
    has no default (torch's is ``1e-2``): give it here or in every parameter group.
    ``foreach`` defaults to ``False``, the readable loop (torch's ``None`` picks foreach on
    CUDA); ``True`` selects the ``torch._foreach_*`` implementation. ``foreach`` and
    ``maximize`` are keyword-only, so a positional call cannot land on a different argument
    than in torch, whose signature has ``capturable`` in that place; torch's ``capturable`` and
    ``differentiable`` switches are left out. ``alpha=0.99``, ``eps=1e-8`` and the zeros are
    torch's defaults.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = required,  # type: ignore[assignment]  # torch's "must be given" sentinel
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        *,
        foreach: bool = False,
        maximize: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "alpha": alpha,
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "centered": centered,
            "foreach": foreach,
            "maximize": maximize,
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
            params, grads, states = self.gather_group(
                group,
                partial(
                    init_rmsprop_state, momentum=group["momentum"] > 0, centered=group["centered"]
                ),
            )
            square_avgs = [state["square_avg"] for state in states]
            grad_avgs = [state["grad_avg"] for state in states] if group["centered"] else []
            momentum_buffer_list = (
                [state["momentum_buffer"] for state in states] if group["momentum"] > 0 else []
            )
            state_steps = [state["step"] for state in states]

            rmsprop(
                params,
                grads,
                square_avgs,
                grad_avgs,
                momentum_buffer_list,
                state_steps,
                lr=group["lr"],
                alpha=group["alpha"],
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                momentum=group["momentum"],
                centered=group["centered"],
                maximize=group["maximize"],
                foreach=group["foreach"],
            )
        return loss
