"""Listings show code, not docstrings: a ``literalinclude`` with ``:pyobject:`` leaves out the
docstrings of the object it shows.

A docstring is written for the API reference, in reStructuredText: in a code block its
``:func:`` roles, ``:math:`` and double backticks show verbatim, and the chapter's prose already
says what it says. So a listing of a function, method or class (``:pyobject:``) shows it without
its docstring (the first statement of its body, when that is a string literal) and without those
of the definitions inside it (a class's methods), with every other line as the file has it
(indentation, comments). Lines are left out whole; docstrings are found with :mod:`ast` in the
object's dedented source.

- ``:lines:`` given: the listing is Sphinx's own. Its numbers count the object's lines with the
  docstrings, as Sphinx counts them, so listings that pick their lines stay as they are.
- ``:start-at:``, ``:start-after:``, ``:end-at:``, ``:end-before:`` look for their text in the
  code without the docstrings. A text that occurs in a docstring is refused: it may have meant a
  line of the docstring, which the listing no longer has.
- ``:emphasize-lines:`` counts the lines shown, as in Sphinx: docstrings not counted.
- ``:lineno-match:`` is refused where a docstring is left out: the numbers would skip it.
"""

from __future__ import annotations

import ast
import textwrap

from sphinx.application import Sphinx
from sphinx.directives.code import LiteralInclude, LiteralIncludeReader

#: The options that pick lines by their text; they apply to the code without the docstring.
TEXT_PATTERNS = ("start-after", "start-at", "end-before", "end-at")


def docstring_spans(source: str) -> list[tuple[int, int]]:
    """The first and last line (counted from 1, inclusive) of each docstring in the ``def`` or
    ``class`` whose source is ``source`` (as ``:pyobject:`` selects it: decorators first, maybe
    indented): its own and those of the definitions inside it (a class's methods), in order.

    Raises ``ValueError`` if ``source`` does not start with one definition, or if a docstring
    shares a line with code (``def f(): "doc"``), which leaving out whole lines would cut.
    """
    text = textwrap.dedent(source)
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        raise ValueError(f"its source does not parse once dedented ({error.msg})") from None
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    if not tree.body or not isinstance(tree.body[0], definitions):
        first_line = (text.strip().splitlines() or [""])[0]
        raise ValueError(f"its source is not a def or class: {first_line[:40]!r}")
    lines = [line.encode() for line in text.splitlines()]  # ast's columns count UTF-8 bytes
    spans = []
    for node in ast.walk(tree.body[0]):
        if not isinstance(node, definitions):
            continue
        first = node.body[0]
        if not (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            continue
        before = lines[first.lineno - 1][: first.col_offset]
        after = lines[first.end_lineno - 1][first.end_col_offset :].strip()
        if before.strip() or (after and not after.startswith(b"#")):
            raise ValueError(
                f"the docstring of {node.name} shares line {first.lineno} with code, so a "
                "listing cannot leave it out: give :lines:"
            )
        spans.append((first.lineno, first.end_lineno))
    return sorted(spans)


def line_spec(numbers: list[int]) -> str:
    """``[1, 2, 3, 7, 9, 10]`` as a ``:lines:`` value, ``"1-3,7,9-10"``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


class _Line(str):
    """A line of the object's source that remembers its number (counted from 1)."""

    number: int


def lines_without_docstring(
    object_lines: list[str], options: dict, reader: LiteralIncludeReader
) -> str | None:
    """The ``:lines:`` value that shows ``object_lines`` (a ``:pyobject:``'s lines) without their
    docstrings and as ``options``' text patterns pick them, or None where there is none.

    Raises ``ValueError`` for a combination that cannot be shown faithfully (see the module)."""
    spans = docstring_spans("".join(object_lines))
    if not spans:
        return None
    left_out = {n for first, last in spans for n in range(first, last + 1)}
    if "lineno-match" in options:
        raise ValueError(
            f"its docstrings (lines {line_spec(sorted(left_out))}) are left out, so "
            ":lineno-match: cannot number the listing: give :lines: instead"
        )
    docstrings = [object_lines[n - 1] for n in sorted(left_out)]
    for option in TEXT_PATTERNS:
        text = options.get(option)
        if text and any(text in line for line in docstrings):
            raise ValueError(
                f":{option}: {text!r} occurs in a docstring, which listings leave out: pick a "
                "text from the code"
            )
    kept = []
    for number, line in enumerate(object_lines, 1):
        if number not in left_out:
            kept.append(_Line(line))
            kept[-1].number = number
    kept = reader.end_filter(reader.start_filter(kept))
    return line_spec([line.number for line in kept])


class Listing(LiteralInclude):
    """Sphinx's ``literalinclude``, but a ``:pyobject:`` listing without ``:lines:`` leaves out
    the object's docstrings (by giving Sphinx the ``:lines:`` that do)."""

    def run(self):
        if "pyobject" in self.options and not {"lines", "diff"} & set(self.options):
            try:
                _, filename = self.env.relfn2path(self.arguments[0])
                reader = LiteralIncludeReader(filename, self.options, self.config)
                object_lines = reader.pyobject_filter(reader.read_file(filename))
            except Exception:  # Sphinx's own run below reports it, as it always did
                return super().run()
            try:
                spec = lines_without_docstring(object_lines, self.options, reader)
            except ValueError as error:
                raise self.error(
                    f"literalinclude {self.arguments[0]} :pyobject: {self.options['pyobject']}: "
                    f"{error}"
                ) from None
            if spec is not None:
                self.options = {k: v for k, v in self.options.items() if k not in TEXT_PATTERNS}
                self.options["lines"] = spec
        return super().run()


def setup(app: Sphinx) -> None:
    app.add_directive("literalinclude", Listing, override=True)
