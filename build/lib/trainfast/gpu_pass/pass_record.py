"""The evidence of a GPU pass, committed: a record like the others, one row per step.

Each pass writes ``book/records/gpu-pass--<device>--<gpu>.json`` (``gpu-pass--cuda--nvidia-h200``):
a :class:`~trainfast.records.Record` named ``gpu-pass`` whose environment is the machine's (its
GPU's own properties too) and whose rows are its steps: ``kind``, ``name``, ``status``,
``seconds``, ``finished`` (UTC), the page's ``environment`` line, the GPU tests' ``tests``
(counts and the tests that did not pass), a ``note`` (a failure's last line, the records a
benchmark wrote) and the ``source_commit`` of the code that ran. A later pass on the same kind
of GPU keeps the rows of the steps it did not run, so a pass split over two commands, or over
two sessions, adds up to one record, each row saying when it ran.

:func:`last_gpu_execution` answers, for a page, when and on which GPU it last executed and
whether every cell passed, for the line under the page's environment line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfast.device import Environment
from trainfast.gpu_pass.steps import Status, StepResult
from trainfast.records import Record, load_records, records_for, write_record

__all__ = [
    "PASS_RECORD",
    "PageExecution",
    "last_gpu_execution",
    "pass_record",
    "pass_record_row",
    "write_pass_record",
]

#: the name of a pass's record
PASS_RECORD = "gpu-pass"
_COLUMNS = [
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


def pass_record_row(result: StepResult, commit: str) -> dict[str, Any]:
    """The row of one step's result: what :data:`_COLUMNS` name, from the result and its details
    (``finished``, stamped by the pass when the step ended; ``environment``, the line a page
    printed; ``tests``, a pytest step's outcomes)."""
    details = result.details or {}
    note = ""
    if result.status is not Status.PASSED and result.error:
        last = [line for line in str(result.error).splitlines() if line.strip()]
        note = last[-1][:300] if last else ""
    elif details.get("records"):
        note = "wrote " + ", ".join(Path(str(p)).name for p in details["records"])  # type: ignore[union-attr]
    elif details.get("summary"):
        note = str(details["summary"])[:300]
    return {
        "kind": result.kind,
        "name": result.name,
        "status": result.status.value,
        "seconds": result.seconds,
        "finished": str(details.get("finished", "")),
        "environment": str(details.get("environment", "")),
        "tests": details.get("tests"),
        "note": note,
        "source_commit": commit,
    }


def pass_record(
    rows: list[dict[str, Any]],
    environment: Environment,
    command: str,
    earlier: Record | None = None,
) -> Record:
    """The pass's record: ``rows`` (this pass's steps), after the rows of ``earlier`` (the same
    GPU's record, if any) for the steps this pass did not run. Its ``created`` is the newest
    row's ``finished``."""
    from trainfast import __version__
    from trainfast.versions import source_commit

    names = {row["name"] for row in rows}
    kept = [row for row in (earlier.rows if earlier else []) if row["name"] not in names]
    every = kept + rows
    created = max((str(row["finished"]) for row in every if row.get("finished")), default="")
    return Record(
        name=PASS_RECORD,
        description=(
            "The GPU pass: each step (a page executed as a notebook, a module of GPU tests, a "
            "benchmark, the compile report), its status, seconds, when it finished, the page's "
            "environment line, the tests' results and the commit of the code that ran."
        ),
        columns=list(_COLUMNS),
        rows=every,
        environment=environment.as_dict(),
        created=created,
        command=command,
        units={"seconds": "s"},
        trainfast_version=__version__,
        source_commit=source_commit(),
    )


def write_pass_record(
    results: list[StepResult],
    environment: Environment,
    command: str,
    directory: Path,
    copy_to: Path | None = None,
) -> Path:
    """Write the pass's record of ``results`` into ``directory`` and a copy into ``copy_to``,
    merged with the record of the same device already in either (the copy in ``OUT/records``
    survives between two commands on one machine where the book's folder is copied afresh);
    returns its path."""
    from dataclasses import replace

    from trainfast.versions import source_commit

    commit = source_commit()
    rows = [pass_record_row(result, commit) for result in results]
    kept: dict[str, dict[str, Any]] = {}
    earlier = None
    for folder in [directory] + ([copy_to] if copy_to is not None else []):
        if not Path(folder).is_dir():  # no folder yet: no earlier pass to keep rows of
            continue
        for record in load_records(folder, PASS_RECORD):
            env = record.environment
            if (env.get("device"), env.get("device_name")) != (
                environment.device,
                environment.device_name,
            ):
                continue
            earlier = earlier or record
            for row in record.rows:
                if str(row.get("finished", "")) >= str(
                    kept.get(row["name"], {}).get("finished", "")
                ):
                    kept[row["name"]] = row
    if earlier is not None:
        earlier = replace(earlier, rows=list(kept.values()))
    record = pass_record(rows, environment, command, earlier)
    path = write_record(record, directory)
    if copy_to is not None:
        write_record(record, copy_to)
    return path


@dataclass(frozen=True)
class PageExecution:
    """When and where a page last executed on a GPU, and whether every cell passed.

    ``passed`` is True when its step passed (every cell ran, on the expected device); ``status``
    is the step's (``failed``, ``timed out``, ...); ``note`` a failure's last line.
    """

    page: str
    gpu: str
    finished: str
    passed: bool
    status: str
    environment: str
    source_commit: str
    note: str = ""

    def sentence(self) -> str:
        """One line for the page: ``Last executed on an NVIDIA H200 on 2026-12-02 at 1a2b3c4:
        every cell passed.``"""
        commit = f" at {self.source_commit[:7]}" if self.source_commit else ""
        verdict = (
            "every cell passed" if self.passed else f"it {self.status}: {self.note}".rstrip(": ")
        )
        return f"Last executed on the {self.gpu} on {self.finished[:10]}{commit}: {verdict}."


def last_gpu_execution(page: str, directory: str | Path | None = None) -> PageExecution | None:
    """When and on which GPU ``page`` (a name under ``book/``: ``optimizers``,
    ``optimizers/momentum``) last executed in a GPU pass, and whether every cell passed; None
    if no pass record has it (the page never executed on CUDA).

    Read from every ``gpu-pass`` CUDA record in ``directory`` (default ``book/records``); the
    newest row of the page's step wins, whichever GPU ran it. A row that was not run (the pass's
    time was spent) is no execution.
    """
    if not isinstance(page, str) or not page.strip() or page.endswith(".md"):
        raise ValueError(f"Invalid page: {page!r} (a name under book/, e.g. 'optimizers/momentum')")
    found: list[tuple[str, Record, dict[str, Any]]] = []
    for record in records_for(PASS_RECORD, "cuda", directory):
        for row in record.rows:
            if row.get("name") == f"page:{page}" and row.get("status") != Status.NOT_RUN.value:
                found.append((str(row.get("finished") or record.created), record, row))
    if not found:
        return None
    finished, record, row = max(found, key=lambda item: item[0])
    return PageExecution(
        page=page,
        gpu=record.device_name,
        finished=finished,
        passed=row["status"] == Status.PASSED.value,
        status=str(row["status"]),
        environment=str(row.get("environment", "")),
        source_commit=str(row.get("source_commit", "")),
        note=str(row.get("note", "")),
    )
