"""Dynamic loss scaling, written out: the algorithm behind ``torch.amp.GradScaler``.

float16 has 5 exponent bits: nothing below ``2^-24`` survives (smaller values flush to zero)
and nothing above 65504 (larger ones become infinity). Gradients of a loss averaged over many
elements are often far smaller than 2^-24 (the chapter measures a histogram). Micikevicius et
al. (2018, "Mixed Precision Training") multiply the loss by a factor ``S`` before backward, so
every gradient is ``S`` times larger and lands inside float16's range, and divide the float32
gradients by ``S`` before the optimizer step. *Dynamic* scaling picks ``S`` by trial:

* if any gradient came out infinite or NaN, ``S`` was too large: skip this optimizer step and
  multiply ``S`` by ``backoff_factor`` (0.5);
* after ``growth_interval`` (2000) consecutive steps without one, multiply ``S`` by
  ``growth_factor`` (2), to keep the smallest gradients as far from underflow as possible.

A *constant* scale can be chosen from gradient statistics instead (NVIDIA's mixed-precision
training guide): :func:`constant_loss_scale`. :func:`updated_scale` is the dynamic rule as a pure
function, :func:`unscale_grads_` the division and
inf/NaN check; :class:`GradScaler` keeps the state and has the constructor and methods of
``torch.amp.GradScaler``, whose trajectories it matches exactly (the tests check the scale,
skipped steps and final parameters against torch's). bfloat16 has float32's 8 exponent bits,
so bfloat16 training needs no scaler.

Differences from torch's: the scale and the found-inf flags live in Python numbers rather than
device tensors. :meth:`GradScaler.scale` reads nothing from the device (it multiplies by a
Python float) and :meth:`~GradScaler.update` reads only those Python flags;
:meth:`~GradScaler.unscale_` (which :meth:`~GradScaler.step` calls if you did not) reads the
found-inf flag back to the host, one synchronisation per optimizer, where torch's leaves it on
the device until ``step`` reads it. Fused optimizers that unscale inside their kernel
(``_step_supports_amp_scaling``) are unscaled by us first, like any other optimizer; sparse
gradients are not supported.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from trainfast.device import parse_device
from trainfast.validation import check_flag, check_int, check_number

_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _skips(scale: Any) -> str:
    """Why a scale torch's GradScaler would take (one that is inf in float32) is refused."""
    if isinstance(scale, float) and scale > _FLOAT32_MAX:
        return "torch.amp.GradScaler would accept it, but an inf scale skips every step, silently"
    return ""


__all__ = ["GradScaler", "constant_loss_scale", "unscale_grads_", "updated_scale"]


def constant_loss_scale(grad_abs_max: float, *, fmt_max: float = 65504.0, margin: int = 0) -> float:
    """The largest power of two ``S`` with ``grad_abs_max * S * 2**margin <= fmt_max``.

    NVIDIA's mixed-precision training guide ("Choosing a scaling factor") picks a constant loss
    scale from gradient statistics: a value whose product with the largest gradient magnitude
    stays below float16's largest value, 65504; Micikevicius et al. (2018) give the same rule.
    Within that bound larger is better, since a scale too small leaves the smallest gradients
    below float16's smallest subnormal, where they flush to zero. A power of two multiplies
    exactly, so scaling and unscaling add no rounding. ``margin`` leaves ``2**margin`` of
    headroom for later steps whose gradients are larger than the measured ones (our parameter,
    named as in Transformer Engine's ``DelayedScaling``; the guide names none). ``fmt_max`` is
    the target format's largest finite value. The scale must fit float32 (``2**-126`` to
    ``2**127``), where loss scalers keep it.

    When not to use it: the bound holds only for the gradients it was measured on. A later step
    with a larger gradient overflows at a constant scale; dynamic scaling (:class:`GradScaler`)
    detects that, skips the step and halves the scale, which is why it is the default.
    """
    check_number("grad_abs_max", grad_abs_max, above=0.0)
    check_number("fmt_max", fmt_max, above=0.0)
    check_int("margin", margin, minimum=0)
    bound = fmt_max / 2.0**margin  # exact: a division by a power of two
    # floor(log2(bound / grad_abs_max)) from the exponents alone (no division to round or
    # overflow), then at most one step each way to the exact power
    exponent = math.frexp(bound)[1] - math.frexp(grad_abs_max)[1]
    while math.ldexp(grad_abs_max, exponent) > bound:
        exponent -= 1
    while math.ldexp(grad_abs_max, exponent + 1) <= bound:
        exponent += 1
    if not -126 <= exponent <= 127:  # float32's normal powers of two
        raise ValueError(
            f"Invalid grad_abs_max: {grad_abs_max!r} (expected one whose scale fits float32: "
            f"it needs 2**{exponent}, outside 2**-126 to 2**127)"
        )
    return math.ldexp(1.0, exponent)


def _float32(value: float) -> float:
    """``value`` rounded to the nearest float32, as torch stores its scale."""
    return torch.tensor(value, dtype=torch.float64).float().item()


def _check_rule(
    scale: float, tracker: int, found_inf: bool, growth: float, backoff: float, interval: int
) -> None:
    """:func:`updated_scale`'s arguments, each named if wrong (a string flag would be truthy)."""
    check_number("scale", scale, above=0.0, maximum=_FLOAT32_MAX)
    check_int("growth_tracker", tracker, minimum=0)
    check_flag("found_inf", found_inf)
    check_number("growth_factor", growth, above=1.0)
    check_number("backoff_factor", backoff, above=0.0, below=1.0)
    check_int("growth_interval", interval, minimum=1)


def updated_scale(
    scale: float,
    growth_tracker: int,
    found_inf: bool,
    *,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> tuple[float, int]:
    """One step of the dynamic-scaling rule: the new ``(scale, growth_tracker)``.

    ``growth_tracker`` counts consecutive steps without inf/NaN. Products are
    taken in float64 and rounded to float32, as ``torch._amp_update_scale_``
    does; a scale that would grow to infinity stays where it is.
    """

    _check_rule(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)
    if found_inf:
        return _float32(scale * backoff_factor), 0
    if growth_tracker + 1 < growth_interval:
        return scale, growth_tracker + 1
    grown = _float32(scale * growth_factor)
    return (grown if grown != float("inf") else scale), 0


def unscale_grads_(grads: Iterable[Tensor], inv_scale: float) -> bool:
    """Multiply each gradient by ``inv_scale`` in place; True if any had inf/NaN.

    Like torch's ``_amp_foreach_non_finite_check_and_unscale_``, it unscales
    them all even when one is non-finite (that step is skipped anyway) and
    reads the flag once, at the end.
    """
    found_inf = None
    for grad in grads:
        bad = ~torch.isfinite(grad).all()
        found_inf = bad if found_inf is None else found_inf | bad.to(found_inf.device)
        grad.mul_(inv_scale)
    return bool(found_inf) if found_inf is not None else False


class _Stage(enum.Enum):
    READY = 0  # nothing done to this optimizer since the last update()
    UNSCALED = 1  # unscale_() ran
    STEPPED = 2  # step() ran


class GradScaler:
    """Dynamic loss scaling with the interface of ``torch.amp.GradScaler``.

    Use it exactly like torch's::

        scaler = GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)                # optional: only to look at true gradients,
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # e.g. to clip them
        scaler.step(optimizer)                    # skipped if a gradient is inf/NaN
        scaler.update()

    The parameters (and so their gradients) must be float32: float16 gradients raise
    ``ValueError``, as in torch. ``enabled=False`` makes every method a pass-through.
    """

    def __init__(
        self,
        device: str = "cuda",
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        check_number(
            "init_scale", init_scale, above=0.0, maximum=_FLOAT32_MAX, note=_skips(init_scale)
        )
        check_number("growth_factor", growth_factor, above=1.0)
        check_number("backoff_factor", backoff_factor, above=0.0, below=1.0)
        check_int("growth_interval", growth_interval, minimum=1)
        check_flag("enabled", enabled)
        device = parse_device(
            device, note="torch.amp.GradScaler would accept it, and stay enabled"
        ).type
        self._device = device
        self._enabled = enabled
        if enabled and device == "cuda" and not torch.cuda.is_available():
            warnings.warn(
                "GradScaler is enabled, but CUDA is not available. Disabling.", stacklevel=2
            )
            self._enabled = False
        self._scale = _float32(init_scale)
        self._growth_tracker = 0
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._stages: dict[int, _Stage] = {}
        self._found_inf: dict[int, bool] = {}  # per optimizer, since the last update()

    def scale(self, outputs: Tensor | Iterable[Tensor]) -> Any:
        """``outputs`` (a tensor, or nested lists/tuples of them) multiplied by the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale  # a Python float: no host-to-device copy
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(value) for value in outputs)
        if isinstance(outputs, Iterable):
            return map(self.scale, outputs)
        raise ValueError(f"outputs must be a Tensor or an iterable of Tensors, got {type(outputs)}")

    def unscale_(self, optimizer: Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place, and note any inf/NaN.

        Call it at most once per optimizer between updates, and before :meth:`step`.
        """
        if not self._enabled:
            return
        stage = self._stages.get(id(optimizer), _Stage.READY)
        if stage is _Stage.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()."
            )
        if stage is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        grads = []
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.dtype == torch.float16:
                    raise ValueError(
                        "Attempting to unscale FP16 gradients: keep float32 (master) parameters "
                        "and let autocast produce the float16 copies"
                    )
                if param.grad.is_sparse:
                    raise ValueError("Sparse gradients are not supported by this GradScaler")
                grads.append(param.grad)
        inv_scale = _float32(1.0 / self._scale)
        with torch.no_grad():
            self._found_inf[id(optimizer)] = unscale_grads_(grads, inv_scale)
        self._stages[id(optimizer)] = _Stage.UNSCALED

    def step(self, optimizer: Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (if not done yet) and call ``optimizer.step()`` unless a gradient was inf/NaN.

        Returns what ``optimizer.step`` returned, or None when the step was skipped.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        stage = self._stages.get(id(optimizer), _Stage.READY)
        if stage is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if stage is _Stage.READY:
            self.unscale_(optimizer)
        result = None
        if not self._found_inf[id(optimizer)]:
            result = optimizer.step(*args, **kwargs)
        self._stages[id(optimizer)] = _Stage.STEPPED
        return result

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Adjust the scale by :func:`updated_scale` (or set it to ``new_scale``); start a new step.

        An inf/NaN in any optimizer stepped since the last update counts as found.
        """
        if not self._enabled:
            return
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise ValueError("new_scale must be a float or a 1-element tensor without grad")
                new_scale = float(new_scale.item())
            check_number(
                "new_scale", new_scale, above=0.0, maximum=_FLOAT32_MAX, note=_skips(new_scale)
            )
            self._scale = _float32(new_scale)
        else:
            if not self._found_inf:
                raise RuntimeError(
                    "No inf checks were recorded prior to update(): call step() first."
                )
            self._scale, self._growth_tracker = updated_scale(
                self._scale,
                self._growth_tracker,
                any(self._found_inf.values()),
                growth_factor=self._growth_factor,
                backoff_factor=self._backoff_factor,
                growth_interval=self._growth_interval,
            )
        self._stages.clear()
        self._found_inf.clear()

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """The same keys as torch's: scale, growth/backoff factors, interval, growth tracker."""
        if not self._enabled:
            return {}
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` (ours or torch's) returned."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved "
                "from a disabled instance of GradScaler."
            )
        self._scale = _float32(float(state_dict["scale"]))
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])
