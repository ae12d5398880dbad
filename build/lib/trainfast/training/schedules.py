"""Learning-rate warmup and decay as pure functions of the step.

:func:`lr_multiplier` is the trainer's (a multiplier of each group's peak rate);
:func:`cosine_with_warmup` and :func:`wsd` are the two schedules LLM training uses, in
Stanford CS336's convention (they return the learning rate itself, and warmup starts from 0);
:func:`as_lambda` makes either a ``LambdaLR`` multiplier.

Warmup ramps the learning rate up linearly from almost zero, which protects the first steps,
when Adam's second-moment estimates are still poor and the weights are far from anywhere
sensible (Goyal et al., 2017, https://arxiv.org/abs/1706.02677). After warmup the rate stays
constant or decays, linearly or along half a cosine (Loshchilov and Hutter, 2017,
https://arxiv.org/abs/1608.03983), to zero at the last step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from trainfast.validation import check_int, check_number

__all__ = ["as_lambda", "batch_size_ramp", "cosine_with_warmup", "lr_multiplier", "wsd"]


def lr_multiplier(
    step: int, *, total_steps: int, warmup_steps: int = 0, schedule: str = "constant"
) -> float:
    """The factor by which the peak learning rate is multiplied at optimizer step ``step``.

    ``step`` counts from 0 (before the first update). During warmup the factor is
    ``(step + 1) / (warmup_steps + 1)``, so the first update already moves the weights; after it,
    ``schedule`` is ``"constant"`` (1), ``"linear"`` (from 1 down to 0 at ``total_steps``) or
    ``"cosine"`` (``0.5 * (1 + cos(pi * progress))``). Use it with
    ``torch.optim.lr_scheduler.LambdaLR``, which multiplies each parameter group's own rate.
    """
    check_int("step", step, minimum=0)
    check_int("total_steps", total_steps, minimum=1)  # inf and NaN are not step counts
    check_int("warmup_steps", warmup_steps, minimum=0)
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(
            f"Invalid warmup_steps: {warmup_steps} (expected 0 <= warmup < {total_steps})"
        )
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"Unknown schedule: {schedule!r} (expected 'constant', 'linear' or 'cosine')")


def cosine_with_warmup(
    it: int, *, max_lr: float, min_lr: float, warmup_iters: int, cosine_cycle_iters: int
) -> float:
    """The learning rate at iteration ``it`` of linear warmup and cosine decay, as Stanford
    CS336's ``get_lr_cosine_schedule`` defines it.

    * warmup, ``it < warmup_iters``: ``it / warmup_iters * max_lr`` (0 at ``it = 0``);
    * cosine, ``warmup_iters <= it <= cosine_cycle_iters``: from ``max_lr`` down to ``min_lr``,
      ``min_lr + 0.5 * (1 + cos(pi * (it - warmup_iters) / (cosine_cycle_iters -
      warmup_iters))) * (max_lr - min_lr)``;
    * after, ``it > cosine_cycle_iters``: ``min_lr``.

    Note the convention differs from :func:`lr_multiplier`, whose warmup starts above zero so
    that the first update already moves the weights, as nanoGPT's ``get_lr`` does since December
    2024 (its warmup is now ``(it + 1) / (warmup_iters + 1) * max_lr``, before that
    ``it / warmup_iters * max_lr``; its cosine and ``min_lr`` phases are these); both are common.
    """
    _check_rates_and_step(it, max_lr, min_lr)
    check_int("warmup_iters", warmup_iters, minimum=0)
    check_int("cosine_cycle_iters", cosine_cycle_iters, minimum=0)
    if not warmup_iters <= cosine_cycle_iters:
        raise ValueError(
            f"Invalid warmup_iters: {warmup_iters} (expected 0 <= warmup_iters <= "
            f"cosine_cycle_iters = {cosine_cycle_iters})"
        )
    if it < warmup_iters:
        return it / warmup_iters * max_lr
    if it > cosine_cycle_iters:
        return min_lr
    if cosine_cycle_iters == warmup_iters:
        return max_lr
    progress = (it - warmup_iters) / (cosine_cycle_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def _check_rates_and_step(it: int, max_lr: float, min_lr: float) -> None:
    """The step of a schedule counts from 0 (``it=-1`` would give a negative rate), and its
    rates are finite with ``0 <= min_lr <= max_lr`` (``max_lr=inf`` would give inf)."""
    check_int("it", it, minimum=0)
    check_number("max_lr", max_lr, minimum=0.0)
    check_number("min_lr", min_lr, minimum=0.0, maximum=max_lr)


def wsd(
    it: int, *, max_lr: float, min_lr: float, warmup_iters: int, stable_iters: int, decay_iters: int
) -> float:
    """Warmup-stable-decay (WSD): linear warmup as in :func:`cosine_with_warmup`, then
    ``max_lr`` held for ``stable_iters``, then a linear decay to ``min_lr`` over
    ``decay_iters``, then ``min_lr``.

    Because the long stable phase does not depend on the run's length, one run can be branched
    into several decays to measure several training lengths (Hu et al., 2024, MiniCPM,
    https://arxiv.org/abs/2404.06395; Hägele et al., 2024, https://arxiv.org/abs/2405.18392).
    """
    _check_rates_and_step(it, max_lr, min_lr)
    for name, length in (
        ("warmup_iters", warmup_iters),
        ("stable_iters", stable_iters),
        ("decay_iters", decay_iters),
    ):
        check_int(name, length, minimum=0)
    if it < warmup_iters:
        return it / warmup_iters * max_lr
    decay_start = warmup_iters + stable_iters
    if it < decay_start:
        return max_lr
    if it >= decay_start + decay_iters:
        return min_lr
    return max_lr - (it - decay_start) / decay_iters * (max_lr - min_lr)


def as_lambda(schedule: Callable[..., float], **kwargs: Any) -> Callable[[int], float]:
    """``schedule`` (:func:`cosine_with_warmup` or :func:`wsd`) as the multiplier function
    ``torch.optim.lr_scheduler.LambdaLR`` takes: ``schedule(it, **kwargs) / max_lr``.

    Build the optimizer with ``lr=max_lr``; ``LambdaLR(optimizer, as_lambda(wsd, ...))`` then
    sets the learning rate ``schedule(it, ...)`` before step ``it`` (counting from 0). A
    parameter group with another base ``lr`` gets the same shape, scaled to its own peak.
    """
    check_number("max_lr", kwargs.get("max_lr"), above=0.0)
    schedule(0, **kwargs)  # the other arguments are named now, not at LambdaLR's first step
    return functools.partial(_ratio, schedule=schedule, kwargs=kwargs)


def _ratio(it: int, *, schedule: Callable[..., float], kwargs: dict[str, Any]) -> float:
    return schedule(it, **kwargs) / kwargs["max_lr"]


def batch_size_ramp(
    examples_seen: int, *, start: int, end: int, ramp_examples: int, multiple_of: int | None = None
) -> int:
    """A batch-size schedule: linear from ``start`` to ``end`` over the first ``ramp_examples``
    examples, then ``end``; rounded down to a multiple of ``multiple_of`` (default ``start``).

    GPT-3 ramped its batch this way over its first few billion tokens (Brown et al., 2020,
    https://arxiv.org/abs/2005.14165, appendix B): early in training the gradient noise scale
    is small, so small batches waste nothing, and it grows as the loss falls
    (:mod:`trainfast.training.noise_scale`).
    """
    check_int("examples_seen", examples_seen, minimum=0)
    check_int("start", start, minimum=1)
    check_int("end", end, minimum=start)
    check_int("ramp_examples", ramp_examples, minimum=1)
    if multiple_of is not None:
        check_int("multiple_of", multiple_of, minimum=1)
    step = multiple_of or start
    size = start + (end - start) * min(1.0, examples_seen / ramp_examples)
    return max(start, int(size) // step * step)
