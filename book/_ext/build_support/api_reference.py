"""The API reference (``book/api``): names resolved where defined, listings linked, an index.

1. **Resolve package names where they are defined.** The reference documents each object once,
   in the module that defines it (``trainfast.optim.adam.AdamW``). Docstrings and chapters name
   it where readers import it (``trainfast.optim.AdamW``, or ``AdamW`` inside
   ``trainfast.optim``). A cross-reference Sphinx cannot find is imported and retried at the
   object's defining module; a name that exists in the package but has no entry (a private
   kernel, an instance attribute) is shown as code without a link. Names that do not exist at
   all still warn, so ``-n`` keeps catching typos.

2. **Link names in listings.** ``sphinx-codeautolink`` links the names of a code block to their
   API entries, using the block's imports. A listing (``literalinclude`` of a package file) has
   none, so each one gets a preface importing its module's own public names, and the block after
   it gets the same import again, so that the listing's ``def`` does not shadow the chapter's
   own import of that name in the cells that follow.

3. **The index.** ``.. trainfast-modules::`` is a table of every public module, the first
   sentence of its docstring, and the chapter that teaches it: the first chapter, in reading
   order, that lists the module's code (a ``literalinclude``) or, failing that, imports from it
   (:func:`teaching_chapters`).

The reference's navigation is ``_toc.yml``'s glob of the generated pages; the toctrees that
autosummary adds (its ``:toctree:`` option is what makes it generate pages) are dropped before
sphinx-external-toc, which allows no toctree but its own, sees them. Signatures are made
readable (:func:`readable_signature`) so that Sphinx can parse and shorten them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.transforms import SphinxTransform
from sphinx.util.docutils import SphinxDirective

__all__ = [
    "PACKAGE",
    "chapter_modules",
    "defined_at",
    "import_name",
    "listing_module",
    "module_summary",
    "public_names",
    "readable_signature",
    "teaching_chapters",
]

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


_LISTING = re.compile(r"^[`:]{3,}\{literalinclude\}\s+(\S+)", re.M)
_CODE_CELL = re.compile(r"^(`{3,})\{code-cell\}[^\n]*\n(.*?)^\1\s*$", re.M | re.S)


def _cell_code(body: str) -> str:
    """A code cell's Python: its ``---`` options block and IPython magics left out."""
    if body.startswith("---\n"):
        body = body.split("\n---\n", 1)[-1]
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) or line.startswith(":") else line
        for line in body.splitlines()
    )


def chapter_modules(text: str, chapter: Path, code_root: Path) -> tuple[set[str], set[str]]:
    """``(listed, imported)``: the package modules chapter ``text`` (its file ``chapter``)
    shows in a ``literalinclude``, and those its code cells import from.

    ``from trainfast.optim import AdamW`` imports ``trainfast.optim`` and, since ``AdamW`` is
    defined in ``trainfast.optim.adam``, that module too.
    """
    listed = set()
    for target in _LISTING.findall(text):
        module = listing_module(str(chapter.parent / target), code_root)
        if module:
            listed.add(module)
    imported: set[str] = set()
    for match in _CODE_CELL.finditer(text):
        try:
            tree = ast.parse(_cell_code(match.group(2)))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
                imported.update(n for n in names if n.split(".")[0] == PACKAGE)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PACKAGE:
                imported.add(node.module)
                for alias in node.names:
                    obj = import_name(f"{node.module}.{alias.name}")
                    home = (
                        obj.__name__ if inspect.ismodule(obj) else getattr(obj, "__module__", None)
                    )
                    if isinstance(home, str) and home.split(".")[0] == PACKAGE:
                        imported.add(home)
    return listed, imported


def teaching_chapters(
    modules: list[str], chapters: dict[str, tuple[set[str], set[str]]]
) -> dict[str, str | None]:
    """The chapter that teaches each module, from what the chapters list and import.

    ``chapters`` maps each chapter, in reading order, to :func:`chapter_modules`'s
    ``(listed, imported)``. A module's chapter is the first that lists its code; failing that,
    the first that imports from it, unless every chapter does (then it is the book's machinery,
    such as the device helper every chapter's first cell imports, and no chapter teaches it);
    failing that, its subpackage's chapter; else None. The package itself is None.
    """
    found: dict[str, str | None] = {}
    for module in modules:
        listing = [name for name, (listed, _) in chapters.items() if module in listed]
        importing = [name for name, (_, imported) in chapters.items() if module in imported]
        everywhere = len(chapters) > 1 and len(importing) == len(chapters)
        found[module] = listing[0] if listing else None
        if found[module] is None and importing and not everywhere:
            found[module] = importing[0]
    found[PACKAGE] = None  # every chapter imports the package itself
    for module in modules:  # a module no chapter lists or imports: its subpackage's chapter
        parent = module.rpartition(".")[0]
        while found[module] is None and parent in found and parent != PACKAGE:
            found[module] = found[parent]
            parent = parent.rpartition(".")[0]
    return found


def reading_order(srcdir: Path, chapters: Iterable[str]) -> list[str]:
    """``chapters`` (page names under ``book/``: ``speedrun``, ``optimizers/adam``) in
    ``_toc.yml``'s order, a chapter's section pages after its landing page, any others after
    them all."""
    import yaml

    toc_file = srcdir / "_toc.yml"
    toc = yaml.safe_load(toc_file.read_text()) if toc_file.exists() else {}

    def walk(entries: list[dict]) -> list[str]:
        found = []
        for entry in entries or []:
            if entry.get("file", "").startswith("book/"):
                found.append(entry["file"].removeprefix("book/"))
            found += walk(entry.get("sections", []))
        return found

    order = walk((toc or {}).get("chapters", []))
    names = set(chapters)
    return [n for n in order if n in names] + sorted(names - set(order))


def _is_teaching_page(book: Path, path: Path) -> bool:
    """A notebook page under ``book`` that teaches: a chapter or section page, not the intro,
    an appendix or the API reference's own pages."""
    relative = path.relative_to(book)
    if relative.parts[0] in ("api", "appendix") or relative.as_posix() == "intro.md":
        return False
    text = path.read_text()
    return text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]


class ModuleTable(SphinxDirective):
    """``.. trainfast-modules::``: every public module of the package, a line on what it holds,
    and the page that teaches it (a chapter on one page, or the section page of a chapter that
    is a folder), as one table (the API reference's index)."""

    def run(self) -> list[nodes.Node]:
        import pkgutil

        package = importlib.import_module(PACKAGE)
        modules = [PACKAGE] + [
            info.name
            for info in pkgutil.walk_packages(package.__path__, PACKAGE + ".")
            if not any(part.startswith("_") for part in info.name.split("."))
        ]
        srcdir = Path(self.env.srcdir)
        book, code_root = srcdir / "book", srcdir / "code"
        names = [
            path.relative_to(book).with_suffix("").as_posix()
            for path in book.rglob("*.md")
            if f"book/{path.relative_to(book).with_suffix('').as_posix()}" in self.env.found_docs
            and _is_teaching_page(book, path)
        ]
        chapters = {}
        for name in reading_order(srcdir, names):
            path = book / f"{name}.md"
            chapters[name] = chapter_modules(path.read_text(), path, code_root)
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


def setup(app: Sphinx) -> None:
    """Connect the reference's events (called by the extension's ``setup``)."""
    app.setup_extension("sphinx.ext.viewcode")  # its events are connected below
    app.setup_extension("sphinx.ext.autodoc")  # so is autodoc-process-signature
    app.connect("builder-inited", _clear_generated_reference, priority=400)  # before autosummary
    app.connect("missing-reference", _on_missing_reference)
    app.connect("viewcode-follow-imported", _viewcode_module)
    app.connect("doctree-read", _on_doctree_read_prefaces, priority=480)  # before codeautolink
    app.add_transform(DropAutosummaryToctrees)
    app.add_transform(DropIndexAutosummaryTable)
    app.add_directive("trainfast-modules", ModuleTable)
    app.connect("autodoc-process-signature", _on_process_signature)
    app.add_css_file("reference.css")
