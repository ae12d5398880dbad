"""Every chapter executes top to bottom as a notebook on this CPU, within one budget.

One test for every chapter of ``_toc.yml`` (:func:`book_site.toc_chapters`), parametrised by
its name: ``pytest tests/test_chapters.py -m chapter -k mixed_precision`` executes one. A cell
that raises fails it; so does a chapter slower than the book's budget, 150 s on a CPU alone.
:func:`chapters.execute_chapter` takes the notebook ``make book`` executed when it is provably
current, so each chapter runs once per ``make book`` + ``make test``. What a chapter's notebook
must contain (solutions, glued values) is checked by the chapter's own ``test_<chapter>.py`` and
by ``test_exercises.py``, on the same execution.
"""

from __future__ import annotations

import book_site
import chapters
import pytest

CHAPTERS = book_site.toc_chapters()
#: Seconds a chapter may take to execute on this CPU, alone (the book's rule).
BUDGET_SECONDS = 150


@pytest.mark.chapter
@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_executes_within_budget(name: str) -> None:
    seconds = chapters.execute_chapter(name)
    assert seconds < BUDGET_SECONDS, (
        f"chapter {name!r} took {seconds:.0f} s to execute; the budget is {BUDGET_SECONDS} s"
    )
