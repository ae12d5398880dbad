"""A sampling profiler's call tree, cut to the frames that matter and to a page's width.

``pyinstrument``'s own text output keeps every frame above a small threshold, indents each level
by three characters and names cells by their temporary file (``/tmp/ipykernel_123/456.py``), so
a training loop's tree runs far past the right edge of a book page. :func:`call_tree` renders
the same processed tree (pyinstrument's default processors: library frames grouped, importlib
removed), keeps frames that took at least ``min_fraction`` of the run, stops at ``max_depth``,
names notebook cells ``<cell>``, and cuts every line to ``width`` characters.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["call_tree"]

_CELL = re.compile(r".*ipykernel_\d+[/\\]\d+\.py")


def _location(frame: Any) -> str:
    path = frame.file_path_short or ""
    path = _CELL.sub("<cell>", path)
    return f"{path}:{frame.line_no}" if frame.line_no else path


def call_tree(
    profiler: Any, min_fraction: float = 0.02, max_depth: int = 14, width: int = 88
) -> str:
    """The last session of ``profiler`` (a stopped ``pyinstrument.Profiler``) as a short tree.

    Each line is ``<seconds> <function>  <file>:<line>``, indented one space per level;
    children below ``min_fraction`` of the whole run are summed into one ``… n more`` line.
    """
    from pyinstrument.renderers import ConsoleRenderer

    if not 0 <= min_fraction < 1:
        raise ValueError(f"Invalid min_fraction: {min_fraction} (expected 0 <= min_fraction < 1)")
    if width < 40:
        raise ValueError(f"Invalid width: {width} (expected at least 40 characters)")
    session = profiler.last_session
    if session is None:
        raise ValueError("Invalid profiler: it has no session (start and stop it first)")
    root = ConsoleRenderer().preprocess(session.root_frame())
    if root is None:
        return "(no samples)"
    total = root.time or 1.0
    lines = [f"{session.duration:.3f} s recorded, {session.sample_count} samples"]

    def cut(text: str) -> str:
        return text if len(text) <= width else text[: width - 1] + "…"

    def visit(frame: Any, depth: int) -> None:
        label = f"{' ' * depth}{frame.time:.3f} {frame.function}  {_location(frame)}"
        lines.append(cut(label))
        if depth >= max_depth:
            return
        kept = [c for c in frame.children if c.time >= min_fraction * total]
        rest = [c for c in frame.children if c.time < min_fraction * total]
        for child in sorted(kept, key=lambda c: -c.time):
            visit(child, depth + 1)
        if rest and sum(c.time for c in rest) >= min_fraction * total:
            seconds = sum(c.time for c in rest)
            lines.append(cut(f"{' ' * (depth + 1)}{seconds:.3f} … {len(rest)} more"))

    visit(root, 0)
    return "\n".join(lines)
