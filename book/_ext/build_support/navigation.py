"""The sidebar's navigation, built once per folder for the pages outside the book's toctree.

Every page's sidebar holds the book's whole navigation tree, and Sphinx builds it afresh for each
page (``global_toctree_for_doc`` copies and resolves the toctree of every chapter and API page),
about a third of a second a page here. Most pages of the site are viewcode's source pages
(``_modules/...``), plus ``genindex``, ``search`` and ``py-modindex``: none of them is a document
in the toctree, so none is "current" in it and none expands a branch of it, and their trees differ
only in the relative links, which depend only on the page's folder. :func:`cache_outside_pages`
builds that tree once per folder and reuses it; a document's own pages are built as before.
"""

from __future__ import annotations

import posixpath
from typing import Any

from sphinx.application import Sphinx

__all__ = ["cache_outside_pages"]


def cache_outside_pages(app: Sphinx) -> None:
    """Make the HTML builder reuse the navigation tree of a page that is not a document, per
    folder and per set of options (the options the theme passes, ``collapse`` included)."""
    builder = app.builder
    build = builder._get_local_toctree  # Sphinx's: the rendered toctree HTML of ``docname``
    trees: dict[tuple, str] = {}

    def local_toctree(docname: str, collapse: bool = True, **kwargs: Any) -> str:
        if docname in app.env.all_docs:
            return build(docname, collapse, **kwargs)
        try:
            key = (posixpath.dirname(docname), collapse, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:  # an option we cannot key on: build it as Sphinx would
            return build(docname, collapse, **kwargs)
        if key not in trees:
            trees[key] = build(docname, collapse, **kwargs)
        return trees[key]

    builder._get_local_toctree = local_toctree  # type: ignore[method-assign]


def _on_builder_inited(app: Sphinx) -> None:
    if app.builder.format == "html" and hasattr(app.builder, "_get_local_toctree"):
        cache_outside_pages(app)


def setup(app: Sphinx) -> None:
    """Connect the navigation's events (called by the extension's ``setup``)."""
    app.connect("builder-inited", _on_builder_inited)
