"""Sphinx extension with what the book's build needs beyond Jupyter Book, one module per job.

- :mod:`build_support.execution_cache`: chapters re-execute when the package or the records
  change, and the outdated ones execute in parallel, into myst-nb's cache, while Sphinx reads
  the other pages (a cell that raises fails the build, naming the chapter and cell);
- :mod:`build_support.notebooks`: the clean and exercise notebooks of every chapter, and the
  download, Colab and Binder buttons that open them;
- :mod:`build_support.api_reference`: the API reference's cross-references, linked listings,
  readable signatures and its index of modules with the chapter that teaches each;
- :mod:`build_support.page_assets`: the theme's settings, a local MathJax, the calculator
  widget's data, one copy of each inline script;
- :mod:`build_support.navigation`: the sidebar's tree built once per folder for the pages
  outside the book's toctree (viewcode's source pages, the indices);
- :mod:`build_support.code_links`: sphinx-codeautolink's links written into the finished
  pages by every core;
- :mod:`build_support.listings`: a ``literalinclude`` of a ``:pyobject:`` shows its code
  without docstrings.

The names the tests use are importable from here as well.
"""

from __future__ import annotations

from sphinx.application import Sphinx

from build_support import (
    api_reference,
    code_links,
    execution_cache,
    listings,
    navigation,
    notebooks,
    page_assets,
)
from build_support.api_reference import (
    defined_at,
    listing_module,
    public_names,
    readable_signature,
    teaching_chapters,
)
from build_support.execution_cache import (
    STAMP_NAME,
    _on_builder_inited,
    children_cpu_seconds,
    invalidate_if_changed,
    source_hash,
)
from build_support.notebooks import (
    EXERCISE_TAG,
    INSTALL_TAG,
    NOTEBOOKS_BRANCH,
    NOTEBOOKS_DIR,
    SITE_STAMP,
    SOLUTION_TAG,
    binder_files,
    clean_notebook,
    exercise_notebook,
    has_solutions,
    is_gpu_notebook,
    stub_solution,
    without_hidden_stderr,
)
from build_support.page_assets import drop_repeated_inline_scripts

__all__ = [
    "EXERCISE_TAG",
    "INSTALL_TAG",
    "NOTEBOOKS_BRANCH",
    "NOTEBOOKS_DIR",
    "SITE_STAMP",
    "SOLUTION_TAG",
    "STAMP_NAME",
    "_on_builder_inited",
    "binder_files",
    "children_cpu_seconds",
    "clean_notebook",
    "defined_at",
    "drop_repeated_inline_scripts",
    "exercise_notebook",
    "has_solutions",
    "invalidate_if_changed",
    "is_gpu_notebook",
    "listing_module",
    "public_names",
    "readable_signature",
    "source_hash",
    "stub_solution",
    "teaching_chapters",
    "without_hidden_stderr",
]


def setup(app: Sphinx) -> dict:
    parts = (
        page_assets,
        execution_cache,
        api_reference,
        notebooks,
        listings,
        navigation,
        code_links,
    )
    for part in parts:
        part.setup(app)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
