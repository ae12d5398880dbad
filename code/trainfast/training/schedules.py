"""Learning-rate warmup and decay as one pure function of the step.

Warmup ramps the learning rate up linearly from almost zero, which protects the first steps,
when Adam's second-moment estimates are still poor and the weights are far from anywhere
sensible (Goyal et al., 2017, https://arxiv.org/abs/1706.02677). After warmup the rate stays
constant or decays, linearly or along half a cosine (Loshchilov and Hutter, 2017,
https://arxiv.org/abs/1608.03983), to zero at the last step.
"""

from __future__ import annotations

import math

__all__ = ["lr_multiplier"]


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
    if total_steps < 1:
        raise ValueError(f"Invalid total_steps: {total_steps} (expected >= 1)")
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
