"""What every optimizer in :mod:`trainfast.optim` shares: hyperparameter checks and gathering.

A negative learning rate or a ``beta`` of 1 does not crash an optimizer: it silently trains
badly. So, as ``torch.optim`` does, we refuse such values at construction, with a message that
names the value (``ValueError: Invalid learning rate: -1.0``). Unlike ``torch.optim``, we also
check every parameter group as it is added, since a group's settings override the constructor's.

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

__all__ = ["CheckedOptimizer", "check_hyperparameters"]


def _check_non_negative(label: str, value: float) -> None:
    if not value >= 0.0:  # written this way round so that NaN fails too
        raise ValueError(f"Invalid {label}: {value}")


def check_hyperparameters(settings: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the first invalid value among the known keys of ``settings``.

    ``settings`` is an optimizer's defaults or one parameter group; keys it lacks are skipped, so
    one function serves every optimizer. A learning rate still ``required`` is skipped here (the
    group check reports it). Nesterov's rule (momentum > 0, no dampening) applies where the
    settings have a ``dampening`` key, i.e. to SGD.
    """
    lr = settings.get("lr", 0.0)
    if lr is not required:
        _check_non_negative("learning rate", lr)
    for key, label in [
        ("momentum", "momentum value"),
        ("weight_decay", "weight_decay value"),
        ("eps", "epsilon value"),
        ("alpha", "alpha value"),
    ]:
        if key in settings:
            _check_non_negative(label, settings[key])
    if "betas" in settings:
        betas = settings["betas"]
        if len(betas) != 2:
            raise ValueError(f"Invalid betas: {betas} (expected two values)")
        for index, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
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
