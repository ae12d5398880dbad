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
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import shutil
from collections.abc import Iterable
from pathlib import Path

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.environment import BuildEnvironment
from sphinx.transforms import SphinxTransform
from sphinx.util import logging

logger = logging.getLogger(__name__)

STAMP_NAME = "watched-sources.sha256"


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


def _on_builder_inited(app: Sphinx) -> None:
    root = Path(app.srcdir)
    watched = [root / p for p in app.config.build_support_watch]
    missing = [str(p) for p in watched if not p.exists()]
    if missing:
        raise FileNotFoundError(f"build_support_watch names paths that do not exist: {missing}")
    if not watched:
        app.env.build_support_changed = False  # type: ignore[attr-defined]
        return
    cache_dir = Path(app.config.nb_execution_cache_path or root / "_build" / ".jupyter_cache")
    if not cache_dir.is_absolute():
        cache_dir = root / cache_dir
    changed = invalidate_if_changed(cache_dir, watched)
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


class DropAutosummaryToctrees(SphinxTransform):
    """Remove autosummary's toctrees: ``_toc.yml`` is the navigation (see the module docstring)."""

    default_priority = 99  # before sphinx-external-toc's InsertToctrees (100) warns about them

    def apply(self, **kwargs: object) -> None:
        from sphinx.ext.autosummary import autosummary_toc

        for node in list(self.document.findall(autosummary_toc)):
            node.parent.remove(node)


CALCULATOR_MARK = 'class="trainfast-calculator"'


def _on_html_page_context(
    app: Sphinx, pagename: str, templatename: str, context: dict, doctree: nodes.document | None
) -> None:
    if CALCULATOR_MARK in context.get("body", ""):
        app.add_css_file("calculator.css")
        app.add_js_file("calculator-data.js")
        app.add_js_file("calculator.js")


def _on_build_finished(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        from trainfast.calculator import write_script

        write_script(Path(app.outdir) / "_static" / "calculator-data.js")


def setup(app: Sphinx) -> dict:
    app.add_config_value("build_support_watch", [], "env", [list])
    app.connect("config-inited", _on_config_inited)
    app.connect("builder-inited", _on_builder_inited)
    app.connect("env-get-outdated", _on_env_get_outdated)
    app.connect("missing-reference", _on_missing_reference)
    app.connect("doctree-read", _on_doctree_read_prefaces, priority=480)  # before codeautolink
    app.connect("html-page-context", _on_html_page_context)
    app.add_transform(DropAutosummaryToctrees)
    app.add_css_file("reference.css")
    app.connect("build-finished", _on_build_finished)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
