"""The pass's summary: ``OUT/summary.json`` (the record) and ``OUT/summary.md`` (to read).

A later pass into the same ``OUT`` keeps the steps it does not re-run, so a pass split over
several calls (``--only``, ``--budget``) adds up to one summary. Both files are written
atomically (a temporary file beside them, then a rename), so a pass killed while writing leaves
the previous summary whole; a summary that cannot be read anyway (written by hand, or by an old
version) stops the pass with an error naming the file instead of being replaced, which would
drop the earlier steps' results.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trainfast.gpu_pass.steps import Status, StepResult

__all__ = ["SummaryError", "read_summary", "settled_steps", "write_summary"]

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
#: what every step of a summary has (:meth:`StepResult.as_dict` writes them)
STEP_KEYS = frozenset({"name", "status", "seconds", "timeout", "log"})


class SummaryError(ValueError):
    """An earlier ``summary.json`` that cannot be read; the message names the file."""


def read_summary(out: Path) -> list[dict[str, object]]:
    """The steps an earlier pass recorded in ``out/summary.json`` (none if there is no file).

    Raises :class:`SummaryError` naming the file when it is not a summary (truncated JSON, no
    ``steps`` list, a step without a name or status).
    """
    path = out / SUMMARY_JSON
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise SummaryError(
            f"{path} is not valid JSON ({error}); it holds an earlier pass's results, so it is "
            "not replaced: repair or move it, then run again"
        ) from None
    steps = data.get("steps") if isinstance(data, dict) else None
    valid = isinstance(steps, list) and all(
        isinstance(s, dict) and isinstance(s.get("name"), str) and STEP_KEYS <= s.keys()
        for s in steps
    )
    if not valid:
        raise SummaryError(
            f"{path} is not a GPU-pass summary (expected an object whose 'steps' list holds "
            f"steps with {sorted(STEP_KEYS)}); move it, then run again"
        )
    return steps


def settled_steps(out: Path) -> set[str]:
    """Names of the steps an earlier call into ``out`` finished (passed, or not available)."""
    settled = {Status.PASSED.value, Status.NOT_AVAILABLE.value}
    return {str(s["name"]) for s in read_summary(out) if s["status"] in settled}


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename, so a
    reader (or the next pass) sees the old file or the new one, never half of one."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_summary(out: Path, results: Sequence[StepResult], header: dict[str, object]) -> Path:
    """Write ``summary.json`` and ``summary.md`` into ``out``, keeping earlier steps not re-run.

    Returns the path of the Markdown summary. An earlier summary that cannot be read raises
    :class:`SummaryError` (see :func:`read_summary`) and nothing is written.
    """
    out.mkdir(parents=True, exist_ok=True)
    earlier = read_summary(out)
    names = {r.name for r in results}
    steps = [s for s in earlier if s["name"] not in names] + [r.as_dict() for r in results]
    counts = {status.value: sum(s["status"] == status.value for s in steps) for status in Status}
    summary = {**header, "counts": counts, "steps": steps}
    write_atomically(out / SUMMARY_JSON, json.dumps(summary, indent=2) + "\n")
    markdown = out / SUMMARY_MD
    write_atomically(markdown, summary_markdown(steps, counts, header))
    return markdown


def summary_markdown(
    steps: Sequence[dict[str, object]], counts: dict[str, int], header: dict[str, object]
) -> str:
    """``summary.md``: a table of the steps, then the end of each unfinished step's output."""
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
    for s in steps:
        if s["status"] == Status.PASSED.value:
            continue
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
    return "\n".join(lines) + "\n"
