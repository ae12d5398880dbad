"""One step of the GPU pass: a command run in its own process group under a time limit.

:func:`run_step` runs one :class:`Step` and reports a :class:`StepResult`: passed, failed (with
the end of its output), timed out (its whole process group killed), or not available here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import TextIO

__all__ = ["NOT_AVAILABLE_EXIT", "ROOT", "Status", "Step", "StepResult", "run_step", "step_result"]

#: the repository this package sits in (``code/trainfast/gpu_pass/steps.py`` -> the root)
ROOT = Path(__file__).resolve().parents[3]

#: how much of a failed step's output the summary keeps (its whole output is in its log)
ERROR_TAIL_CHARS = 6000

#: exit code by which a step says "this is not available here" (not a failure)
NOT_AVAILABLE_EXIT = 3


class Status(str, Enum):
    """What became of a step."""

    PASSED = "passed"
    FAILED = "failed"
    TIMED_OUT = "timed out"
    NOT_AVAILABLE = "not available"
    NOT_RUN = "not run"  # the invocation's --budget was spent before it started


@dataclass
class Step:
    """One step of the pass: a command run in ``cwd`` under a time limit.

    ``kind`` is the family (``measure``, ``page``, ...) that ``--only`` and ``--timeout``
    can name instead of the full ``name``; ``result_file`` is a JSON file the command may write
    with facts for the summary (a page's environment line, say); ``junit`` the JUnit XML a
    pytest step writes, read for its tests' results (:mod:`~trainfast.gpu_pass.junit`).
    ``estimate`` is the seconds the plan expects it to take
    (:mod:`~trainfast.gpu_pass.estimates`): with a budget, a step starts when its estimate fits
    in what is left (its limit when it has none). ``concurrent`` steps run side by side with the
    concurrent steps next to them (``run_pass``'s ``jobs``); the others run alone.
    """

    name: str
    command: list[str]
    timeout: float
    kind: str = ""
    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)
    result_file: Path | None = None
    junit: Path | None = None
    estimate: float | None = None
    concurrent: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"Step {self.name!r}: timeout must be positive, got {self.timeout}")
        self.kind = self.kind or self.name.split(":", 1)[0]


@dataclass
class StepResult:
    """How one step went: status, seconds, and on failure the end of its output."""

    name: str
    kind: str
    status: Status
    seconds: float
    timeout: float
    returncode: int | None
    command: str
    log: str
    error: str | None = None
    details: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["status"] = self.status.value
        return data


# --- running one step --------------------------------------------------------------------------


def _stop(process: subprocess.Popen[str]) -> None:
    """Terminate a step's whole process group (its workers and kernels too), then kill it."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _pump(source: TextIO, log: TextIO, echo: TextIO | None, prefix: str) -> None:
    for line in source:
        log.write(line)
        log.flush()
        if echo is not None:
            echo.write(f"{prefix}{line}")
            echo.flush()


def run_step(step: Step, logs: Path, echo: TextIO | None = None) -> StepResult:
    """Run ``step`` under its time limit; its output goes to ``logs/<name>.log`` (and ``echo``,
    e.g. ``sys.stdout``, if given).

    Never raises for the step's own failure: that is the result's status and error.
    """
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{step.name.replace(':', '--').replace('/', '_')}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **step.env}
    start = time.perf_counter()
    timed_out = False
    with log_path.open("w") as log:
        log.write(f"$ {subprocess.list2cmdline(step.command)}\n")
        log.flush()
        try:
            process = subprocess.Popen(
                step.command,
                cwd=step.cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                start_new_session=True,  # its own process group, so a timeout kills it all
            )
        except OSError as error:
            reason = f"could not start: {error!r}"
            log.write(reason + "\n")
            return step_result(step, Status.FAILED, 0.0, None, log_path, reason)
        assert process.stdout is not None
        reader = threading.Thread(
            target=_pump, args=(process.stdout, log, echo, f"[{step.name}] "), daemon=True
        )
        reader.start()
        try:
            process.wait(timeout=step.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(process)
        reader.join(timeout=10)
        seconds = time.perf_counter() - start
        if timed_out:
            log.write(f"\n*** killed after {step.timeout:g} s (its time limit)\n")
    output = log_path.read_text(errors="replace")
    details: dict[str, object] = {}
    if step.result_file is not None and step.result_file.exists():
        with contextlib.suppress(ValueError):
            details = json.loads(step.result_file.read_text())
    if timed_out:
        status = Status.TIMED_OUT
    elif process.returncode == 0:
        status = Status.PASSED
    elif process.returncode == NOT_AVAILABLE_EXIT and "not available" in output:
        status = Status.NOT_AVAILABLE
    else:
        status = Status.FAILED
    if status is Status.PASSED and details.get("problem"):
        status = Status.FAILED  # the step ran but did not do what was asked (wrong device, ...)
    if step.junit is not None:
        from trainfast.gpu_pass.junit import junit_outcomes

        details["tests"] = junit_outcomes(step.junit, log_path)
    lines = [line for line in output.splitlines() if line.strip()]
    if status is Status.PASSED and lines and not details.get("summary"):
        details["summary"] = lines[-1][:200]  # pytest's counts, the record a benchmark wrote
    error = None
    if status is not Status.PASSED:
        tail = output[-ERROR_TAIL_CHARS:]
        error = (f"{details['problem']}\n" if details.get("problem") else "") + tail
    return step_result(step, status, seconds, process.returncode, log_path, error, details)


def step_result(
    step: Step,
    status: Status,
    seconds: float,
    returncode: int | None,
    log: Path,
    error: str | None,
    details: dict[str, object] | None = None,
) -> StepResult:
    """The :class:`StepResult` of ``step``: its name, kind, limit and command, and how it went."""
    fields = (step.name, step.kind, status, round(seconds, 2), step.timeout, returncode)
    command = subprocess.list2cmdline(step.command)
    return StepResult(*fields, command, str(log), error, details or {})
