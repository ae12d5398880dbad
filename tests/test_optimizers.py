"""Tests of trainfast.optim: every optimizer against torch.optim (or, for Muon, against Keller
Jordan's reference), foreach against single-tensor, state dicts, schedulers, input checks, state
memory and the step-time benchmark. Small models and fixed seeds: the whole file runs in seconds.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer
from trainfast.optim import (
    SGD,
    Adam,
    AdamW,
    Muon,
    RMSprop,
    muon_param_groups,
    muon_update,
    state_bytes_per_param,
    state_bytes_table,
    zeropower_via_newtonschulz5,
)
from trainfast.optim import benchmarks as benchmark_module
from trainfast.optim.benchmarks import compare_step_times

# float32 defaults of torch.testing.assert_close, spelled out: "same as torch up to rounding"
TIGHT = {"rtol": 1.3e-6, "atol": 1e-5}
N_STEPS = 30

OptimizerFactory = Callable[..., Optimizer]


# --- helpers -------------------------------------------------------------------------------


def _mlp(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).to(dtype)


def _data(seed: int = 1, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 8, generator=generator, dtype=dtype)  # (batch, in_features)
    y = torch.randn(32, 4, generator=generator, dtype=dtype)  # (batch, out_features)
    return x, y


def _train(
    model: nn.Module, optimizer: Optimizer, n_steps: int, scheduler: Any = None
) -> list[float]:
    x, y = _data(dtype=next(model.parameters()).dtype)
    losses = []
    for _ in range(n_steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x).float(), y.float())  # no bfloat16 mse_loss on CPU < 2.6
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses


def _params(model: nn.Module) -> list[Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _run(factory: Callable[[Any], Optimizer], n_steps: int = N_STEPS, **model_kwargs: Any):
    model = _mlp(**model_kwargs)
    optimizer = factory(model.parameters())
    _train(model, optimizer, n_steps)
    return _params(model), optimizer


def _assert_same_state(ours: Optimizer, theirs: Optimizer) -> None:
    ours_state, theirs_state = ours.state_dict()["state"], theirs.state_dict()["state"]
    assert ours_state.keys() == theirs_state.keys()
    for index in ours_state:
        assert ours_state[index].keys() == theirs_state[index].keys()
        torch.testing.assert_close(ours_state[index], theirs_state[index], **TIGHT)


# --- 1. parity with torch.optim --------------------------------------------------------------

SGD_CASES = [
    {"lr": 0.05},
    {"lr": 0.05, "momentum": 0.9},
    {"lr": 0.05, "momentum": 0.9, "dampening": 0.3},
    {"lr": 0.05, "momentum": 0.9, "nesterov": True},
    {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.05},
    {"lr": 0.05, "weight_decay": 0.05, "maximize": True},
    {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.05, "maximize": True},
]
RMSPROP_CASES = [
    {"lr": 1e-2},
    {"lr": 1e-2, "alpha": 0.9, "eps": 1e-6},
    {"lr": 1e-2, "centered": True},
    {"lr": 1e-2, "momentum": 0.9},
    {"lr": 1e-2, "centered": True, "momentum": 0.9, "weight_decay": 0.05},
    {"lr": 1e-2, "weight_decay": 0.05, "maximize": True},
    {"lr": 1e-2, "centered": True, "momentum": 0.5, "weight_decay": 0.05, "maximize": True},
]
ADAM_CASES = [
    {"lr": 1e-2},
    {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6},
    {"lr": 1e-2, "weight_decay": 0.1},
    {"lr": 1e-2, "amsgrad": True},
    {"lr": 1e-2, "maximize": True},
    {"lr": 1e-2, "betas": (0.5, 0.9), "weight_decay": 0.1, "amsgrad": True, "maximize": True},
]
PARITY_CASES = [
    *[(SGD, torch.optim.SGD, kwargs) for kwargs in SGD_CASES],
    *[(RMSprop, torch.optim.RMSprop, kwargs) for kwargs in RMSPROP_CASES],
    *[(Adam, torch.optim.Adam, kwargs) for kwargs in ADAM_CASES],
    *[(AdamW, torch.optim.AdamW, kwargs) for kwargs in ADAM_CASES],
]


def _case_id(case: tuple[type, type, dict[str, Any]]) -> str:
    ours, _, kwargs = case
    settings = ",".join(f"{k}={v}" for k, v in kwargs.items() if k != "lr") or "defaults"
    return f"{ours.__name__}[{settings}]"


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("case", PARITY_CASES, ids=[_case_id(c) for c in PARITY_CASES])
def test_matches_torch(case: tuple[type, type, dict[str, Any]], foreach: bool) -> None:
    ours, theirs, kwargs = case
    ours_params, ours_optimizer = _run(lambda ps: ours(ps, foreach=foreach, **kwargs))
    torch_params, torch_optimizer = _run(lambda ps: theirs(ps, foreach=foreach, **kwargs))
    assert any((p != q).any() for p, q in zip(ours_params, _params(_mlp()), strict=True))
    torch.testing.assert_close(ours_params, torch_params, **TIGHT)
    _assert_same_state(ours_optimizer, torch_optimizer)


GROUP_CASES = [
    (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
    (RMSprop, torch.optim.RMSprop, {"lr": 1e-2, "momentum": 0.5, "weight_decay": 0.01}),
    (Adam, torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.01}),
    (AdamW, torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.01}),
]


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("case", GROUP_CASES, ids=[c[0].__name__ for c in GROUP_CASES])
def test_param_groups_match_torch(case: tuple[type, type, dict[str, Any]], foreach: bool) -> None:
    ours, theirs, kwargs = case

    def groups(model: nn.Module) -> list[dict[str, Any]]:
        first, _, last = model
        return [
            {"params": first.parameters(), "lr": kwargs["lr"] * 3, "weight_decay": 0.2},
            {"params": [last.weight]},  # constructor settings
            {"params": [last.bias], "weight_decay": 0.0},  # overrides the constructor's
        ]

    results = []
    for cls in (ours, theirs):
        model = _mlp()
        optimizer = cls(groups(model), foreach=foreach, **kwargs)
        _train(model, optimizer, N_STEPS)
        results.append((_params(model), optimizer))
    (ours_params, ours_optimizer), (torch_params, torch_optimizer) = results
    torch.testing.assert_close(ours_params, torch_params, **TIGHT)
    assert [g["lr"] for g in ours_optimizer.param_groups] == [kwargs["lr"] * 3] + [kwargs["lr"]] * 2
    assert [g["weight_decay"] for g in ours_optimizer.param_groups] == [0.2, 0.01, 0.0]


def test_lr_required_from_constructor_or_every_group() -> None:
    model = _mlp()
    first, _, last = model
    optimizer = Adam(
        [{"params": first.parameters(), "lr": 0.1}, {"params": last.parameters(), "lr": 0.2}]
    )
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.2]
    with pytest.raises(ValueError, match=r"No learning rate.*SGD"):
        SGD(model.parameters())
    with pytest.raises(ValueError, match=r"No learning rate.*group 1 has none"):
        RMSprop([{"params": first.parameters(), "lr": 0.1}, {"params": last.parameters()}])


# --- 2. foreach path == single-tensor path ---------------------------------------------------

EVERYTHING_ON: list[tuple[OptimizerFactory, dict[str, Any]]] = [
    (SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (RMSprop, {"lr": 1e-2, "centered": True, "momentum": 0.9, "weight_decay": 0.01}),
    (Adam, {"lr": 1e-2, "amsgrad": True, "weight_decay": 0.01, "maximize": True}),
    (AdamW, {"lr": 1e-2, "amsgrad": True}),
]


class _MixedPrecisionMLP(nn.Module):
    """The MLP with its first layer in float32 and its last in float64."""

    def __init__(self) -> None:
        super().__init__()
        first, _, last = _mlp()
        self.first, self.last = first, last.double()

    def forward(self, x: Tensor) -> Tensor:
        return self.last(torch.tanh(self.first(x)).double()).float()


@pytest.mark.parametrize("case", EVERYTHING_ON, ids=[c[0].__name__ for c in EVERYTHING_ON])
def test_foreach_equals_single_tensor_with_mixed_dtypes(
    case: tuple[OptimizerFactory, dict[str, Any]],
) -> None:
    """Two dtypes in one group: the foreach path buckets them and must still agree."""
    cls, kwargs = case
    results = []
    for foreach in (False, True):
        model = _MixedPrecisionMLP()
        optimizer = cls(model.parameters(), foreach=foreach, **kwargs)
        _train(model, optimizer, 10)
        results.append(_params(model))
    torch.testing.assert_close(results[0], results[1], **TIGHT)


#: every optimizer of the package, with each option that touches the gradient on its way in
GRADIENT_CASES = [
    (SGD, {"lr": 0.1}),
    (SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    (SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.5, "maximize": True}),
    (RMSprop, {"lr": 0.01, "weight_decay": 0.1}),
    (RMSprop, {"lr": 0.01, "centered": True, "momentum": 0.9, "maximize": True}),
    (Adam, {"lr": 0.1, "weight_decay": 0.1, "amsgrad": True}),
    (Adam, {"lr": 0.1, "maximize": True}),
    (AdamW, {"lr": 0.1, "weight_decay": 0.1}),
    (AdamW, {"lr": 0.1, "weight_decay": 0.1, "amsgrad": True, "maximize": True}),
    (Muon, {"lr": 0.1, "weight_decay": 0.1}),
    (Muon, {"lr": 0.1, "nesterov": False}),
]


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize(
    "cls,kwargs", GRADIENT_CASES, ids=[f"{c.__name__}-{sorted(k)}" for c, k in GRADIENT_CASES]
)
def test_step_leaves_gradients_alone(cls: type, kwargs: dict[str, Any], foreach: bool) -> None:
    """No optimizer of ours writes into .grad, whatever its options (torch's own foreach SGD
    with Nesterov does, which the chapter's page on Adam shows live)."""
    weight = nn.Parameter(torch.randn(6, 4))
    optimizer = cls([weight], foreach=foreach, **kwargs)
    for _ in range(2):
        weight.grad = torch.randn(6, 4)
        grad = weight.grad.clone()
        optimizer.step()
        torch.testing.assert_close(weight.grad, grad, rtol=0, atol=0)


# --- 3. state_dict round trip and LR schedulers ----------------------------------------------

ROUND_TRIP: list[tuple[OptimizerFactory, dict[str, Any]]] = [
    (SGD, {"lr": 0.05, "momentum": 0.9}),
    (RMSprop, {"lr": 1e-2, "centered": True, "momentum": 0.9}),
    (Adam, {"lr": 1e-2, "amsgrad": True}),
    (AdamW, {"lr": 1e-2}),
]


@pytest.mark.parametrize("case", ROUND_TRIP, ids=[c[0].__name__ for c in ROUND_TRIP])
def test_state_dict_round_trip(case: tuple[OptimizerFactory, dict[str, Any]]) -> None:
    cls, kwargs = case
    model = _mlp()
    optimizer = cls(model.parameters(), **kwargs)
    _train(model, optimizer, 20)
    uninterrupted = _params(model)

    model = _mlp()
    optimizer = cls(model.parameters(), **kwargs)
    _train(model, optimizer, 10)
    saved_model, saved_optimizer = copy.deepcopy(model.state_dict()), optimizer.state_dict()
    resumed_model = _mlp(seed=99)  # different weights, overwritten by the checkpoint
    resumed_model.load_state_dict(saved_model)
    resumed = cls(resumed_model.parameters(), **kwargs)
    resumed.load_state_dict(copy.deepcopy(saved_optimizer))
    _train(resumed_model, resumed, 10)
    torch.testing.assert_close(_params(resumed_model), uninterrupted, **TIGHT)


def test_loads_torch_adam_state_dict() -> None:
    """A checkpoint written by torch.optim.Adam continues identically in ours."""
    model = _mlp()
    torch_optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    _train(model, torch_optimizer, 10)
    checkpoint = copy.deepcopy((model.state_dict(), torch_optimizer.state_dict()))
    _train(model, torch_optimizer, 10)

    ours_model = _mlp(seed=99)
    ours_model.load_state_dict(checkpoint[0])
    ours = Adam(ours_model.parameters(), lr=1e-2, amsgrad=True)
    ours.load_state_dict(checkpoint[1])
    _train(ours_model, ours, 10)
    torch.testing.assert_close(_params(ours_model), _params(model), **TIGHT)


@pytest.mark.parametrize("ours,theirs", [(SGD, torch.optim.SGD), (AdamW, torch.optim.AdamW)])
def test_lr_scheduler_drives_ours_like_torch(ours: type, theirs: type) -> None:
    results = []
    for cls in (ours, theirs):
        model = _mlp()
        optimizer = cls(model.parameters(), lr=0.05)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
        _train(model, optimizer, 17, scheduler)
        results.append((_params(model), scheduler.get_last_lr()))
    assert results[0][1] == results[1][1] == [0.05 * 0.5**3]
    torch.testing.assert_close(results[0][0], results[1][0], **TIGHT)


# --- 4. bad input ----------------------------------------------------------------------------


def _weights() -> list[Tensor]:
    return [nn.Parameter(torch.randn(3, 2))]


BAD_INPUT = [
    (lambda: SGD(_weights(), lr=-1.0), r"Invalid learning rate: -1\.0"),
    (lambda: SGD(_weights(), lr=float("nan")), r"Invalid learning rate: nan"),
    (lambda: SGD(_weights(), lr=0.1, momentum=-0.5), r"Invalid momentum value: -0\.5"),
    (lambda: SGD(_weights(), lr=0.1, weight_decay=-0.1), r"Invalid weight_decay value: -0\.1"),
    (
        lambda: SGD(_weights(), lr=0.1, nesterov=True),
        r"Nesterov momentum requires a momentum and zero dampening \(got momentum=0, dampening=0\)",
    ),
    (
        lambda: SGD(_weights(), lr=0.1, momentum=0.9, dampening=0.1, nesterov=True),
        r"dampening \(got momentum=0\.9, dampening=0\.1\)",
    ),
    (lambda: RMSprop(_weights(), lr=0.1, alpha=-0.5), r"Invalid alpha value: -0\.5"),
    (lambda: RMSprop(_weights(), lr=0.1, eps=-1e-8), r"Invalid epsilon value: -1e-08"),
    (lambda: RMSprop(_weights(), lr=0.1, momentum=-1), r"Invalid momentum value: -1"),
    (lambda: Adam(_weights(), lr=-0.01), r"Invalid learning rate: -0\.01"),
    (
        lambda: Adam(_weights(), lr=0.1, betas=(1.0, 0.999)),
        r"Invalid beta parameter at index 0: 1\.0",
    ),
    (
        lambda: Adam(_weights(), lr=0.1, betas=(0.9, -0.1)),
        r"Invalid beta parameter at index 1: -0\.1",
    ),
    (lambda: AdamW(_weights(), lr=0.1, weight_decay=-1e-2), r"Invalid weight_decay value: -0\.01"),
    (lambda: AdamW(_weights(), lr=0.1, eps=-1.0), r"Invalid epsilon value: -1\.0"),
    # a parameter group's own setting is checked too, even when the constructor's is fine
    (lambda: SGD([{"params": _weights(), "lr": -0.1}], lr=0.1), r"Invalid learning rate: -0\.1"),
    (
        lambda: Adam([{"params": _weights(), "betas": (0.9, 1.0)}], lr=0.1),
        r"Invalid beta parameter at index 1: 1\.0",
    ),
    (
        lambda: Adam([nn.Parameter(torch.randn(3, dtype=torch.complex64))], lr=0.1),
        r"Complex parameters are not supported \(got dtype torch\.complex64\)",
    ),
    (lambda: Muon(_weights(), lr=-0.02), r"Invalid learning rate: -0\.02"),
    (lambda: Muon(_weights(), momentum=-0.9), r"Invalid momentum value: -0\.9"),
    (lambda: Muon(_weights(), ns_steps=-1), r"Invalid ns_steps: -1"),
    (
        lambda: Muon(
            [{"params": [nn.Parameter(torch.randn(3))], "use_muon": False}], adamw_eps=-1.0
        ),
        r"Invalid epsilon value: -1\.0",
    ),
    (
        lambda: Muon([{"params": [nn.Parameter(torch.randn(3))], "use_muon": True}]),
        r"2-D weight matrices only, got a parameter of shape \(3,\)",
    ),
]


@pytest.mark.parametrize("build,message", BAD_INPUT, ids=[m for _, m in BAD_INPUT])
def test_bad_input_raises_naming_the_value(build: Callable[[], Optimizer], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    "build",
    [
        lambda p: SGD([p], lr=0.1, momentum=0.9),
        lambda p: RMSprop([p], lr=0.1),
        lambda p: Adam([p], lr=0.1),
        lambda p: AdamW([p], lr=0.1),
        lambda p: Muon([{"params": [p], "use_muon": True}]),
        lambda p: Muon([{"params": [p], "use_muon": False}]),
    ],
    ids=["SGD", "RMSprop", "Adam", "AdamW", "Muon", "Muon-AdamW"],
)
def test_sparse_gradient_refused_with_one_message(build: Callable[[Tensor], Optimizer]) -> None:
    weight = nn.Parameter(torch.randn(3, 2))
    optimizer = build(weight)
    weight.grad = torch.randn(3, 2).to_sparse()
    name = type(optimizer).__name__
    with pytest.raises(
        ValueError,
        match=rf"^{name} does not support sparse gradients \(got one "
        r"for a parameter of shape \(3, 2\)\)",
    ):
        optimizer.step()
    assert len(optimizer.state) == 0  # refused before any state was created


def test_muon_copy_keeps_its_group_defaults() -> None:
    optimizer = Muon(_weights(), lr=0.03, adamw_lr=1e-3)
    clone = copy.deepcopy(optimizer)
    clone.add_param_group({"params": [nn.Parameter(torch.randn(3))], "use_muon": False})
    clone.add_param_group({"params": [nn.Parameter(torch.randn(3, 3))]})
    assert [g["lr"] for g in clone.param_groups] == [0.03, 1e-3, 0.03]
    with pytest.raises(ValueError, match=r"Invalid learning rate: -0\.1"):
        Muon(_weights(), adamw_lr=-0.1)  # checked even though no group uses it


def test_rejected_group_leaves_optimizer_unchanged() -> None:
    optimizer = Adam(_weights(), lr=0.1)
    with pytest.raises(ValueError, match=r"Invalid epsilon value: -1\.0"):
        optimizer.add_param_group({"params": _weights(), "eps": -1.0})
    muon = Muon(_weights())
    with pytest.raises(ValueError, match=r"shape \(4, 2, 3\)"):
        muon.add_param_group({"params": [nn.Parameter(torch.randn(4, 2, 3))]})
    assert len(optimizer.param_groups) == len(muon.param_groups) == 1


# --- 5. Muon ---------------------------------------------------------------------------------

# Keller Jordan's reference (github.com/KellerJordan/Muon, muon.py: zeropower_via_newtonschulz5,
# muon_update and SingleDeviceMuon.step), transcribed op for op as the oracle for our Muon.


def _reference_newtonschulz5(G: Tensor, steps: int) -> Tensor:
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def _reference_muon_step(
    param: Tensor,
    grad: Tensor,
    buffer: Tensor,
    lr: float,
    weight_decay: float,
    beta: float,
    nesterov: bool,
) -> None:
    grad = grad.clone()  # the reference lerps into the gradient in place
    buffer.lerp_(grad, 1 - beta)
    update = grad.lerp_(buffer, beta) if nesterov else buffer
    update = _reference_newtonschulz5(update, steps=5)
    update *= max(1, grad.size(-2) / grad.size(-1)) ** 0.5
    param.mul_(1 - lr * weight_decay)
    param.add_(update.reshape(param.shape), alpha=-lr)


def _gradient_sequence(shape: tuple[int, int], n: int, seed: int = 3) -> list[Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for _ in range(n)]


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
@pytest.mark.parametrize("nesterov", [True, False], ids=["nesterov", "plain"])
def test_muon_matches_reference(nesterov: bool, foreach: bool) -> None:
    shapes = [(24, 12), (12, 24), (16, 16)]  # tall (transposed, scaled by √2), wide, square
    torch.manual_seed(0)
    start = [torch.randn(s) * 0.1 for s in shapes]
    ours = [nn.Parameter(w.clone()) for w in start]
    reference = [w.clone() for w in start]
    buffers = [torch.zeros_like(w) for w in start]
    optimizer = Muon(
        ours, lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=0.1, foreach=foreach
    )
    sequences = [_gradient_sequence(s, 6, seed=i) for i, s in enumerate(shapes)]
    for step in range(6):
        for p, seq in zip(ours, sequences, strict=True):
            p.grad = seq[step].clone()
        optimizer.step()
        for w, buf, seq in zip(reference, buffers, sequences, strict=True):
            _reference_muon_step(w, seq[step], buf, 0.05, 0.1, 0.9, nesterov)
    torch.testing.assert_close([p.detach() for p in ours], reference, **TIGHT)
    torch.testing.assert_close(
        [optimizer.state[p]["momentum_buffer"] for p in ours], buffers, **TIGHT
    )
    assert max((p.detach() - w).abs().max().item() for p, w in zip(ours, start, strict=True)) > 0.05


def test_muon_update_is_the_reference_update() -> None:
    grad = torch.randn(20, 10)
    ours_buffer = torch.randn(20, 10)
    reference_buffer = ours_buffer.clone()
    ours = muon_update(grad, ours_buffer, momentum=0.95, nesterov=True, ns_steps=5)
    reference_grad = grad.clone()
    reference_buffer.lerp_(reference_grad, 1 - 0.95)
    expected = _reference_newtonschulz5(reference_grad.lerp_(reference_buffer, 0.95), 5) * 2**0.5
    assert ours.dtype == torch.bfloat16 and ours.shape == (20, 10)
    torch.testing.assert_close(ours.float(), expected.float(), rtol=0, atol=0)
    torch.testing.assert_close(ours_buffer, reference_buffer, rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (48, 48)])
def test_newton_schulz_flops_are_what_torch_counts(shape: tuple[int, int]) -> None:
    """The FLOP model of Newton–Schulz against torch's FlopCounterMode on the iteration itself."""
    from torch.utils.flop_counter import FlopCounterMode
    from trainfast.optim.muon import newton_schulz_flops, zeropower_via_newtonschulz5

    with FlopCounterMode(display=False) as counter:
        zeropower_via_newtonschulz5(torch.randn(shape), steps=5)
    assert counter.get_total_flops() == newton_schulz_flops(*shape, steps=5)
    with pytest.raises(ValueError, match=r"Invalid shape \(0, 4\)"):
        newton_schulz_flops(0, 4)


@pytest.mark.parametrize("shape", [(64, 32), (32, 64), (48, 48)])
def test_newtonschulz_output_is_nearly_orthogonal(shape: tuple[int, int]) -> None:
    # singular values spread over two orders of magnitude (much smaller ones need more steps:
    # each step multiplies a tiny singular value by only a = 3.4445)
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(shape[0], min(shape)))
    v, _ = torch.linalg.qr(torch.randn(shape[1], min(shape)))
    s = torch.logspace(-2, 0, min(shape))
    G = u @ torch.diag(s) @ v.T * 7.0  # (rows, cols), any overall scale
    X = zeropower_via_newtonschulz5(G, steps=5)
    assert X.shape == G.shape and X.dtype == torch.bfloat16
    singular_values = torch.linalg.svdvals(X.float())
    # Keller Jordan: roughly Uniform(0.5, 1.5) rather than exactly 1
    assert singular_values.min() > 0.5 and singular_values.max() < 1.5
    # it keeps the singular vectors: X ≈ U S' Vᵀ with S' ≈ 1
    torch.testing.assert_close(X.float(), u @ v.T, atol=0.2, rtol=0)
    with pytest.raises(ValueError, match=r"2-D matrix, got shape \(2, 3, 4\)"):
        zeropower_via_newtonschulz5(torch.randn(2, 3, 4), steps=5)
    # in float32 (for a machine whose bfloat16 products are slow): the same map, less rounded
    X32 = zeropower_via_newtonschulz5(G, steps=5, dtype=torch.float32)
    assert X32.dtype == torch.float32
    torch.testing.assert_close(X32, X.float(), atol=0.05, rtol=0)
    with pytest.raises(ValueError, match=r"Invalid ns_dtype: torch.int8"):
        zeropower_via_newtonschulz5(G, steps=5, dtype=torch.int8)


def test_muon_in_float32_steps_like_muon_in_bfloat16() -> None:
    def trained(ns_dtype: torch.dtype) -> list[Tensor]:
        model = _split_model()
        optimizer = Muon(muon_param_groups(model), lr=0.02, ns_dtype=ns_dtype)
        for step in range(3):
            torch.manual_seed(step)
            model(torch.randn(4, 8)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    for ours, bf16 in zip(trained(torch.float32), trained(torch.bfloat16), strict=True):
        torch.testing.assert_close(ours, bf16, atol=0.01, rtol=0)
    model = _split_model()
    with pytest.raises(ValueError, match=r"Invalid ns_dtype: torch.float64"):
        Muon(muon_param_groups(model), ns_dtype=torch.float64)
    # a state dict saved before ns_dtype existed loads with the original's format
    optimizer = Muon(muon_param_groups(model), ns_dtype=torch.float32)
    saved = optimizer.state_dict()
    del saved["param_groups"][0]["ns_dtype"]
    optimizer.load_state_dict(saved)
    assert optimizer.param_groups[0]["ns_dtype"] == torch.bfloat16
    groups = muon_param_groups(model)
    groups[0]["ns_dtype"] = "fp32"
    with pytest.raises(ValueError, match=r"Invalid ns_dtype: 'fp32'"):
        Muon(groups)


def _split_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, 16),
        nn.LayerNorm(16),
        nn.Tanh(),
        nn.Linear(16, 16),
        nn.Tanh(),
        nn.Linear(16, 4),
    )


def test_muon_param_groups_splits_hidden_weights_from_the_rest() -> None:
    model = _split_model()
    muon_group, adamw_group = muon_param_groups(model)
    assert muon_group["use_muon"] and not adamw_group["use_muon"]
    assert [id(p) for p in muon_group["params"]] == [id(model[0].weight), id(model[3].weight)]
    expected_adamw = [
        model[0].bias,
        model[1].weight,
        model[1].bias,
        model[3].bias,
        model[5].weight,
        model[5].bias,
    ]
    assert [id(p) for p in adamw_group["params"]] == [id(p) for p in expected_adamw]
    # an MLP's input layer named: it goes to AdamW, as Keller Jordan keeps the first layer
    muon_group, adamw_group = muon_param_groups(model, input_layer=model[0])
    assert [id(p) for p in muon_group["params"]] == [id(model[3].weight)]
    assert id(model[0].weight) in {id(p) for p in adamw_group["params"]}

    # an embedding tied to the head, and a head given explicitly
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(8, 20, bias=False)
            self.embed = nn.Embedding(20, 8)
            self.head.weight = self.embed.weight
            self.hidden = nn.Linear(8, 8)

    tied = Tied()
    groups = muon_param_groups(tied, output_layer=tied.head)
    assert [id(p) for p in groups[0]["params"]] == [id(tied.hidden.weight)]
    assert {id(p) for p in groups[1]["params"]} == {id(tied.embed.weight), id(tied.hidden.bias)}
    # without output_layer, the last Linear registered (hidden) would be taken as the head
    assert [g["use_muon"] for g in muon_param_groups(tied)] == [False]


def test_muon_adamw_groups_match_torch_adamw() -> None:
    """Muon's use_muon=False groups are AdamW: same numbers as torch.optim.AdamW."""
    settings = {"betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.1}
    ours_model, torch_model = _mlp(), _mlp()
    ours = Muon(
        [{"params": ours_model.parameters(), "use_muon": False}],
        adamw_lr=1e-2,
        adamw_betas=settings["betas"],
        adamw_eps=settings["eps"],
        adamw_weight_decay=settings["weight_decay"],
    )
    _train(ours_model, ours, N_STEPS)
    _train(torch_model, torch.optim.AdamW(torch_model.parameters(), lr=1e-2, **settings), N_STEPS)
    torch.testing.assert_close(_params(ours_model), _params(torch_model), **TIGHT)


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
def test_muon_whole_model_matches_reference_plus_torch_adamw(foreach: bool) -> None:
    """One Muon over the whole model == reference on hidden weights + torch AdamW on the rest."""
    ours_model, reference_model = _split_model(), _split_model()
    ours = Muon(
        muon_param_groups(ours_model), lr=0.02, weight_decay=0.01, adamw_lr=1e-2, foreach=foreach
    )
    hidden, rest = (g["params"] for g in muon_param_groups(reference_model))
    adamw = torch.optim.AdamW(rest, lr=1e-2, betas=(0.9, 0.95), eps=1e-10, weight_decay=0.0)
    buffers = [torch.zeros_like(p) for p in hidden]
    x, y = _data()
    for _ in range(8):
        for model in (ours_model, reference_model):
            model.zero_grad()
            F.mse_loss(model(x), y).backward()
        ours.step()
        adamw.step()
        with torch.no_grad():
            for p, buf in zip(hidden, buffers, strict=True):
                _reference_muon_step(p, p.grad, buf, 0.02, 0.01, 0.95, nesterov=True)
    torch.testing.assert_close(_params(ours_model), _params(reference_model), **TIGHT)


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
def test_muon_close_to_torch_muon() -> None:
    """torch.optim.Muon with adjust_lr_fn="original" is the same algorithm, rounded differently.

    torch scales the learning rate by sqrt(max(1, rows/cols)) in float32 where the original
    scales the bfloat16 update, and writes the quintic with addmm; in float64 the two agree to
    1e-15, in bfloat16 each step's update differs by a few percent (relative Frobenius norm).
    Momentum buffers see only gradients, so they must agree exactly. The 10% bound is checked to
    be meaningful: torch without Nesterov, or without the scale, misses it by far.
    """

    def relative_step_errors(
        **torch_settings: Any,
    ) -> tuple[list[float], list[tuple[Tensor, Tensor]]]:
        shapes = [(32, 16), (16, 32)]
        torch.manual_seed(0)
        start = [torch.randn(s) * 0.1 for s in shapes]
        ours = [nn.Parameter(w.clone()) for w in start]
        theirs = [nn.Parameter(w.clone()) for w in start]
        ours_optimizer = Muon(ours, lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.1)
        settings = {
            "lr": 0.02,
            "momentum": 0.95,
            "weight_decay": 0.1,
            "nesterov": True,
            "ns_steps": 5,
        }
        torch_optimizer = torch.optim.Muon(theirs, **{**settings, **torch_settings})
        sequences = [_gradient_sequence(s, 5, seed=i) for i, s in enumerate(shapes)]
        errors = []
        for step in range(5):
            before = [
                (p.detach().clone(), q.detach().clone()) for p, q in zip(ours, theirs, strict=True)
            ]
            for p, q, seq in zip(ours, theirs, sequences, strict=True):
                p.grad, q.grad = seq[step].clone(), seq[step].clone()
            ours_optimizer.step()
            torch_optimizer.step()
            for (p0, q0), p, q in zip(before, ours, theirs, strict=True):
                ours_delta, torch_delta = p.detach() - p0, q.detach() - q0
                errors.append(((ours_delta - torch_delta).norm() / torch_delta.norm()).item())
        buffers = [
            (
                ours_optimizer.state[p]["momentum_buffer"],
                torch_optimizer.state[q]["momentum_buffer"],
            )
            for p, q in zip(ours, theirs, strict=True)
        ]
        return errors, buffers

    errors, buffers = relative_step_errors(adjust_lr_fn="original")
    assert max(errors) < 0.10, errors
    for ours_buffer, torch_buffer in buffers:
        torch.testing.assert_close(ours_buffer, torch_buffer, rtol=0, atol=0)
    # (on the first step Nesterov's look-ahead is parallel to the buffer: compare from the second)
    assert min(relative_step_errors(adjust_lr_fn="original", nesterov=False)[0][2:]) > 0.25
    # "spectral_unclamped" scales the wide (16, 32) matrix by sqrt(1/2) instead of 1; torch 2.9 to
    # 2.11's Muon has only "original" and "match_rms_adamw" (the GPU machine's torch is 2.11)
    if not _torch_muon_accepts("spectral_unclamped"):
        pytest.skip(
            f"torch {torch.__version__}'s Muon has no adjust_lr_fn='spectral_unclamped'; "
            "every other case of this test ran and passed"
        )
    assert max(relative_step_errors(adjust_lr_fn="spectral_unclamped")[0]) > 0.25


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
@pytest.mark.parametrize("adjust_lr_fn", ["original", "match_rms_adamw"])
@pytest.mark.parametrize("shape", [(64, 32), (32, 64)])
def test_muon_follows_torch_muon_over_twenty_steps(
    adjust_lr_fn: str, shape: tuple[int, int]
) -> None:
    """Twenty steps with weight decay: our Muon and torch.optim.Muon end within bfloat16
    rounding of each other, under 3% of the distance the weights travelled (1.3-1.5% here); the
    control (our Muon without Nesterov) ends far outside that."""

    def run(ours_settings: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
        torch.manual_seed(0)
        start = torch.randn(shape) * 0.1
        ours, theirs = nn.Parameter(start.clone()), nn.Parameter(start.clone())
        settings = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.1, "adjust_lr_fn": adjust_lr_fn}
        ours_optimizer = Muon([ours], **{**settings, "nesterov": True, **ours_settings})
        torch_optimizer = torch.optim.Muon([theirs], **settings, nesterov=True, ns_steps=5)
        for grad in _gradient_sequence(shape, 20, seed=1):
            ours.grad, theirs.grad = grad.clone(), grad.clone()
            ours_optimizer.step()
            torch_optimizer.step()
        return start, ours.detach(), theirs.detach()

    start, ours, theirs = run({})
    assert (ours - theirs).norm() / (theirs - start).norm() < 0.03
    start, ours, theirs = run({"nesterov": False})
    assert (ours - theirs).norm() / (theirs - start).norm() > 0.1


def _torch_muon_accepts(adjust_lr_fn: str) -> bool:
    """Whether this torch's ``torch.optim.Muon`` knows ``adjust_lr_fn``."""
    try:
        torch.optim.Muon([nn.Parameter(torch.zeros(2, 2))], lr=0.02, adjust_lr_fn=adjust_lr_fn)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("shape", [(32, 16), (16, 32)])
def test_muon_match_rms_adamw_scales_the_update_as_moonlight(shape: tuple[int, int]) -> None:
    """adjust_lr_fn="match_rms_adamw": update RMS about 0.2, and torch's Muon agrees."""
    from trainfast.optim.muon import update_scale

    grad = _gradient_sequence(shape, 1, seed=0)[0]
    deltas = {}
    for fn in ("original", "match_rms_adamw"):
        param = nn.Parameter(torch.zeros(shape))
        param.grad = grad.clone()
        Muon([param], lr=1.0, adjust_lr_fn=fn).step()
        deltas[fn] = -param.detach()
    rows, cols = shape
    assert update_scale(rows, cols, "match_rms_adamw") == pytest.approx(0.2 * max(shape) ** 0.5)
    ratio = deltas["match_rms_adamw"].norm() / deltas["original"].norm()
    expected = update_scale(rows, cols, "match_rms_adamw") / update_scale(rows, cols, "original")
    assert ratio.item() == pytest.approx(expected, rel=1e-2)  # bfloat16 rounding of the scale
    rms = deltas["match_rms_adamw"].pow(2).mean().sqrt().item()
    assert 0.12 < rms < 0.25  # singular values land in about [0.7, 1.2], not exactly 1
    if hasattr(torch.optim, "Muon"):
        theirs = nn.Parameter(torch.zeros(shape))
        theirs.grad = grad.clone()
        torch.optim.Muon([theirs], lr=1.0, adjust_lr_fn="match_rms_adamw").step()
        error = (deltas["match_rms_adamw"] + theirs.detach()).norm() / theirs.detach().norm()
        assert error.item() < 0.10
    with pytest.raises(ValueError, match="'rms'"):
        Muon([nn.Parameter(torch.zeros(shape))], adjust_lr_fn="rms")


def test_muon_state_dict_round_trip_and_scheduler() -> None:
    def build(model: nn.Module) -> tuple[Muon, Any]:
        optimizer = Muon(muon_param_groups(model), lr=0.02, adamw_lr=1e-2, weight_decay=0.01)
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)

    model = _split_model()
    optimizer, scheduler = build(model)
    _train(model, optimizer, 10, scheduler)
    assert [g["lr"] for g in optimizer.param_groups] == [0.02 * 0.5**3, 1e-2 * 0.5**3]
    uninterrupted = _params(model)

    model = _split_model()
    optimizer, scheduler = build(model)
    _train(model, optimizer, 5, scheduler)
    checkpoint = copy.deepcopy((model.state_dict(), optimizer.state_dict(), scheduler.state_dict()))
    resumed_model = _split_model(seed=99)
    resumed_model.load_state_dict(checkpoint[0])
    resumed, resumed_scheduler = build(resumed_model)
    resumed.load_state_dict(checkpoint[1])
    resumed_scheduler.load_state_dict(checkpoint[2])
    _train(resumed_model, resumed, 5, resumed_scheduler)
    torch.testing.assert_close(_params(resumed_model), uninterrupted, **TIGHT)


# --- 6. optimizer state memory ---------------------------------------------------------------


def _stepped(factory: Callable[[Any], Optimizer], dtype: torch.dtype = torch.float32) -> Optimizer:
    model = _mlp(dtype=dtype)
    optimizer = factory(model.parameters())
    _train(model, optimizer, 1)
    return optimizer


N_PARAMS = 8 * 16 + 16 + 16 * 4 + 4  # the MLP's 212 parameters in 4 tensors
STEP_COUNTS = 4 * 4 / N_PARAMS  # one float32 step count per tensor (Adam, RMSprop)


@pytest.mark.parametrize(
    "factory,expected",
    [
        (lambda ps: SGD(ps, lr=0.1), 0.0),
        (lambda ps: SGD(ps, lr=0.1, momentum=0.9), 4.0),
        (lambda ps: RMSprop(ps, lr=0.1), 4.0 + STEP_COUNTS),
        (lambda ps: RMSprop(ps, lr=0.1, centered=True, momentum=0.9), 12.0 + STEP_COUNTS),
        (lambda ps: Adam(ps, lr=0.1), 8.0 + STEP_COUNTS),
        (lambda ps: Adam(ps, lr=0.1, amsgrad=True), 12.0 + STEP_COUNTS),
        (lambda ps: AdamW(ps, lr=0.1), 8.0 + STEP_COUNTS),
        (lambda ps: torch.optim.Adam(ps, lr=0.1), 8.0 + STEP_COUNTS),  # works on torch's too
    ],
    ids=[
        "sgd",
        "sgd-momentum",
        "rmsprop",
        "rmsprop-centered-momentum",
        "adam",
        "adam-amsgrad",
        "adamw",
        "torch-adam",
    ],
)
def test_state_bytes_per_param(factory: Callable[[Any], Optimizer], expected: float) -> None:
    assert state_bytes_per_param(_stepped(factory)) == pytest.approx(expected, rel=1e-12)


def test_state_bytes_follow_the_weights_dtype_and_muon() -> None:
    # bfloat16 weights: bfloat16 moments (2 + 2 bytes), float32 step counts
    adam = _stepped(lambda ps: Adam(ps, lr=0.1), dtype=torch.bfloat16)
    assert state_bytes_per_param(adam) == pytest.approx(4.0 + STEP_COUNTS, rel=1e-12)
    # Muon on matrices: one momentum buffer
    weights = [nn.Parameter(torch.randn(6, 4)), nn.Parameter(torch.randn(4, 4))]
    muon = Muon(weights)
    for w in weights:
        w.grad = torch.randn_like(w)
    assert state_bytes_per_param(muon) == 0.0  # state is created at the first step
    muon.step()
    assert state_bytes_per_param(muon) == 4.0


def test_state_bytes_table() -> None:
    rows = state_bytes_table()
    assert {r["optimizer"] for r in rows} == {"SGD", "RMSprop", "Adam", "AdamW", "Muon"}
    by_config = {(r["optimizer"], r["configuration"]): r for r in rows}
    assert by_config["SGD", "momentum=0"]["state_bytes_per_param"] == 0.0
    assert by_config["SGD", "momentum=0.9"]["state"] == "momentum_buffer"
    assert by_config["Adam", "default"]["copies_of_weights"] == pytest.approx(2.0, abs=0.01)
    assert by_config["Adam", "amsgrad=True"]["state_bytes_per_param"] == pytest.approx(
        12.0, abs=0.01
    )
    assert by_config["Muon", "hidden weights only"]["state_bytes_per_param"] == 4.0
    # whole model: between Muon's one copy and AdamW's two
    assert (
        4.0
        < by_config["Muon", "whole model: hidden weights + AdamW"]["state_bytes_per_param"]
        < 8.0
    )


# --- 7. step-time benchmark ------------------------------------------------------------------

TIME_COLUMNS = ["ours_single_ms", "ours_foreach_ms", "torch_single_ms", "torch_foreach_ms"]


def test_compare_step_times_rows() -> None:
    rows = compare_step_times([(16, 8), (8,), (4, 16)], n_steps=2, n_warmup=1, n_repeats=2)
    assert [r["optimizer"] for r in rows] == ["SGD", "RMSprop", "Adam", "AdamW"]
    for row in rows:
        assert row["tensors"] == 3 and row["parameters"] == 16 * 8 + 8 + 4 * 16
        assert all(row[c] > 0 for c in TIME_COLUMNS)
        assert row["ratio_foreach"] == row["ours_foreach_ms"] / row["torch_foreach_ms"]
        assert row["ratio_single"] == row["ours_single_ms"] / row["torch_single_ms"]
        fused = row["torch_fused_ms"]
        assert (fused is None) == (row["optimizer"] == "RMSprop") and (fused is None or fused > 0)
    with pytest.raises(ValueError, match=r"Unknown optimizers: \['Lion'\]"):
        compare_step_times([(2, 2)], optimizers=["Lion"])


def test_step_time_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmark_module, "transformer_shapes", lambda width, depth: [(8, 8), (8,)])
    record = benchmark_module.step_time_record(torch.device("cpu"), quick=True)
    assert record.name == "optimizer-step-time"
    assert record.environment["device"] == "cpu"
    assert len(record.rows) == 4
    assert all(record.units[c] == "ms" for c in TIME_COLUMNS)
    assert set(TIME_COLUMNS) | {"ratio_foreach", "ratio_single"} <= set(record.columns)


def test_committed_step_time_records_have_the_columns_the_chapter_shows() -> None:
    """The chapter renders the newest record of its device: each one must have a fused time."""
    from trainfast.records import records_for

    records = records_for("optimizer-step-time", None)
    assert records, "no optimizer-step-time record in book/records"
    for record in records:
        assert set(TIME_COLUMNS) | {"torch_fused_ms", "tensors"} <= set(record.columns)
        for row in record.rows:
            fused = row["torch_fused_ms"]
            assert (fused is None) == (row["optimizer"] == "RMSprop"), (record.created, row)


@pytest.mark.parametrize("path", ["foreach", "fused"])
def test_adamw_passes_are_the_ones_torch_dispatches(path: str) -> None:
    """The byte model of a torch AdamW step against the operators torch really runs."""
    from trainfast.optim.benchmarks import (
        ADAMW_PASSES,
        bytes_per_parameter_of_passes,
        count_step_traffic,
    )

    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(shape)) for shape in [(96, 64), (64,), (64, 96)]]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, **{path: True})
    optimizer.step()  # the first step creates the state
    traffic = count_step_traffic(optimizer.step)
    n_params = sum(p.numel() for p in params)
    big = [op for op in traffic if op.read_bytes + op.written_bytes >= n_params]  # not counters
    passes = ADAMW_PASSES[path]
    assert [op.op for op in big] == [p.op for p in passes]
    for op, expected in zip(big, passes, strict=True):
        counters = 4 * len(params)  # the fused kernel also reads the float32 step counters
        assert op.read_bytes - 4 * n_params * expected.reads in (0, counters), op
        assert op.written_bytes == 4 * n_params * expected.writes, op
    total = sum(op.read_bytes + op.written_bytes for op in traffic) / n_params
    assert total == pytest.approx(bytes_per_parameter_of_passes(passes), rel=1e-3)  # + counters
    assert bytes_per_parameter_of_passes(passes) == {"foreach": 84, "fused": 28}[path]


def test_step_traffic_counts_what_an_op_changes_not_what_it_may() -> None:
    from trainfast.optim.benchmarks import count_step_traffic

    a, b = torch.ones(10), torch.ones(10)
    (mul, copy) = count_step_traffic(lambda: (a.mul_(2.0), b.mul(1.0)))
    assert (mul.op, mul.read_bytes, mul.written_bytes) == ("mul_", 40, 40)
    assert (copy.op, copy.read_bytes, copy.written_bytes) == ("mul", 40, 40)  # a new tensor
    (same,) = count_step_traffic(lambda: b.mul_(1.0))  # allowed to write, changes nothing
    assert same.written_bytes == 0


def test_rmsprop_signature_cannot_be_misread_positionally() -> None:
    """torch.optim.RMSprop has ``capturable`` where ours would have ``foreach``: keyword-only."""
    import inspect

    ours = inspect.signature(RMSprop.__init__).parameters
    theirs = inspect.signature(torch.optim.RMSprop.__init__).parameters
    assert ours["foreach"].kind is inspect.Parameter.KEYWORD_ONLY
    assert ours["maximize"].kind is inspect.Parameter.KEYWORD_ONLY
    positional = [n for n, p in ours.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == list(theirs)[: len(positional)]  # the same order as far as ours goes
    for name in ("alpha", "eps", "weight_decay", "momentum", "centered", "maximize"):
        assert ours[name].default == theirs[name].default, name
    params = [nn.Parameter(torch.ones(2))]
    with pytest.raises(TypeError):
        RMSprop(params, 0.01, 0.99, 1e-8, 0, 0, False, True)  # torch's 8th is capturable


# --- chapter checks (listings, execution) below ---


def test_weight_decay_groups_leave_out_biases_norms_and_embeddings() -> None:
    from trainfast.optim.groups import weight_decay_groups

    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    decay, no_decay = weight_decay_groups(model, weight_decay=0.1)
    assert {id(p) for p in decay["params"]} == {id(model[1].weight), id(model[3].weight)}
    assert {id(p) for p in no_decay["params"]} == {
        id(model[0].weight),
        id(model[1].bias),
        id(model[2].weight),
        id(model[2].bias),
        id(model[3].bias),
    }
    optimizer = AdamW(weight_decay_groups(model, 0.1), lr=1e-3)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    with pytest.raises(ValueError, match="-0.5"):
        weight_decay_groups(model, -0.5)


def test_weight_decay_groups_leave_out_rmsnorm_gains_and_prelu_slopes() -> None:
    """Norms the module tuple does not list still keep their gains out of the decay."""
    from trainfast.optim.groups import weight_decay_groups

    model = nn.Sequential(
        nn.Linear(4, 8, bias=False), nn.RMSNorm(8), nn.PReLU(8), nn.Conv1d(8, 8, 3, bias=False)
    )
    decay, no_decay = weight_decay_groups(model, weight_decay=0.1)
    assert {id(p) for p in decay["params"]} == {id(model[0].weight), id(model[3].weight)}
    assert {id(p) for p in no_decay["params"]} == {id(model[1].weight), id(model[2].weight)}
    # the rule is the tensor's rank, not its module: a 1-D parameter of a custom module too
    custom = nn.Module()
    custom.gain = nn.Parameter(torch.ones(5))
    custom.matrix = nn.Parameter(torch.ones(5, 5))
    (decay,), (no_decay,) = (g["params"] for g in weight_decay_groups(custom, 0.1))
    assert decay is custom.matrix and no_decay is custom.gain


def test_layerwise_lr_groups_scale_down_towards_the_input() -> None:
    from trainfast.optim.groups import layerwise_lr_groups

    layers = [nn.Linear(2, 2) for _ in range(3)]
    optimizer = SGD(layerwise_lr_groups(layers, lr=0.1, decay=0.5), lr=1.0)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.025, 0.05, 0.1])
    with pytest.raises(ValueError, match="decay: 0"):
        layerwise_lr_groups(layers, lr=0.1, decay=0)


def test_exercise_checks_pass_a_right_answer_and_catch_a_wrong_one(capsys) -> None:
    from trainfast.optim.exercises import check_adam_step, check_momentum_step

    def momentum_step(param, grad, buffer, lr, momentum, dampening):
        buffer.mul_(momentum).add_(grad, alpha=1 - dampening)
        param.add_(buffer, alpha=-lr)

    def momentum_without_dampening(param, grad, buffer, lr, momentum, dampening):
        buffer.mul_(momentum).add_(grad)
        param.add_(buffer, alpha=-lr)

    def adam_step(param, grad, m, v, t, lr, beta1, beta2, eps, correct=True):
        m.mul_(beta1).add_(grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        m_hat = m / (1 - beta1**t) if correct else m
        v_hat = v / (1 - beta2**t) if correct else v
        param.addcdiv_(m_hat, v_hat.sqrt().add_(eps), value=-lr)

    check_momentum_step(momentum_step)
    check_adam_step(adam_step)
    assert "All 3 cases passed." in capsys.readouterr().out
    with pytest.raises(AssertionError, match="dampening=0.1"):
        check_momentum_step(momentum_without_dampening)
    with pytest.raises(AssertionError, match="param at t=1"):
        check_adam_step(lambda *args: adam_step(*args, correct=False))


def test_decay_groups_check_passes_the_split_and_catches_blanket_decay(capsys) -> None:
    from trainfast.optim.exercises import check_decay_groups
    from trainfast.optim.groups import weight_decay_groups

    block = nn.TransformerEncoderLayer(d_model=16, nhead=2)
    check_decay_groups(AdamW(weight_decay_groups(block, 0.1), lr=1e-3), block, 0.1)
    assert "All 12 cases passed." in capsys.readouterr().out
    with pytest.raises(AssertionError, match="8 of 12 cases failed"):
        check_decay_groups(AdamW(block.parameters(), lr=1e-3, weight_decay=0.1), block, 0.1)
    half = list(block.parameters())[:3]
    with pytest.raises(AssertionError, match="10 of 12 cases failed"):
        check_decay_groups(AdamW(half, lr=1e-3, weight_decay=0.1), block, 0.1)
    assert "missing from the optimizer" in capsys.readouterr().out


def test_chapter_listings_come_from_the_package() -> None:
    import chapters

    assert chapters.listing_problems("optimizers") == []


def _sgd_trajectory(fn, xy, lr, momentum, n_iters, *, keep_start: bool = True):
    point = xy.detach().clone().requires_grad_(True)
    optimizer = torch.optim.SGD([point], lr=lr, momentum=momentum)
    path = [point.detach().clone()] if keep_start else []
    for _ in range(n_iters):
        optimizer.zero_grad()
        fn(point[0], point[1]).backward()
        optimizer.step()
        path.append(point.detach().clone())
    return torch.stack(path)


def test_opt_fn_check_passes_a_right_answer_and_catches_wrong_ones(capsys) -> None:
    from trainfast.optim.exercises import check_opt_fn_with_sgd

    check_opt_fn_with_sgd(_sgd_trajectory)
    assert "All 4 cases passed." in capsys.readouterr().out
    with pytest.raises(AssertionError, match=r"shape \(20, 2\), expected \(21, 2\)"):
        check_opt_fn_with_sgd(lambda *a: _sgd_trajectory(*a, keep_start=False))
    with pytest.raises(AssertionError, match="momentum=0.9"):  # momentum ignored
        check_opt_fn_with_sgd(lambda fn, xy, lr, momentum, n: _sgd_trajectory(fn, xy, lr, 0.0, n))

    def in_place(fn, xy, lr, momentum, n_iters):
        path = _sgd_trajectory(fn, xy, lr, momentum, n_iters)
        xy.copy_(path[-1])
        return path

    with pytest.raises(AssertionError, match="modified in place"):
        check_opt_fn_with_sgd(in_place)


class _Scratch:
    """A from-scratch SGD/RMSprop/Adam with one switchable bug, to test the exercise checks."""

    def __init__(self, params, lr, bug=None, **settings):
        self.params, self.lr, self.bug, self.t = list(params), lr, bug, 0
        self.settings = settings
        self.state = [{} for _ in self.params]

    @torch.no_grad()
    def step(self):
        self.t += 1
        for param, state in zip(self.params, self.state, strict=True):
            self.update(param, param.grad, state, **self.settings)

    def decayed(self, param, grad, weight_decay):
        if self.bug == "aliased grad":  # the review's wrong answer: g = p.grad; g += wd * p
            grad += weight_decay * param
            return grad
        return grad if self.bug == "no decay" else grad + weight_decay * param


class _ScratchSGD(_Scratch):
    def update(self, param, grad, state, momentum=0.0, weight_decay=0.0):
        grad = self.decayed(param, grad, weight_decay)
        if momentum:
            mix = 1 - momentum if self.bug == "averaged buffer" else 1.0
            buffer = state.get("buffer")
            state["buffer"] = grad.clone() if buffer is None else momentum * buffer + mix * grad
            grad = state["buffer"]
        param -= self.lr * grad


class _ScratchRMSprop(_Scratch):
    def update(self, param, grad, state, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0):
        grad = self.decayed(param, grad, weight_decay)
        v = state["v"] = alpha * state.get("v", torch.zeros_like(param)) + (1 - alpha) * grad**2
        denom = (v + eps).sqrt() if self.bug == "eps inside" else v.sqrt() + eps
        update = grad / denom
        if momentum:
            update = state["b"] = momentum * state.get("b", torch.zeros_like(param)) + update
        param -= self.lr * update


class _ScratchAdam(_Scratch):
    def update(self, param, grad, state, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        (beta1, beta2), t = betas, self.t
        grad = self.decayed(param, grad, weight_decay)
        m = state["m"] = beta1 * state.get("m", torch.zeros_like(param)) + (1 - beta1) * grad
        v = state["v"] = beta2 * state.get("v", torch.zeros_like(param)) + (1 - beta2) * grad**2
        if self.bug != "no bias correction":
            m, v = m / (1 - beta1**t), v / (1 - beta2**t)
        param -= self.lr * m / (v.sqrt() + eps)


@pytest.mark.parametrize(
    "check_name,scratch,bug,first_failure",
    [
        ("check_sgd", _ScratchSGD, "no decay", "weight_decay=0.1"),
        ("check_sgd", _ScratchSGD, "averaged buffer", "momentum=0.9"),
        ("check_rmsprop", _ScratchRMSprop, "eps inside", "lr=0.01"),
        ("check_rmsprop", _ScratchRMSprop, "no decay", "weight_decay=0.1"),
        ("check_adam", _ScratchAdam, "no bias correction", "lr=0.01"),
        ("check_adam", _ScratchAdam, "no decay", "weight_decay=0.1"),
        # rewrites the caller's .grad: right updates, so only the .grad check can catch it
        ("check_sgd", _ScratchSGD, "aliased grad", "weight_decay=0.1.*changed 0.weight.grad"),
        ("check_rmsprop", _ScratchRMSprop, "aliased grad", "weight_decay=0.1.*changed"),
        ("check_adam", _ScratchAdam, "aliased grad", "weight_decay=0.1.*changed 0.weight.grad"),
    ],
)
def test_from_scratch_checks_pass_a_right_answer_and_catch_a_bug(
    capsys, check_name: str, scratch: type, bug: str, first_failure: str
) -> None:
    from trainfast.optim import exercises

    check = getattr(exercises, check_name)
    check(scratch)
    assert "All 3 cases passed." in capsys.readouterr().out
    buggy = type(
        scratch.__name__,
        (scratch,),
        {"__init__": lambda self, p, lr, **s: scratch.__init__(self, p, lr, bug=bug, **s)},
    )
    with pytest.raises(AssertionError, match=rf"first: {buggy.__name__}\(.*{first_failure}"):
        check(buggy)


class _ScratchGroups:
    def __init__(self, params, bug=None, **defaults):
        self.groups = []
        for group in params:
            merged = {"momentum": 0.0, "weight_decay": 0.0, **defaults, **group}
            if bug == "defaults win":
                merged = {"momentum": 0.0, "weight_decay": 0.0, **group, **defaults}
            if "lr" not in merged and bug != "no lr check":
                raise ValueError("no lr")
            merged["params"] = list(merged["params"])
            self.groups.append(merged)
        self.optimizers = [
            _ScratchSGD(
                g["params"],
                g.get("lr", 0.1),
                momentum=g["momentum"],
                weight_decay=g["weight_decay"],
                bug=bug if bug == "aliased grad" else None,
            )
            for g in self.groups
        ]

    def step(self):
        for optimizer in self.optimizers:
            optimizer.step()


def test_param_groups_check_passes_a_right_answer_and_catches_wrong_ones(capsys) -> None:
    from trainfast.optim.exercises import check_sgd_param_groups

    check_sgd_param_groups(_ScratchGroups)
    check_sgd_param_groups(SGD)  # ours; torch.optim.SGD falls back to lr=1e-3 instead of raising
    assert capsys.readouterr().out.count("All 3 cases passed.") == 2
    with pytest.raises(AssertionError, match="first: three groups, defaults {'lr': 0.1}"):
        check_sgd_param_groups(lambda p, **d: _ScratchGroups(p, bug="defaults win", **d))
    with pytest.raises(AssertionError, match="1 of 3 cases failed; first: a group without lr"):
        check_sgd_param_groups(lambda p, **d: _ScratchGroups(p, bug="no lr check", **d))
    with pytest.raises(AssertionError, match="changed 2.weight.grad"):  # weight decay aliased
        check_sgd_param_groups(lambda p, **d: _ScratchGroups(p, bug="aliased grad", **d))


def test_decay_rule_check_passes_the_package_rule_and_catches_wrong_ones(capsys) -> None:
    from trainfast.optim.exercises import check_decay_rule
    from trainfast.optim.groups import NO_DECAY_MODULES

    check_decay_rule(
        lambda m, name, p: (
            p.ndim >= 2 and not isinstance(m, NO_DECAY_MODULES) and not name.endswith("bias")
        )
    )
    assert "All 27 cases passed." in capsys.readouterr().out
    with pytest.raises(AssertionError, match="first: embedding \\+ LayerNorm \\+ head: 0.weight"):
        check_decay_rule(lambda m, name, p: p.ndim >= 2 and not isinstance(m, nn.LayerNorm))
    with pytest.raises(AssertionError, match="in_proj_bias"):
        check_decay_rule(
            lambda m, name, p: not isinstance(m, (nn.LayerNorm, nn.Embedding)) and name != "bias"
        )
    with pytest.raises(AssertionError, match="RMSNorm"):  # the module rule alone misses RMSNorm
        check_decay_rule(
            lambda m, name, p: not isinstance(m, NO_DECAY_MODULES) and not name.endswith("bias")
        )
    with pytest.raises(AssertionError, match="first: EmbeddingBag \\+ head: 0.weight"):
        check_decay_rule(lambda m, name, p: p.ndim >= 2 and not isinstance(m, nn.Embedding))


def test_budget_check_passes_the_right_choice_and_catches_forgotten_gradients(capsys) -> None:
    from trainfast.optim.exercises import check_optimizer_for_budget

    def choose(n_params: float, budget_gb: float, per_param: dict | None = None) -> str | None:
        per_param = per_param or {"adamw": 16, "momentum": 12, "sgd": 8}
        return next((n for n, b in per_param.items() if b * n_params <= budget_gb * 1e9), None)

    check_optimizer_for_budget(choose)
    assert "All 7 cases passed." in capsys.readouterr().out
    no_gradients = {"adamw": 12, "momentum": 8, "sgd": 4}  # forgets the gradients
    with pytest.raises(AssertionError, match="14 GB"):
        check_optimizer_for_budget(lambda n, b: choose(n, b, no_gradients))
    one_moment = {"adamw": 12, "momentum": 12, "sgd": 8}  # Adam with one moment
    with pytest.raises(AssertionError, match="14 GB"):
        check_optimizer_for_budget(lambda n, b: choose(n, b, one_moment))
    with pytest.raises(AssertionError, match="1.05e\\+09 parameters in 16 GB"):  # GiB, not GB
        check_optimizer_for_budget(
            lambda n, b: next(
                (
                    k
                    for k, v in {"adamw": 16, "momentum": 12, "sgd": 8}.items()
                    if v * n <= b * 2**30
                ),
                None,
            )
        )
    with pytest.raises(AssertionError, match="16 GB"):  # a total equal to the budget fits
        check_optimizer_for_budget(
            lambda n, b: next(
                (k for k, v in {"adamw": 16, "momentum": 12, "sgd": 8}.items() if v * n < b * 1e9),
                None,
            )
        )


def test_every_exercise_check_runs_in_a_hidden_solution_cell() -> None:
    import chapters
    from trainfast.optim import exercises

    cells = [
        cell
        for page in chapters.pages_of("optimizers")
        if page != "optimizers/index"
        for cell in chapters.read_chapter(page).cells
    ]
    solutions = [
        cell.source
        for cell in cells
        if cell.cell_type == "code" and "solution" in cell.metadata.get("tags", [])
    ]
    assert len(solutions) >= 5
    for cell in cells:
        tags = cell.metadata.get("tags", [])
        assert "solution" not in tags or "hide-input" in tags, cell.source[:60]
    for name in exercises.__all__:
        assert any(f"{name}(" in source for source in solutions), f"{name} runs in no solution cell"


# --- honest comparisons: intervals, verdicts, tuning on validation ---


def test_mean_interval_matches_scipy_student_t() -> None:
    stats = pytest.importorskip("scipy.stats")
    from trainfast.optim.comparison import mean_interval

    for values in ([0.91, 0.93, 0.95], [1.0, 2.0, 4.0, 8.0, 16.0]):
        interval = mean_interval(values)
        low, high = stats.t.interval(
            0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values)
        )
        assert (interval.low, interval.high) == pytest.approx((low, high), rel=1e-3)
        assert interval.mean == pytest.approx(np.mean(values))
    with pytest.raises(ValueError, match=r"\[0.9\]"):
        mean_interval([0.9])


def test_student_t_975_matches_scipy_and_names_a_bad_value() -> None:
    stats = pytest.importorskip("scipy.stats")
    from trainfast.optim.comparison import student_t_975

    # the table, the interpolated tail (31 is where 1.96 would be 4% short), the far tail
    for dof in (1, 2, 5, 30, 31, 45, 60, 200, 10_000):
        assert student_t_975(dof) == pytest.approx(stats.t.ppf(0.975, dof), rel=3e-4), dof
    assert student_t_975(np.int64(31)) == student_t_975(31)  # numpy integers are integers
    assert student_t_975(2) > 4  # "2 SE" at 2 degrees of freedom is an 82% interval, not 95%
    with pytest.raises(ValueError, match="degrees_of_freedom: 0"):
        student_t_975(0)
    for bad in (2.0, True, np.float64(3.0)):
        with pytest.raises(TypeError, match=re.escape(f"degrees_of_freedom: {bad!r}")):
            student_t_975(bad)


def test_verdict_says_inside_the_noise_only_when_the_interval_holds_zero() -> None:
    from trainfast.optim.comparison import verdict

    noisy = verdict("A", [0.90, 0.95, 0.91], "B", [0.92, 0.91, 0.93], "points")
    assert "inside the noise" in noisy
    clear = verdict("A", [0.90, 0.91, 0.92], "B", [0.95, 0.955, 0.97], "points")
    assert clear.startswith("B is ahead of A by 0.048 points (95% interval 0.041 to 0.056")
    with pytest.raises(ValueError, match="3 values against 2"):
        verdict("A", [1, 2, 3], "B", [1, 2], "points")


def test_verdict_writes_numbers_as_a_person_does() -> None:
    """A difference of 1 reads "+1.0 points", never "+1 points" (the sections issue's template
    test scans the built pages for that seam)."""
    from trainfast.optim.comparison import verdict

    noisy = verdict("A", [91.0, 90.0, 93.0], "B", [90.0, 90.0, 91.0], "points")
    assert noisy.startswith("the difference between A and B, +1.0 points (95% interval -1.5 to")
    assert " 1 points" not in noisy and "+1 points" not in noisy
    clear = verdict("A", [99.0, 98.0, 99.0], "B", [81.0, 80.0, 81.0], "points")
    assert clear == "A is ahead of B by 18 points (95% interval 18 to 18 points, 3 seeds)"


def test_tune_then_repeat_selects_on_validation_and_reports_fresh_seeds() -> None:
    from trainfast.loop import History
    from trainfast.optim.comparison import Run, tune_then_repeat

    calls = []

    def run(lr: float, seed: int) -> Run:
        calls.append((lr, seed))
        # lr 0.1 wins on validation, lr 1.0 would win on test: the test score must not be used
        validation, test = {0.01: (0.5, 0.5), 0.1: (0.9, 0.6), 1.0: (0.7, 0.99)}[lr]
        return Run(lr, seed, validation, test + seed / 100, History())

    tuned = tune_then_repeat(run, [0.01, 0.1, 1.0], seeds=(1, 2))
    assert tuned.best_lr == 0.1
    assert calls == [(0.01, 0), (0.1, 0), (1.0, 0), (0.1, 1), (0.1, 2)]
    assert tuned.test_accuracies == pytest.approx([0.61, 0.62])
    with pytest.raises(ValueError, match="tuning seed 0"):
        tune_then_repeat(run, [0.1], seeds=(0, 1))


def test_tune_then_repeat_widens_an_edge_optimum_until_it_is_interior() -> None:
    from trainfast.loop import History
    from trainfast.optim.comparison import Run, tune_then_repeat

    def run(lr: float, seed: int) -> Run:  # validation accuracy peaks at lr = 1
        accuracy = 1 - abs(math.log10(lr)) / 10
        return Run(lr, seed, accuracy, accuracy, History())

    tuned = tune_then_repeat(run, [1e-3, 1e-2, 1e-1], seeds=(1,), widen=4)
    assert [r.lr for r in tuned.grid] == pytest.approx([1e-3, 1e-2, 1e-1, 1.0, 10.0])
    assert tuned.best_lr == pytest.approx(1.0)  # interior: one point beyond it was tried
    downward = tune_then_repeat(run, [100.0, 1000.0], seeds=(1,), widen=4)
    assert [r.lr for r in downward.grid] == pytest.approx([0.1, 1.0, 10.0, 100.0, 1000.0])
    capped = tune_then_repeat(run, [1e-4, 1e-3], seeds=(1,), widen=1)  # stops after one point
    assert [r.lr for r in capped.grid] == pytest.approx([1e-4, 1e-3, 1e-2])
    assert capped.best_lr == pytest.approx(1e-2)  # still at the edge: the caller must say so


def test_require_interior_refuses_an_edge_optimum() -> None:
    from trainfast.loop import History
    from trainfast.optim.comparison import Run, Tuned, require_interior

    grid = [Run(lr, 0, 1 - lr, 1 - lr, History()) for lr in (0.01, 0.1, 1.0)]
    assert require_interior("A", Tuned(grid, 0.1)) == 0.1
    for edge in (0.01, 1.0):
        with pytest.raises(RuntimeError, match=rf"A: the chosen lr {edge:g} is at the edge"):
            require_interior("A", Tuned(grid, edge))


MUON_ARMS = {"AdamW", "Muon + AdamW", "Muon (Moonlight) + AdamW"}


def test_muon_record_tunes_every_arm_to_an_interior_rate_then_repeats_fresh_seeds() -> None:
    """The committed muon-vs-adamw record is the study the chapter describes."""
    from trainfast.records import records_for

    records = records_for("muon-vs-adamw", None)
    assert records, "no muon-vs-adamw record in book/records"
    for record in records:
        rows = record.rows
        for column in ("train_examples", "validation_examples", "test_examples", "width"):
            assert column in record.columns, (record.created, column)
        assert {row["optimizer"] for row in rows} == MUON_ARMS
        repeat_seeds = []
        for arm in sorted(MUON_ARMS):
            tuning = [r for r in rows if r["optimizer"] == arm and r["role"] == "tuning"]
            repeats = [r for r in rows if r["optimizer"] == arm and r["role"] == "repeat"]
            grid = sorted(r["lr"] for r in tuning)
            assert len(grid) >= 5 and len(set(grid)) == len(grid), (arm, grid)
            assert {r["seed"] for r in tuning} == {0}, arm
            best = max(tuning, key=lambda r: r["validation_accuracy"])["lr"]
            assert {r["lr"] for r in repeats} == {best}, (arm, best)
            assert grid[0] < best < grid[-1], f"{arm}: lr {best} at the edge of {grid}"
            seeds = sorted(r["seed"] for r in repeats)
            assert len(seeds) >= 3 and 0 not in seeds, (arm, seeds)
            repeat_seeds.append(seeds)
            muon = {r["muon_params"] for r in rows if r["optimizer"] == arm}
            assert (muon == {0}) == (arm == "AdamW"), (arm, muon)
            for r in tuning + repeats:
                assert 0 <= r["test_accuracy"] <= 1 and 0 <= r["validation_accuracy"] <= 1
        assert all(seeds == repeat_seeds[0] for seeds in repeat_seeds)  # paired by seed


def test_muon_study_runs_on_one_cpu_thread_and_says_so() -> None:
    """The study pins one thread on a CPU (its docstring says so), records it in every row,
    and gives the caller back the threads it had."""
    from trainfast.optim.comparison import muon_vs_adamw_record

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        record = muon_vs_adamw_record(torch.device("cpu"), quick=True)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
    assert {row["threads"] for row in record.rows} == {1}


def test_digits_splits_hold_validation_out_of_training() -> None:
    pytest.importorskip("sklearn")
    from trainfast.datasets import digits
    from trainfast.optim.comparison import digits_splits

    train_part, validation, test = digits_splits(validation_fraction=0.25)
    everything = {tuple(row.tolist()) for row in digits("train").tensors[0]}
    assert len(train_part) + len(validation) == len(digits("train"))
    assert len(validation) == round(0.25 * (len(digits("train")) + len(digits("test"))))
    train_rows = {tuple(row.tolist()) for row in train_part.tensors[0]}
    validation_rows = {tuple(row.tolist()) for row in validation.tensors[0]}
    assert train_rows | validation_rows <= everything
    assert len(test) == len(digits("test"))
    with pytest.raises(ValueError, match="validation_fraction: 1.5"):
        digits_splits(1.5)


def test_verdict_for_a_loss_names_the_lower_one() -> None:
    from trainfast.optim.comparison import verdict

    sentence = verdict("A", [0.5, 0.52, 0.51], "B", [0.6, 0.63, 0.61], "nats", lower_is_better=True)
    assert sentence.startswith("A is lower than B by 0.1 nats (95% interval 0.0")
    assert "by 0.1 nats" in sentence  # under 1, nothing added
    flipped = verdict("B", [0.6, 0.63, 0.61], "A", [0.5, 0.52, 0.51], "nats", lower_is_better=True)
    assert flipped == sentence


#: Constants the optimizers chapter may type: units and formats (4 bytes, 8×8 pixels, 95%
#: intervals), tile sizes (64 to 256 rows, multiples of 8), published settings (β₂ = 0.95 and
#: its 20-step horizon, Gemma 2's caps 30 and 50), the batch sizes the studies are keyed by
#: (1, 8, 64), exercise specifications (weight decay 0.1, defaults 0, counting from 1).


def test_numbers_in_prose_skips_code_math_roles_and_names() -> None:
    from chapters import numbers_in_prose

    lines = [
        "---",
        "kernelspec: {version: 3}",
        "---",
        "# Title",
        "(label-2)=",
        "**3. An exercise.** After 300 steps, {glue:text}`loss:.2f` and {cite}`kingma2015adam`.",
        "Inline `x = 5` and $x^2 + 7$ and float32, GPT-2, 2-D, 124M, [link](https://a.b/c/9).",
        "```{code-cell} ipython3",
        "steps = 300",
        "```",
        "$$",
        "\\theta_1 = 42",
        "$$",
        ":::{note}",
        "A note with 12 inside.",
        ":::",
        "We measured 0.75 here, with 32 lanes.",
    ]
    page = "\n".join(lines)
    found = numbers_in_prose(page, allow={"32"})
    assert [entry.split(" in ")[0] for entry in found] == [
        "line 6: 300",
        "line 15: 12",
        "line 17: 0.75",
    ]


def _glued(notebook, name: str) -> str:
    """The text/plain value the chapter glued under ``name``."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("metadata", {}).get("scrapbook", {}).get("name") == name:
                data = output["data"]  # myst-nb's glue stores under a papermill record type
                return data.get("text/plain", data.get("application/papermill.record/text/plain"))
    raise KeyError(name)


@pytest.mark.chapter
def test_chapter_five_optimizer_rates_are_interior_to_their_grids() -> None:
    import chapters

    notebook = chapters.executed_notebook("optimizers/comparing")
    assert _glued(notebook, "mlp_edges") == "0"


@pytest.mark.parametrize(
    "name", ["train", "tune_then_repeat", "weight_decay_groups", "clip_grad_norm_"]
)
def test_listings_without_docstrings_show_the_rest_of_the_object(name: str) -> None:
    """These listings leave out the docstring (the prose says it; the API reference has it) and
    nothing else; an edit that shifts the lines fails here."""
    import chapters
    from trainfast import loop, stability
    from trainfast.optim import comparison, groups

    objects = {
        "train": loop.train,
        "tune_then_repeat": comparison.tune_then_repeat,
        "weight_decay_groups": groups.weight_decay_groups,
        "clip_grad_norm_": stability.clip_grad_norm_,
    }
    assert chapters.listing_lines("optimizers", name) == chapters.docstring_free_lines(
        objects[name]
    )


def test_train_listing_emphasises_the_four_lines_of_a_step() -> None:
    import inspect
    import re
    from pathlib import Path

    from trainfast import loop

    page = (Path(__file__).parents[1] / "book" / "optimizers" / "gradient_descent.md").read_text()
    spec, start, end = re.search(
        r":pyobject: train\n:lines: ([\d,-]+)\n:emphasize-lines: (\d+)-(\d+)\n", page
    ).groups()
    source = inspect.getsource(loop.train).splitlines()
    shown = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        shown += source[int(first) - 1 : int(last or first)]
    marked = [line.strip() for line in shown[int(start) - 1 : int(end)]]
    assert marked[1:] == [
        "optimizer.zero_grad(set_to_none=True)",
        "loss = loss_fn(model(inputs), targets)",
        "loss.backward()",
        "optimizer.step()",
    ]
