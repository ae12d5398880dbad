"""Every page executes top to bottom as a notebook on this CPU, within its budget of CPU time,
and types no number into its prose that code produced.

One test for every executable page of ``_toc.yml`` (:func:`book_site.notebook_pages`: a chapter
that is one page, or each section page of a chapter that is a folder), parametrised by its
name: ``pytest tests/test_chapters.py -m chapter -k optimizers`` executes the chapter's pages. A
cell that raises fails it; so does a page over its budget. The budget is in CPU seconds of the
page's kernel (and the processes it waits for), not in wall-clock seconds: on a machine busy with
other work a page takes longer but uses about the same CPU, and a timed test must not fail because
the machine is busy (:func:`budget_problem`). The wall-clock time is reported beside it.
:func:`chapters.execute_chapter` takes the notebook ``make book`` executed when it is provably
current, so each page runs once per ``make book`` + ``make test``. What a page's notebook must
contain (solutions, glued values) is checked by the chapter's own ``test_<chapter>.py`` and by
``test_exercises.py``, on the same execution.
"""

from __future__ import annotations

import re

import book_site
import chapters
import pytest

PAGES = book_site.notebook_pages()
APPENDICES = ["appendix/launching", "appendix/sweep_agents"]
#: CPU seconds a section page may take to execute on this CPU (the sections issue's budget).
PAGE_BUDGET_CPU_SECONDS = 60


#: Pages over the page budget, each with its CPU seconds and why; a page leaves this table when
#: it fits. profiling/case_study compiles its model from scratch on a fresh clone (the build's
#: Inductor cache, _build/torchinductor, is empty there): 95 s of CPU in the fresh clone of
#: 041d867, 31 s with the cache warm. The cold compile is the page's own measurement (its
#: compile-time paragraph reads it), so it stays until the page reads it from a record.
OVER_BUDGET_CPU_SECONDS = {"profiling/case_study": 120}


def budget_cpu_seconds(page: str) -> float:
    """The CPU seconds page ``page`` may take: the page budget (every chapter is a folder of
    section pages now, since issues 46-50), or its entry in :data:`OVER_BUDGET_CPU_SECONDS`."""
    return OVER_BUDGET_CPU_SECONDS.get(page, PAGE_BUDGET_CPU_SECONDS)


def test_every_page_over_the_budget_exists_and_is_named_with_a_reason() -> None:
    assert set(OVER_BUDGET_CPU_SECONDS) <= set(PAGES), "a page that is gone is still excused"
    assert all(seconds > PAGE_BUDGET_CPU_SECONDS for seconds in OVER_BUDGET_CPU_SECONDS.values())


def budget_problem(page: str, execution: chapters.Execution, budget: float) -> str | None:
    """Why ``execution`` of ``page`` breaks its ``budget`` of CPU seconds, or None.

    An execution whose CPU time was not recorded (a cache filled by another tool) is judged by
    its wall-clock time, an upper bound of the CPU time only on an idle machine, so the message
    says so.
    """
    if execution.cpu_seconds is None:
        if execution.seconds <= budget:
            return None
        return (
            f"{page} took {execution.seconds:.0f} s of wall-clock time (its CPU time was not "
            f"recorded); the budget is {budget:.0f} CPU seconds"
        )
    if execution.cpu_seconds <= budget:
        return None
    return (
        f"{page} took {execution.cpu_seconds:.0f} s of CPU time ({execution.seconds:.0f} s of "
        f"wall-clock time); the budget is {budget:.0f} CPU seconds"
    )


@pytest.mark.chapter
@pytest.mark.parametrize("name", PAGES)
def test_page_executes_within_budget(name: str) -> None:
    execution = chapters.execute_chapter(name)
    problem = budget_problem(name, execution, budget_cpu_seconds(name))
    assert problem is None, problem


def test_the_budget_is_cpu_time_not_wall_time() -> None:
    """A page that waited for a busy machine (wall time far over its CPU time) is within its
    budget; one that used the CPU for longer is not, and the message names both times."""
    busy = chapters.Execution(notebook=None, seconds=196.0, cpu_seconds=41.0)
    assert budget_problem("profiling/case_study", busy, 60) is None
    heavy = chapters.Execution(notebook=None, seconds=75.0, cpu_seconds=72.4)
    assert budget_problem("profiling/case_study", heavy, 60) == (
        "profiling/case_study took 72 s of CPU time (75 s of wall-clock time); the budget is 60 "
        "CPU seconds"
    )
    unknown = chapters.Execution(notebook=None, seconds=61.0, cpu_seconds=None)
    assert "CPU time was not recorded" in budget_problem("x", unknown, 60)


def test_cpu_time_of_a_kernel_is_measured() -> None:
    """The measure the budget uses counts a kernel's own CPU seconds (here a busy loop)."""
    import time

    import nbformat
    from nbclient import NotebookClient

    loop = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5:\n    pass"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(loop)])
    before = chapters._build_support().children_cpu_seconds()
    start = time.perf_counter()
    NotebookClient(notebook, kernel_name="python3", timeout=120).execute()
    wall = time.perf_counter() - start
    cpu = chapters._build_support().children_cpu_seconds() - before
    assert 1.5 <= cpu <= wall + 0.5, (cpu, wall)


@pytest.mark.parametrize("name", [*PAGES, *APPENDICES])
def test_page_prose_types_no_number_that_code_produced(name: str) -> None:
    allow = chapters.PROSE_CONSTANTS[book_site.chapter_of(name)]
    assert chapters.typed_numbers(name, allow=allow) == []


@pytest.mark.parametrize("name", PAGES)
def test_every_page_opens_with_its_own_environment_line(name):
    """The first code cell prints ``page_environment_line(device, "<this page>")`` with its input
    hidden: where the page ran, and where it last ran on a GPU, in one line."""
    first = next(c for c in chapters.read_chapter(name).cells if c.cell_type == "code")
    assert f'print(page_environment_line(device, "{name}"))' in first.source, first.source
    assert "remove-input" in first.metadata.get("tags", []), f"{name}: the cell's code is shown"


def test_the_environment_line_says_where_a_page_last_ran_on_a_gpu(tmp_path, monkeypatch):
    import torch
    from trainfast.device import page_environment_line
    from trainfast.records import make_record, write_record

    monkeypatch.chdir(tmp_path)  # its records/ is the book's records for the line
    (tmp_path / "records").mkdir()
    cpu = torch.device("cpu")
    assert page_environment_line(cpu, "optimizers/adam").endswith(" | never executed on a GPU")
    row = {"name": "page:optimizers/adam", "status": "passed", "source_commit": "abcdef1234"}
    record = make_record(
        "gpu-pass", "A pass.", [row | {"finished": "2026-12-02T10:00"}], device="cpu"
    )
    record.environment.update(device="cuda", device_name="NVIDIA H200")
    write_record(record, tmp_path / "records")
    line = page_environment_line(cpu, "optimizers/adam")
    assert line.startswith("device: cpu (")
    assert line.endswith(" | last on a GPU: NVIDIA H200, 2026-12-02, at abcdef1, every cell passed")
    assert "GPU" not in page_environment_line(cpu)  # no page named: no GPU clause


#: A code cell whose source starts with a blank line (two after its options): the page's HTML
#: drops that line, so sphinx-codeautolink cannot match the cell to its HTML and warns, which
#: fails the build (-W) on a fresh clone.
BLANK_FIRST_LINE = re.compile(r"```\{code-cell\}[^\n]*\n(?::[^\n]*\n)+\n\n")


def blank_first_lines(text: str) -> list[int]:
    """The line numbers of the code cells in MyST ``text`` whose source starts blank."""
    return [text[: m.start()].count("\n") + 1 for m in BLANK_FIRST_LINE.finditer(text)]


def test_no_code_cell_starts_with_a_blank_line() -> None:
    planted = "```{code-cell} ipython3\n:tags: [hide-input]\n\n\nx = 1\n```\n"
    assert blank_first_lines(planted) == [1]
    assert blank_first_lines(planted.replace("\n\n\n", "\n\n")) == []
    found = {
        page: lines
        for page in [*PAGES, *APPENDICES]
        if (lines := blank_first_lines((book_site.ROOT / "book" / f"{page}.md").read_text()))
    }
    assert not found, f"code cells starting with a blank line: {found}"
