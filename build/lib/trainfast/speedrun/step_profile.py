"""Where a speedrun step's time goes: by part of the step and by kind of operator.

A systems change can only speed up the part of the step it touches (Amdahl, 1967): a fused
attention kernel the attention, a faster optimizer implementation the optimizer's step, bf16
arithmetic the matrix products. :func:`profile_step` runs a few training steps of one
:class:`~trainfast.speedrun.SpeedrunConfig` under ``torch.profiler``
(:func:`trainfast.profiling.traces.profile_steps`) on random tokens of the right shape (the
time of a step does not depend on which tokens it reads) and returns:

* the **parts** of the step, as named ranges: ``batch`` (cutting the next batch from the token
  array), ``forward``, ``backward`` and ``optimizer`` (its step and zeroing the gradients);
* the **kinds** of operator, by their own (self) CPU time: ``linear`` (the dense layers'
  products, ``aten::mm`` and ``aten::addmm``), ``attention`` (the attention's batched products,
  softmax and mask, or the fused kernel) and ``other`` (norms, activations, the embedding, the
  loss, the optimizer's arithmetic).

:meth:`StepBreakdown.amdahl` turns a share into the most a change of that part can buy, and
:attr:`StepBreakdown.linear_flops_per_second` is what the dense layers achieved, to set beside
the CPU's peak (:func:`trainfast.kernels.roofline.cpu_peak_flops`).

When not to use it: the profiler adds a few microseconds to every operator, so the shares of a
step of many small operators are skewed towards them; time a change with the harness, and read
a profile only to explain the time. It profiles one process: a data-parallel step's
communication is not in it.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from trainfast.accounting import matmul_parameter_count
from trainfast.profiling.traces import annotate, profile_steps
from trainfast.speedrun.data import TokenStream
from trainfast.speedrun.harness import SpeedrunConfig, make_optimizer
from trainfast.transformer import Transformer
from trainfast.validation import check_int, check_number

__all__ = ["KINDS", "PARTS", "StepBreakdown", "operator_kind", "profile_step"]

PARTS = ("batch", "forward", "backward", "optimizer")
KINDS = ("linear", "attention", "other")
_LINEAR = {"aten::mm", "aten::addmm"}
_ATTENTION = {"aten::bmm", "aten::baddbmm", "aten::_softmax", "aten::_softmax_backward_data",
              "aten::masked_fill", "aten::masked_fill_"}  # fmt: skip


def operator_kind(name: str) -> str | None:
    """The kind of an operator of the profile's table: ``"linear"``, ``"attention"`` or
    ``"other"``; None for a named range or a profiler's own row (not an operator)."""
    if name in PARTS or name.startswith("ProfilerStep") or not name.startswith("aten::"):
        return None
    if name in _LINEAR:
        return "linear"
    if name in _ATTENTION or "scaled_dot_product" in name:
        return "attention"
    return "other"


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds per step of each part (:data:`PARTS`) and each kind of operator (:data:`KINDS`)."""

    config: str
    threads: int
    parts: dict[str, float]  # wall time inside each named range, per step
    kinds: dict[str, float]  # self CPU time of each kind of operator, per step
    linear_flops: float  # the dense layers' matmul FLOPs per step (6 N D)

    @property
    def step_seconds(self) -> float:
        """The step's time under the profiler: the sum of its parts."""
        return sum(self.parts.values())

    def part_share(self, part: str) -> float:
        """The share of the step's time spent in ``part``."""
        if part not in self.parts:
            raise ValueError(f"Unknown part: {part!r} (expected one of {list(self.parts)})")
        return self.parts[part] / self.step_seconds

    def kind_share(self, kind: str) -> float:
        """The share of the operators' own time spent in operators of ``kind``."""
        if kind not in self.kinds:
            raise ValueError(f"Unknown kind: {kind!r} (expected one of {list(self.kinds)})")
        return self.kinds[kind] / sum(self.kinds.values())

    @property
    def linear_flops_per_second(self) -> float:
        """FLOP/s the dense layers' products achieved (their FLOPs over their own time)."""
        return self.linear_flops / self.kinds["linear"] if self.kinds["linear"] else math.nan

    @staticmethod
    def amdahl(share: float, speedup: float = math.inf) -> float:
        """The whole step's speedup when a part taking ``share`` of it runs ``speedup`` times as
        fast (Amdahl): ``1 / (1 - share + share / speedup)``; with no ``speedup`` given, the
        most removing that part entirely could buy."""
        check_number("share", share, minimum=0.0, maximum=1.0)
        check_number("speedup", speedup, above=0.0, allow_inf=True)
        rest = 1 - share + (0.0 if math.isinf(speedup) else share / speedup)
        return math.inf if rest == 0 else 1 / rest


def profile_step(
    config: SpeedrunConfig,
    *,
    steps: int = 3,
    threads: int = 1,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> StepBreakdown:
    """Profile ``steps`` training steps of ``config`` (after one untimed and one discarded
    step) on ``threads`` intra-op threads, in this process (``config.data_parallel`` and
    ``config.compile`` are ignored: one process, eager), and break them down by part and kind."""
    if not isinstance(config, SpeedrunConfig):
        raise ValueError(f"Invalid config: {config!r} (expected a SpeedrunConfig)")
    check_int("steps", steps, minimum=1)
    check_int("threads", threads, minimum=1)
    device = torch.device(device)
    shape = config.shape
    torch.manual_seed(seed)
    model = Transformer(
        shape, attention=config.attention, zero_init_projections=config.zero_init_projections
    ).to(device)
    optimizer = make_optimizer(config, model)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, shape.vocab_size, (steps + 3) * shape.tokens + 1, dtype=np.uint16)
    stream = TokenStream(tokens, shape.batch_size, shape.seq_len, order_seed=seed)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16")

    def step() -> None:
        with annotate("batch"):
            inputs, targets = (t.to(device) for t in stream.next_batch())
        with annotate("forward"), autocast:
            loss = model.loss(inputs, targets)
        with annotate("backward"):
            loss.backward()
        with annotate("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as folder:
            profile = profile_steps(step, wait=1, warmup=1, active=steps, out_dir=folder,
                                    device=device)  # fmt: skip
    finally:
        torch.set_num_threads(before)
    parts = {part: profile.operator(part).total_cpu_s / steps for part in PARTS}
    kinds = dict.fromkeys(KINDS, 0.0)
    for row in profile.operators:
        kind = operator_kind(row.name)
        if kind is not None:
            kinds[kind] += row.self_cpu_s / steps
    linear = 6 * matmul_parameter_count(shape) * shape.tokens
    return StepBreakdown(config.name, threads, parts, kinds, float(linear))
