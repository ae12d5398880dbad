"""The exercise convention, scanned over every chapter's executed notebook.

A solution cell is tagged ``solution`` (and ``hide-input``) and ends by calling a
``check_...`` function from the package's ``exercises`` modules, which prints one line per case
and raises ``AssertionError`` on a failing one (``trainfast.checks.report``). The executed
notebooks come from :func:`chapters.executed_notebook`: the build's jupyter-cache entry when it
is provably current, else an execution of the chapter (once per session).
"""

from __future__ import annotations

import ast

import book_site
import chapters
import pytest

CHAPTERS = book_site.toc_chapters()
PAGES = book_site.notebook_pages()
#: The book's rule: every chapter has at least this many exercises (over all its pages).
MIN_EXERCISES = 4


def _solutions(notebook) -> list:
    return [
        c
        for c in notebook.cells
        if c.cell_type == "code" and "solution" in c.metadata.get("tags", [])
    ]


def _checks_called(source: str) -> list[str]:
    return [
        node.func.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id.startswith("check_")
    ]


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_has_at_least_four_exercises(name):
    pages = [page for page in book_site.chapter_pages(name) if book_site.is_notebook(page)]
    solutions = [cell for page in pages for cell in _solutions(chapters.read_chapter(page))]
    assert len(solutions) >= MIN_EXERCISES, (
        f"{name} has {len(solutions)} cells tagged solution over its pages {pages}; every "
        f"chapter needs {MIN_EXERCISES}"
    )


@pytest.mark.parametrize("name", PAGES)
def test_solution_cells_follow_the_convention(name):
    for cell in _solutions(chapters.read_chapter(name)):
        assert "hide-input" in cell.metadata["tags"], f"{name}: solution cell not hidden"
        checks = _checks_called(cell.source)
        assert checks, f"{name}: a solution cell calls no check_... function:\n{cell.source}"
        imported = {
            alias.name
            for node in ast.walk(ast.parse(cell.source))
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith(".exercises")
            for alias in node.names
        }
        assert set(checks) <= imported, f"{name}: checks come from trainfast's exercises modules"


@pytest.mark.chapter
@pytest.mark.parametrize("name", PAGES)
def test_every_solution_passes_its_check_in_the_executed_chapter(name):
    notebook = chapters.executed_notebook(name)
    assert not chapters.cell_errors(notebook), f"{name}: {chapters.cell_errors(notebook)}"
    solutions = _solutions(notebook)
    if not solutions:
        pytest.skip(f"{name} has no solution cells (a chapter's count: see the test above)")
    for cell in solutions:
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert "FAILED:" not in text, f"{name}: a check failed in the executed notebook:\n{text}"
        assert "cases passed." in text, (
            f"{name}: the solution cell printed no check summary, so its check did not run:\n"
            f"{cell.source}"
        )
