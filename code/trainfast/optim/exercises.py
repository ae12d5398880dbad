"""Checks for the optimizers chapter's exercises: your step function against the package's.

Each check runs the reader's function and the reference (:func:`~trainfast.optim.sgd.sgd`,
:func:`~trainfast.optim.adam.adam`) side by side on random tensors over several steps and
settings, prints one line per case, and raises ``AssertionError`` naming the first case that
differs. Tolerances are float32 rounding: an equivalent formula written in another order
passes, a missing term does not.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from trainfast.checks import Case, report
from trainfast.optim.adam import adam
from trainfast.optim.groups import NO_DECAY_MODULES
from trainfast.optim.sgd import sgd

__all__ = ["check_adam_step", "check_decay_groups", "check_momentum_step"]

MomentumStep = Callable[[Tensor, Tensor, Tensor, float, float, float], None]
AdamStep = Callable[[Tensor, Tensor, Tensor, Tensor, int, float, float, float, float], None]

_RTOL, _ATOL = 1e-5, 1e-6


def _difference(name: str, ours: Tensor, reference: Tensor) -> str | None:
    if not torch.allclose(ours, reference, rtol=_RTOL, atol=_ATOL):
        return f"{name} differs by up to {(ours - reference).abs().max().item():.2e}"
    return None


def check_momentum_step(step: MomentumStep, *, steps: int = 5, seed: int = 0) -> None:
    """Check ``step(param, grad, buffer, lr, momentum, dampening)``, SGD with momentum.

    ``step`` must update ``param`` and ``buffer`` in place. The check takes the first step
    itself (the buffer starts as a copy of the first gradient, as in ``torch.optim.SGD``) and
    calls ``step`` from the second step on.
    """
    results = []
    for lr, momentum, dampening in [(0.1, 0.9, 0.0), (0.01, 0.5, 0.1), (0.5, 0.99, 0.5)]:
        case = f"lr={lr}, momentum={momentum}, dampening={dampening}, {steps} steps"
        generator = torch.Generator().manual_seed(seed)
        param = torch.randn(4, 3, generator=generator)
        reference = param.clone()
        buffer: Tensor | None = None
        reference_buffers: list[Tensor | None] = [None]
        problem = None
        for _ in range(steps):
            grad = torch.randn(4, 3, generator=generator)
            if buffer is None:
                buffer = grad.clone()  # b_1 = g_1; the step below then applies it
                param.add_(buffer, alpha=-lr)
            else:
                step(param, grad.clone(), buffer, lr, momentum, dampening)
            sgd(
                [reference],
                [grad],
                reference_buffers,
                lr=lr,
                weight_decay=0.0,
                momentum=momentum,
                dampening=dampening,
                nesterov=False,
                maximize=False,
            )
            problem = _difference("param", param, reference) or _difference(
                "buffer",
                buffer,
                reference_buffers[0],  # type: ignore[arg-type]
            )
            if problem:
                break
        results.append((case, problem))
    report(results)


def check_adam_step(step: AdamStep, *, steps: int = 5, seed: int = 0) -> None:
    """Check ``step(param, grad, exp_avg, exp_avg_sq, t, lr, beta1, beta2, eps)``, Adam at step t.

    ``t`` counts from 1; ``step`` must update ``param``, ``exp_avg`` and ``exp_avg_sq`` in place.
    """
    results = []
    for lr, beta1, beta2, eps in [(1e-3, 0.9, 0.999, 1e-8), (0.1, 0.5, 0.9, 1e-3)]:
        case = f"lr={lr}, betas=({beta1}, {beta2}), eps={eps}, {steps} steps"
        generator = torch.Generator().manual_seed(seed)
        param = torch.randn(5, generator=generator)
        reference = param.clone()
        exp_avg, exp_avg_sq = torch.zeros(5), torch.zeros(5)
        ref_avg, ref_avg_sq, ref_step = torch.zeros(5), torch.zeros(5), torch.tensor(0.0)
        problem = None
        for t in range(1, steps + 1):
            grad = torch.randn(5, generator=generator)
            step(param, grad.clone(), exp_avg, exp_avg_sq, t, lr, beta1, beta2, eps)
            adam(
                [reference],
                [grad],
                [ref_avg],
                [ref_avg_sq],
                [],
                [ref_step],
                lr=lr,
                beta1=beta1,
                beta2=beta2,
                eps=eps,
                weight_decay=0.0,
                amsgrad=False,
                maximize=False,
                decoupled_weight_decay=False,
            )
            problem = (
                _difference(f"exp_avg at t={t}", exp_avg, ref_avg)
                or _difference(f"exp_avg_sq at t={t}", exp_avg_sq, ref_avg_sq)
                or _difference(f"param at t={t}", param, reference)
            )
            if problem:
                break
        results.append((case, problem))
    report(results)


def check_decay_groups(
    optimizer: torch.optim.Optimizer, model: nn.Module, weight_decay: float
) -> None:
    """Check that ``optimizer`` decays exactly the weight matrices of ``model``.

    Every parameter must appear in exactly one group; weight matrices (2-D or more, outside
    normalisation and embedding modules) must have ``weight_decay``, everything else 0.
    """
    decay_of = {}
    results: list[Case] = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) in decay_of:
                results.append(("every parameter in one group", "a parameter is in two groups"))
            decay_of[id(param)] = group["weight_decay"]
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            is_matrix = param.ndim >= 2 and not isinstance(module, NO_DECAY_MODULES)
            expected = weight_decay if is_matrix else 0.0
            if id(param) not in decay_of:
                results.append((full, "missing from the optimizer"))
            elif decay_of[id(param)] != expected:
                results.append((full, f"weight_decay={decay_of[id(param)]}, expected {expected}"))
            else:
                results.append((f"{full} {tuple(param.shape)}: weight_decay={expected}", None))
    report(results)
