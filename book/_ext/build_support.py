"""Sphinx extension with the two things the book's build needs beyond Jupyter Book.

1. **Re-execute chapters when the package changes.** myst-nb's execution cache (jupyter-cache)
   keys a notebook on its own code cells, and Sphinx re-reads only pages whose source changed.
   A change to ``code/trainfast`` would therefore publish stale outputs. This extension hashes
   the files named in ``build_support_watch``; when the hash differs from the one stored beside
   the cache, it empties the execution cache and marks every page outdated, so every chapter runs
   again. Every chapter imports the package, so "every chapter" is the right granularity.

2. **Serve MathJax from the site itself.** Sphinx loads MathJax from a CDN by default; the
   ``django-static-mathjax`` wheel (in requirements.txt) ships MathJax 3.2.2, whose single-file
   SVG build we copy into ``_static``. Without that wheel the CDN default is kept.

3. **Resolve package names where they are defined.** The API reference (``book/api``) documents
   each object once, in the module that defines it (``trainfast.optim.adam.AdamW``). Docstrings
   and chapters name it where readers import it (``trainfast.optim.AdamW``, or ``AdamW`` inside
   ``trainfast.optim``). A cross-reference Sphinx cannot find is imported and retried at the
   object's defining module; a name that exists in the package but has no entry (a private
   kernel, an instance attribute) is shown as code without a link. Names that do not exist at
   all still warn, so ``-n`` keeps catching typos.

4. **Link names in listings.** ``sphinx-codeautolink`` links the names of a code block to their
   API entries, using the block's imports. A listing (``literalinclude`` of a package file) has
   none, so each one gets a preface importing its module's own public names, and the block after
   it gets the same import again, so that the listing's ``def`` does not shadow the chapter's
   own import of that name in the cells that follow.

5. **The calculator's data.** A page with a ``<div class="trainfast-calculator">`` gets the
   widget (``_static/calculator.js``, hand-written) and its data, which the HTML build writes
   from the package (:func:`trainfast.calculator.write_script`) into ``_static/calculator-data.js``,
   so the widget's presets and test cases are always the package's.

The reference's navigation is ``_toc.yml``'s glob of the generated pages; the toctrees that
autosummary adds (its ``:toctree:`` option is what makes it generate pages) are dropped before
sphinx-external-toc, which allows no toctree but its own, sees them.
6. **Notebooks a reader can open anywhere.** For every chapter the HTML build writes, under
   ``notebooks/`` in its output, a *clean* notebook (the chapter converted by jupytext, no outputs,
   a first cell that installs the package where it is missing) and an *exercise* notebook (the
   same, with the bodies of cells tagged ``solution`` replaced by a stub and the checks kept).
   The page's download menu offers them beside the executed notebook. ``notebooks/`` is what
   ``.github/workflows/book.yml`` publishes as the ``notebooks`` branch, and the Colab and Binder
   buttons are rewritten to open the clean notebook there (the theme would point them at the
   ``.md`` source, which Colab cannot read); ``repository.branch`` stays as it is for the rest.
   The executed notebook keeps its outputs when myst-nb took them from the cache
   (:func:`_restore_cached_outputs`).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import nbformat
from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.environment import BuildEnvironment
from sphinx.transforms import SphinxTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

STAMP_NAME = "watched-sources.sha256"
#: Written beside the HTML output (``_build/.site-built``) when an HTML build finishes, so the
#: site tests can tell whether the site is newer than its sources (Sphinx leaves unchanged
#: files, ``searchindex.js`` included, untouched).
SITE_STAMP = ".site-built"


def source_hash(paths: Iterable[Path]) -> str:
    """SHA-256 over the relative names and bytes of every file under ``paths``.

    ``__pycache__`` folders and ``*.pyc`` files are skipped, so importing the package does not
    change the hash; renaming, adding or deleting a file does.
    """
    digest = hashlib.sha256()
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def invalidate_if_changed(cache_dir: Path, watched: list[Path]) -> bool:
    """Empty ``cache_dir`` if the watched sources changed since the last call; True if so.

    The first call on a cache that has no stamp also counts as a change: a cache built before
    this extension existed cannot be trusted.
    """
    new = source_hash(watched)
    stamp = cache_dir / STAMP_NAME
    old = stamp.read_text().strip() if stamp.exists() else None
    changed = old != new
    if changed and cache_dir.exists():
        shutil.rmtree(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(new + "\n")
    return changed


def _cache_dir(app: Sphinx) -> Path:
    """myst-nb's execution cache folder (jupyter-cache), as an absolute path."""
    root = Path(app.srcdir)
    cache_dir = Path(app.config.nb_execution_cache_path or root / "_build" / ".jupyter_cache")
    return cache_dir if cache_dir.is_absolute() else root / cache_dir


def _on_builder_inited(app: Sphinx) -> None:
    root = Path(app.srcdir)
    watched = [root / p for p in app.config.build_support_watch]
    missing = [str(p) for p in watched if not p.exists()]
    if missing:
        raise FileNotFoundError(f"build_support_watch names paths that do not exist: {missing}")
    if not watched:
        app.env.build_support_changed = False  # type: ignore[attr-defined]
        return
    changed = invalidate_if_changed(_cache_dir(app), watched)
    app.env.build_support_changed = changed  # type: ignore[attr-defined]
    if changed:
        logger.info(
            "[build_support] watched sources changed: execution cache emptied, "
            "every page will be re-executed"
        )


def _on_env_get_outdated(
    app: Sphinx, env: BuildEnvironment, added: set, changed: set, removed: set
) -> list[str]:
    if getattr(env, "build_support_changed", False):
        return sorted(env.found_docs)
    return []


def _on_config_inited(app: Sphinx, config: Config) -> None:
    # The theme's top bar held only a second search box (the sidebar has one): no top bar.
    config.html_theme_options = {**config.html_theme_options, "navbar_persistent": []}
    # pydata-sphinx-theme reads ``default_mode`` from the page context; without it every page
    # logged "Got invalid theme mode: . Resetting to auto." as a console error.
    config.html_context = {"default_mode": "auto", **config.html_context}
    # The kernels that execute the chapters inherit this: figures drawn for the page's column.
    os.environ.setdefault("MATPLOTLIBRC", str(Path(__file__).with_name("matplotlibrc")))
    spec = importlib.util.find_spec("mathjax")
    if spec is None or spec.origin is None:
        return  # keep Sphinx's CDN default
    bundle = Path(spec.origin).parent / "static" / "mathjax" / "es5" / "tex-svg.js"
    if bundle.exists():
        config.html_static_path = [*config.html_static_path, str(bundle)]
        config.mathjax_path = "tex-svg.js"


PACKAGE = "trainfast"


def import_name(dotted: str) -> object | None:
    """The object a dotted name denotes (a module, or an attribute path inside one), or None."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attr in parts[split:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def defined_at(target: str, module: str | None, cls: str | None) -> tuple[str | None, bool]:
    """Where a package name that Sphinx could not find is defined: ``(dotted name, exists)``.

    ``target`` is tried as written and relative to the current ``module`` (and ``cls``). The
    dotted name is the object's ``__module__.__qualname__`` when it has one (a function, class or
    module), else None; ``exists`` says whether the name denotes anything in the package at all,
    including instance attributes that ``__init__`` assigns (``self.<name>``).
    """
    candidates = [target] if target.startswith(PACKAGE + ".") else []
    for scope in (f"{module}.{cls}" if module and cls else None, module):
        if scope and scope.startswith(PACKAGE):
            candidates.append(f"{scope}.{target}")
    for name in candidates:
        obj = import_name(name)
        if obj is None:
            continue
        if inspect.ismodule(obj):
            return obj.__name__, True
        home, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if isinstance(home, str) and isinstance(qualname, str) and home.startswith(PACKAGE):
            return f"{home}.{qualname}", True
        return None, True
    if module and cls and "." not in target:
        owner = import_name(f"{module}.{cls}")
        if inspect.isclass(owner) and f"self.{target}" in inspect.getsource(owner):
            return None, True
    return None, False


def _on_missing_reference(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.TextElement
) -> nodes.Element | None:
    if node.get("refdomain") != "py":
        return None
    real, exists = defined_at(node["reftarget"], node.get("py:module"), node.get("py:class"))
    if real is not None and real != node["reftarget"]:
        domain = env.get_domain("py")
        found = domain.resolve_any_xref(env, node["refdoc"], app.builder, real, node, contnode)
        if found:
            return found[0][1]
    return contnode if exists else None


def listing_module(source: str, code_root: Path) -> str | None:
    """The dotted module name of a listing's source file if it is in the package, else None."""
    path = Path(source).resolve()
    package = (code_root / PACKAGE).resolve()
    if path.suffix != ".py" or not path.is_relative_to(package):
        return None
    parts = path.relative_to(code_root.resolve()).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def public_names(module_name: str) -> list[str]:
    """Names a listing of ``module_name`` may use that have an API entry: those in ``__all__``
    and the public functions and classes the package defines that the module imports."""
    module = importlib.import_module(module_name)
    names = set(getattr(module, "__all__", []))
    for name, value in vars(module).items():
        home = getattr(value, "__module__", None)
        if not name.startswith("_") and isinstance(home, str) and home.startswith(PACKAGE):
            names.add(name)
    return sorted(names)


def _on_doctree_read_prefaces(app: Sphinx, doctree: nodes.document) -> None:
    try:
        from sphinx_codeautolink.extension.directive import PrefaceMarker
    except ImportError:
        return
    code_root = Path(app.srcdir) / "code"
    for block in list(doctree.findall(nodes.literal_block)):
        module = listing_module(block.get("source", ""), code_root)
        names = public_names(module) if module else []
        if not names:
            continue
        line = f"from {module} import {', '.join(names)}"
        parent = block.parent
        index = parent.index(block)
        parent.insert(index + 1, PrefaceMarker(line, "next"))  # undo the listing's defs
        parent.insert(index, PrefaceMarker(line, "next"))


def _viewcode_module(app: Sphinx, modname: str, attribute: str) -> str | None:
    """The module whose source page shows ``modname.attribute``: where it is defined, except for
    a value made outside the package (a type alias such as ``tuple[str, str | None]`` says
    ``builtins``), which stays with the module that documents it instead of pointing the source
    index at a module that has no source page."""
    home = getattr(import_name(f"{modname}.{attribute}"), "__module__", None)
    if modname.startswith(PACKAGE) and isinstance(home, str) and not home.startswith(PACKAGE):
        return modname
    return None


def _clear_generated_reference(app: Sphinx) -> None:
    """Delete the reference's generated pages of modules that no longer exist, before autosummary
    writes the others (it leaves a page whose text is unchanged alone), so that a deleted
    module's page does not linger and fail the build importing it; and the source pages."""
    generated = Path(app.srcdir) / "book" / "api" / "generated"
    for page in generated.glob(f"{PACKAGE}*.rst"):
        try:
            importlib.import_module(page.stem)
        except ImportError:
            page.unlink()
    # viewcode writes source pages only for modules that exist: remove the pages of deleted ones
    for page in (Path(app.outdir) / "_modules" / PACKAGE).rglob("*.html"):
        parts = page.relative_to(Path(app.outdir) / "_modules").with_suffix("").parts
        try:
            importlib.import_module(".".join(parts))
        except ImportError:
            page.unlink()


class DropAutosummaryToctrees(SphinxTransform):
    """Remove autosummary's toctrees: ``_toc.yml`` is the navigation (see the module docstring)."""

    default_priority = 99  # before sphinx-external-toc's InsertToctrees (100) warns about them

    def apply(self, **kwargs: object) -> None:
        from sphinx.ext.autosummary import autosummary_toc

        for node in list(self.document.findall(autosummary_toc)):
            node.parent.remove(node)


def module_summary(module_name: str) -> str:
    """The first sentence of a module's docstring, its paragraph's lines joined (reST)."""
    doc = inspect.getdoc(importlib.import_module(module_name)) or ""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    head, dot, _ = paragraph.partition(". ")
    summary = head + "." if dot else paragraph

    def qualified(match: re.Match[str]) -> str:  # `benchmark` means its module's benchmark
        role, target = match.group(1), match.group(2).lstrip("~")
        if not target.startswith((PACKAGE + ".", "torch", "numpy")):
            target = f"{module_name}.{target}"
        return f":{role}:`~{target}`"

    return re.sub(r":(\w+):`(~?[\w.]+)`", qualified, summary)


def teaching_chapters(modules: list[str], chapters: dict[str, str]) -> dict[str, str | None]:
    """The chapter (name under ``book/``) that teaches each module: the one whose source names
    the module (``trainfast.optim.adam``, or its file ``code/trainfast/optim/adam.py``) most
    often; failing that, the chapter of its subpackage; None when no chapter names either (and
    for the package itself, which every chapter names)."""
    found: dict[str, str | None] = {}
    for module in modules:
        path = "code/" + module.replace(".", "/")
        pattern = re.compile(re.escape(module) + r"\b")
        counts = {
            name: len(pattern.findall(text)) + text.count(path + ".py") + text.count(path + "/")
            for name, text in chapters.items()
        }
        best = max(counts, key=lambda name: counts[name], default=None)
        found[module] = best if best is not None and counts[best] else None
    found[PACKAGE] = None  # every chapter names the package itself
    for module in modules:  # a module no chapter names: its subpackage's chapter
        parent = module.rpartition(".")[0]
        while found[module] is None and parent in found and parent != PACKAGE:
            found[module] = found[parent]
            parent = parent.rpartition(".")[0]
    return found


class ModuleTable(SphinxDirective):
    """``.. trainfast-modules::``: every public module of the package, a line on what it holds,
    and the chapter that teaches it, as one table (the API reference's index)."""

    def run(self) -> list[nodes.Node]:
        import pkgutil

        package = importlib.import_module(PACKAGE)
        modules = [PACKAGE] + [
            info.name
            for info in pkgutil.walk_packages(package.__path__, PACKAGE + ".")
            if not any(part.startswith("_") for part in info.name.split("."))
        ]
        book = Path(self.env.srcdir) / "book"
        chapters = {}
        for path in sorted(book.glob("*.md")):
            if path.stem != "intro" and f"book/{path.stem}" in self.env.found_docs:
                chapters[path.stem] = path.read_text()
                self.env.note_dependency(str(path))
        taught = teaching_chapters(modules, chapters)
        lines = [".. list-table::", "   :header-rows: 1", "   :class: trainfast-modules", ""]
        lines += ["   * - Module", "     - What it holds", "     - Taught in"]
        for module in modules:
            chapter = taught[module]
            lines += [
                f"   * - :py:mod:`{module}`",
                f"     - {module_summary(module)}",
                f"     - :doc:`/book/{chapter}`" if chapter else "     - —",
            ]
        return self.parse_text_to_nodes("\n".join(lines))


class DropIndexAutosummaryTable(SphinxTransform):
    """The API index's ``autosummary`` is there to generate the pages; its one-row table
    (``trainfast``) is replaced by :class:`ModuleTable`, so it is removed from that page."""

    default_priority = 99

    def apply(self, **kwargs: object) -> None:
        from sphinx.ext.autosummary import autosummary_table

        if self.env.docname != "book/api/index":
            return
        for node in list(self.document.findall(autosummary_table)):
            node.parent.remove(node)


_FUNCTION_DEFAULT = re.compile(r"<(?:function|built-in function) ([\w.]+)(?: at 0x[0-9a-f]+)?>")


def _factory_call(factory: Any) -> str:
    """``list()`` for ``default_factory=list``; ``TransformerShape(...)`` for a lambda making
    one."""
    name = getattr(factory, "__name__", "")
    if name.isidentifier():
        return f"{name}()"
    try:
        return f"{type(factory()).__name__}(...)"
    except Exception:  # a factory that needs what the build lacks: say only that there is one
        return "..."


def readable_signature(signature: str, obj: object) -> str:
    """A signature Sphinx can parse, and so shorten (``Iterable[Tensor]``, linked names).

    Defaults that are not Python expressions made Sphinx give up parsing and print the raw text,
    ``~collections.abc.Iterable[~torch.Tensor]`` included: a dataclass field's ``<factory>``
    becomes the factory's call (``list()``), a function default its name, and torch's
    ``<required parameter>`` sentinel (``lr`` of an optimizer) no default at all.
    """
    signature = signature.replace(" = <required parameter>", "")
    signature = _FUNCTION_DEFAULT.sub(r"\1", signature)
    if "<factory>" in signature and dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            if field.init and field.default_factory is not dataclasses.MISSING:
                signature = signature.replace("<factory>", _factory_call(field.default_factory), 1)
    return signature


def _on_process_signature(
    app: Sphinx,
    what: str,
    name: str,
    obj: object,
    options: object,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    if not signature:
        return None
    return readable_signature(signature, obj), return_annotation


def drop_repeated_inline_scripts(html: str) -> str:
    """``html`` without the second and later copies of an identical inline ``<script>`` line.

    sphinx-thebe's configuration (``const THEBE_JS_URL = ...``) reached every page twice, and
    declaring the constant again is a ``SyntaxError`` in every page's console (the browser test
    in tests/test_site_layout.py checks every page's console).
    """
    seen: set[str] = set()
    kept = []
    for line in html.split("\n"):
        tag = line.strip()
        if tag.startswith("<script>") and tag.endswith("</script>"):
            if tag in seen:
                continue
            seen.add(tag)
        kept.append(line)
    return "\n".join(kept)


def _drop_repeated_scripts(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    for page in Path(app.outdir).rglob("*.html"):
        if static in page.parents:
            continue
        text = page.read_text()
        cleaned = drop_repeated_inline_scripts(text)
        if cleaned != text:
            page.write_text(cleaned)


CALCULATOR_MARK = 'class="trainfast-calculator"'


def _add_calculator(
    app: Sphinx, pagename: str, templatename: str, context: dict, doctree: nodes.document | None
) -> None:
    if CALCULATOR_MARK in context.get("body", ""):
        app.add_css_file("calculator.css")
        app.add_js_file("calculator-data.js")
        app.add_js_file("calculator.js")


def _write_calculator_data(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        from trainfast.calculator import write_script

        write_script(Path(app.outdir) / "_static" / "calculator-data.js")


# --- 6. Notebooks a reader can open anywhere ---------------------------------------------------

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
        _, merged = get_cache(_cache_dir(app)).merge_match_into_notebook(notebook)
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


def setup(app: Sphinx) -> dict:
    app.setup_extension("sphinx.ext.viewcode")  # its events are connected below
    app.setup_extension("sphinx.ext.autodoc")  # so is autodoc-process-signature
    app.add_config_value("build_support_watch", [], "env", [list])
    app.add_config_value("build_support_gpu_notebooks", [], "html", [list])
    app.connect("config-inited", _on_config_inited)
    app.connect("builder-inited", _on_builder_inited)
    app.connect("builder-inited", _clear_generated_reference, priority=400)  # before autosummary
    app.connect("env-get-outdated", _on_env_get_outdated)
    app.connect("missing-reference", _on_missing_reference)
    app.connect("viewcode-follow-imported", _viewcode_module)
    app.connect("doctree-read", _on_doctree_read_prefaces, priority=480)  # before codeautolink
    app.add_transform(DropAutosummaryToctrees)
    app.add_transform(DropIndexAutosummaryTable)
    app.add_directive("trainfast-modules", ModuleTable)
    app.connect("autodoc-process-signature", _on_process_signature)
    app.add_css_file("reference.css")
    app.add_css_file("layout.css")
    app.connect("html-page-context", _add_calculator)
    app.connect("html-page-context", _restore_cached_outputs, priority=500)
    app.connect("html-page-context", _point_launch_buttons_at_notebooks, priority=600)
    app.connect("build-finished", _write_calculator_data)
    app.connect("build-finished", _drop_repeated_scripts)
    app.connect("build-finished", _write_notebooks)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
