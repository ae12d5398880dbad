"""What the pass's steps run, each in its own process (``python -m trainfast.gpu_pass --...``).

A benchmark (:func:`run_benchmark`), a chapter executed as a notebook (:func:`execute_chapter`)
and the live compile report (:func:`compile_report_rows`). Each writes the facts the summary
shows (the records written, the environment line, the report's rows) into a small JSON file, the
step's ``result_file``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path

from trainfast.gpu_pass.pages import page_chapter
from trainfast.gpu_pass.steps import NOT_AVAILABLE_EXIT

__all__ = [
    "CPU_CHAPTERS",
    "compile_report_rows",
    "execute_chapter",
    "expected_device_problem",
    "expected_devices",
    "run_benchmark",
    "run_chapter",
    "run_compile_report",
    "write_result",
]


def write_result(path: Path | None, data: dict[str, object]) -> None:
    """Write a step's facts for the summary into ``path`` (nothing if None)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")


#: chapters (or single pages) that may run on the CPU on any machine, and why: their pages pass
#: on the CPU or on the pass's device
CPU_CHAPTERS = {
    "speedrun": "its pages read the study's CPU record and run the tiny preset on the CPU; the GPU "
    "preset runs as the speedrun benchmark",
}


def expected_devices(page: str, device: str) -> tuple[str, ...]:
    """The devices ``page`` (a name under ``book/``) may print in its environment line on a pass
    on ``device``: ``device``, and the CPU for a page of :data:`CPU_CHAPTERS`."""
    if page in CPU_CHAPTERS or page_chapter(page) in CPU_CHAPTERS:
        return tuple(dict.fromkeys(("cpu", device)))
    return (device,)


def expected_device_problem(line: str, device: str | tuple[str, ...]) -> str | None:
    """Why a page's environment line shows it did not run on ``device`` (or on one of several),
    or None."""
    devices = (device,) if isinstance(device, str) else tuple(device)
    if not line:
        return "no environment line (no cell printed environment_line(device))"
    if not any(line.startswith(f"device: {d}") for d in devices):
        expected = " or ".join(repr(d) for d in devices)
        return f"ran on {line.split('|')[0].strip()!r}, expected {expected}"
    return None


def execute_chapter(
    chapter: Path, notebook: Path, timeout: float = 1800, result: Path | None = None
) -> dict[str, object]:
    """Execute a MyST chapter as a notebook (jupytext, then nbclient) and save it executed.

    The kernel is this interpreter (``ipykernel`` from wherever it is importable, e.g. a
    ``--target`` folder on ``PYTHONPATH``), named by a kernel spec written into a temporary
    folder, so no kernel needs to be installed. The notebook is saved even when a cell fails.
    Returns (and writes to ``result``) the environment line a cell printed and the
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
        facts: dict[str, object] = {"page": _page_name(chapter), "notebook": str(notebook)}
        try:
            client.execute()
        finally:
            facts["seconds"] = round(time.perf_counter() - start, 2)
            facts["environment"] = _environment_line(nb)
            notebook.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, notebook)
            write_result(result, facts)
    return facts


def _environment_line(nb: object) -> str:
    """The first line a code cell printed that starts as ``environment_line`` starts
    ("device: "): the chapter's environment line, in whichever cell it is (a chapter may open
    with a table)."""
    for cell in getattr(nb, "cells", []):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                for line in str(output.get("text", "")).splitlines():
                    if line.startswith("device: "):
                        return line.strip()
    return ""


def run_benchmark(name: str, args: argparse.Namespace) -> int:
    """Run benchmark ``name`` through ``trainfast.measure`` and copy the records it wrote."""
    import torch

    from trainfast import measure

    reason = measure.not_on_this_gpu(name, torch.device(args.device))
    if reason is not None:  # "not available", not a failure: a one-GPU machine cannot run it
        print(reason)
        write_result(args.result, {"summary": reason})
        return NOT_AVAILABLE_EXIT
    before = time.time()
    argv = ["--out", str(args.records), "--only", name, "--device", args.device]
    status = measure.main(argv + (["--quick"] if args.quick else []))
    written = sorted(p for p in args.records.glob(f"{name}--*.json") if p.stat().st_mtime >= before)
    if args.copy_to is not None:
        args.copy_to.mkdir(parents=True, exist_ok=True)
        for path in written:
            (args.copy_to / path.name).write_bytes(path.read_bytes())
    write_result(args.result, {"records": [str(p) for p in written]})
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


def run_compile_report(args: argparse.Namespace) -> int:
    """Print the live compile report's rows; exit status ``NOT_AVAILABLE_EXIT`` where there is
    none."""
    rows = compile_report_rows(args.device)
    if isinstance(rows, str):
        print(rows)  # contains "not available"
        write_result(args.result, {"summary": rows})
        return NOT_AVAILABLE_EXIT
    for row in rows:
        print(json.dumps(row))
    write_result(args.result, {"summary": f"{len(rows)} kernels compiled", "rows": rows})
    return 0


def _page_name(path: Path) -> str:
    """``path``'s page name: its path under the nearest ``book`` folder above it, without
    ``.md`` (its stem where there is none)."""
    path = Path(path).resolve()
    parts = path.with_suffix("").parts
    if "book" in parts:
        start = len(parts) - 1 - parts[::-1].index("book")
        return "/".join(parts[start + 1 :])
    return path.stem


def run_chapter(args: argparse.Namespace) -> int:
    """Execute ``--execute-chapter`` into ``--notebook``; fail if a cell fails or the chapter's
    environment line shows another device than ``--device`` (the CPU for :data:`CPU_CHAPTERS`)."""
    from nbclient.exceptions import CellExecutionError

    try:
        facts = execute_chapter(args.execute_chapter, args.notebook, result=args.result)
    except CellExecutionError as error:
        print(error, file=sys.stderr)
        return 1
    line = str(facts["environment"])
    print(line)
    problem = expected_device_problem(
        line, expected_devices(_page_name(args.execute_chapter), args.device)
    )
    if problem:
        write_result(args.result, {**facts, "problem": problem})
        print(problem, file=sys.stderr)
        return 1
    return 0
