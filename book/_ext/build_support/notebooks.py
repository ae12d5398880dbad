"""Notebooks a reader can open anywhere: the clean and exercise notebooks, and the buttons.

For every notebook page (a chapter on one page, or a section page of a chapter that is a folder)
the HTML build writes, under ``notebooks/`` in its output, a *clean* notebook (the page converted
by jupytext, no outputs, a first cell that installs the package where it is missing) and, where
the page has exercises, an *exercise* notebook (the same, with the bodies of cells tagged
``solution`` replaced by a stub and the checks kept), plus Binder's environment files
(:func:`binder_files`). The page's download menu offers them beside the executed notebook.
``notebooks/`` is what ``.github/workflows/book.yml`` publishes as the
``notebooks`` branch, and the Colab and Binder buttons are rewritten to open the clean notebook
there (the theme would point them at the ``.md`` source, which Colab cannot read);
``repository.branch`` stays as it is for the rest. The executed notebook keeps its outputs when
myst-nb took them from the cache, and leaves out the stderr the page hides
(:func:`_prepare_executed_download`).
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
    "binder_files",
    "clean_notebook",
    "exercise_notebook",
    "has_solutions",
    "install_cell",
    "is_gpu_notebook",
    "launch_urls",
    "notebook_paths",
    "stub_solution",
    "without_hidden_stderr",
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
    The clone goes to a fresh folder: one left by another notebook in the same machine would make
    ``git clone`` fail and the records silently missing.
    """
    url = repository_url.rstrip("/")
    source = f"""\
# Colab, Binder or a fresh environment: install the book's package and its measurement records.
import importlib.util
import os

if importlib.util.find_spec("trainfast") is None:
    %pip install --quiet "trainfast[book] @ git+{url}"
if not os.path.isdir("records"):
    !rm -rf /tmp/train-faster && git clone --quiet --depth 1 {url} /tmp/train-faster && cp -r /tmp/train-faster/book/records records"""  # noqa: E501 (a notebook cell's one command)
    return nbformat.v4.new_code_cell(source, metadata={"tags": [INSTALL_TAG]})


def binder_files(repository_url: str) -> dict[str, str]:
    """The files Binder reads at the root of the notebooks branch, by name: ``requirements.txt``
    (PyTorch's CPU wheels, which Binder's machines need, and the book's package from the
    repository) and ``runtime.txt`` (the Python the book is tested with). With them Binder builds
    one image per commit of the branch and every launch starts from it; without them each launch
    installed torch afresh in its first cell."""
    url = repository_url.rstrip("/")
    return {
        "requirements.txt": (
            "# Binder's environment for these notebooks (written by the book's build).\n"
            "--extra-index-url https://download.pytorch.org/whl/cpu\n"
            "torch>=2.4\n"
            f"trainfast[book] @ git+{url}\n"
        ),
        "runtime.txt": "python-3.11\n",
    }


def is_gpu_notebook(pagename: str, gpu_notebooks: list[str]) -> bool:
    """Whether page ``pagename`` opens on a GPU runtime in Colab: it, or its chapter (a folder,
    ``book/memory_hierarchy`` for ``book/memory_hierarchy/roofline``), is listed in
    ``build_support_gpu_notebooks``."""
    return any(pagename == name or pagename.startswith(name + "/") for name in gpu_notebooks)


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


def notebook_paths(pagename: str, exercises: bool = True) -> dict[str, str]:
    """Paths, relative to the HTML output, of page ``pagename``'s clean notebook and, unless
    ``exercises`` is False (a page without solutions, whose exercise notebook would be the
    clean one again), its exercise notebook."""
    paths = {"clean": f"{NOTEBOOKS_DIR}/{pagename}.ipynb"}
    if exercises:
        paths["exercises"] = f"{NOTEBOOKS_DIR}/{pagename}-exercises.ipynb"
    return paths


def has_solutions(notebook: nbformat.NotebookNode) -> bool:
    """Whether ``notebook`` has a code cell tagged ``solution`` (so an exercise notebook)."""
    return any(
        cell.cell_type == "code" and SOLUTION_TAG in cell.metadata.get("tags", [])
        for cell in notebook.cells
    )


def _page_has_solutions(app: Sphinx, pagename: str) -> bool:
    cache = app.env.__dict__.setdefault("build_support_solutions", {})
    if pagename not in cache:
        import jupytext

        source = Path(app.env.doc2path(pagename))
        cache[pagename] = has_solutions(jupytext.read(source, fmt="md:myst"))
    return cache[pagename]


def launch_urls(repository_url: str, pagename: str, colab_url: str, binderhub_url: str) -> dict:
    """Colab and Binder URLs opening page ``pagename``'s clean notebook on the notebooks branch."""
    org, repo = repository_url.rstrip("/").split("/")[-2:]
    path = f"{pagename}.ipynb"
    return {
        "Colab": f"{colab_url.rstrip('/')}/github/{org}/{repo}/blob/{NOTEBOOKS_BRANCH}/{path}",
        "Binder": f"{binderhub_url.rstrip('/')}/v2/gh/{org}/{repo}/{NOTEBOOKS_BRANCH}"
        f"?urlpath=tree/{path}",
    }


def without_hidden_stderr(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``notebook`` without the stderr its page hides: the ``stderr`` stream outputs of cells
    tagged ``remove-stderr`` (a library's start-up warnings, a profiler's log lines), which the
    page leaves out and a downloaded notebook should too. A copy; ``notebook`` is left as is."""
    cleaned = copy.deepcopy(notebook)
    for cell in cleaned.cells:
        if cell.cell_type == "code" and "remove-stderr" in cell.metadata.get("tags", []):
            cell.outputs = [
                output
                for output in cell.get("outputs", [])
                if not (output.get("output_type") == "stream" and output.get("name") == "stderr")
            ]
    return cleaned


def _prepare_executed_download(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """Make ``jupyter_execute/<page>.ipynb``, the page's executed download, what the page shows.

    1. Its outputs, when myst-nb took them from the cache: myst-nb 1.4 writes that file from the
       notebook as read, not from the one it merged the cached outputs into, so after a rebuild
       that re-read a page without executing it, the "executed" notebook would have no outputs.
    2. Without the stderr the page hides (:func:`without_hidden_stderr`).

    Runs before sphinx-book-theme copies the file into ``_sources`` for download (priority 501).
    """
    if app.builder.format != "html" or pagename not in _notebook_pages(app):
        return
    written = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not written.exists():
        return
    notebook = nbformat.read(written, as_version=4)
    has_outputs = any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")
    if not has_outputs and app.config.nb_execution_mode == "cache":
        from jupyter_cache import get_cache

        try:
            _, notebook = get_cache(cache_dir(app)).merge_match_into_notebook(notebook)
        except KeyError:
            pass
    cleaned = without_hidden_stderr(notebook)
    if cleaned != nbformat.read(written, as_version=4):
        nbformat.write(cleaned, written)


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
    paths = notebook_paths(pagename, exercises=_page_has_solutions(app, pagename))
    pathto = context["pathto"]
    for group in context.get("header_buttons", []):
        if group.get("label") == "download-buttons":
            for button in group["buttons"]:
                if button.get("label") == "download-notebook-button":
                    button["text"] = ".ipynb (executed)"
            offered = [
                {
                    "type": "link",
                    "url": pathto(paths["clean"], 1),
                    "text": ".ipynb (clean)",
                    "icon": "fas fa-code",
                    "tooltip": "Download the notebook without outputs",
                    "label": "download-clean-notebook-button",
                }
            ]
            if "exercises" in paths:
                offered.append(
                    {
                        "type": "link",
                        "url": pathto(paths["exercises"], 1),
                        "text": ".ipynb (exercises)",
                        "icon": "fas fa-pencil-alt",
                        "tooltip": "Download the notebook with the solutions removed",
                        "label": "download-exercise-notebook-button",
                    }
                )
            group["buttons"][1:1] = offered
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
        gpu = is_gpu_notebook(pagename, app.config.build_support_gpu_notebooks)
        clean = clean_notebook(Path(app.env.doc2path(pagename)), repository_url, gpu=gpu)
        paths = notebook_paths(pagename, exercises=has_solutions(clean))
        notebooks = {"clean": clean}
        if "exercises" in paths:
            notebooks["exercises"] = exercise_notebook(clean)
        for kind, notebook in notebooks.items():
            target = Path(app.outdir) / paths[kind]
            target.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook, target)
    records = Path(app.srcdir) / "book" / "records"
    if records.is_dir():
        shutil.copytree(records, tree / "book" / "records")
    tree.mkdir(parents=True, exist_ok=True)
    (tree / "README.md").write_text(
        "# Train Faster: the pages as notebooks\n\n"
        f"Generated by the book's build from {repository_url} (branch `main`); do not edit.\n"
        "`book/<chapter>/<section>.ipynb` is a section page without outputs (`book/<chapter>.ipynb`"
        " for a chapter on one page), `...-exercises.ipynb` the same with the solutions removed.\n"
        "The first cell installs the `trainfast` package where it is missing. `requirements.txt`\n"
        "and `runtime.txt` are Binder's: it builds the image once, not at every launch.\n"
    )
    for name, text in binder_files(repository_url).items():
        (tree / name).write_text(text)


def setup(app: Sphinx) -> None:
    """Connect the notebooks' events (called by the extension's ``setup``)."""
    app.add_config_value("build_support_gpu_notebooks", [], "html", [list])
    app.connect("html-page-context", _prepare_executed_download, priority=500)
    app.connect("html-page-context", _point_launch_buttons_at_notebooks, priority=600)
    app.connect("build-finished", _write_notebooks)
