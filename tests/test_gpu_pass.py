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
    executable_pages,
    gpu_test_files,
    pytest_command,
    run_pass,
    run_step,
    select_steps,
    write_summary,
)
from trainfast.gpu_pass.schedule import PlanDoesNotFit, plan_pass
from trainfast.gpu_pass.step_commands import expected_device_problem
from trainfast.measure import BENCHMARKS
from trainfast.records import load_records

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
    optimizers = [f"page:{p}" for p in executable_pages(ROOT) if p.startswith("optimizers/")]
    assert optimizers and set(optimizers) <= set(names) and names[-1] == "compile-report"
    assert names[-1 - len(modules) : -1] == [f"pytest-gpu:{m}" for m in modules]
    assert all(s.timeout < 600 for s in steps)  # each fits one 10-minute device call
    assert [s.name for s in select_steps(steps, ["chapter:optimizers", "pytest-gpu"])] == [
        *optimizers,  # chapter:<chapter> names its pages
        *(f"pytest-gpu:{m}" for m in modules),
    ]
    assert len(select_steps(steps, ["measure"])) == len(BENCHMARKS)
    with pytest.raises(ValueError, match=r"\['chapter:nope'\]"):
        select_steps(steps, ["chapter", "chapter:nope"])
    apply_timeouts(steps, ["100", "chapter=200", f"{optimizers[0]}=7", "pytest-gpu=90"])
    limits = {s.name: s.timeout for s in steps}
    assert limits["measure:roofline"] == 100 and limits[optimizers[1]] == 200
    assert limits[optimizers[0]] == 7 and limits[f"pytest-gpu:{modules[0]}"] == 90
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
    kinds = [s.kind for s in select_steps(steps, ["compile-report", "page", "pytest-gpu"])]
    pages, tests = (sum(s.kind == kind for s in steps) for kind in ("page", "pytest-gpu"))
    assert kinds == ["compile-report", *["page"] * pages, *["pytest-gpu"] * tests]
    assert pages > 1 and tests > 0


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
    tests = result.details["tests"]  # no JUnit XML from a killed run: read from the log
    assert (tests["from"], tests["passed"], tests["failed"]) == ("log", 1, 1)
    assert tests["not_passed"] == ["tests/test_fake_gpu.py::test_fails FAILED"]


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
    first = executable_pages(ROOT)[0]
    assert listing.returncode == 0 and f"page:{first}\t540 s" in listing.stdout
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
        "--records",
        str(tmp_path / "book-records"),
        "--only",
        "page:speedrun/target",  # a short page
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900, env=ENV)
    assert run.returncode == 0, run.stdout[-3000:]
    (step,) = json.loads((tmp_path / "summary.json").read_text())["steps"]
    assert step["status"] == "passed" and step["name"] == "page:speedrun/target"
    assert step["details"]["environment"].startswith("device: cpu")
    assert (tmp_path / "notebooks" / "speedrun" / "target.ipynb").exists()
    (record,) = load_records(tmp_path / "records", "gpu-pass")  # a dry run's stays in OUT
    (row,) = record.rows
    assert row["environment"] == step["details"]["environment"] and row["status"] == "passed"
    assert not (tmp_path / "book-records").exists()


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


def test_the_device_call_script_runs_the_planned_commands_on_the_cpu_too(tmp_path):
    """``.ci/gpu-call.sh 1`` and ``2`` with ``--list``, as the dry run (``DEVICE=cpu``): each
    lists its command of the plan, in the plan's order (a bad option would be a usage error,
    found only on the GPU machine), and leaves the files it returns, none in a folder."""
    (tmp_path / "site").mkdir()  # the wheels count as installed
    env = {**ENV, "OUT": str(tmp_path / "out"), "SITE": str(tmp_path / "site"), "PYTHON": PYTHON}
    env.update(PASS_OUT=str(tmp_path / "pass"), GPU_CALL_EXTRA="--list", DEVICE="cpu")
    script = [shutil.which("bash") or "bash", str(ROOT / ".ci" / "gpu-call.sh")]
    from trainfast.gpu_pass.estimates import recorded_estimates

    recorded = recorded_estimates(ROOT / "book" / "records")  # as the command reads them
    plan = plan_pass(default_steps(tmp_path / "pass", "cpu"), recorded=recorded)

    def listed(*args):
        run = subprocess.run(
            [*script, *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "exited 0" in run.stdout
        return [line.split("\t")[0] for line in run.stdout.splitlines() if "\t" in line]

    for number in (1, 2):
        assert listed(str(number)) == plan.command(number).names
    assert listed() == plan.command(1).names  # command 1 by default
    assert listed("custom", "60", "page:speedrun/target", "measure:roofline") == [
        "page:speedrun/target",
        "measure:roofline",
    ]  # a rerun of chosen steps, in the order named
    returned = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert {"probe.txt", "records.tgz", "logs.tgz"} <= set(returned)
    assert all((tmp_path / "out" / name).is_file() for name in returned)
    for bad in (["3"], ["custom", "soon", "x"], ["custom", "60"]):
        run = subprocess.run([*script, *bad], capture_output=True, text=True, env=env, cwd=ROOT)
        assert run.returncode == 2 and "usage:" in run.stderr and "exited" not in run.stdout


# --- the book's pages, the plan that fits the device time, the pass record ------------------

NOTEBOOK = (
    "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
    "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n# {}\n"
)


def test_pages_come_from_the_toc_with_chapters_as_folders_and_flat_chapters(tmp_path):
    from trainfast.gpu_pass import executable_pages, page_chapter, toc_pages

    (tmp_path / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nchapters:\n"
        "  - file: book/optimizers/index\n    sections:\n"
        "      - file: book/optimizers/sgd\n      - file: book/optimizers/momentum\n"
        "        sections:\n          - file: book/optimizers/nesterov\n"
        "  - file: book/profiling\n  - file: book/api/index\n"
    )
    for page in ("optimizers/index", "optimizers/sgd", "optimizers/momentum", "profiling"):
        (tmp_path / "book" / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "book" / f"{page}.md").write_text(NOTEBOOK.format(page))
    (tmp_path / "book" / "intro.md").write_text("# Not a notebook\n")
    (tmp_path / "book" / "api").mkdir()
    (tmp_path / "book" / "api" / "index.rst").write_text("API\n===\n")
    assert toc_pages(tmp_path)[:2] == ["intro", "optimizers/index"]
    with pytest.raises(FileNotFoundError, match="book/optimizers/nesterov"):
        executable_pages(tmp_path)  # listed, missing: never silently skipped
    (tmp_path / "book" / "optimizers" / "nesterov.md").write_text(NOTEBOOK.format("nesterov"))
    assert executable_pages(tmp_path) == [
        "optimizers/index",
        "optimizers/sgd",
        "optimizers/momentum",
        "optimizers/nesterov",
        "profiling",
    ]
    assert [page_chapter(p) for p in ("optimizers/sgd", "profiling")] == ["optimizers", "profiling"]
    steps = default_steps(tmp_path / "out", "cpu", root=tmp_path)
    pages = [s.name for s in steps if s.kind == "page"]
    assert pages[0] == "page:optimizers/index" and len(pages) == 5
    assert [s.name for s in select_steps(steps, ["chapter:optimizers"])] == pages[:4]
    # the book today: every chapter of _toc.yml that is a notebook, in its order
    book = executable_pages(ROOT)
    assert book[0].startswith("optimizers") and "speedrun/log" in book
    assert book.index("optimizers/step_cost") < book.index("hyperparameters/trainer")
    assert all((ROOT / "book" / f"{page}.md").exists() for page in book)


def test_the_plan_fits_two_commands_in_15_minutes_the_most_wanted_first(tmp_path):
    from trainfast.gpu_pass.schedule import COMMAND_SECONDS, DEVICE_SECONDS, STALE

    steps = default_steps(tmp_path, "cuda")
    plan = plan_pass(steps)
    first, second = plan.commands
    kinds = {s.kind for s in steps}
    assert kinds == {"measure", "page", "pytest-gpu", "compile-report"}
    # command 1: every page and every GPU test module, side by side
    wanted = {s.name for s in steps if s.kind in ("page", "pytest-gpu", "compile-report")}
    assert set(first.names) == wanted and first.jobs == 8
    assert all(p.step.concurrent for p in first.steps)
    # command 2: the speedrun first, then the stale records in their order, one at a time
    assert second.names[0] == "measure:speedrun" and second.jobs == 1
    stale = [n for n in second.names if n.removeprefix("measure:") in STALE]
    assert stale == [f"measure:{n}" for n in STALE if f"measure:{n}" in second.names]
    assert second.names.index(stale[0]) == 1
    assert {p.step.name for p in plan.deferred} | set(second.names) == {
        s.name for s in steps if s.kind == "measure"
    }
    for command in plan.commands:
        assert command.estimated <= command.budget <= COMMAND_SECONDS
        assert command.timeout_s <= 600
        assert all(
            p.estimate.source and p.step.estimate == p.estimate.seconds for p in command.steps
        )
    assert plan.total <= DEVICE_SECONDS == 900
    assert plan.command(2) is second
    with pytest.raises(ValueError, match="Invalid command: 3"):
        plan.command(3)
    with pytest.raises(PlanDoesNotFit, match="speedrun's GPU log"):
        plan_pass(steps, 600)
    with pytest.raises(PlanDoesNotFit, match="command 1"):
        plan_pass(steps, 200)
    with pytest.raises(PlanDoesNotFit, match="command 1"):
        plan_pass(steps, jobs=1)  # one at a time, the pages and tests take over 9 minutes
    with pytest.raises(ValueError, match="Invalid jobs: 0"):
        plan_pass(steps, jobs=0)


def test_the_plan_is_printed_the_same_for_the_dry_run_and_refused_when_it_does_not_fit():
    def plan(*arguments):
        command = [PYTHON, "-m", "trainfast.gpu_pass", "--plan", *arguments]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, env=ENV)

    on_gpu, dry = plan("--budget", "900"), plan("--budget", "900", "--device", "cpu")
    assert on_gpu.returncode == 0, on_gpu.stderr
    assert dry.stdout == on_gpu.stdout  # the dry run goes through the same plan
    lines = on_gpu.stdout.splitlines()
    assert lines[0].startswith("GPU pass plan: 900 s of device time, 2 commands")
    one = next(i for i, line in enumerate(lines) if line.startswith("command 1:"))
    two = next(i for i, line in enumerate(lines) if line.startswith("command 2:"))
    assert one < two and "measure:speedrun" in lines[two + 1]
    first = executable_pages(ROOT)[0]
    assert any(f"page:{first}" in line and " s  (" in line for line in lines[one:two])
    assert lines[-1] == "total 900 s of 900 s (15.0 of 15 min)"
    refused = plan("--budget", "600")
    assert refused.returncode == 2 and "the plan does not fit" in refused.stderr
    assert "speedrun" in refused.stderr and "Traceback" not in refused.stderr


def test_estimates_come_from_the_last_pass_record_then_the_table(tmp_path):
    from trainfast.gpu_pass.estimates import (
        ESTIMATES,
        PAGE_START_SECONDS,
        estimate_for,
        recorded_estimates,
    )
    from trainfast.records import make_record, write_record

    page = Step("page:optimizers/sgd", ["true"], 60)
    whole = ESTIMATES["page"].seconds
    shared = estimate_for(page, {}, {"optimizers": 4}).seconds
    assert shared == pytest.approx(whole / 4 + PAGE_START_SECONDS, abs=0.051)  # rounded
    assert estimate_for(Step("measure:speedrun", ["true"], 60)).seconds == 360
    assert estimate_for(Step("measure:new-one", ["true"], 60)) == ESTIMATES["measure"]
    with pytest.raises(ValueError, match="No estimate for step 'odd:x'"):
        estimate_for(Step("odd:x", ["true"], 60))
    rows = [
        {"name": "page:optimizers/sgd", "status": "passed", "seconds": 21.5},
        {"name": "measure:roofline", "status": "timed out", "seconds": 90.0},  # says nothing
    ]
    record = make_record("gpu-pass", "A pass.", rows, device="cpu")
    record.environment.update(device="cuda", device_name="NVIDIA H200")
    write_record(record, tmp_path)
    recorded = recorded_estimates(tmp_path)
    assert set(recorded) == {"page:optimizers/sgd"}
    assert estimate_for(page, recorded).seconds == 21.5
    assert "gpu-pass record, NVIDIA H200" in estimate_for(page, recorded).source


def test_concurrent_steps_run_side_by_side_and_a_step_starts_when_its_estimate_fits(tmp_path):
    sleep = [PYTHON, "-c", "import time; time.sleep(2)"]
    steps = [Step(f"page:{n}", sleep, 30, concurrent=True) for n in "abcd"]
    steps.append(Step("alone", [PYTHON, "-c", "pass"], 30))
    start = time.perf_counter()
    results = run_pass(steps, tmp_path, echo=None, jobs=4)
    assert time.perf_counter() - start < 7  # four 2 s steps together, not 8 s one by one
    assert [r.status for r in results] == [Status.PASSED] * 5
    assert results[-1].name == "alone" and all(r.details["finished"] for r in results)
    fits = Step("fits", [PYTHON, "-c", "pass"], 500, estimate=1)  # its limit does not fit
    late = Step("late", [PYTHON, "-c", "pass"], 5, estimate=100)
    first, second, third = run_pass(
        [Step("first", [PYTHON, "-c", "pass"], 30), fits, late],
        tmp_path / "b",
        echo=None,
        budget=30,
    )
    assert (first.status, second.status, third.status) == (
        Status.PASSED,
        Status.PASSED,
        Status.NOT_RUN,
    )
    assert "not run: its estimate 100 s >" in third.error


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_x" name="test_a" time="0.1"/>
<testcase classname="tests.test_x" name="test_b" time="0.1"><failure message="boom"/></testcase>
<testcase classname="tests.test_x" name="test_c" time="0.0">
<skipped message="needs 2 GPUs"/></testcase>
<testcase classname="tests.test_x" name="test_d" time="0.1"><error message="x"/></testcase>
</testsuite></testsuites>
"""


def test_the_pass_record_has_a_row_per_step_with_the_tests_and_keeps_earlier_steps(tmp_path):
    from trainfast.device import describe_environment
    from trainfast.gpu_pass import write_pass_record

    junit = tmp_path / "test_x.xml"
    junit.write_text(JUNIT)
    page = tmp_path / "result.json"
    print_line = (
        "import json, sys; json.dump({'environment': 'device: cpu (x)'}, open(sys.argv[1], 'w'))"
    )
    steps = [
        Step("page:optimizers", [PYTHON, "-c", print_line, str(page)], 30, result_file=page),
        Step("pytest-gpu:test_x", [PYTHON, "-c", "raise SystemExit(1)"], 30, junit=junit),
    ]
    environment = describe_environment(torch.device("cpu"))
    records = tmp_path / "records"

    def write(results):
        write_pass_record(results, environment, "python -m trainfast.gpu_pass", records)

    run_pass(steps, tmp_path / "out", echo=None, on_result=write)
    (record,) = load_records(records, "gpu-pass")
    assert record.columns == [
        "kind",
        "name",
        "status",
        "seconds",
        "finished",
        "environment",
        "tests",
        "note",
        "source_commit",
    ]
    rows = {row["name"]: row for row in record.rows}
    assert rows["page:optimizers"]["environment"] == "device: cpu (x)"
    assert rows["page:optimizers"]["status"] == "passed" and rows["page:optimizers"]["finished"]
    tests = rows["pytest-gpu:test_x"]["tests"]
    assert (tests["passed"], tests["failed"], tests["errors"], tests["skipped"]) == (1, 1, 1, 1)
    assert "tests.test_x::test_c SKIPPED (needs 2 GPUs)" in tests["not_passed"]
    assert rows["pytest-gpu:test_x"]["status"] == "failed"
    assert record.environment["cpu"] and record.created == max(r["finished"] for r in record.rows)
    # a second pass (command 2, say) adds its rows and keeps the first's
    run_pass(
        [Step("measure:x", [PYTHON, "-c", "pass"], 30)],
        tmp_path / "out",
        echo=None,
        on_result=write,
    )
    (record,) = load_records(records, "gpu-pass")
    assert [row["name"] for row in record.rows] == [
        "page:optimizers",
        "pytest-gpu:test_x",
        "measure:x",
    ]
    # command 2 on the same machine, where book/records came afresh with the tree: the copy in
    # OUT/records still holds command 1's rows
    fresh = tmp_path / "fresh-book-records"
    (last,) = run_pass([Step("measure:y", [PYTHON, "-c", "pass"], 30)], tmp_path / "o2", echo=None)
    write_pass_record([last], environment, "python -m trainfast.gpu_pass", fresh, copy_to=records)
    for folder in (fresh, records):
        (record,) = load_records(folder, "gpu-pass")
        assert [row["name"] for row in record.rows][-2:] == ["measure:x", "measure:y"]
        assert len(record.rows) == 4


def test_when_and_where_a_page_last_executed_on_a_gpu(tmp_path):
    from trainfast.gpu_pass import last_gpu_execution
    from trainfast.records import make_record, write_record

    def pass_on(gpu, rows):
        record = make_record("gpu-pass", "A pass.", rows, device="cpu")
        record.environment.update(device="cuda", device_name=gpu)
        write_record(record, tmp_path)

    def row(name, status, finished, note=""):
        return {
            "name": f"page:{name}",
            "status": status,
            "finished": finished,
            "note": note,
            "environment": "device: cuda (GPU)",
            "source_commit": "abcdef1234",
        }

    pass_on("NVIDIA H100 80GB HBM3", [row("optimizers", "passed", "2026-11-26T20:00:00+00:00")])
    pass_on(
        "NVIDIA H200",
        [
            row("optimizers", "failed", "2026-12-02T10:00:00+00:00", "ZeroDivisionError"),
            row("profiling", "not run", "2026-12-02T10:01:00+00:00"),
        ],
    )
    last = last_gpu_execution("optimizers", tmp_path)
    assert (last.gpu, last.passed, last.status) == ("NVIDIA H200", False, "failed")
    assert last.sentence() == (
        "Last executed on the NVIDIA H200 on 2026-12-02 at abcdef1: it failed: ZeroDivisionError."
    )
    assert last_gpu_execution("profiling", tmp_path) is None  # not run is no execution
    assert last_gpu_execution("speedrun", tmp_path) is None  # never on CUDA
    pass_on("NVIDIA H200", [row("optimizers", "passed", "2026-12-03T10:00:00+00:00")])
    assert last_gpu_execution("optimizers", tmp_path).sentence().endswith(": every cell passed.")
    with pytest.raises(ValueError, match="Invalid page: 'optimizers.md'"):
        last_gpu_execution("optimizers.md", tmp_path)


def test_a_planned_command_runs_on_the_cpu_and_writes_its_record_outside_the_book(tmp_path):
    """The dry run of command 1, one step of it: the plan's budget and limits, the summary, and
    the pass record in OUT/records (never in --records, the book's)."""
    out, book = tmp_path / "out", tmp_path / "book-records"
    command = [PYTHON, "-m", "trainfast.gpu_pass", "--out", str(out), "--device", "cpu"]
    command += ["--records", str(book), "--command", "1", "--only", "compile-report"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=ENV)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (step,) = json.loads((out / "summary.json").read_text())["steps"]
    assert step["name"] == "compile-report" and step["status"] == "not available"
    assert step["timeout"] == 60  # the planned limit (plan.LIMITS)
    (record,) = load_records(out / "records", "gpu-pass")
    assert [row["status"] for row in record.rows] == ["not available"]
    assert record.environment["device"] == "cpu" and not book.exists()
