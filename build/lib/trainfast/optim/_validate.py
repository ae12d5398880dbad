"""What every optimizer in :mod:`trainfast.optim` shares: hyperparameter checks and gathering.

A negative learning rate or a ``beta`` of 1 does not crash an optimizer: it silently trains
badly. So, as ``torch.optim`` does, we refuse such values at construction, with a message that
names the value (``ValueError: Invalid learning rate: -1.0``). Unlike ``torch.optim``, we also
check every parameter group as it is added, since a group's settings override the constructor's,
and refuse values torch accepts but cannot train with (``lr=inf``, ``momentum=1.5``), saying so.

:meth:`CheckedOptimizer.gather_group` is the other shared piece, torch's ``_init_group``
pattern: collect a group's parameters that have a gradient, refuse sparse gradients with one
message, and create each parameter's state lazily before its first step. Each optimizer's
``step`` is then "gather, then call the functional update", and the optimizer files differ only
in their math.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.optimizer import required

from trainfast.validation import check_flag, check_int, check_number

__all__ = ["CheckedOptimizer", "check_hyperparameters"]


#: key -> (label in messages, exclusive upper bound or None, why a value torch accepts is refused)
_LIMITS: dict[str, tuple[str, float | None, str]] = {
    "lr": ("learning rate", None, "an infinite learning rate turns the weights into inf or NaN"),
    "momentum": (
        "momentum value",
        1.0,
        "with momentum >= 1 old gradients never fade and the steps grow without bound",
    ),
    "weight_decay": (
        "weight_decay value",
        None,
        "an infinite decay turns the weights into inf or NaN",
    ),
    "eps": ("epsilon value", None, "an infinite epsilon makes every update 0"),
    "alpha": (
        "alpha value",
        1.0,
        "with alpha >= 1 the average stops tracking the squared gradients",
    ),
}
_FLAGS = ("nesterov", "maximize", "amsgrad", "centered", "decoupled_weight_decay", "use_muon")


def _torch_note(value: Any, why: str) -> str:
    """Where torch.optim's own check (``0 <= value``) would pass, say so and why we refuse."""
    accepted = _as_number(value) is not None and value >= 0
    return f"torch.optim would accept it, but {why}" if accepted else ""


def _as_number(value: Any) -> float | None:
    try:
        return check_number("value", value, allow_inf=True)
    except ValueError:
        return None


def check_hyperparameters(settings: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first invalid value among the known keys of ``settings``.

    ``settings`` is an optimizer's defaults or one parameter group; keys it lacks are skipped, so
    one function serves every optimizer. A learning rate still ``required`` is skipped here (the
    group check reports it). Every number must be finite (``lr=inf`` passes torch's own check and
    makes the weights inf), momentum and RMSprop's ``alpha`` below 1, and every switch a
    ``bool``. Nesterov's rule (momentum > 0, no dampening) applies where the settings have a
    ``dampening`` key, i.e. to SGD.
    """
    for key, (label, below, why) in _LIMITS.items():
        if key not in settings or settings[key] is required:
            continue
        value = settings[key]
        check_number(label, value, minimum=0.0, below=below, note=_torch_note(value, why))
    if "dampening" in settings:
        check_number("dampening value", settings["dampening"], minimum=0.0, maximum=1.0)
    if "ns_steps" in settings:
        check_int("ns_steps", settings["ns_steps"], minimum=0)
    for key in _FLAGS:
        if key in settings:
            check_flag(key, settings[key])
    if settings.get("foreach") is not None:
        check_flag("foreach", settings["foreach"])
    if "betas" in settings:
        betas = settings["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"Invalid betas: {betas!r} (expected two values)")
        for index, beta in enumerate(betas):
            check_number(f"beta parameter at index {index}", beta, minimum=0.0, below=1.0)
    if settings.get("nesterov") and "dampening" in settings:
        momentum, dampening = settings["momentum"], settings["dampening"]
        if momentum <= 0 or dampening != 0:
            raise ValueError(
                "Nesterov momentum requires a momentum and zero dampening "
                f"(got momentum={momentum}, dampening={dampening})"
            )


class CheckedOptimizer(Optimizer):
    """A ``torch.optim.Optimizer`` that checks each parameter group's settings as it is added.

    The base class fills a group's missing settings from ``defaults`` (so a group overrides the
    constructor, which overrides the defaults); afterwards we check the filled group, and refuse
    complex parameters. A learning rate given neither to the constructor nor to the group is an
    error that says so. A rejected group is not added.
    """

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self.defaults.get("lr") is required and "lr" not in param_group:
            raise ValueError(
                f"No learning rate: pass lr=... to {type(self).__name__} or give every parameter "
                f"group an 'lr' (group {len(self.param_groups)} has none)"
            )
        super().add_param_group(param_group)
        try:
            check_hyperparameters(self.param_groups[-1])
            for p in self.param_groups[-1]["params"]:
                if p.is_complex():  # g * g would not be |g|²: refuse rather than be wrong
                    raise ValueError(
                        f"Complex parameters are not supported (got dtype {p.dtype}); "
                        "use torch.optim, which views them as real"
                    )
        except ValueError:
            self.param_groups.pop()  # leave the optimizer as it was
            raise

    def gather_group(
        self,
        group: dict[str, Any],
        init_state: Callable[[dict[str, Any], Tensor], None] | None = None,
    ) -> tuple[list[Tensor], list[Tensor], list[dict[str, Any]]]:
        """The parameters of ``group`` that have a gradient, their gradients and their states.

        A parameter without a gradient is skipped (it takes no step). A sparse gradient raises
        ``ValueError``: every optimizer here is written for dense tensors. ``init_state(state,
        param)`` fills a parameter's empty state dict before its first step (lazily, as
        ``torch.optim`` does, so the state has the parameter's device and dtype). Without
        ``init_state`` the states are only read: a parameter with none gets an empty dict that
        is not stored, so ``state_dict()`` stays as torch's (plain SGD keeps no state at all).
        """
        params: list[Tensor] = []
        grads: list[Tensor] = []
        states: list[dict[str, Any]] = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError(
                    f"{type(self).__name__} does not support sparse gradients (got one for a "
                    f"parameter of shape {tuple(p.shape)}); use torch.optim.SparseAdam or a "
                    "dense gradient"
                )
            if init_state is None:  # read the state, never create it (SGD may keep none)
                state = self.state.get(p, {})
            else:
                state = self.state[p]
                if len(state) == 0:
                    init_state(state, p)
            params.append(p)
            grads.append(p.grad)
            states.append(state)
        return params, grads, states
