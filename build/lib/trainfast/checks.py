"""The book's one convention for exercise checks: a line per failing case, then raise.

Every chapter's ``exercises`` module builds a list of ``(case, problem)`` pairs, where
``problem`` is None for a case that passed and a short reason otherwise, and hands it to
:func:`report`. A check that passes prints one summary line (a check with 80 cases would
otherwise print 80 lines nobody reads); a wrong answer prints one line per failing case and
raises ``AssertionError`` naming the first, so a notebook cell (and the book's own solution
cells, executed during the build) fails loudly instead of printing ``False``.
"""

from __future__ import annotations

__all__ = ["Case", "report"]

#: A case's description and its problem (None: passed).
Case = tuple[str, "str | None"]


def report(results: list[Case]) -> None:
    """Print ``FAILED: <case> (<problem>)`` per failing case and raise, or one summary line.

    When every case passes, prints ``All <n> cases passed.`` only. Otherwise raises
    ``AssertionError("<k> of <n> cases failed; first: <case>: <problem>")``; an empty list
    raises too, since a check that checked nothing must not pass.
    """
    if not results:
        raise AssertionError("the check ran no cases")
    failures = [(case, problem) for case, problem in results if problem is not None]
    for case, problem in failures:
        print(f"FAILED: {case} ({problem})")
    if failures:
        case, problem = failures[0]
        raise AssertionError(
            f"{len(failures)} of {len(results)} cases failed; first: {case}: {problem}"
        )
    print(f"All {len(results)} cases passed.")
