"""A GPU pass planned to fit the device time: two commands, the most wanted steps first.

The device machine is lent for :data:`DEVICE_SECONDS` in all (its start, the transfers and its
idle time counted), at most 10 minutes a command and one command at a time. :func:`plan_pass`
splits the pass into at most two commands of at most :data:`COMMAND_SECONDS` each, by value:

1. every executable page executed on CUDA and ``pytest -m gpu`` on every module, side by side,
   :data:`JOBS` at a time on the machine's 16 cores, with the compile report (command 1; no
   timing from it is kept, so sharing the machine costs nothing it reports);
2. the speedrun's GPU log, then the stale records again (:data:`STALE`), then the other
   benchmarks for the new GPU, one at a time on an otherwise idle machine (command 2), as far
   as the time goes; the rest is left for a later pass and listed.

Command 1 and the speedrun must fit, or the plan is refused (:class:`PlanDoesNotFit`, naming
what does not fit). Each step's time is :func:`~trainfast.gpu_pass.estimates.estimate_for`'s,
and the printout (:meth:`PassPlan.lines`) names its source. The same plan is what
``--command N`` runs, on CUDA or, for the dry run, on the CPU.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from trainfast.gpu_pass.estimates import OVERHEADS, Estimate, estimate_for
from trainfast.gpu_pass.pages import page_chapter
from trainfast.gpu_pass.plan import LIMITS
from trainfast.gpu_pass.steps import Step

__all__ = [
    "COMMAND_SECONDS",
    "DEVICE_SECONDS",
    "JOBS",
    "STALE",
    "Command",
    "PassPlan",
    "PlanDoesNotFit",
    "PlannedStep",
    "plan_pass",
]

#: device time a session is lent, in seconds (15 minutes: the device tool's notes)
DEVICE_SECONDS = 900.0
#: the most one command may take, in seconds: the tool stops a command at 10 minutes
COMMAND_SECONDS = 540.0
#: pages and test modules at a time in command 1, on the machine's 16 cores (two each)
JOBS = 8
#: command 1's budget over its estimate: a margin for steps slower than the last pass's
MARGIN = 1.25
#: the benchmarks whose records today's code would measure otherwise, most wanted first
#: (readiness review 2026-12-01, §3.2): warm/cold timed launches, the loader's generator, the
#: tf32 backward, the checkpointing column, the prefetch prediction
STALE = (
    "timing-pitfalls",
    "profiling-case-study",
    "precision-step-time",
    "activation-checkpointing",
    "copy-compute-overlap",
)


class PlanDoesNotFit(ValueError):
    """A pass whose essential steps do not fit the device time; the message says which."""


@dataclass(frozen=True)
class PlannedStep:
    """A step of a command with its estimate and, in command 1, the lane it is expected on."""

    step: Step
    estimate: Estimate
    start: float = 0.0  # seconds into the command, as planned


@dataclass
class Command:
    """One device call: its steps in order, its budget (the seconds it may run, the wheels'
    install included), how many run side by side, and its estimated time."""

    number: int
    steps: list[PlannedStep]
    budget: float
    jobs: int
    estimated: float
    install: float = 0.0

    @property
    def names(self) -> list[str]:
        return [p.step.name for p in self.steps]

    @property
    def timeout_s(self) -> int:
        """The device tool's ``timeout_s`` for this command: its budget and a minute for the
        start of Python and the last tar, at most 600."""
        return int(min(600, self.budget + 60))


@dataclass
class PassPlan:
    """The commands of a pass, the overheads around them, and what is left for later."""

    device_seconds: float
    commands: list[Command]
    overheads: list[tuple[str, Estimate]]
    deferred: list[PlannedStep] = field(default_factory=list)

    @property
    def total(self) -> float:
        """Device seconds the plan takes: the overheads and each command's whole budget."""
        return sum(e.seconds for _, e in self.overheads) + sum(c.budget for c in self.commands)

    def command(self, number: int) -> Command:
        """Command ``number`` (1 or 2); ``ValueError`` naming it if the plan has no such one."""
        for command in self.commands:
            if command.number == number:
                return command
        raise ValueError(f"Invalid command: {number!r} (the plan has {len(self.commands)})")

    def lines(self) -> list[str]:
        """The plan as text: each overhead and command, each step with its estimate and its
        source, what is left for a later pass, and the total against the device time."""
        out = [
            f"GPU pass plan: {self.device_seconds:.0f} s of device time, "
            f"{len(self.commands)} commands of at most {COMMAND_SECONDS:.0f} s"
        ]
        overheads = dict(self.overheads)
        start = overheads["machine start"]
        out.append(f"  machine start{'':>33}{start.seconds:6.0f} s  ({start.source})")
        for command in self.commands:
            out.append(
                f"command {command.number}: bash .ci/gpu-call.sh {command.number}  (budget "
                f"{command.budget:.0f} s, estimated {command.estimated:.0f} s, "
                f"{command.jobs} at a time; device run timeout_s={command.timeout_s}, "
                "carry .whl)"
            )
            if command.install:
                out.append(
                    f"  install wheels{'':>32}{command.install:6.0f} s  "
                    f"({OVERHEADS['install wheels'].source})"
                )
            for planned in command.steps:
                at = f"@{planned.start:4.0f}" if command.jobs > 1 else "     "
                out.append(
                    f"  {at} {planned.step.name:<40}{planned.estimate.seconds:6.0f} s  "
                    f"({planned.estimate.source})"
                )
            transfer = overheads["transfer"]
            out.append(f"  transfer{'':>38}{transfer.seconds:6.0f} s  ({transfer.source})")
            if command.number < len(self.commands):
                gap = overheads["between commands"]
                out.append(f"between commands{'':>32}{gap.seconds:6.0f} s  ({gap.source})")
        close = overheads["give back"]
        out.append(f"give back{'':>39}{close.seconds:6.0f} s  ({close.source})")
        if self.deferred:
            left = ", ".join(f"{p.step.name} ({p.estimate.seconds:.0f} s)" for p in self.deferred)
            out.append(f"left for a later pass: {left}")
        out.append(
            f"total {self.total:.0f} s of {self.device_seconds:.0f} s "
            f"({self.total / 60:.1f} of {self.device_seconds / 60:.0f} min)"
        )
        return out


def _limited(step: Step, estimate: Estimate, jobs: int) -> Step:
    """``step`` with its planned limit (:data:`~trainfast.gpu_pass.plan.LIMITS`), its estimate,
    and, when it runs side by side, its share of the CPU threads."""
    limit = LIMITS.get(step.name, LIMITS.get(step.kind, step.timeout))
    env = dict(step.env)
    if jobs > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or jobs) // jobs))
    return replace(step, timeout=limit, estimate=estimate.seconds, concurrent=jobs > 1, env=env)


def _lanes(planned: list[tuple[Step, Estimate]], jobs: int) -> tuple[list[PlannedStep], float]:
    """Longest first onto ``jobs`` lanes, each step on the lane free first (as a pool runs
    them): the steps with their planned start, and when the last ends."""
    lanes = [0.0] * jobs
    placed = []
    for step, estimate in sorted(planned, key=lambda p: -p[1].seconds):
        lane = min(range(jobs), key=lambda i: lanes[i])
        placed.append(PlannedStep(step, estimate, lanes[lane]))
        lanes[lane] += estimate.seconds
    return placed, max(lanes, default=0.0)


def plan_pass(
    steps: Sequence[Step],
    device_seconds: float = DEVICE_SECONDS,
    *,
    jobs: int = JOBS,
    recorded: dict[str, Estimate] | None = None,
) -> PassPlan:
    """The pass of ``steps`` (:func:`~trainfast.gpu_pass.plan.default_steps`) in commands that
    fit ``device_seconds`` of device time; see the module's docstring for the order.

    ``recorded`` are timings of an earlier pass
    (:func:`~trainfast.gpu_pass.estimates.recorded_estimates`), preferred to the table's.
    Raises :class:`PlanDoesNotFit` where command 1 (every page, every GPU test module) or the
    speedrun does not fit, and ``ValueError`` for a bad ``device_seconds`` or ``jobs``.
    """
    if not (math.isfinite(device_seconds) and device_seconds > 0):
        raise ValueError(f"Invalid device_seconds: {device_seconds!r} (need a positive number)")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"Invalid jobs: {jobs!r} (need an int of at least 1)")
    pages_of: dict[str, int] = {}
    for step in steps:
        if step.kind == "page":
            chapter = page_chapter(step.name.split(":", 1)[1])
            pages_of[chapter] = pages_of.get(chapter, 0) + 1

    def estimated(step: Step) -> Estimate:
        return estimate_for(step, recorded, pages_of)

    overheads = [
        (name, OVERHEADS[name]) for name in ("machine start", "transfer", "between commands")
    ]
    overheads += [("transfer", OVERHEADS["transfer"]), ("give back", OVERHEADS["give back"])]
    fixed = sum(e.seconds for _, e in overheads)
    install = OVERHEADS["install wheels"].seconds

    # command 1: the pages and the GPU tests side by side, then nothing waits for them
    first = [s for s in steps if s.kind in ("page", "pytest-gpu", "compile-report")]
    first_planned, makespan = _lanes([(s, estimated(s)) for s in first], jobs)
    first_planned = [replace(p, step=_limited(p.step, p.estimate, jobs)) for p in first_planned]
    wall = install + makespan
    budget_1 = min(COMMAND_SECONDS, math.ceil(wall * MARGIN / 10) * 10)
    if wall > COMMAND_SECONDS or fixed + budget_1 > device_seconds:
        raise PlanDoesNotFit(
            f"command 1 (every page and every GPU test module, {jobs} at a time) takes an "
            f"estimated {wall:.0f} s, and with the machine's overheads ({fixed:.0f} s) more than "
            f"{min(COMMAND_SECONDS, device_seconds - fixed):.0f} s are left for it"
        )
    command_1 = Command(1, first_planned, budget_1, jobs, wall, install)

    # command 2: the speedrun, the stale records, the rest, one at a time
    budget_2 = min(COMMAND_SECONDS, device_seconds - fixed - budget_1)
    by_name = {s.name: s for s in steps if s.kind == "measure"}
    speedrun = by_name.pop("measure:speedrun", None)
    if speedrun is None:
        raise PlanDoesNotFit("no measure:speedrun step: the pass needs the speedrun's GPU log")
    need = estimated(speedrun)
    if need.seconds > budget_2:
        raise PlanDoesNotFit(
            f"the speedrun's GPU log ({need.seconds:.0f} s, {need.source}) does not fit the "
            f"{budget_2:.0f} s left for command 2 of {device_seconds:.0f} s of device time"
        )
    order = [f"measure:{name}" for name in STALE if f"measure:{name}" in by_name]
    order += [name for name in by_name if name not in order]
    second = [PlannedStep(_limited(speedrun, need, 1), need, 0.0)]
    deferred = []
    used = need.seconds
    for name in order:
        estimate = estimated(by_name[name])
        if used + estimate.seconds <= budget_2:
            second.append(PlannedStep(_limited(by_name[name], estimate, 1), estimate, used))
            used += estimate.seconds
        else:
            deferred.append(PlannedStep(by_name[name], estimate))
    command_2 = Command(2, second, budget_2, 1, used)
    return PassPlan(device_seconds, [command_1, command_2], overheads, deferred)
