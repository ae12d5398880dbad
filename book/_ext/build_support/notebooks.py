"""Notebooks a reader can open anywhere: the clean and exercise notebooks, and the buttons.

For every chapter the HTML build writes, under ``notebooks/`` in its output, a *clean* notebook
(the chapter converted by jupytext, no outputs, a first cell that installs the package where it
is missing) and an *exercise* notebook (the same, with the bodies of cells tagged ``solution``
replaced by a stub and the checks kept). The page's download menu offers them beside the
executed notebook. ``notebooks/`` is what ``.github/workflows/book.yml`` publishes as the
``notebooks`` branch, and the Colab and Binder buttons are rewritten to open the clean notebook
there (the theme would point them at the ``.md`` source, which Colab cannot read);
``repository.branch`` stays as it is for the rest. The executed notebook keeps its outputs when
myst-nb took them from the cache (:func:`_restore_cached_outputs`).
"""

from __future__ import annotations

import ast
import copy
import shutil
from pathlib import Path
from typing import Any

import nbformat
from sphinx.application import Sphinx

from build_support.execution_cache import cache_dir

__all__ = [
    "EXERCISE_TAG",
    "INSTALL_TAG",
    "NOTEBOOKS_BRANCH",
    "NOTEBOOKS_DIR",
    "SITE_STAMP",
    "SOLUTION_TAG",
    "clean_notebook",
    "exercise_notebook",
    "install_cell",
    "launch_urls",
    "notebook_paths",
    "stub_solution",
]

#: Written beside the HTML output (``_build/.site-built``) when an HTML build finishes, so the
#: site tests can tell whether the site is newer than its sources (Sphinx leaves unchanged
#: files, ``searchindex.js`` included, untouched).
SITE_STAMP = ".site-built"


#: Folder of the HTML output holding the downloadable notebooks: the tree of the notebooks branch.
NOTEBOOKS_DIR = "notebooks"


NOTEBOOKS_BRANCH = "notebooks"


SOLUTION_TAG = "solution"


#: Tag of a solution cell whose code was replaced by a stub in the exercise notebook.
EXERCISE_TAG = "exercise"


INSTALL_TAG = "install-trainfast"


STUB = 'raise NotImplementedError("your code here")'


def install_cell(repository_url: str) -> nbformat.NotebookNode:
    """The first cell of a clean notebook: install the package and fetch its records if missing.

    On Colab or Binder ``trainfast`` is not installed and the chapter's ``records`` folder is not
    beside the notebook; in the book's own environment both are there and the cell does nothing.
    """
    url = repository_url.rstrip("/")
    source = f"""\
# Colab, Binder or a fresh environment: install the book's package and its measurement records.
import importlib.util
import os

if importlib.util.find_spec("trainfast") is None:
    %pip install --quiet "trainfast[book] @ git+{url}"
if not os.path.isdir("records"):
    !git clone --quiet --depth 1 {url} /tmp/train-faster && cp -r /tmp/train-faster/book/records records"""  # noqa: E501 (a notebook cell's one command)
    return nbformat.v4.new_code_cell(source, metadata={"tags": [INSTALL_TAG]})


def clean_notebook(source: Path, repository_url: str, gpu: bool = False) -> nbformat.NotebookNode:
    """Chapter ``source`` (MyST Markdown) as a notebook with no outputs and the install cell first.

    ``gpu`` adds Colab's ``accelerator: GPU`` metadata, so Colab opens it on a GPU runtime.
    """
    import jupytext

    notebook = jupytext.read(source, fmt="md:myst")
    notebook.metadata.pop("jupytext", None)  # a plain .ipynb, not a paired text notebook
    notebook.metadata.setdefault("language_info", {"name": "python"})
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    notebook.cells.insert(0, install_cell(repository_url))
    if gpu:
        notebook.metadata["accelerator"] = "GPU"
        notebook.metadata["colab"] = {"gpuType": "T4", "provenance": []}
    nbformat.validate(notebook)
    return notebook


def _lines(source: str, first: int, last: int) -> list[str]:
    return source.splitlines()[first - 1 : last]


def _stub_function(node: ast.FunctionDef | ast.AsyncFunctionDef, source: str) -> list[str]:
    """``node``'s decorators, signature and docstring, as written, with ``STUB`` for a body."""
    start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    body = node.body
    has_docstring = (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    if body[0].lineno == node.lineno:  # `def f(): return 1` on one line
        stubbed = copy.deepcopy(node)
        stubbed.body = [*body[:1]] if has_docstring else []
        stubbed.body.append(ast.parse(STUB).body[0])
        return ast.unparse(ast.fix_missing_locations(stubbed)).splitlines()
    kept_until = body[0].end_lineno if has_docstring else body[0].lineno - 1
    indent = " " * body[0].col_offset
    return [*_lines(source, start, kept_until), indent + STUB]


def stub_solution(source: str) -> str:
    """A solution cell's code with its solution removed and its imports and checks kept.

    Imports and calls of a ``check_...`` function stay; a function keeps its signature and
    docstring and gets ``raise NotImplementedError`` for a body; an assignment keeps its targets
    and gets ``...`` for a value; anything else becomes ``# your code here``. Comments between
    statements go with the solution.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise ValueError(
            f"a solution cell is not plain Python ({error}): {source[:80]!r}"
        ) from None
    out: list[str] = []
    after_import = False
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id.startswith("check_")
        ):
            kept = _lines(source, node.lineno, node.end_lineno)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kept = _stub_function(node, source)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = " = ".join(ast.unparse(target) for target in targets)
            kept = [f"{names} = ...  # your answer here"]
        elif isinstance(node, ast.ClassDef):
            stubbed = copy.deepcopy(node)
            for item in stubbed.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    item.body = [ast.parse(STUB).body[0]]
            kept = ast.unparse(stubbed).splitlines()
        else:
            kept = ["# your code here"]
        importing = isinstance(node, (ast.Import, ast.ImportFrom))
        if out and not (importing and after_import):
            out += ["", ""]  # PEP 8's two blank lines, as the chapters write them
        out += kept
        after_import = importing
    return "\n".join(out)


def exercise_notebook(clean: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``clean`` with every ``solution`` cell stubbed (see :func:`stub_solution`) and shown."""
    notebook = copy.deepcopy(clean)
    for cell in notebook.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "code" and SOLUTION_TAG in tags:
            cell.source = stub_solution(cell.source)
            cell.metadata["tags"] = [
                EXERCISE_TAG if tag == SOLUTION_TAG else tag for tag in tags if tag != "hide-input"
            ]
    nbformat.validate(notebook)
    return notebook


def notebook_paths(pagename: str) -> dict[str, str]:
    """Paths, relative to the HTML output, of page ``pagename``'s clean and exercise notebooks."""
    return {
        "clean": f"{NOTEBOOKS_DIR}/{pagename}.ipynb",
        "exercises": f"{NOTEBOOKS_DIR}/{pagename}-exercises.ipynb",
    }


def launch_urls(repository_url: str, pagename: str, colab_url: str, binderhub_url: str) -> dict:
    """Colab and Binder URLs opening page ``pagename``'s clean notebook on the notebooks branch."""
    org, repo = repository_url.rstrip("/").split("/")[-2:]
    path = f"{pagename}.ipynb"
    return {
        "Colab": f"{colab_url.rstrip('/')}/github/{org}/{repo}/blob/{NOTEBOOKS_BRANCH}/{path}",
        "Binder": f"{binderhub_url.rstrip('/')}/v2/gh/{org}/{repo}/{NOTEBOOKS_BRANCH}"
        f"?urlpath=tree/{path}",
    }


def _restore_cached_outputs(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """Give ``jupyter_execute/<page>.ipynb`` its outputs when myst-nb took them from the cache.

    myst-nb 1.4 writes that file from the notebook as read, not from the one it merged the
    cached outputs into, so after a rebuild that re-read a chapter without executing it, the
    "executed" notebook on the page would have no outputs. Runs before sphinx-book-theme copies
    the file into ``_sources`` for download (priority 501).
    """
    if app.builder.format != "html" or pagename not in _notebook_pages(app):
        return
    if app.config.nb_execution_mode != "cache":
        return
    written = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not written.exists():
        return
    notebook = nbformat.read(written, as_version=4)
    if any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"):
        return
    from jupyter_cache import get_cache

    try:
        _, merged = get_cache(cache_dir(app)).merge_match_into_notebook(notebook)
    except KeyError:
        return
    nbformat.write(merged, written)


def _point_launch_buttons_at_notebooks(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """Offer the page's clean and exercise notebooks; point Colab and Binder at the clean one.

    Runs after sphinx-book-theme's handlers (priority 501), which built the buttons. The
    notebooks themselves are written at the end of the build (:func:`_write_notebooks`).
    """
    if app.builder.format != "html" or pagename not in _notebook_pages(app):
        return
    options = app.config.html_theme_options
    repository_url = options.get("repository_url", "")
    if not repository_url:
        return
    paths = notebook_paths(pagename)
    pathto = context["pathto"]
    for group in context.get("header_buttons", []):
        if group.get("label") == "download-buttons":
            for button in group["buttons"]:
                if button.get("label") == "download-notebook-button":
                    button["text"] = ".ipynb (executed)"
            group["buttons"][1:1] = [
                {
                    "type": "link",
                    "url": pathto(paths["clean"], 1),
                    "text": ".ipynb (clean)",
                    "icon": "fas fa-code",
                    "tooltip": "Download the notebook without outputs",
                    "label": "download-clean-notebook-button",
                },
                {
                    "type": "link",
                    "url": pathto(paths["exercises"], 1),
                    "text": ".ipynb (exercises)",
                    "icon": "fas fa-pencil-alt",
                    "tooltip": "Download the notebook with the solutions removed",
                    "label": "download-exercise-notebook-button",
                },
            ]
        if group.get("label") == "launch-buttons":
            launch = options.get("launch_buttons", {})
            urls = launch_urls(
                repository_url,
                pagename,
                launch.get("colab_url", ""),
                launch.get("binderhub_url", ""),
            )
            for button in group["buttons"]:
                if button.get("text") in urls:
                    button["url"] = urls[button["text"]]


def _notebook_pages(app: Sphinx) -> list[str]:
    """Every page that is a notebook (a MyST page with a kernelspec), in a stable order."""
    return sorted(d for d in app.env.found_docs if "kernelspec" in app.env.metadata.get(d, {}))


def _write_notebooks(app: Sphinx, exception: Exception | None) -> None:
    """Write the notebooks tree afresh: every chapter's clean and exercise notebooks (from the
    sources as they are now, so that no notebook outlives a change to a chapter or to this
    file), the records the chapters render, and a README."""
    if exception is not None or app.builder.format != "html":
        return
    (Path(app.outdir).parent / SITE_STAMP).write_text(f"{app.outdir}\n")
    repository_url = app.config.html_theme_options.get("repository_url", "")
    if not repository_url:
        return
    tree = Path(app.outdir) / NOTEBOOKS_DIR
    if tree.exists():
        shutil.rmtree(tree)
    for pagename in _notebook_pages(app):
        gpu = pagename in app.config.build_support_gpu_notebooks
        clean = clean_notebook(Path(app.env.doc2path(pagename)), repository_url, gpu=gpu)
        paths = notebook_paths(pagename)
        for kind, notebook in (("clean", clean), ("exercises", exercise_notebook(clean))):
            target = Path(app.outdir) / paths[kind]
            target.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook, target)
    records = Path(app.srcdir) / "book" / "records"
    if records.is_dir():
        shutil.copytree(records, tree / "book" / "records")
    tree.mkdir(parents=True, exist_ok=True)
    (tree / "README.md").write_text(
        "# Train Faster: the chapters as notebooks\n\n"
        f"Generated by the book's build from {repository_url} (branch `main`); do not edit.\n"
        "`book/<chapter>.ipynb` is the chapter without outputs, "
        "`book/<chapter>-exercises.ipynb` the same with the solutions removed. The first cell\n"
        "installs the `trainfast` package where it is missing.\n"
    )


def setup(app: Sphinx) -> None:
    """Connect the notebooks' events (called by the extension's ``setup``)."""
    app.add_config_value("build_support_gpu_notebooks", [], "html", [list])
    app.connect("html-page-context", _restore_cached_outputs, priority=500)
    app.connect("html-page-context", _point_launch_buttons_at_notebooks, priority=600)
    app.connect("build-finished", _write_notebooks)
