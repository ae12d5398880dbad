"""The steps of a pass: which there are, which run (``--only``), their limits (``--timeout``).

:func:`default_steps` lists every step in order (benchmarks, pages, GPU tests, compile
report), each a ``python -m trainfast.gpu_pass`` call of its own (see
:mod:`trainfast.gpu_pass.step_commands`) except the tests, which are pytest's. The pages are the
book's executable pages (:func:`~trainfast.gpu_pass.pages.executable_pages`), one step each,
``page:<page>`` (``page:optimizers``, ``page:optimizers/momentum``); ``chapter:<chapter>`` in
``--only`` or ``--timeout`` names every page of that chapter, and ``chapter`` every page.
:data:`LIMITS` are the limits a planned pass gives its steps
(:mod:`~trainfast.gpu_pass.schedule`).
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from trainfast.gpu_pass.pages import executable_pages, page_chapter
from trainfast.gpu_pass.steps import ROOT, Step

__all__ = [
    "DEFAULT_TIMEOUTS",
    "LIMITS",
    "PYTEST_TEST_TIMEOUT",
    "apply_timeouts",
    "default_steps",
    "gpu_test_files",
    "parse_timeout",
    "pytest_command",
    "select_steps",
]

#: seconds each kind of step may run by default; each below the device tool's 10-minute cap
#: (``pytest-gpu``: each test module's step)
DEFAULT_TIMEOUTS: dict[str, float] = {
    "measure": 420,
    "page": 540,
    "pytest-gpu": 540,
    "compile-report": 300,
}

#: the limits (seconds, by step name or kind, the name winning) a planned pass gives its steps:
#: a few times the H100's timings (``gpu_pass.estimates``), so that a hung step is stopped
#: long before the command's end. The H100 (2026-11-26) took 16 s for the compile report, 4-98 s
#: a benchmark (profiling-case-study 75, scaling-study 98), 8, 35 and 194 s for the GPU tests of
#: test_mixed_precision, test_profiling and test_memory_hierarchy, 52-67 s a chapter
LIMITS: dict[str, float] = {
    "compile-report": 60,
    "pytest-gpu": 90,
    "pytest-gpu:test_memory_hierarchy": 240,
    "measure": 90,
    "measure:speedrun": 420,
    "measure:scaling-study": 150,
    "measure:profiling-case-study": 120,
    "measure:gpu-bound-case-study": 240,  # an estimate of 100 s; a baseline out of memory retries
    "page": 200,
}

#: seconds one GPU test may run (``pytest --timeout``, where pytest-timeout is installed) before
#: it fails as hung, so that it does not eat its module's step. Above the first build of the
#: CUDA extension (``trainfast.kernels.custom_ops``), which its first test pays: compiling its
#: two sources for sm_90 took 50 s on the 2-core build machine (2026-11-26)
PYTEST_TEST_TIMEOUT = 120


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """Test modules with ``@pytest.mark.gpu`` tests (collecting only them keeps it cheap).

    The mark must be in the code, not in a string (a test of this pass writes such a module).
    """
    return sorted(
        str(path.relative_to(root))
        for path in (root / "tests").glob("test_*.py")
        if "pytest.mark.gpu" in (source := path.read_text()) and _marks_gpu(source)
    )


def _marks_gpu(source: str) -> bool:
    """Whether ``source`` uses the attribute ``pytest.mark.gpu`` in its code."""
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == "gpu"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "pytest"
        for node in ast.walk(ast.parse(source))
    )


def default_steps(
    out: Path,
    device: str,
    quick: bool = False,
    records: Path | None = None,
    root: Path = ROOT,
) -> list[Step]:
    """Every step of the pass, in order: benchmarks, pages (:func:`executable_pages`, in the
    book's order), GPU tests (one step per test module, ``pytest-gpu:<module's stem>``, its JUnit
    XML in ``OUT/pytest-gpu/``), compile report.

    Benchmarks come first so that the pages executed after them render the new records (a
    planned pass orders them by value instead: :mod:`~trainfast.gpu_pass.schedule`).
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
    for page in executable_pages(root):
        source = root / "book" / f"{page}.md"
        arguments = ["--execute-chapter", str(source)]
        arguments += ["--notebook", str(out / "notebooks" / f"{page}.ipynb")]
        steps.append(own(f"page:{page}", "page", arguments, cwd=source.parent))
    pytest_env = {**env, "TRAINFAST_REPORT_FAILURES_AT_ONCE": "1"}  # see tests/conftest.py
    for module in gpu_test_files(root):
        stem = Path(module).stem
        junit = out / "pytest-gpu" / f"{stem}.xml"
        command = pytest_command(module, junit)
        timeout = DEFAULT_TIMEOUTS["pytest-gpu"]
        step = Step(f"pytest-gpu:{stem}", command, timeout, env=pytest_env, cwd=root, junit=junit)
        steps.append(step)
    steps.append(own("compile-report", "compile-report", ["--compile-report"]))
    return steps


def pytest_command(module: str, junit: Path) -> list[str]:
    """The command of step ``pytest-gpu:<module's stem>``: ``pytest -m gpu`` on one module.

    ``-v`` names each test as it finishes and ``-rfE --tb=short`` lists the failures at the end;
    the step's environment makes ``tests/conftest.py`` print each failure's traceback at once,
    so a step killed at its limit still has them in its log. Where ``pytest-timeout`` is
    importable, ``--timeout`` stops one hung test after :data:`PYTEST_TEST_TIMEOUT` seconds.
    """
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-rfE", "--tb=short"]
    command += ["-p", "no:cacheprovider", f"--junitxml={junit}"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        command.append(f"--timeout={PYTEST_TEST_TIMEOUT:g}")
    return [*command, module]


def _matches(step: Step, pattern: str) -> bool:
    """Whether ``pattern`` names ``step``: its name or kind, or for a page ``chapter`` (every
    page) or ``chapter:<chapter>`` (the pages of that chapter)."""
    if pattern in (step.name, step.kind):
        return True
    if step.kind != "page":
        return False
    return pattern == "chapter" or pattern == f"chapter:{page_chapter(step.name[len('page:') :])}"


def select_steps(steps: Sequence[Step], only: Sequence[str] | None) -> list[Step]:
    """The steps named by ``only`` (a step's full name or its kind), in the order named.

    Each step is placed by the first pattern that matches it, so ``["measure:speedrun",
    "measure"]`` runs the speedrun first, then the other benchmarks; the steps one kind matches
    keep their pass order. Without ``only``, every step in pass order. A pattern that names no
    step raises ``ValueError`` naming it, before anything runs.
    """
    if not only:
        return list(steps)
    unknown = [p for p in only if not any(_matches(s, p) for s in steps)]
    if unknown:
        known = sorted({s.kind for s in steps} | {s.name for s in steps})
        raise ValueError(f"No step named {unknown} (steps: {known})")
    chosen: dict[str, Step] = {}
    for pattern in only:
        for step in steps:
            if _matches(step, pattern):
                chosen.setdefault(step.name, step)
    return list(chosen.values())


def parse_timeout(setting: str) -> tuple[str, float]:
    """``--timeout``'s value as ``(step name or kind, or "" for every step, seconds)``.

    A value that is not ``SECONDS`` or ``NAME=SECONDS`` with a positive, finite number of seconds
    raises ``ValueError`` naming it.
    """
    pattern, _, value = setting.rpartition("=")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"Bad --timeout {setting!r}: expected SECONDS or NAME=SECONDS") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"Bad --timeout {setting!r}: seconds must be positive and finite")
    return pattern, seconds


def apply_timeouts(steps: Sequence[Step], settings: Sequence[str]) -> None:
    """Set time limits from ``--timeout`` values: ``SECONDS`` for all, ``NAME=SECONDS`` for some.

    Later settings win; a bad value raises ``ValueError`` naming it.
    """
    for setting in settings:
        pattern, seconds = parse_timeout(setting)
        chosen = [s for s in steps if not pattern or _matches(s, pattern)]
        if pattern and not chosen:
            raise ValueError(f"Bad --timeout {setting!r}: no step named {pattern!r}")
        for step in chosen:
            step.timeout = seconds
