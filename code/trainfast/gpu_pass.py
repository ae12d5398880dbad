"""``python -m trainfast.gpu_pass``: everything the book needs from a GPU machine, in one command.

On a CUDA machine one pass runs, each as its own step:

* ``measure:<name>``: every registered benchmark (:data:`trainfast.measure.BENCHMARKS`) at full
  size, writing its record into ``--records`` (``book/records``) and a copy into ``OUT/records``;
* ``chapter:<name>``: every chapter in ``book/`` converted from MyST Markdown with jupytext and
  executed as a notebook with nbclient, saved as ``OUT/notebooks/<name>.ipynb``, with the
  environment line its first cell printed;
* ``pytest-gpu``: ``pytest -m gpu`` on the test modules that have GPU tests;
* ``compile-report``: the live compile report beside the ahead-of-time one
  (``trainfast.kernels.compile_report``), or "not available" where the package lacks it.

Each step is a subprocess with its own time limit, so one hang cannot eat the budget: a step that
runs past it is killed (with its process group) and reported as timed out, a step that fails is
reported with the end of its output (the traceback), and the pass goes on. ``OUT/summary.json``
and ``OUT/summary.md`` say per step what passed, failed, timed out or was not available, how long
it took, and why; ``OUT/logs/<step>.log`` keeps each step's whole output. A second pass into the
same ``OUT`` keeps the steps it does not re-run, so a pass split with ``--only`` (the device tool
allows 10 minutes a command) adds up to one summary.

Where not to use it: for a quick look at one benchmark, ``python -m trainfast.measure --only``
is simpler; the chapters' own tests (``tests/test_<chapter>.py -m chapter``) check more than
"every cell ran".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TextIO

__all__ = [
    "DEFAULT_TIMEOUTS",
    "Status",
    "Step",
    "StepResult",
    "apply_timeouts",
    "chapters",
    "compile_report_rows",
    "default_steps",
    "execute_chapter",
    "gpu_test_files",
    "main",
    "run_pass",
    "run_step",
    "select_steps",
    "write_summary",
]

#: the repository this module sits in (``code/trainfast/gpu_pass.py`` -> the root)
ROOT = Path(__file__).resolve().parents[2]

#: seconds each kind of step may run by default; each below the device tool's 10-minute cap
DEFAULT_TIMEOUTS: dict[str, float] = {
    "measure": 420,
    "chapter": 540,
    "pytest-gpu": 540,
    "compile-report": 300,
}

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

    ``kind`` is the family (``measure``, ``chapter``, ...) that ``--only`` and ``--timeout``
    can name instead of the full ``name``; ``result_file`` is a JSON file the command may write
    with facts for the summary (a chapter's environment line, say).
    """

    name: str
    command: list[str]
    timeout: float
    kind: str = ""
    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)
    result_file: Path | None = None

    def __post_init__(self) -> None:
        if self.timeout <= 0:
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
            log.write(f"could not start: {error!r}\n")
            return _result(step, Status.FAILED, 0.0, None, log_path, f"could not start: {error!r}")
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
    lines = [line for line in output.splitlines() if line.strip()]
    if status is Status.PASSED and lines and not details.get("summary"):
        details["summary"] = lines[-1][:200]  # pytest's counts, the record a benchmark wrote
    error = None
    if status is not Status.PASSED:
        tail = output[-ERROR_TAIL_CHARS:]
        error = (f"{details['problem']}\n" if details.get("problem") else "") + tail
    return _result(step, status, seconds, process.returncode, log_path, error, details)


def _result(
    step: Step,
    status: Status,
    seconds: float,
    returncode: int | None,
    log: Path,
    error: str | None,
    details: dict[str, object] | None = None,
) -> StepResult:
    fields = (step.name, step.kind, status, round(seconds, 2), step.timeout, returncode)
    command = subprocess.list2cmdline(step.command)
    return StepResult(*fields, command, str(log), error, details or {})


# --- the steps ---------------------------------------------------------------------------------


def chapters(root: Path = ROOT) -> list[str]:
    """The chapters: every ``book/*.md`` that is a notebook (has a kernelspec), by name."""
    return sorted(
        path.stem
        for path in (root / "book").glob("*.md")
        if "kernelspec:" in path.read_text().split("\n---", 1)[0]
    )


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """Test modules with ``@pytest.mark.gpu`` tests (collecting only them keeps it cheap)."""
    return sorted(
        str(path.relative_to(root))
        for path in (root / "tests").glob("test_*.py")
        if "pytest.mark.gpu" in path.read_text()
    )


def default_steps(
    out: Path,
    device: str,
    quick: bool = False,
    records: Path | None = None,
    root: Path = ROOT,
) -> list[Step]:
    """Every step of the pass, in order: benchmarks, chapters, GPU tests, compile report.

    Benchmarks come first so that the chapters executed after them render the new records.
    """
    from trainfast.measure import BENCHMARKS

    python = sys.executable
    records = records if records is not None else root / "book" / "records"
    # CUDA_VISIBLE_DEVICES="" makes pick_device() in a chapter choose the CPU when asked to.
    env = {"PYTHONPATH": os.pathsep.join([str(root / "code"), os.environ.get("PYTHONPATH", "")])}
    env["WANDB_MODE"] = os.environ.get("WANDB_MODE", "offline")
    env["WANDB_SILENT"] = "true"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""

    def own(name: str, kind: str, arguments: list[str], cwd: Path = root) -> Step:
        """A step that runs this module in its own process (see :func:`main`)."""
        result = out / "results" / f"{name.replace(':', '--')}.json"
        command = [python, "-m", "trainfast.gpu_pass", *arguments, "--device", device]
        command += ["--result", str(result)]
        timeout = DEFAULT_TIMEOUTS[kind]
        return Step(name, command, timeout, env=env, cwd=cwd, result_file=result)

    steps: list[Step] = []
    for name in BENCHMARKS:
        arguments = ["--run-benchmark", name, "--records", str(records)]
        arguments += ["--copy-to", str(out / "records"), *(["--quick"] if quick else [])]
        steps.append(own(f"measure:{name}", "measure", arguments))
    for name in chapters(root):
        arguments = ["--execute-chapter", str(root / "book" / f"{name}.md")]
        arguments += ["--notebook", str(out / "notebooks" / f"{name}.ipynb")]
        steps.append(own(f"chapter:{name}", "chapter", arguments, cwd=root / "book"))
    pytest = [python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    pytest += [f"--junitxml={out / 'pytest-gpu.xml'}", *gpu_test_files(root)]
    steps.append(Step("pytest-gpu", pytest, DEFAULT_TIMEOUTS["pytest-gpu"], env=env, cwd=root))
    steps.append(own("compile-report", "compile-report", ["--compile-report"]))
    return steps


def _matches(step: Step, pattern: str) -> bool:
    return pattern in (step.name, step.kind)


def select_steps(steps: Sequence[Step], only: Sequence[str] | None) -> list[Step]:
    """The steps named by ``only`` (a step's full name or its kind), in pass order.

    A pattern that names no step raises ``ValueError`` naming it, before anything runs.
    """
    if not only:
        return list(steps)
    unknown = [p for p in only if not any(_matches(s, p) for s in steps)]
    if unknown:
        known = sorted({s.kind for s in steps} | {s.name for s in steps})
        raise ValueError(f"No step named {unknown} (steps: {known})")
    return [s for s in steps if any(_matches(s, p) for p in only)]


def apply_timeouts(steps: Sequence[Step], settings: Sequence[str]) -> None:
    """Set time limits from ``--timeout`` values: ``SECONDS`` for all, ``NAME=SECONDS`` for some.

    Later settings win; a bad value raises ``ValueError`` naming it.
    """
    for setting in settings:
        pattern, _, value = setting.rpartition("=")
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(
                f"Bad --timeout {setting!r}: expected SECONDS or NAME=SECONDS"
            ) from None
        if seconds <= 0:
            raise ValueError(f"Bad --timeout {setting!r}: seconds must be positive")
        chosen = [s for s in steps if not pattern or _matches(s, pattern)]
        if pattern and not chosen:
            raise ValueError(f"Bad --timeout {setting!r}: no step named {pattern!r}")
        for step in chosen:
            step.timeout = seconds


# --- the pass and its summary ------------------------------------------------------------------


def write_summary(out: Path, results: Sequence[StepResult], header: dict[str, object]) -> Path:
    """Write ``summary.json`` and ``summary.md`` into ``out``, keeping earlier steps not re-run.

    Returns the path of the Markdown summary.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    earlier: list[dict[str, object]] = []
    if path.exists():
        with contextlib.suppress(ValueError, KeyError):
            earlier = json.loads(path.read_text())["steps"]
    names = {r.name for r in results}
    steps = [s for s in earlier if s.get("name") not in names] + [r.as_dict() for r in results]
    counts = {status.value: sum(s["status"] == status.value for s in steps) for status in Status}
    summary = {**header, "counts": counts, "steps": steps}
    path.write_text(json.dumps(summary, indent=2) + "\n")

    lines = [
        "# GPU pass",
        "",
        f"{header.get('environment', '')}  ",
        f"finished {header.get('finished', '')}; "
        + ", ".join(f"{n} {status}" for status, n in counts.items() if n),
        "",
        "| step | status | seconds | limit (s) | environment / note |",
        "|---|---|---|---|---|",
    ]
    for s in steps:
        details = s.get("details") or {}
        assert isinstance(details, dict)
        note = details.get("environment") or details.get("summary") or ""
        if s["status"] != Status.PASSED.value and s.get("error"):
            last = [line for line in str(s["error"]).splitlines() if line.strip()]
            note = last[-1] if last else note
        note = str(note).replace("|", "\\|")[:160]
        lines.append(
            f"| {s['name']} | {s['status']} | {s['seconds']} | {s['timeout']:g} | {note} |"
        )
    failures = [s for s in steps if s["status"] not in (Status.PASSED.value,)]
    for s in failures:
        lines += [
            "",
            f"## {s['name']}: {s['status']}",
            "",
            f"log: `{s['log']}`",
            "",
            "```text",
            str(s.get("error") or "").strip()[-3000:],
            "```",
        ]
    markdown = out / "summary.md"
    markdown.write_text("\n".join(lines) + "\n")
    return markdown


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
    """
    header = dict(header or {})
    header.setdefault("started", _now())
    results: list[StepResult] = []
    start = time.perf_counter()
    for number, step in enumerate(steps, start=1):
        left = None if budget is None else budget - (time.perf_counter() - start)
        if left is not None and ((left < step.timeout and bool(results)) or left <= 0):
            _say(echo, f"== {step.name}: not run ({left:.0f} s of the budget left)")
            note = f"not run: its limit {step.timeout:g} s > {max(left, 0):.0f} s left of --budget"
            results.append(_result(step, Status.NOT_RUN, 0.0, None, Path(), note))
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


# --- what the steps run (in their own process) ---------------------------------------------------


def _write_result(path: Path | None, data: dict[str, object]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")


def _expected_device_problem(line: str, device: str) -> str | None:
    if not line:
        return "no environment line (the first cell prints environment_line(device))"
    if not line.startswith(f"device: {device}"):
        return f"ran on {line.split('|')[0].strip()!r}, expected {device!r}"
    return None


def execute_chapter(
    chapter: Path, notebook: Path, timeout: float = 1800, result: Path | None = None
) -> dict[str, object]:
    """Execute a MyST chapter as a notebook (jupytext, then nbclient) and save it executed.

    The kernel is this interpreter (``ipykernel`` from wherever it is importable, e.g. a
    ``--target`` folder on ``PYTHONPATH``), named by a kernel spec written into a temporary
    folder, so no kernel needs to be installed. The notebook is saved even when a cell fails.
    Returns (and writes to ``result``) the environment line the first cell printed and the
    seconds it took; a failing cell raises nbclient's ``CellExecutionError``.
    """
    import tempfile

    import jupytext
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = jupytext.read(chapter)
    with tempfile.TemporaryDirectory() as kernels:
        spec = Path(kernels) / "trainfast-gpu-pass"
        spec.mkdir()
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        kernel = {"argv": argv, "display_name": "trainfast gpu pass", "language": "python"}
        (spec / "kernel.json").write_text(json.dumps(kernel))
        manager = KernelManager(
            kernel_name="trainfast-gpu-pass",
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernels]),
        )
        client = NotebookClient(
            nb,
            km=manager,
            timeout=int(timeout),
            resources={"metadata": {"path": str(chapter.parent)}},
        )
        start = time.perf_counter()
        facts: dict[str, object] = {"chapter": chapter.stem, "notebook": str(notebook)}
        try:
            client.execute()
        finally:
            facts["seconds"] = round(time.perf_counter() - start, 2)
            facts["environment"] = _first_output_line(nb)
            notebook.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, notebook)
            _write_result(result, facts)
    return facts


def _first_output_line(nb: object) -> str:
    """The first line the first code cell printed (the chapter's environment line)."""
    for cell in getattr(nb, "cells", []):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                return str(output.get("text", "")).strip().splitlines()[0]
        return ""
    return ""


def _run_benchmark(name: str, args: argparse.Namespace) -> int:
    from trainfast import measure

    before = time.time()
    argv = ["--out", str(args.records), "--only", name, "--device", args.device]
    status = measure.main(argv + (["--quick"] if args.quick else []))
    written = sorted(p for p in args.records.glob(f"{name}--*.json") if p.stat().st_mtime >= before)
    if args.copy_to is not None:
        args.copy_to.mkdir(parents=True, exist_ok=True)
        for path in written:
            (args.copy_to / path.name).write_bytes(path.read_bytes())
    _write_result(args.result, {"records": [str(p) for p in written]})
    return status


def compile_report_rows(device: str) -> list[dict[str, object]] | str:
    """The live compile report: ``trainfast.kernels.compile_report.compile_report`` for the GPU
    this pass runs on, one row per (kernel, dtype); or why it is not available here.

    On a GPU machine the kernels are compiled there, for the GPU they run on; the chapter's
    ahead-of-time report (compiled on a CPU for the same GPU) is what these rows are set beside.
    """
    import importlib

    import torch

    try:
        module = importlib.import_module("trainfast.kernels.compile_report")
    except ModuleNotFoundError as error:
        if error.name != "trainfast.kernels.compile_report":
            raise
        return "trainfast.kernels.compile_report is not available in this version of the package"
    report = getattr(module, "compile_report", None)
    if not callable(report):
        return "trainfast.kernels.compile_report has no compile_report function: not available"
    from trainfast.gpus import gpu_for_device

    target = gpu_for_device(device)
    if target is None:
        return f"no GPU in trainfast.gpus.GPUS matches device {device!r}: report not available"
    dtypes = [torch.float16] + ([torch.bfloat16] if target.compute_capability >= (8, 0) else [])
    rows: list[dict[str, object]] = []
    for dtype in dtypes:
        for kernel in report(target, dtype):
            fields = asdict(kernel) if is_dataclass(kernel) else {}
            row = {"gpu": target.name, "dtype": str(dtype).removeprefix("torch.")}
            row.update({k: v for k, v in fields.items() if isinstance(v, (str, int, float, bool))})
            row["verdict"] = str(getattr(kernel, "verdict", ""))
            rows.append(row)
    return rows


def _compile_report(args: argparse.Namespace) -> int:
    rows = compile_report_rows(args.device)
    if isinstance(rows, str):
        print(rows)  # contains "not available"
        _write_result(args.result, {"summary": rows})
        return NOT_AVAILABLE_EXIT
    for row in rows:
        print(json.dumps(row))
    _write_result(args.result, {"summary": f"{len(rows)} kernels compiled", "rows": rows})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainfast.gpu_pass",
        description=__doc__,
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
        help="run only these steps: a name (chapter:optimizers) or a kind "
        "(measure, chapter, pytest-gpu, compile-report)",
    )
    parser.add_argument(
        "--timeout",
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
        type=float,
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
        return _run_benchmark(args.run_benchmark, args)
    if args.compile_report:
        return _compile_report(args)
    if args.execute_chapter:
        from nbclient.exceptions import CellExecutionError

        try:
            facts = execute_chapter(args.execute_chapter, args.notebook, result=args.result)
        except CellExecutionError as error:
            print(error, file=sys.stderr)
            return 1
        line = str(facts["environment"])
        print(line)
        problem = _expected_device_problem(line, args.device)
        if problem:
            _write_result(args.result, {**facts, "problem": problem})
            print(problem, file=sys.stderr)
            return 1
        return 0

    if args.out is None and not args.list:
        parser.error("--out is required (except with --list)")
    out = (args.out or Path("gpu-pass")).resolve()
    steps = default_steps(out, args.device, args.quick, args.records.resolve())
    apply_timeouts(steps, args.timeout)
    steps = select_steps(steps, args.only)
    if args.resume:
        done = _settled_steps(out)
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


def _settled_steps(out: Path) -> set[str]:
    """Names of the steps an earlier call into ``out`` finished (passed, or not available)."""
    path = out / "summary.json"
    if not path.exists():
        return set()
    settled = {Status.PASSED.value, Status.NOT_AVAILABLE.value}
    return {s["name"] for s in json.loads(path.read_text())["steps"] if s["status"] in settled}


if __name__ == "__main__":
    raise SystemExit(main())
