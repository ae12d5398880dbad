"""The versions the package supports, and a clear error for a combination known not to work.

The package needs torch 2.4 or newer (``pyproject.toml``); CI runs its tests on CPU with torch
2.4 (the floor) and 2.11 (the GPU machine's), and the book is built with the pins in
``requirements.txt`` (torch 2.14.1). README's "Supported versions" table is the matrix.

One combination fails in a way a user cannot read: Triton's CPU interpreter
(``TRITON_INTERPRET=1``, which :mod:`trainfast.kernels` turns on where there is no GPU) with
NumPy 2. With Triton 3.6 (torch 2.11's) and NumPy 2.4, 28 kernel tests fail inside the
interpreter with "only 0-dimensional arrays can be converted to Python scalars"; with NumPy 1.26
they pass, as they do with Triton 3.8 (torch 2.14's). :func:`interpreter_problem` names that
combination before a kernel runs; Triton on a GPU is not affected.

The compile report (:mod:`trainfast.kernels.compile_report`) drives Triton's launch internals
(``triton.knobs``, ``JITFunction._pack_args``, the backend argument of
``create_function_from_signature``), which are private and change between releases: Triton 3.0
(torch 2.4's) has none of them. :func:`compile_report_problem` names a Triton older than the
oldest one the report was run with.

A record's provenance names the code that measured it: :func:`source_commit`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = [
    "COMPILE_REPORT_TRITON_FLOOR",
    "TORCH_FLOOR",
    "compile_report_problem",
    "interpreter_problem",
    "parse_version",
    "source_commit",
]

#: The oldest torch the package supports (``pyproject.toml``'s ``torch>=2.4``).
TORCH_FLOOR = (2, 4)
#: The newest Triton whose interpreter is known to fail with NumPy 2 (3.6, shipped with torch
#: 2.11). Older Triton versions are treated alike: none was shown to work with NumPy 2.
LAST_TRITON_FAILING_WITH_NUMPY_2 = (3, 6)
#: The oldest Triton the compile report has run with (3.6, torch 2.11's; also 3.8, torch 2.14's).
COMPILE_REPORT_TRITON_FLOOR = (3, 6)


def parse_version(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``"3.6.0"`` or ``"2.11.0+cu126"``."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        raise ValueError(f"Unreadable version: {version!r} (expected MAJOR.MINOR...)") from None


def interpreter_problem(triton_version: str, numpy_version: str) -> str | None:
    """Why Triton ``triton_version``'s CPU interpreter will not run with NumPy ``numpy_version``,
    naming both and the fix; None for a combination not known to fail."""
    triton, numpy = parse_version(triton_version), parse_version(numpy_version)
    if numpy >= (2, 0) and triton <= LAST_TRITON_FAILING_WITH_NUMPY_2:
        return (
            f"Triton {triton_version}'s CPU interpreter (TRITON_INTERPRET=1) does not work with "
            f"NumPy {numpy_version}: its kernels fail with 'only 0-dimensional arrays can be "
            "converted to Python scalars'. Install NumPy < 2 (pip install 'numpy<2'; the book "
            "pins 1.26.4), or run the kernels on a GPU. Supported versions: README.md."
        )
    return None


def compile_report_problem(triton_version: str) -> str | None:
    """Why the compile report cannot run with Triton ``triton_version``, naming it; None if it can.

    The kernels themselves run on older Triton; only the ahead-of-time compile report needs it.
    """
    if parse_version(triton_version) < COMPILE_REPORT_TRITON_FLOOR:
        floor = ".".join(map(str, COMPILE_REPORT_TRITON_FLOOR))
        return (
            f"The compile report needs Triton {floor} or newer (it drives Triton's private launch "
            f"internals, which Triton {triton_version} does not have); this Triton can still run "
            f"the kernels. Install torch 2.11 or newer (Triton {floor}+) to compile the report. "
            "Supported versions: README.md."
        )
    return None


#: the repository this package was imported from, when it runs from a checkout
_CHECKOUT = Path(__file__).resolve().parents[2]


def source_commit(checkout: Path = _CHECKOUT) -> str:
    """The commit of the code that is running, for a record's provenance.

    In order: the ``TRAINFAST_COMMIT`` environment variable (set where the code is a copy
    without its git history, e.g. on the GPU machine: ``.ci/gpu-call.sh`` reads it from
    ``.whl/COMMIT``); else ``git rev-parse HEAD`` of ``checkout`` when it is the top of a git
    repository, with ``+dirty`` appended when ``git status`` shows tracked files under ``code/``
    changed; else ``""``. ``trainfast.__version__`` cannot say this: from a source tree that
    was not installed it is ``0.0.0+unknown``.
    """
    given = os.environ.get("TRAINFAST_COMMIT", "").strip()
    if given:
        return given

    def git(*arguments: str) -> str:
        run = subprocess.run(
            ["git", "-C", str(checkout), *arguments],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return run.stdout.strip()

    try:
        top, head = git("rev-parse", "--show-toplevel", "HEAD").splitlines()
        if Path(top).resolve() != checkout.resolve():
            return ""  # a repository around this folder (a venv inside a project), not ours
        changed = git("status", "--porcelain", "--untracked-files=no", "--", "code")
    except (OSError, ValueError, subprocess.SubprocessError):
        return ""  # no git, not a repository, or no commit yet
    return head + ("+dirty" if changed else "")
