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
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from trainfast.gpu_pass import step_commands
from trainfast.gpu_pass.estimates import recorded_estimates
from trainfast.gpu_pass.pass_record import write_pass_record
from trainfast.gpu_pass.plan import apply_timeouts, default_steps, parse_timeout, select_steps
from trainfast.gpu_pass.schedule import DEVICE_SECONDS, JOBS, PlanDoesNotFit, plan_pass
from trainfast.gpu_pass.steps import ROOT, Status, Step, StepResult, run_step, step_result
from trainfast.gpu_pass.summary import SummaryError, read_summary, settled_steps, write_summary

__all__ = ["main", "run_pass"]


def run_pass(
    steps: Sequence[Step],
    out: Path,
    header: dict[str, object] | None = None,
    echo: TextIO | None = None,
    budget: float | None = None,
    jobs: int = 1,
    on_result: Callable[[list[StepResult]], None] | None = None,
) -> list[StepResult]:
    """Run ``steps`` under their own limits, each alone or, where ``concurrent``, side by side
    with the concurrent steps next to it, ``jobs`` at a time; write the summary after each.

    A failed or timed-out step is reported and the pass goes on; the summary is rewritten after
    every step, so a pass that is itself killed still leaves one. With ``budget`` (seconds for
    the whole call), a step starts only if its ``estimate`` (its limit where it has none) fits in
    what is left, and runs with its limit cut to what is left; the first step always starts.
    The others are reported "not run", for a later call. ``on_result`` is called with the
    results so far after each step (the pass record is written so). Each result's details get
    ``finished``, the UTC time it ended. An earlier summary in ``out`` that cannot be read
    raises :class:`~trainfast.gpu_pass.summary.SummaryError` before any step runs.
    """
    read_summary(out)  # fail before the first step, not after it, on a summary we must keep
    header = dict(header or {})
    header.setdefault("started", _now())
    results: list[StepResult] = []
    lock = threading.Lock()
    start = time.perf_counter()
    total = len(steps)

    def record(result: StepResult) -> None:
        with lock:
            result.details["finished"] = _now()
            results.append(result)
            write_summary(out, results, {**header, "finished": _now()})
            if on_result is not None:
                on_result(list(results))

    def run_one(number: int, step: Step) -> None:
        with lock:
            left = None if budget is None else budget - (time.perf_counter() - start)
            needed = step.estimate if step.estimate is not None else step.timeout
            started_any = bool(results) or number > 1
        if left is not None and ((left < needed and started_any) or left <= 0):
            _say(echo, f"== {step.name}: not run ({max(left, 0):.0f} s of the budget left)")
            what = "estimate" if step.estimate is not None else "limit"
            note = f"not run: its {what} {needed:g} s > {max(left, 0):.0f} s left of --budget"
            record(step_result(step, Status.NOT_RUN, 0.0, None, Path(), note))
            return
        if left is not None and left < step.timeout:
            step = replace(step, timeout=left)
        _say(echo, f"== [{number}/{total}] {step.name} (limit {step.timeout:g} s)")
        result = run_step(step, out / "logs", echo)
        _say(echo, f"== {step.name}: {result.status.value} in {result.seconds:.1f} s")
        record(result)

    number = 0
    index = 0
    while index < total:
        group = [steps[index]]
        while steps[index].concurrent and index + len(group) < total:
            following = steps[index + len(group)]
            if not following.concurrent:
                break
            group.append(following)
        if len(group) == 1 or jobs <= 1:
            for step in group:
                number += 1
                run_one(number, step)
        else:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(run_one, number + i + 1, s) for i, s in enumerate(group)]
                for future in futures:
                    future.result()
            number += len(group)
        index += len(group)
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
        help="run only these steps, in the order named: a name (page:optimizers/momentum), a "
        "kind (page, measure, pytest-gpu, compile-report; its steps in pass order) or a "
        "chapter's pages (chapter:optimizers); a step goes where the first pattern matching it "
        "stands",
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
        help="wall time for this call: steps whose limit no longer fits are left 'not run'; "
        "with --plan or --command, the device time of the whole pass (default "
        f"{DEVICE_SECONDS:g})",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the planned pass (its commands, each step with its estimate and source) "
        "and exit; 2 if it does not fit --budget",
    )
    parser.add_argument(
        "--command",
        type=int,
        choices=[1, 2],
        help="run command 1 (every page and GPU test, side by side) or 2 (the speedrun, the "
        "stale records, the other benchmarks) of the planned pass",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=JOBS,
        help=f"steps side by side in command 1 (default {JOBS}, for the GPU machine's 16 cores)",
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

    if args.jobs < 1:
        parser.error(f"--jobs: need at least 1, got {args.jobs}")
    if args.out is None and not (args.list or args.plan):
        parser.error("--out is required (except with --list or --plan)")
    out = (args.out or Path("gpu-pass")).resolve()
    records = args.records.resolve()
    steps = default_steps(out, args.device, args.quick, records)
    budget, jobs = args.budget, 1
    try:
        if args.plan or args.command:
            plan = plan_pass(
                steps,
                args.budget or DEVICE_SECONDS,
                jobs=args.jobs,
                recorded=recorded_estimates(records),
            )
            if args.plan:
                print("\n".join(plan.lines()))
                return 0
            command = plan.command(args.command)
            steps = [planned.step for planned in command.steps]
            budget, jobs = command.budget - command.install, command.jobs
        apply_timeouts(steps, args.timeout)
        steps = select_steps(steps, args.only)
        done = settled_steps(out)  # read now: a summary we could not keep stops the pass here
    except PlanDoesNotFit as error:
        print(f"error: the plan does not fit: {error}", file=sys.stderr)
        return 2
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

    from trainfast.device import describe_environment, environment_line, pick_device

    header: dict[str, object] = {
        "command": subprocess.list2cmdline(
            ["python", "-m", "trainfast.gpu_pass", *(argv or sys.argv[1:])]
        ),
        "device": args.device,
        "quick": args.quick,
    }
    try:
        device = pick_device(args.device)
    except ValueError as error:  # cuda asked for where there is none: say so, run nothing
        header["environment"] = f"{error} (torch {torch.__version__})"
        write_summary(out, [], {**header, "finished": _now()})
        print(header["environment"], file=sys.stderr)
        return 2
    header["environment"] = environment_line(device)
    print(header["environment"], flush=True)
    environment = describe_environment(device)

    # the pass record: into --records (book/records) on CUDA, with a copy in OUT/records; a dry
    # run's stays in OUT/records, so that rehearsing on a CPU never changes the book's records
    home, copy = (records, out / "records") if device.type == "cuda" else (out / "records", None)

    def write_record_of(results: list[StepResult]) -> None:
        """The pass record after each step: nothing finished is lost if the call is cut."""
        write_pass_record(results, environment, str(header["command"]), home, copy)

    results = run_pass(
        steps, out, header, echo=sys.stdout, budget=budget, jobs=jobs, on_result=write_record_of
    )
    if not results:
        write_summary(out, [], {**header, "finished": _now()})
    print((out / "summary.md").read_text(), flush=True)
    settled = (Status.PASSED, Status.NOT_AVAILABLE)
    return 0 if all(r.status in settled for r in results) else 1
