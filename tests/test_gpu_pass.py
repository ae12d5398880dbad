"""The GPU pass's plumbing, dry-run on CPU: time limits, failures reported, summary written.

Fake steps (tiny Python commands) prove that a failing step is reported with its traceback, a
hanging one is killed at its limit, and the pass goes on; the real quick steps (one benchmark,
the compile report, one small chapter) prove the commands the pass builds work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from trainfast.gpu_pass import (
    Status,
    Step,
    SummaryError,
    apply_timeouts,
    compile_report_rows,
    default_steps,
    gpu_test_files,
    pytest_command,
    run_pass,
    run_step,
    select_steps,
    write_summary,
)
from trainfast.gpu_pass.step_commands import expected_device_problem
from trainfast.measure import BENCHMARKS

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "code"), "OMP_NUM_THREADS": "1"}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_a_failure_and_a_hang_are_reported_and_the_pass_goes_on(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    hang = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('hanging', flush=True)\n"
        "time.sleep(120)\n"
    )
    steps = [
        Step("fake:fails", [PYTHON, "-c", "def f():\n    raise RuntimeError('boom')\nf()"], 30),
        Step("fake:hangs", [PYTHON, "-c", hang], 3),
        Step("fake:absent", [PYTHON, "-c", "print('not available'); raise SystemExit(3)"], 30),
        Step("fake:passes", [PYTHON, "-c", "print('fine')"], 30),
    ]
    start = time.perf_counter()
    results = run_pass(steps, tmp_path, {"environment": "device: test"}, echo=None)
    assert time.perf_counter() - start < 40

    statuses = {r.name: r.status for r in results}
    assert statuses == {
        "fake:fails": Status.FAILED,
        "fake:hangs": Status.TIMED_OUT,
        "fake:absent": Status.NOT_AVAILABLE,
        "fake:passes": Status.PASSED,
    }
    failed, hung = results[0], results[1]
    assert "Traceback" in failed.error and "RuntimeError: boom" in failed.error
    assert failed.returncode == 1
    assert 3 <= hung.seconds < 20 and "hanging" in hung.error and "killed after 3 s" in hung.error
    deadline = time.time() + 10  # the step's own child was killed with it (its process group)
    while _alive(int(pid_file.read_text())) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(int(pid_file.read_text()))
    assert results[3].error is None and "fine" in Path(results[3].log).read_text()

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["environment"] == "device: test"
    assert summary["counts"] == {
        "passed": 1,
        "failed": 1,
        "timed out": 1,
        "not available": 1,
        "not run": 0,
    }
    assert [s["name"] for s in summary["steps"]] == [s.name for s in steps]
    markdown = (tmp_path / "summary.md").read_text()
    assert "| fake:hangs | timed out |" in markdown and "RuntimeError: boom" in markdown


def test_a_later_pass_into_the_same_folder_keeps_the_steps_it_did_not_run(tmp_path):
    steps = [Step("a", [PYTHON, "-c", "pass"], 30), Step("b", [PYTHON, "-c", "pass"], 30)]
    run_pass(steps, tmp_path, echo=None)
    run_pass([Step("b", [PYTHON, "-c", "raise SystemExit(1)"], 30)], tmp_path, echo=None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["name"], s["status"]) for s in summary["steps"]] == [
        ("a", "passed"),
        ("b", "failed"),
    ]
    write_summary(tmp_path, [], {})  # an empty pass changes nothing
    assert len(json.loads((tmp_path / "summary.json").read_text())["steps"]) == 2


def test_a_budget_leaves_steps_that_do_not_fit_for_a_later_call(tmp_path):
    steps = [Step(n, [PYTHON, "-c", "import time; time.sleep(1.5)"], 30) for n in "abc"]
    steps[0].timeout = 1  # the first step always starts, its limit cut to the budget
    results = run_pass(steps, tmp_path, echo=None, budget=20)
    assert [r.status for r in results] == [Status.TIMED_OUT, Status.NOT_RUN, Status.NOT_RUN]
    assert "not run: its limit 30 s >" in results[1].error
    (tmp_path / "summary.json").unlink()
    first = run_pass(
        [Step("x", [PYTHON, "-c", "import time; time.sleep(60)"], 50)],
        tmp_path,
        echo=None,
        budget=2,
    )
    assert first[0].status is Status.TIMED_OUT and first[0].timeout <= 2


def _two_passed_steps(out: Path) -> list[dict]:
    run_pass([Step(n, [PYTHON, "-c", "pass"], 30) for n in "ab"], out, echo=None)
    return json.loads((out / "summary.json").read_text())["steps"]


KILL_BEFORE_RENAME = """
import os, signal, sys
from pathlib import Path
import trainfast.gpu_pass.summary as summary
from trainfast.gpu_pass import Step, run_pass

def killed(source, target):  # the temporary file is written in full; the rename never happens
    os.kill(os.getpid(), signal.SIGKILL)

summary.os.replace = killed
run_pass([Step("c", [sys.executable, "-c", "pass"], 30)], Path(sys.argv[1]), echo=None)
"""


def test_a_pass_killed_while_writing_its_summary_loses_nothing_finished(tmp_path):
    before = _two_passed_steps(tmp_path)
    run = subprocess.run(
        [PYTHON, "-c", KILL_BEFORE_RENAME, str(tmp_path)], env=ENV, timeout=120, check=False
    )
    assert run.returncode == -9  # killed mid-write, after step "c" finished
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == before
    # the next pass writes over what the killed one left and keeps every finished step
    run_pass([Step("c", [PYTHON, "-c", "pass"], 30)], tmp_path, echo=None)
    steps = json.loads((tmp_path / "summary.json").read_text())["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [(n, "passed") for n in "abc"]


def test_a_failed_write_leaves_the_old_summary_and_no_temporary_file(tmp_path, monkeypatch):
    import trainfast.gpu_pass.summary as summary

    before = (tmp_path / "summary.json", _two_passed_steps(tmp_path))

    def full_disk(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(summary.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run_pass([Step("c", [PYTHON, "-c", "pass"], 30)], tmp_path, echo=None)
    assert json.loads(before[0].read_text())["steps"] == before[1]
    assert not list(tmp_path.glob(".summary*.tmp"))


@pytest.mark.parametrize(
    "text", ['{"steps": [{"name": "a", "stat', "[]", '{"steps": [{"name": "a"}]}', "\xff"]
)
def test_a_summary_that_cannot_be_read_is_named_and_never_replaced(tmp_path, text):
    broken = tmp_path / "summary.json"
    broken.write_bytes(text.encode("latin-1"))
    with pytest.raises(SummaryError, match=str(broken)):
        run_pass([Step("c", [PYTHON, "-c", "pass"], 30)], tmp_path, echo=None)
    with pytest.raises(SummaryError, match=str(broken)):
        write_summary(tmp_path, [], {})
    assert broken.read_bytes() == text.encode("latin-1")
    assert not (tmp_path / "logs").exists()  # no step ran


def test_resume_on_a_truncated_summary_stops_with_an_error_naming_the_file(tmp_path):
    _two_passed_steps(tmp_path)
    broken = tmp_path / "summary.json"
    broken.write_text(broken.read_text()[:40])  # what a killed, non-atomic write left
    kept = broken.read_text()
    command = [PYTHON, "-m", "trainfast.gpu_pass", "--device", "cpu", "--out", str(tmp_path)]
    run = subprocess.run(
        [*command, "--resume", "--only", "compile-report"],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert run.returncode == 2, run.stderr
    assert str(broken) in run.stderr and "Traceback" not in run.stderr
    assert broken.read_text() == kept


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--budget", "-5"], "'-5'"),
        (["--budget", "nan"], "'nan'"),
        (["--budget", "soon"], "'soon'"),
        (["--timeout", "soon"], "'soon'"),
        (["--timeout", "chapter=-1"], "'chapter=-1'"),
        (["--timeout", "inf"], "'inf'"),
        (["--timeout", "nothing=5"], "'nothing=5'"),
        (["--only", "chapter:nope"], "chapter:nope"),
    ],
)
def test_bad_budgets_timeouts_and_steps_are_usage_errors_naming_the_value(
    tmp_path, arguments, named
):
    run = subprocess.run(
        [PYTHON, "-m", "trainfast.gpu_pass", "--out", str(tmp_path), "--list", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert "usage:" in run.stderr and named in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "summary.json").exists()


def test_compile_report_is_not_available_without_a_gpu_or_the_function():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the pass runs the report")
    rows = compile_report_rows("cpu")
    assert isinstance(rows, str) and "not available" in rows


def test_steps_are_chosen_by_name_or_kind_and_limits_set_per_step(tmp_path):
    steps = default_steps(tmp_path, "cpu", quick=True)
    names = [s.name for s in steps]
    assert names[: len(BENCHMARKS)] == [f"measure:{n}" for n in BENCHMARKS]
    modules = [Path(m).stem for m in gpu_test_files()]
    assert "chapter:optimizers" in names and names[-1] == "compile-report"
    assert names[-1 - len(modules) : -1] == [f"pytest-gpu:{m}" for m in modules]
    assert all(s.timeout < 600 for s in steps)  # each fits one 10-minute device call
    assert [s.name for s in select_steps(steps, ["chapter:optimizers", "pytest-gpu"])] == [
        "chapter:optimizers",
        *(f"pytest-gpu:{m}" for m in modules),
    ]
    assert len(select_steps(steps, ["measure"])) == len(BENCHMARKS)
    with pytest.raises(ValueError, match=r"\['chapter:nope'\]"):
        select_steps(steps, ["chapter", "chapter:nope"])
    apply_timeouts(steps, ["100", "chapter=200", "chapter:optimizers=7", "pytest-gpu=90"])
    limits = {s.name: s.timeout for s in steps}
    assert limits["measure:roofline"] == 100 and limits["chapter:profiling"] == 200
    assert limits["chapter:optimizers"] == 7 and limits[f"pytest-gpu:{modules[0]}"] == 90
    for bad in ["soon", "chapter=-1", "nothing=5"]:
        with pytest.raises(ValueError, match=bad):
            apply_timeouts(steps, [bad])
    with pytest.raises(ValueError, match="timeout must be positive, got 0"):
        Step("x", ["true"], 0)


def test_only_runs_the_steps_in_the_order_named(tmp_path):
    steps = default_steps(tmp_path, "cpu", quick=True)
    first = ["measure:speedrun", "measure:scaling-study"]
    chosen = [s.name for s in select_steps(steps, [*first, "compile-report", "measure"])]
    rest = [f"measure:{n}" for n in BENCHMARKS if f"measure:{n}" not in first]
    assert chosen == [*first, "compile-report", *rest]  # a step goes where it is first named
    kinds = [s.kind for s in select_steps(steps, ["compile-report", "chapter", "pytest-gpu"])]
    chapters, tests = (sum(s.kind == kind for s in steps) for kind in ("chapter", "pytest-gpu"))
    assert kinds == ["compile-report", *["chapter"] * chapters, *["pytest-gpu"] * tests]
    assert chapters > 1 and tests > 0


FAKE_GPU_TESTS = """
import os, signal
import pytest

pytestmark = pytest.mark.gpu

def test_passes():
    pass

def test_fails():
    answer = 41
    assert answer == 42, "the answer was 41"

def test_killed():  # what the step's time limit does to a hung test: the whole run dies here
    os.kill(os.getpid(), signal.SIGKILL)

def test_never_reached():
    pass
"""


def test_a_pytest_step_killed_midway_has_each_test_named_and_the_tracebacks_so_far(tmp_path):
    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)
    (root / "book").mkdir()
    for name in ("conftest.py", "chapters.py"):  # the project's own pytest set-up
        (root / "tests" / name).symlink_to(ROOT / "tests" / name)
    (root / "tests" / "test_fake_gpu.py").write_text(FAKE_GPU_TESTS)
    steps = default_steps(tmp_path / "out", "cpu", root=root)
    (step,) = [s for s in steps if s.kind == "pytest-gpu"]
    assert "tests/test_gpu_pass.py" not in gpu_test_files()  # it has the mark in a string only
    assert step.name == "pytest-gpu:test_fake_gpu"
    junit = tmp_path / "out" / "pytest-gpu" / "test_fake_gpu.xml"
    assert f"--junitxml={junit}" in step.command and step.command[-1] == "tests/test_fake_gpu.py"
    result = run_step(step, tmp_path / "logs")
    assert result.status is Status.FAILED and result.returncode == -9
    log = Path(result.log).read_text()
    assert "test_fake_gpu.py::test_passes PASSED" in log
    assert "test_fake_gpu.py::test_fails FAILED" in log
    # the traceback, printed when the test failed, before the run was killed in the next one
    assert "AssertionError: the answer was 41" in log and "assert 41 == 42" in log
    assert log.index("the answer was 41") < log.index("test_fake_gpu.py::test_killed")
    assert "test_never_reached" not in log


def test_pytest_steps_stop_a_hung_test_where_pytest_timeout_is_installed(monkeypatch):
    import importlib.util

    from trainfast.gpu_pass.plan import PYTEST_TEST_TIMEOUT

    real = importlib.util.find_spec
    for installed in (False, True):

        def find_spec(name, *args, installed=installed):
            if name == "pytest_timeout":
                return object() if installed else None
            return real(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        command = pytest_command("tests/test_x.py", Path("x.xml"))
        assert "-v" in command and "-rfE" in command and "--tb=short" in command
        timeouts = [word for word in command if word.startswith("--timeout")]
        assert timeouts == ([f"--timeout={PYTEST_TEST_TIMEOUT:g}"] if installed else [])
        assert command[-1] == "tests/test_x.py"


def test_a_failing_chapter_is_reported_with_its_cell_traceback(tmp_path):
    chapter = tmp_path / "broken.md"
    chapter.write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
        "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n"
        "# Broken\n\n```{code-cell} ipython3\nprint('device: cpu (test)')\n```\n\n"
        "```{code-cell} ipython3\n1 / 0\n```\n"
    )
    result = tmp_path / "result.json"
    notebook = tmp_path / "broken.ipynb"
    command = [
        PYTHON,
        "-m",
        "trainfast.gpu_pass",
        "--execute-chapter",
        str(chapter),
        "--notebook",
        str(notebook),
        "--device",
        "cpu",
        "--result",
        str(result),
    ]
    step = Step("chapter:broken", command, 120, env=ENV, result_file=result)
    (outcome,) = run_pass([step], tmp_path / "out", echo=None)
    assert outcome.status is Status.FAILED
    assert "ZeroDivisionError" in outcome.error
    assert outcome.details["environment"] == "device: cpu (test)"
    assert notebook.exists()  # saved as far as it ran


def test_the_real_quick_steps_pass_on_cpu(tmp_path):
    out = tmp_path / "out"
    command = [
        PYTHON,
        "-m",
        "trainfast.gpu_pass",
        "--device",
        "cpu",
        "--quick",
        "--out",
        str(out),
        "--records",
        str(tmp_path / "records"),
        "--timeout",
        "240",
        "--only",
        "measure:copy-bandwidth",
        "compile-report",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, env=ENV)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"].startswith("device: cpu")
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["measure:copy-bandwidth"]["status"] == "passed"
    # on a CPU the live report is not available (before and after compile_report exists)
    assert steps["compile-report"]["status"] == "not available"
    (record,) = (tmp_path / "records").glob("copy-bandwidth--cpu--*.json")
    assert (out / "records" / record.name).read_bytes() == record.read_bytes()
    assert "| measure:copy-bandwidth | passed |" in run.stdout  # the summary, printed


def test_list_and_a_missing_cuda_device(tmp_path):
    listing = subprocess.run(
        [PYTHON, "-m", "trainfast.gpu_pass", "--list", "--only", "chapter"],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert listing.returncode == 0 and "chapter:optimizers\t540 s" in listing.stdout
    if torch.cuda.is_available():
        return
    run = subprocess.run(
        [PYTHON, "-m", "trainfast.gpu_pass", "--out", str(tmp_path), "--only", "pytest-gpu"],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert run.returncode == 2 and "'cuda' is not available" in run.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == [] and "'cuda' is not available" in summary["environment"]


@pytest.mark.chapter
def test_the_environment_line_is_found_in_any_cell_and_cpu_chapters_expect_the_cpu(tmp_path):
    # mixed_precision opens with a datasheet table: on the H100 its chapter ran without error and
    # was failed for "no environment line"; the speedrun chapter runs on the CPU by design
    chapter = tmp_path / "speedrun.md"
    chapter.write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
        "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n"
        "# Table first\n\n```{code-cell} ipython3\nprint('| GPU | SMs |')\n```\n\n"
        "```{code-cell} ipython3\nprint('device: cpu (test) | torch')\n```\n"
    )
    result = tmp_path / "result.json"
    command = [PYTHON, "-m", "trainfast.gpu_pass", "--execute-chapter", str(chapter)]
    command += ["--notebook", str(tmp_path / "nb.ipynb"), "--device", "cuda"]
    run = subprocess.run(
        command + ["--result", str(result)], capture_output=True, text=True, timeout=300, env=ENV
    )
    facts = json.loads(result.read_text())
    assert facts["environment"] == "device: cpu (test) | torch", facts
    assert run.returncode == 0, run.stderr[-2000:]  # a CPU chapter, on the CPU
    problem = expected_device_problem(facts["environment"], "cuda")  # any other chapter
    assert problem == "ran on 'device: cpu (test)', expected 'cuda'"


def test_a_real_chapter_executes_and_its_environment_line_is_in_the_summary(tmp_path):
    command = [
        PYTHON,
        "-m",
        "trainfast.gpu_pass",
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
        "--only",
        "chapter:speedrun",  # the shortest chapter
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, env=ENV)
    assert run.returncode == 0, run.stdout[-3000:]
    (step,) = json.loads((tmp_path / "summary.json").read_text())["steps"]
    assert step["status"] == "passed"
    assert step["details"]["environment"].startswith("device: cpu")
    assert (tmp_path / "notebooks" / "speedrun.ipynb").exists()


def test_the_gpu_wheels_are_pinned_as_the_book_pins_them():
    def pins(name: str) -> dict[str, str]:
        lines = (ROOT / name).read_text().splitlines()
        found = [line.split("#")[0].strip() for line in lines]
        pairs = [line.split("==") for line in found if line]
        assert all(len(pair) == 2 for pair in pairs), f"{name}: not every line pins one version"
        return {package.lower().replace("_", "-"): version for package, version in pairs}

    gpu, book = pins(".ci/gpu-wheels.txt"), pins("requirements.txt")
    differ = {p: (v, book[p]) for p, v in gpu.items() if p in book and book[p] != v}
    assert not differ, f".ci/gpu-wheels.txt and requirements.txt differ: {differ}"
    assert {"nbclient", "ipykernel", "jupytext", "myst-nb", "wandb", "sweeps"} <= set(gpu)
    assert ".whl/" in (ROOT / ".gitignore").read_text().split()


def test_the_device_call_script_plans_its_parts_in_order_with_valid_limits(tmp_path):
    """``.ci/gpu-call.sh`` with ``--list``: every invocation is accepted (a bad --timeout or
    --only would be a usage error, found only on the GPU machine) and the steps come in the
    order the README gives."""
    (tmp_path / "site").mkdir()  # the wheels count as installed
    env = {**ENV, "OUT": str(tmp_path / "out"), "SITE": str(tmp_path / "site"), "PYTHON": PYTHON}
    env.update(PASS_OUT=str(tmp_path / "pass"), GPU_CALL_EXTRA="--list")
    script = [shutil.which("bash") or "bash", str(ROOT / ".ci" / "gpu-call.sh")]

    def planned(*args):
        run = subprocess.run(
            [*script, *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        listed = [line.split("\t") for line in run.stdout.splitlines() if "\t" in line]
        return run, [n for n, _ in listed], dict(listed)

    run, names, limits = planned("540")
    assert run.stdout.count(" exited 0 with ") == 4
    first = [f"measure:{n}" for n in ("profiling-case-study", "speedrun", "timing-pitfalls")]
    rest = [f"measure:{n}" for n in BENCHMARKS if f"measure:{n}" not in first]
    tests = [f"pytest-gpu:{Path(m).stem}" for m in gpu_test_files()]
    chapters = [s.name for s in default_steps(tmp_path, "cpu") if s.kind == "chapter"]
    assert names == ["compile-report", *tests, *first, *rest, *chapters]
    assert limits["compile-report"] == "60 s" and limits["measure:speedrun"] == "420 s"
    assert all(float(limit.removesuffix(" s")) <= 520 for limit in limits.values())
    assert (tmp_path / "out" / "gp.tgz").exists()
    _, names, _ = planned("540", "measure-new", "chapter:profiling")
    assert names == [*first, "chapter:profiling"]
    for bad in (["soon"], ["60", "measure", "nothing"]):
        run = subprocess.run([*script, *bad], capture_output=True, text=True, env=env, cwd=ROOT)
        assert run.returncode == 2 and bad[-1] in run.stderr and "exited" not in run.stdout
