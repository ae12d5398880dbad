"""The pass itself: :func:`run_pass` runs the steps, :func:`main` is its command line.

``python -m trainfast.gpu_pass`` (see the package's docstring) builds the steps
(:mod:`~trainfast.gpu_pass.plan`), runs them here one after another, and writes the summary
(:mod:`~trainfast.gpu_pass.summary`) after each. The same command, with a hidden option, is what
each step runs in its own process (:mod:`~trainfast.gpu_pass.step_commands`).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from trainfast.gpu_pass import step_commands
from trainfast.gpu_pass.plan import apply_timeouts, default_steps, parse_timeout, select_steps
from trainfast.gpu_pass.steps import ROOT, Status, Step, StepResult, run_step, step_result
from trainfast.gpu_pass.summary import SummaryError, read_summary, settled_steps, write_summary

__all__ = ["main", "run_pass"]


def run_pass(
    steps: Sequence[Step],
    out: Path,
    header: dict[str, object] | None = None,
    echo: TextIO | None = None,
    budget: float | None = None,
) -> list[StepResult]:
    """Run ``steps`` one after another, each under its own limit, and write the summary.

    A failed or timed-out step is reported and the pass goes on; the summary is rewritten after
    every step, so a pass that is itself killed still leaves one. With ``budget`` (seconds for
    the whole call), a step starts only if its limit fits in what is left (the first step runs
    with its limit cut to the budget); the others are reported "not run", for a later call.
    An earlier summary in ``out`` that cannot be read raises
    :class:`~trainfast.gpu_pass.summary.SummaryError` before any step runs.
    """
    read_summary(out)  # fail before the first step, not after it, on a summary we must keep
    header = dict(header or {})
    header.setdefault("started", _now())
    results: list[StepResult] = []
    start = time.perf_counter()
    for number, step in enumerate(steps, start=1):
        left = None if budget is None else budget - (time.perf_counter() - start)
        if left is not None and ((left < step.timeout and bool(results)) or left <= 0):
            _say(echo, f"== {step.name}: not run ({left:.0f} s of the budget left)")
            note = f"not run: its limit {step.timeout:g} s > {max(left, 0):.0f} s left of --budget"
            results.append(step_result(step, Status.NOT_RUN, 0.0, None, Path(), note))
            continue
        if left is not None and left < step.timeout:
            step = replace(step, timeout=left)
        _say(echo, f"== [{number}/{len(steps)}] {step.name} (limit {step.timeout:g} s)")
        result = run_step(step, out / "logs", echo)
        results.append(result)
        _say(echo, f"== {step.name}: {result.status.value} in {result.seconds:.1f} s")
        write_summary(out, results, {**header, "finished": _now()})
    return results


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _say(echo: TextIO | None, line: str) -> None:
    if echo is not None:
        echo.write(line + "\n")
        echo.flush()


def _seconds(text: str) -> float:
    """``--budget``'s value: a positive, finite number of seconds (else a usage error)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"seconds must be positive and finite, got {text!r}")
    return seconds


def _timeout(text: str) -> str:
    """``--timeout``'s value, checked now so that a bad one is a usage error naming it."""
    try:
        parse_timeout(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("Bad --timeout ")) from None
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainfast.gpu_pass",
        description=sys.modules["trainfast.gpu_pass"].__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, help="folder for the summary, logs, notebooks")
    parser.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="where the steps run (default cuda; cpu for a dry run)",
    )
    parser.add_argument("--quick", action="store_true", help="benchmarks at small sizes")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="STEP",
        help="run only these steps, in the order named: a name (chapter:optimizers) or a kind "
        "(measure, chapter, pytest-gpu, compile-report; its steps in pass order); a step "
        "goes where the first pattern matching it stands",
    )
    parser.add_argument(
        "--timeout",
        type=_timeout,
        action="append",
        default=[],
        metavar="[STEP=]SECONDS",
        help="time limit for every step, or for the steps named (repeatable)",
    )
    parser.add_argument(
        "--records",
        type=Path,
        default=ROOT / "book" / "records",
        help="where benchmarks write their records (default book/records)",
    )
    parser.add_argument(
        "--budget",
        type=_seconds,
        metavar="SECONDS",
        help="wall time for this call: steps whose limit no longer fits are left 'not run'",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="skip the steps OUT/summary.json already has as passed or not available",
    )
    parser.add_argument("--list", action="store_true", help="list the steps and their limits")
    # what a step runs, in its own process
    parser.add_argument("--run-benchmark", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--execute-chapter", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--compile-report", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--notebook", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--copy-to", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.run_benchmark:
        return step_commands.run_benchmark(args.run_benchmark, args)
    if args.compile_report:
        return step_commands.run_compile_report(args)
    if args.execute_chapter:
        return step_commands.run_chapter(args)

    if args.out is None and not args.list:
        parser.error("--out is required (except with --list)")
    out = (args.out or Path("gpu-pass")).resolve()
    steps = default_steps(out, args.device, args.quick, args.records.resolve())
    try:
        apply_timeouts(steps, args.timeout)
        steps = select_steps(steps, args.only)
        done = settled_steps(out)  # read now: a summary we could not keep stops the pass here
    except SummaryError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ValueError as error:  # a --timeout or --only naming no step
        parser.error(str(error))
    if args.resume:
        steps = [step for step in steps if step.name not in done]
    if args.list:
        for step in steps:
            print(f"{step.name}\t{step.timeout:g} s")
        return 0

    import torch

    from trainfast.device import environment_line, pick_device

    header: dict[str, object] = {
        "command": subprocess.list2cmdline(
            ["python", "-m", "trainfast.gpu_pass", *(argv or sys.argv[1:])]
        ),
        "device": args.device,
        "quick": args.quick,
    }
    try:
        header["environment"] = environment_line(pick_device(args.device))
    except ValueError as error:  # cuda asked for where there is none: say so, run nothing
        header["environment"] = f"{error} (torch {torch.__version__})"
        write_summary(out, [], {**header, "finished": _now()})
        print(header["environment"], file=sys.stderr)
        return 2
    print(header["environment"], flush=True)
    results = run_pass(steps, out, header, echo=sys.stdout, budget=args.budget)
    if not results:
        write_summary(out, [], {**header, "finished": _now()})
    print((out / "summary.md").read_text(), flush=True)
    settled = (Status.PASSED, Status.NOT_AVAILABLE)
    return 0 if all(r.status in settled for r in results) else 1
