r"""Adam and AdamW: momentum on the gradient, divided by a running root mean square.

Kingma & Ba (2015) for Adam, Loshchilov & Hutter (2019) for AdamW's decoupled weight decay,
Reddi et al. (2018) for amsgrad. With :math:`t` counting steps from 1:

.. math::

    \theta_{t-1} &\leftarrow (1 - \gamma\lambda)\,\theta_{t-1} \quad \text{(AdamW; Adam adds }
        \lambda\theta_{t-1} \text{ to } g_t \text{ instead)} \\
    m_t &= \beta_1 m_{t-1} + (1 - \beta_1) g_t \qquad
    v_t = \beta_2 v_{t-1} + (1 - \beta_2) g_t^2 \\
    \theta_t &= \theta_{t-1} - \frac{\gamma}{1 - \beta_1^t} \cdot
        \frac{m_t}{\sqrt{v_t} / \sqrt{1 - \beta_2^t} + \epsilon}

The two bias corrections undo the zero start of :math:`m` and :math:`v`; written this way (the
way ``torch.optim.Adam`` computes them) they cost two scalars per tensor, not two extra passes
over the weights. In the names of the code: ``exp_avg`` is :math:`m_t`, ``exp_avg_sq`` is
:math:`v_t`, ``max_exp_avg_sq`` is amsgrad's running maximum of :math:`v_t`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT, required

from trainfast.optim._foreach import group_by_device_and_dtype
from trainfast.optim._validate import CheckedOptimizer, check_hyperparameters

__all__ = [
    "Adam",
    "adam",
    "AdamW",
    "init_adam_state",
    "multi_tensor_adam",
    "single_tensor_adam",
]


def adam(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    max_exp_avg_sqs: list[Tensor],
    state_steps: list[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    amsgrad: bool,
    maximize: bool,
    decoupled_weight_decay: bool,
    foreach: bool = False,
) -> None:
    """One Adam (or, with ``decoupled_weight_decay=True``, AdamW) step on ``params`` in place.

    The state lists are updated in place; ``max_exp_avg_sqs`` is used only with ``amsgrad``
    (pass an empty list otherwise) and ``state_steps`` are scalar step-count tensors, as in
    ``torch.optim.Adam``. ``foreach=True`` runs the same math with ``torch._foreach_*`` ops.
    """
    implementation = multi_tensor_adam if foreach else single_tensor_adam
    implementation(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=weight_decay,
        amsgrad=amsgrad,
        maximize=maximize,
        decoupled_weight_decay=decoupled_weight_decay,
    )


def single_tensor_adam(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    max_exp_avg_sqs: list[Tensor],
    state_steps: list[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    amsgrad: bool,
    maximize: bool,
    decoupled_weight_decay: bool,
) -> None:
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        exp_avg, exp_avg_sq = exp_avgs[i], exp_avg_sqs[i]
        state_steps[i] += 1
        if weight_decay != 0:
            if decoupled_weight_decay:  # AdamW: shrink the weights, leave the gradient alone
                param.mul_(1 - lr * weight_decay)
            else:  # Adam: L2 penalty, which then gets divided by √v like the gradient
                grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)  # m_t = β1 m + (1-β1) g
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v_t = β2 v + (1-β2) g²

        t = state_steps[i].item()
        bias_correction1 = 1 - beta1**t
        bias_correction2 = 1 - beta2**t
        step_size = lr / bias_correction1
        if amsgrad:  # never let the denominator shrink: use the largest v seen so far
            torch.maximum(max_exp_avg_sqs[i], exp_avg_sq, out=max_exp_avg_sqs[i])
            exp_avg_sq = max_exp_avg_sqs[i]
        denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)  # √v̂_t + ε
        param.addcdiv_(exp_avg, denom, value=-step_size)  # θ_t = θ - γ m̂_t / (√v̂_t + ε)


def multi_tensor_adam(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    max_exp_avg_sqs: list[Tensor],
    state_steps: list[Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    amsgrad: bool,
    maximize: bool,
    decoupled_weight_decay: bool,
) -> None:
    if len(params) == 0:
        return
    buckets = group_by_device_and_dtype(
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps
    )
    for lists, _ in buckets:
        device_params, device_grads, device_exp_avgs, device_exp_avg_sqs, device_max, steps = (
            cast(list[Tensor], tensors) for tensors in lists
        )
        if maximize:
            device_grads = torch._foreach_neg(device_grads)
        # steps live on the CPU; adding a CPU tensor (not the number 1) avoids wrapping 1 afresh
        # for every tensor (the trick torch.optim uses)
        torch._foreach_add_(steps, torch.tensor(1.0), alpha=1.0)
        if weight_decay != 0:
            if decoupled_weight_decay:
                torch._foreach_mul_(device_params, 1 - lr * weight_decay)
            elif maximize:  # the negated grads are our own copies: update them in place
                torch._foreach_add_(device_grads, device_params, alpha=weight_decay)
            else:
                device_grads = torch._foreach_add(device_grads, device_params, alpha=weight_decay)
        torch._foreach_lerp_(device_exp_avgs, device_grads, 1 - beta1)
        torch._foreach_mul_(device_exp_avg_sqs, beta2)
        torch._foreach_addcmul_(device_exp_avg_sqs, device_grads, device_grads, value=1 - beta2)
        del device_grads  # a copy when maximizing or decaying: free it before the next one

        # one scalar per tensor, computed in Python from the step counts
        bias_corrections1 = [1 - beta1 ** step.item() for step in steps]
        bias_corrections2 = [1 - beta2 ** step.item() for step in steps]
        step_sizes = [-lr / bc for bc in bias_corrections1]  # negative: addcdiv_ adds
        if amsgrad:
            torch._foreach_maximum_(device_max, device_exp_avg_sqs)
            denom = torch._foreach_sqrt(device_max)
        else:
            denom = torch._foreach_sqrt(device_exp_avg_sqs)
        torch._foreach_div_(denom, [math.sqrt(bc) for bc in bias_corrections2])
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(device_params, device_exp_avgs, denom, step_sizes)


def init_adam_state(state: dict[str, Any], param: Tensor, amsgrad: bool) -> None:
    """Create Adam's state for ``param`` in ``state`` (once: before its first step).

    The step count is a scalar tensor on the CPU, where ``torch.optim.Adam`` keeps it too: the
    bias corrections read it as a Python number without waiting for the GPU. The moments have
    the parameter's shape, dtype, device and memory layout.
    """
    state["step"] = torch.tensor(0.0)
    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)  # m_0
    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)  # v_0
    if amsgrad:
        state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)


class Adam(CheckedOptimizer):
    """Adam: ``torch.optim.Adam``'s algorithm, arguments and defaults, written out in
    :func:`adam`.

    Why: per-parameter step sizes with momentum and bias correction; robust defaults make it the
    first thing to try. Its state is two copies of the weights (8 bytes per float32 parameter,
    12 with amsgrad), which is what ZeRO later shards. With ``weight_decay``, prefer
    :class:`AdamW`: Adam's L2 penalty is divided by :math:`\\sqrt{v}` and so decays parameters
    with large gradients less.

    ``lr`` has no default: give it here or in every parameter group. ``foreach=True`` selects
    the ``torch._foreach_*`` implementation. torch's ``fused``, ``capturable`` and
    ``differentiable`` switches, and tensor-valued ``lr``/``betas``, are left out.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = required,  # type: ignore[assignment]  # torch's "must be given" sentinel
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        foreach: bool = False,
        maximize: bool = False,
        decoupled_weight_decay: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "foreach": foreach,
            "maximize": maximize,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        check_hyperparameters(defaults)
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # state dicts saved by torch.optim.Adam before torch 2.6 lack this key
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("decoupled_weight_decay", False)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Take one step for every parameter that has a gradient; return ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            params, grads, states = self.gather_group(
                group, partial(init_adam_state, amsgrad=group["amsgrad"])
            )
            exp_avgs = [state["exp_avg"] for state in states]
            exp_avg_sqs = [state["exp_avg_sq"] for state in states]
            max_exp_avg_sqs = (
                [state["max_exp_avg_sq"] for state in states] if group["amsgrad"] else []
            )
            state_steps = [state["step"] for state in states]

            beta1, beta2 = group["betas"]
            adam(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                max_exp_avg_sqs,
                state_steps,
                lr=group["lr"],
                beta1=beta1,
                beta2=beta2,
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                amsgrad=group["amsgrad"],
                maximize=group["maximize"],
                decoupled_weight_decay=group["decoupled_weight_decay"],
                foreach=group["foreach"],
            )
        return loss


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay, as ``torch.optim.AdamW`` (default
    ``weight_decay=1e-2``).

    Why: the decay shrinks every weight by the same factor :math:`1 - \\gamma\\lambda` per step,
    independent of its gradient history, which is what "weight decay" means for SGD and what
    Adam's L2 penalty fails to do. The default optimizer for transformers. For models whose
    hidden layers are large matrices, :class:`~trainfast.optim.Muon` is worth comparing.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = required,  # type: ignore[assignment]  # torch's "must be given" sentinel
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool = False,
    ) -> None:
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            decoupled_weight_decay=True,
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # whatever the saved state says, AdamW decouples
            group["decoupled_weight_decay"] = True
