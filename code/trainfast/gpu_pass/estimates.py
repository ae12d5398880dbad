"""How long each step of a GPU pass takes: one table, each figure with where it comes from.

:data:`ESTIMATES` holds the timings of the last pass that recorded them, the H100's of
2026-11-26 (its records' ``created`` times, commit messages, ``.ci/gpu-call.sh``'s comments), and
what the issues size; :data:`OVERHEADS` the device machine's own costs (the device tool's notes).
A later pass's record (``book/records/gpu-pass--cuda--<gpu>.json``) is newer evidence:
:func:`estimate_for` takes a step's seconds from it first (:func:`recorded_estimates`).

These are estimates for planning, not measurements the book shows. The H100's benchmark times
are gaps between consecutive records' ``created`` times in one call, so each includes a process
start and reads as an upper bound; its chapter times were taken four side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainfast.gpu_pass.pages import page_chapter
from trainfast.gpu_pass.steps import Step

__all__ = [
    "ESTIMATES",
    "OVERHEADS",
    "Estimate",
    "PAGE_START_SECONDS",
    "estimate_for",
    "recorded_estimates",
]


@dataclass(frozen=True)
class Estimate:
    """Seconds a step (or an overhead) is expected to take, and where the figure comes from."""

    seconds: float
    source: str


_H100 = "H100 pass of 2026-11-26"
_GAP = f"{_H100}, gap between records' created times"
_CASE = f"{_H100}, second run (460b4ff)"
_TESTS = f"{_H100}, second run (a35046b)"
_REVIEW = "readiness review 2026-12-01, §4.5 (an estimate, not a timing)"

#: step name (or kind, for the steps of a kind without their own figure) -> estimate
ESTIMATES: dict[str, Estimate] = {
    # benchmarks (record timestamps, 14:59:07 to 15:08:34; the first benchmark of a call has
    # no gap before it and takes the kind's figure)
    "measure:optimizer-step-time": Estimate(40, f"{_H100}: as muon-vs-adamw, the first of a call"),
    "measure:muon-vs-adamw": Estimate(40, _GAP),
    "measure:matmul-throughput": Estimate(33, _GAP),
    "measure:precision-step-time": Estimate(36, _GAP),
    "measure:autocast-policy": Estimate(10, _GAP),
    "measure:matmul-error": Estimate(8, _GAP),
    "measure:copy-bandwidth": Estimate(8, _GAP),
    "measure:matmul-tiles": Estimate(
        19,
        f"{_GAP}, and 2 s more for QUANTISATION_SIZES (issue 48, an estimate, not a timing: "
        "78 products of about 0.3 ms and their inputs; every size a multiple of 16, so no new "
        "specialisation to compile)",
    ),
    "measure:attention-forward": Estimate(36, _GAP),
    "measure:attention-fwd-bwd": Estimate(19, _GAP),
    "measure:roofline": Estimate(6, _GAP),
    "measure:strided-access": Estimate(14, _GAP),
    "measure:host-transfers": Estimate(98, f"{_GAP} (may include a call's start)"),
    "measure:fused-linear-gelu": Estimate(20, _GAP),
    "measure:activation-checkpointing": Estimate(18, _GAP),
    "measure:caching-allocator": Estimate(4, _GAP),
    "measure:allocator-snapshot": Estimate(9, _GAP),
    "measure:timing-pitfalls": Estimate(11, _GAP),
    "measure:launch-overhead": Estimate(15, _GAP),
    "measure:compile-time": Estimate(58, _GAP),
    "measure:compile-by-width": Estimate(30, _GAP),
    "measure:copy-compute-overlap": Estimate(77, f"{_GAP} (may include a killed step)"),
    "measure:profiling-case-study": Estimate(75, _CASE),
    "measure:scaling-study": Estimate(98, _CASE),
    "measure:gpu-bound-case-study": Estimate(
        100,
        "issue 47's sizing, an estimate, not a timing: 78 steps at the H200's predicted step "
        "times (31 s at batch 53), a cold Inductor compile of GPT-2 small's step (about 45 s, "
        "three times the case study's 12 s on the H100 for three times the layers), a process "
        "start and the models' builds",
    ),
    "measure:speedrun": Estimate(360, "issue 50: the speedrun's GPU log, sized to about 6 min"),
    "measure": Estimate(
        58,
        f"{_H100}: the slowest benchmark gap but host-transfers (98) and copy-compute-overlap (77)",
    ),
    # the process-group benchmarks are "not available" on one GPU: a process start
    "measure:all-reduce-time": Estimate(5, "not available on one GPU: a process start"),
    "measure:ddp-overlap": Estimate(5, "not available on one GPU: a process start"),
    "measure:launcher-failure": Estimate(5, "not available on one GPU: a process start"),
    "measure:launcher-restart": Estimate(5, "not available on one GPU: a process start"),
    # GPU tests, one module a step
    "pytest-gpu:test_mixed_precision": Estimate(8, _TESTS),
    "pytest-gpu:test_profiling": Estimate(35, _TESTS),
    "pytest-gpu:test_memory_hierarchy": Estimate(194, _TESTS),
    "pytest-gpu:test_compile_report": Estimate(40, f"{_REVIEW}: a live torch.compile"),
    "pytest-gpu:test_accounting": Estimate(15, _REVIEW),
    "pytest-gpu": Estimate(
        15, f"{_REVIEW}: test_accounting's 15 s, taken for a module without a timing"
    ),
    "compile-report": Estimate(16, f"{_H100} (README, .ci/gpu-call.sh)"),
    # a chapter that is one page: the H100's chapters that ran to the end, four side by side
    "page": Estimate(67, f"{_H100}: the slowest chapter that finished, 52-67 s, 4 side by side"),
}

#: seconds a section page pays on top of its share of its chapter's time: its own kernel start
#: and imports of torch and trainfast (an estimate; about 10 s on the 2-core build machine)
PAGE_START_SECONDS = 10.0

#: the device machine's own costs
OVERHEADS: dict[str, Estimate] = {
    "machine start": Estimate(120, "device tool notes: a machine's start takes 1-2 minutes"),
    "install wheels": Estimate(30, _REVIEW),
    "transfer": Estimate(20, f"{_REVIEW}: the tree there and $OUT back, per command"),
    "between commands": Estimate(
        30, "device tool notes: a machine stays warm 30 s after a call, then goes back"
    ),
    "give back": Estimate(10, "an allowance for handing the machine back"),
}


def recorded_estimates(directory: Path) -> dict[str, Estimate]:
    """Each step's seconds in the newest GPU pass record in ``directory`` that has any
    (``gpu-pass--cuda--*.json``), as estimates naming that record; an empty dict where there is
    none. Steps that did not finish (timed out, not run) say nothing of their time and are
    left out."""
    from trainfast.records import records_for

    newest: dict[str, Estimate] = {}
    if not Path(directory).is_dir():  # a folder not made yet holds no pass record
        return newest
    for record in sorted(records_for("gpu-pass", "cuda", directory), key=lambda r: r.created):
        source = f"gpu-pass record, {record.device_name}, {record.created[:10]}"
        for row in record.rows:
            if row.get("status") in ("passed", "failed") and row.get("seconds"):
                newest[str(row["name"])] = Estimate(float(row["seconds"]), source)
    return newest


def estimate_for(
    step: Step,
    recorded: dict[str, Estimate] | None = None,
    pages_of: dict[str, int] | None = None,
) -> Estimate:
    """The estimate of ``step``: its own recorded time (``recorded``, from
    :func:`recorded_estimates`), else its own entry of :data:`ESTIMATES`, else its kind's.

    A section page without either gets its chapter's estimate shared among the chapter's pages
    (``pages_of``: chapter -> number of pages) plus :data:`PAGE_START_SECONDS`: the H100's
    timings are of whole chapters.
    """
    recorded = recorded or {}
    for table in (recorded, ESTIMATES):
        if step.name in table:
            return table[step.name]
    if step.kind == "page":
        page = step.name.split(":", 1)[1]
        chapter = page_chapter(page)
        whole = recorded.get(f"page:{chapter}") or ESTIMATES["page"]
        n = (pages_of or {}).get(chapter, 1)
        if n > 1:
            seconds = whole.seconds / n + PAGE_START_SECONDS
            return Estimate(round(seconds, 1), f"{whole.source}, shared by its {n} pages")
        return whole
    if step.kind in ESTIMATES:
        return ESTIMATES[step.kind]
    raise ValueError(f"No estimate for step {step.name!r} (kind {step.kind!r})")
