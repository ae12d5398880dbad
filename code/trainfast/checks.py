"""The book's one convention for exercise checks: one line per case, then raise on a failure.

Every chapter's ``exercises`` module builds a list of ``(case, problem)`` pairs, where
``problem`` is None for a case that passed and a short reason otherwise, and hands it to
:func:`report`. The reader sees every case; a wrong answer raises ``AssertionError`` naming the
first failing case, so a notebook cell (and the book's own solution cells, executed during the
build) fails loudly instead of printing ``False``.
"""

from __future__ import annotations

__all__ = ["Case", "report"]

#: A case's description and its problem (None: passed).
Case = tuple[str, "str | None"]


def report(results: list[Case]) -> None:
    """Print ``passed: <case>`` or ``FAILED: <case> (<problem>)`` per case; raise on any failure.

    Raises ``AssertionError("<k> of <n> cases failed; first: <case>: <problem>")``; an empty
    list raises too, since a check that checked nothing must not pass.
    """
    if not results:
        raise AssertionError("the check ran no cases")
    for case, problem in results:
        print(f"passed: {case}" if problem is None else f"FAILED: {case} ({problem})")
    failures = [(case, problem) for case, problem in results if problem is not None]
    if failures:
        case, problem = failures[0]
        raise AssertionError(f"{len(failures)} of {len(results)} cases failed; first: {case}: {problem}")
    print(f"All {len(results)} cases passed.")
