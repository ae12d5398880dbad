"""The book's ``literalinclude``: a ``:pyobject:`` listing shows code without docstrings
(``book/_ext/build_support/listings.py``), the rest of the listing as Sphinx shows it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

from build_support.listings import docstring_spans, line_spec  # noqa: E402

SOURCE = '''\
import functools


def documented(x):
    """Twice ``x``: see :func:`undocumented`.

    A second paragraph.
    """
    return 2 * x  # the idea


def undocumented(x):
    return x


def one_line(x):
    """Just :math:`x`."""
    return x


class Model:
    """A model; :class:`Model` in the API reference."""

    size = 3

    @functools.cache
    def forward(self, x):
        r"""The forward pass, :math:`y = Wx`."""
        y = x * self.size
        return y

    @classmethod
    def build(cls):
        return cls()
'''


def test_docstring_spans_of_a_def_a_method_a_class_and_one_without():
    def lines(first: str, last: str) -> str:
        """``SOURCE`` from the line that starts with ``first`` to the one after it that starts
        with ``last``, indented as in the file."""
        rows = SOURCE.splitlines(keepends=True)
        start = next(i for i, row in enumerate(rows) if row.strip().startswith(first))
        end = next(i for i in range(start + 1, len(rows)) if rows[i].strip().startswith(last))
        return "".join(rows[start : end + 1])

    assert docstring_spans(lines("def documented", "return 2")) == [(2, 5)]
    assert docstring_spans(lines("def undocumented", "return x")) == []
    assert docstring_spans(lines("def one_line", "return x")) == [(2, 2)]
    # a method, indented and decorated: the decorator is line 1, as Sphinx counts
    assert docstring_spans(lines("@functools.cache", "return y")) == [(3, 3)]
    # a class: its own docstring and its methods'
    assert docstring_spans(lines("class Model", "return cls()")) == [(2, 2), (8, 8)]


def test_a_docstring_that_shares_a_line_with_code_is_refused():
    with pytest.raises(ValueError, match="docstring of f shares line 1 with code"):
        docstring_spans('def f(x): "Doc."\n')
    with pytest.raises(ValueError, match="docstring of g shares line 2 with code"):
        docstring_spans('def g(x):\n    "Doc."; return x\n')
    assert docstring_spans('def h(x):\n    "Doc."  # a comment\n    return x\n') == [(2, 2)]
    with pytest.raises(ValueError, match="not a def or class: 'x = 1'"):
        docstring_spans("x = 1\n")


def test_line_spec_joins_runs():
    assert line_spec([1, 2, 3, 7, 9, 10]) == "1-3,7,9-10"
    assert line_spec([4]) == "4"


def _build(tmp_path: Path, page: str) -> tuple[dict[str, object], str]:
    """A one-page MyST site built with the book's listings extension: the literal blocks (their
    text and highlighted lines, by ``:name:``) and the build's warnings."""
    from io import StringIO

    from docutils import nodes
    from sphinx.application import Sphinx
    from sphinx.util.docutils import docutils_namespace

    source = tmp_path / "src"
    source.mkdir()
    (source / "model.py").write_text(SOURCE)
    (source / "index.md").write_text(page)
    warnings = StringIO()
    with docutils_namespace():  # the override of literalinclude ends with the build
        app = Sphinx(
            str(source),
            None,
            str(tmp_path / "out"),
            str(tmp_path / "doctrees"),
            "dummy",
            confoverrides={"extensions": ["myst_parser", "build_support.listings"]},
            status=None,
            warning=warnings,
            freshenv=True,
        )
        app.build()
        doctree = app.env.get_doctree("index")
    blocks = {
        block["names"][0]: (block.astext(), block.get("highlight_args", {}).get("hl_lines", []))
        for block in doctree.findall(nodes.literal_block)
    }
    return blocks, warnings.getvalue()


def _listing(name: str, options: str) -> str:
    return f"```{{literalinclude}} model.py\n:name: {name}\n{options}\n```\n\n"


def test_a_built_listing_leaves_out_docstrings_and_keeps_every_other_line(tmp_path):
    blocks, warnings = _build(
        tmp_path,
        "# Listings\n\n"
        + _listing("def", ":pyobject: documented")
        + _listing("plain", ":pyobject: undocumented")
        + _listing("method", ":pyobject: Model.forward\n:dedent: 4\n:emphasize-lines: 3")
        + _listing("class", ":pyobject: Model\n:end-before: @classmethod")
        + _listing("start", ":pyobject: Model\n:start-at: size")
        + _listing("picked", ":pyobject: documented\n:lines: 1-2"),
    )
    assert "ERROR" not in warnings and "WARNING" not in warnings, warnings
    assert blocks["def"] == ("def documented(x):\n    return 2 * x  # the idea\n", [])
    assert blocks["plain"][0] == "def undocumented(x):\n    return x\n"
    # dedented as before; the emphasised line counts the lines shown (y = ...)
    assert blocks["method"] == (
        "@functools.cache\ndef forward(self, x):\n    y = x * self.size\n    return y\n",
        [3],
    )
    assert blocks["class"][0] == textwrap.dedent(
        """\
        class Model:

            size = 3

            @functools.cache
            def forward(self, x):
                y = x * self.size
                return y

        """
    )
    assert blocks["start"][0].startswith("    size = 3\n") and '"""' not in blocks["start"][0]
    picked = 'def documented(x):\n    """Twice ``x``: see :func:`undocumented`.\n'
    assert blocks["picked"][0] == picked  # :lines: given: Sphinx's own listing


def test_a_built_listing_refuses_what_it_cannot_show_faithfully(tmp_path):
    _, warnings = _build(
        tmp_path,
        "# Listings\n\n"
        + _listing("pattern", ":pyobject: documented\n:end-before: A second paragraph")
        + _listing("numbers", ":pyobject: documented\n:lineno-match:"),
    )
    assert ":end-before: 'A second paragraph' occurs in a docstring" in warnings, warnings
    assert ":lineno-match: cannot number the listing" in warnings, warnings
