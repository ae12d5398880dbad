"""Shared pytest set-up: the chapter harness lives in tests/chapters.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# W&B must never stop to ask for a login during tests; a key in the environment still wins.
os.environ.setdefault("WANDB_MODE", "offline" if not os.environ.get("WANDB_API_KEY") else "online")
os.environ.setdefault("WANDB_SILENT", "true")

sys.path.insert(0, str(Path(__file__).parent))  # `import chapters` from any test module

# Under pytest-xdist each worker is one process per core: a worker that also ran torch's intra-op
# pool on every core would put N workers x N threads on N cores, and small ops then spend their
# time waiting for each other (the suite ran 2x slower that way on 2 cores). One thread per
# worker, and for the processes it starts (gloo ranks, chapter kernels), which read the variable.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


#: (chapter, seconds) that xdist workers reported (their EXECUTION_TIMES live in their process)
_WORKER_TIMES: list[tuple[str, float]] = []
_REPORTED = 0


def pytest_runtest_makereport(item, call):  # noqa: ARG001
    """On an xdist worker: send the chapters executed since the last report to the controller."""
    global _REPORTED
    from chapters import EXECUTION_TIMES

    if os.environ.get("PYTEST_XDIST_WORKER") and len(EXECUTION_TIMES) > _REPORTED:
        for name, seconds in EXECUTION_TIMES[_REPORTED:]:
            item.user_properties.append(("chapter_execution", (name, seconds)))
        _REPORTED = len(EXECUTION_TIMES)


def pytest_runtest_logreport(report):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for key, value in getattr(report, "user_properties", []):
        if key == "chapter_execution" and tuple(value) not in _WORKER_TIMES:
            _WORKER_TIMES.append(tuple(value))


class FailuresAtOnce:
    """Print a failing test's report (its traceback) the moment it fails, not at the end.

    pytest prints tracebacks after the last test, so a run killed at a time limit (a step of
    ``python -m trainfast.gpu_pass``, which sets ``TRAINFAST_REPORT_FAILURES_AT_ONCE=1``) would
    leave only the names of the failures. Registered by :func:`pytest_configure` when that
    variable is ``1``.
    """

    def __init__(self, config) -> None:
        self.config = config

    @pytest.hookimpl(trylast=True)  # after the reporter's own "FAILED" for the test
    def pytest_runtest_logreport(self, report) -> None:
        if not report.failed:
            return
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None:
            return
        terminal.ensure_newline()
        terminal.write_sep("-", f"{report.nodeid} failed ({report.when})", red=True)
        terminal.write_line(report.longreprtext)
        terminal.write_sep("-", f"end of {report.nodeid}")


def pytest_configure(config):
    if os.environ.get("TRAINFAST_REPORT_FAILURES_AT_ONCE") == "1":
        config.pluginmanager.register(FailuresAtOnce(config), "trainfast-failures-at-once")


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    from chapters import EXECUTION_TIMES

    times = EXECUTION_TIMES + _WORKER_TIMES
    if times:
        terminalreporter.section("chapters executed as notebooks on this machine")
        for name, seconds in times:
            terminalreporter.write_line(f"{name}: {seconds:.1f} s")


# --- running in parallel (pytest-xdist; `make test` runs `-n auto --dist loadgroup`) -------------
#
# Tests that need something only one of them may hold at a time share an `xdist_group`, and
# `--dist loadgroup` runs a group's tests on one worker, one after another:
# - "chromium": the browser tests (one headless chromium, one port for the site's server);
# - "chapter-<name>": every test that executes chapter <name> (or takes the build's execution),
#   so that a chapter executes at most once per run, on one worker (tests/chapters.py caches it
#   per process);
# - "api-build": the tests of the API reference's small Sphinx build (test_api_reference.py);
# - "ports": tests that start torchrun or its launcher benchmarks, which listen on TCP ports;
# - "compile-report": test_compile_report.py, whose module-scoped reports (55 Triton kernels
#   compiled for GPUs this machine lacks, about 45 s cold) would otherwise be compiled by every
#   worker that runs one of its tests, each missing the results the other has not yet written.
# Gloo tests through trainfast.distributed.spawn need no group: its ranks meet through a file://
# store in a fresh temporary folder, and gloo's own sockets take ports the OS assigns.
_CHROMIUM_MODULES = {"test_site", "test_site_layout", "test_calculator_widget"}
_PORT_WORDS = ("torchrun", "launcher", "restart", "tcp://", "MASTER_PORT")


def exclusive_group(item) -> str | None:
    """The xdist group ``item`` must run in (see above), or None."""
    import inspect

    module = item.module.__name__.rpartition(".")[2] if getattr(item, "module", None) else ""
    if module in _CHROMIUM_MODULES:
        return "chromium"
    if module == "test_compile_report":
        return "compile-report"
    if "small_build" in getattr(item, "fixturenames", ()):
        return "api-build"  # the API reference's small Sphinx build, about 90 s: built once
    if item.get_closest_marker("chapter") is not None:
        params = getattr(getattr(item, "callspec", None), "params", {})
        name = params.get("name") if isinstance(params.get("name"), str) else None
        return f"chapter-{name or module.removeprefix('test_')}"
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError, AttributeError):
        source = ""
    if any(word in item.nodeid or word in source for word in _PORT_WORDS):
        return "ports"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into node ids
def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    for item in items:
        group = exclusive_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
