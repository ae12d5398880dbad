"""Each GPU test's result, from the JUnit XML a ``pytest-gpu`` step writes, or from its log.

pytest writes ``--junitxml`` when the run ends; a step killed at its limit leaves none, but its
``-v`` log names every test as it finishes (``tests/test_x.py::test_y PASSED``), so the results
so far are read from there. :func:`junit_outcomes` gives the counts and the names of the tests
that did not pass, which the pass record keeps per module.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

__all__ = ["junit_outcomes"]

#: a ``-v`` line: ``tests/test_x.py::test_y[case] PASSED`` (xdist's ``[gw0] PASSED ...`` too)
_VERBOSE = re.compile(
    r"^(?:\[gw\d+\] )?(?:\[\s*\d+%\] )?(?P<id>\S+::\S+) (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|"
    r"XFAIL|XPASS)\b"
)
_OUTCOMES = {
    "PASSED": "passed",
    "FAILED": "failed",
    "ERROR": "errors",
    "SKIPPED": "skipped",
    "XFAIL": "skipped",
    "XPASS": "passed",
}


def _empty(source: str) -> dict[str, Any]:
    return {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "not_passed": [], "from": source}


def junit_outcomes(junit: Path, log: Path | None = None) -> dict[str, Any]:
    """Counts of the tests a pytest step ran (``passed``, ``failed``, ``errors``, ``skipped``)
    and ``not_passed``: each failed, erroring or skipped test's id with its outcome (and a
    skip's reason). From ``junit`` where pytest wrote it, else from the ``-v`` lines of
    ``log`` (``from`` says which; a killed step's log holds the tests finished before it)."""
    if junit.exists():
        try:
            return _from_junit(junit)
        except ElementTree.ParseError:
            pass  # half-written: the log knows as much
    outcomes = _empty("log")
    if log is None or not log.exists():
        outcomes["from"] = "nothing (no JUnit XML and no log)"
        return outcomes
    for line in log.read_text(errors="replace").splitlines():
        line = line.split("] ", 1)[1] if line.startswith("[pytest-gpu:") else line
        match = _VERBOSE.match(line.strip())
        if match:
            outcome = _OUTCOMES[match["outcome"]]
            outcomes[outcome] += 1
            if outcome != "passed":
                outcomes["not_passed"].append(f"{match['id']} {match['outcome']}")
    return outcomes


def _from_junit(junit: Path) -> dict[str, Any]:
    outcomes = _empty("junit")
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        children = {child.tag: child for child in case}
        if "failure" in children:
            outcome, label = "failed", "FAILED"
        elif "error" in children:
            outcome, label = "errors", "ERROR"
        elif "skipped" in children:
            reason = children["skipped"].get("message", "")
            outcome, label = "skipped", f"SKIPPED ({reason})" if reason else "SKIPPED"
        else:
            outcome, label = "passed", ""
        outcomes[outcome] += 1
        if label:
            outcomes["not_passed"].append(f"{test} {label}")
    return outcomes
