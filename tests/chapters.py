"""Checks every chapter-level test module runs on its chapter, and on each of its pages.

A chapter is one page (``book/<name>.md``) or a folder of section pages (``book/<name>/index.md``
and ``book/<name>/<section>.md``, listed in ``_toc.yml`` under the chapter's ``sections:``). The
checks below take a chapter's name, which covers every page of it, or one page's name
(``optimizers/momentum``); execution is per page.

Three rules from the book's conventions (README, "Writing a chapter"):

1. Code the reader studies is *included* from the package: a ``{literalinclude}`` of a file in
   ``code/trainfast`` with ``:pyobject:`` naming an object that exists. A Python block that is
   not executed is an error unless it is marked ``:class: excerpt`` (an excerpt of something
   else, e.g. torch's source, with a caption saying where from). A code cell may not define a
   function or class under a name the package already exports (that would be a hand copy).
2. (In each chapter's own test module) every hand-written implementation matches torch.
3. Each page executes top to bottom as a notebook on CPU; :func:`execute_chapter` times it, in
   wall-clock and in CPU seconds.

Each page is executed once per ``.ci/run``: ``make book`` executes every chapter into
jupyter-cache, and :func:`execute_chapter` takes that executed notebook instead of running the
chapter again, but only when it is provably current: the cache's stamp of the watched sources
(``code/trainfast``, ``book/records``; see ``book/_ext/build_support/execution_cache.py``) equals
their hash now, and the cache holds a notebook whose code cells and cell metadata equal the
chapter's now (jupyter-cache's own match). Otherwise, as on a fresh clone running ``make test``
alone, it executes the chapter itself. Either way a cell that raised fails the test. Within one
pytest session a chapter is executed (or taken from the build) once, however many tests look at it
(:func:`executed_notebook`). ``.ci/run`` sets ``TRAINFAST_BUILT_FIRST=1`` after ``make book``: then
a chapter that the build's cache cannot supply is an error, not a second execution.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import trainfast
import yaml
from myst_nb.core.read import read_myst_markdown_notebook

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PACKAGE = ROOT / "code" / "trainfast"
EXECUTION_CACHE = ROOT / "_build" / ".jupyter_cache"

#: (chapter, seconds) for every chapter executed in this session; printed by conftest.py.
EXECUTION_TIMES: list[tuple[str, float]] = []
#: page -> its :class:`Execution`, so a page runs once per session.
EXECUTED: dict[str, Execution] = {}

_FENCE = re.compile(r"^(?P<fence>`{3,}|:{3,})\s*(?P<info>[^\n]*)$")
_PYTHON = {"python", "py", "python3", "ipython", "ipython3", "pycon"}


@dataclass
class Block:
    """A fenced block of a MyST page: its info string, options and body."""

    line: int
    info: str
    options: dict[str, str]
    body: str

    @property
    def directive(self) -> str | None:
        match = re.match(r"\{([\w:-]+)\}", self.info)
        return match.group(1) if match else None

    @property
    def argument(self) -> str:
        return re.sub(r"^\{[\w:-]+\}\s*", "", self.info).strip()


def chapter_path(name: str) -> Path:
    """The MyST source of page ``name``: ``book/<name>.md`` (``optimizers/momentum``,
    ``speedrun``), or a folder chapter's landing page ``book/<name>/index.md``."""
    for path in (BOOK / f"{name}.md", BOOK / name / "index.md"):
        if path.exists():
            return path
    raise FileNotFoundError(f"No page {name!r}: neither book/{name}.md nor book/{name}/index.md")


def pages_of(name: str) -> list[str]:
    """The pages ``name`` stands for: a chapter's pages in reading order, or the page itself."""
    import book_site

    if name in book_site.toc_chapters():
        return book_site.chapter_pages(name)
    chapter_path(name)  # a page that does not exist raises, naming it
    return [name]


def _is_closing(line: str, fence: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= len(fence) and set(stripped) == {fence[0]}


def blocks(text: str, first_line: int = 1) -> list[Block]:
    """Every fenced block (``` or :::) of a MyST page with its options, nested ones included."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i].strip())
        if not match or not match.group("info").strip():
            i += 1
            continue
        fence, info = match.group("fence"), match.group("info").strip()
        start, i = i, i + 1
        body: list[str] = []
        while i < len(lines) and not _is_closing(lines[i], fence):
            body.append(lines[i])
            i += 1
        i += 1
        options: dict[str, str] = {}
        while body and (m := re.match(r"^:([\w-]+):\s*(.*)$", body[0].strip())):
            options[m.group(1)] = m.group(2).strip()
            body.pop(0)
        block = Block(first_line + start, info, options, "\n".join(body))
        found.append(block)
        if block.directive not in ("code-cell", "code-block", "code", "sourcecode", None):
            found.extend(blocks(block.body, first_line + start + 1))
    return found


def _resolve(module: str, dotted: str) -> object:
    obj: object = importlib.import_module(module)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _package_names() -> set[str]:
    """Every public name the package exports (``__all__`` of each module)."""
    names: set[str] = set()
    for info in pkgutil.walk_packages(trainfast.__path__, prefix="trainfast."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency missing: nothing exported to compare
            continue
        names.update(getattr(module, "__all__", []))
    return names - {"__version__"}


def docstring_free_lines(obj: object) -> str:
    """The ``:lines:`` spec that shows ``obj``'s source (as Sphinx counts it: from the decorator,
    as ``inspect.getsource``) whole except its docstring."""
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(obj))
    node = ast.parse(source).body[0]
    doc = node.body[0]
    assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), obj
    last = len(source.rstrip("\n").splitlines())
    return f"1-{doc.lineno - 1},{doc.end_lineno + 1}-{last}"


def listing_lines(chapter: str, name: str) -> str:
    """The ``:lines:`` spec of the listing of ``:pyobject: name`` in chapter (or page)
    ``chapter``."""
    pattern = re.compile(rf":pyobject: {name}\n:lines: ([\d,-]+)\n")
    for page in pages_of(chapter):
        match = pattern.search(chapter_path(page).read_text())
        if match:
            return match.group(1)
    raise LookupError(f"{chapter}: no listing of {name} with :lines:")


def listing_problems(name: str) -> list[str]:
    """Every breach of rule 1 in chapter (or page) ``name``, as readable messages (empty if
    none); a chapter that is a folder is checked page by page."""
    exported = _package_names()
    return [
        problem for page in pages_of(name) for problem in _page_listing_problems(page, exported)
    ]


def _page_listing_problems(name: str, exported: set[str]) -> list[str]:
    path = chapter_path(name)
    problems: list[str] = []
    for block in blocks(path.read_text()):
        where = f"{path.relative_to(BOOK)}:{block.line}"
        if block.directive == "literalinclude":
            target = (path.parent / block.argument).resolve()
            if PACKAGE not in target.parents:
                problems.append(f"{where}: listing {block.argument} is not from code/trainfast")
                continue
            if not target.exists():
                problems.append(f"{where}: listing {block.argument} does not exist")
                continue
            obj = block.options.get("pyobject")
            if not obj:
                problems.append(f"{where}: listing {block.argument} has no :pyobject:")
                continue
            module = ".".join(target.relative_to(PACKAGE.parent).with_suffix("").parts)
            module = module.removesuffix(".__init__")
            try:
                _resolve(module, obj)
            except (ImportError, AttributeError) as error:
                problems.append(f"{where}: {module}.{obj} does not resolve ({error})")
        elif block.directive == "code-cell":
            try:
                tree = ast.parse(block.body)
            except SyntaxError:
                continue  # IPython magics; execution will tell
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in exported:
                    problems.append(
                        f"{where}: code cell defines {node.name!r}, which trainfast exports: "
                        "import it instead of copying it"
                    )
        elif block.directive in ("code-block", "code", "sourcecode") or (
            block.directive is None and block.info.split()[:1] and block.info.split()[0] in _PYTHON
        ):
            language = block.argument.split()[:1] if block.directive else block.info.split()[:1]
            if (
                language
                and language[0] in _PYTHON
                and "excerpt" not in block.options.get("class", "")
            ):
                problems.append(
                    f"{where}: unexecuted Python block; include it from the package, make it a "
                    "code-cell, or mark it ':class: excerpt' with a caption naming its source"
                )
    return problems


def read_chapter(name: str) -> nbformat.NotebookNode:
    """Page ``name`` (a chapter that is one page, or a section page) as a notebook, read as the
    book build reads it."""
    path = chapter_path(name)
    return nbformat.from_dict(read_myst_markdown_notebook(path.read_text(), path=path))


def _watched_sources_are_current(cache: Path) -> bool:
    """True if the cache's stamp equals the hash of the watched sources as they are now."""
    build_support = _build_support()
    stamp = cache / build_support.STAMP_NAME
    if not stamp.exists():
        return False
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    watched = [ROOT / p for p in config["sphinx"]["config"]["build_support_watch"]]
    return stamp.read_text().strip() == build_support.source_hash(watched)


@dataclass(frozen=True)
class Execution:
    """A page executed as a notebook: the notebook with its outputs, the wall-clock seconds it
    took, and its kernel's CPU seconds (None where the build's cache did not record them)."""

    notebook: nbformat.NotebookNode
    seconds: float
    cpu_seconds: float | None


def _build_support():  # noqa: ANN202 - the build's extension, imported as the build does
    """The build's extension; ``book/_ext`` stays on the path, so that a process started to
    execute a page (:func:`_execute`) can import it too."""
    if str(ROOT / "book" / "_ext") not in sys.path:
        sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import build_support

    return build_support


def executed_by_the_build(name: str, cache: Path | None = None) -> Execution | None:
    """The notebook ``make book`` executed for page ``name``, if it is provably current.

    Returns the :class:`Execution` (the seconds and CPU seconds the build measured), or None
    when there is no cache, the package or records changed since it was filled, or no cached
    notebook matches the page's cells as they are now. ``cache`` defaults to the book build's.
    """
    cache = cache if cache is not None else EXECUTION_CACHE
    if not (cache / "global.db").exists() or not _watched_sources_are_current(cache):
        return None
    from jupyter_cache import get_cache

    jcache = get_cache(cache)
    try:
        record = jcache.match_cache_notebook(read_chapter(name))
        bundle = jcache.get_cache_bundle(record.pk)
    except KeyError:
        return None
    cpu = record.data.get("cpu_seconds")
    return Execution(
        bundle.nb,
        float(record.data.get("execution_seconds") or 0.0),
        None if cpu is None else float(cpu),
    )


def cell_errors(notebook: nbformat.NotebookNode) -> list[str]:
    """``ename: evalue`` of every error output in an executed notebook."""
    return [
        f"{output.get('ename')}: {output.get('evalue')}"
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]


def execute_chapter(name: str, timeout: int = 1800) -> Execution:
    """Execute page ``name`` as a notebook in its folder (or take the build's execution).

    See the module docstring for when the book build's execution is taken instead.
    """
    return _execute(name, timeout)


def executed_notebook(name: str, timeout: int = 1800) -> nbformat.NotebookNode:
    """Page ``name`` executed as :func:`execute_chapter` executes it (once per session)."""
    return _execute(name, timeout).notebook


def _execute(name: str, timeout: int) -> Execution:
    if name in EXECUTED:
        return EXECUTED[name]
    cached = executed_by_the_build(name)
    if cached is not None:
        errors = cell_errors(cached.notebook)
        if errors:
            raise AssertionError(f"page {name!r} raised in the book build: {errors[0]}")
        EXECUTION_TIMES.append((f"{name} (executed by make book)", cached.seconds))
        EXECUTED[name] = cached
        return cached
    if os.environ.get("TRAINFAST_BUILT_FIRST") == "1":
        raise AssertionError(
            f"page {name!r}: TRAINFAST_BUILT_FIRST=1 says make book ran just before, but its "
            "execution cache holds no current notebook for the page (the page, the package "
            "or book/records changed since, or the build did not execute it)"
        )
    # as the build does (build_support.execution_cache.execute_one): in a process of its own,
    # whose every child is the page's, so that its CPU time is the page's
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    execute_one = _build_support().execution_cache.execute_one
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        outcome = pool.submit(execute_one, str(chapter_path(name)), timeout, False).result()
    if outcome.error is not None:
        raise AssertionError(f"page {name!r} raised: {outcome.error}")
    notebook = nbformat.reads(outcome.notebook, as_version=4)
    EXECUTION_TIMES.append((name, outcome.seconds))
    EXECUTED[name] = Execution(notebook, outcome.seconds, outcome.cpu_seconds)
    return EXECUTED[name]


_PROSE_DIRECTIVES = {"note", "tip", "warning", "important", "admonition", "seealso", "caution"}
_ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")  # {glue:text}`x:.1f`, {cite}`key`, {ref}`label`
_CITATION_LINK = re.compile(r"\[[^\]]*\b(?:19|20)\d\d[a-z]?\b[^\]]*\]\([^)]*\)")
_NUMBER = re.compile(r"(?<![\w.\-/])\d+(?:[.,]\d+)*(?![\w]|-\w)")


def typed_numbers(name: str, allow: Iterable[str] = ()) -> list[str]:
    """Numbers typed by hand in chapter ``name``'s prose, as ``"line N: number in 'context'"``.

    Prose is what remains after removing front matter, fenced blocks (code cells, listings,
    bibliographies; the text of admonitions stays), display and inline math, inline code, roles
    (glue, citations, references), citation links (``[Author, 2020](url)``), link targets, labels,
    exercise numbers (``**3. Title.**``) and the markers of numbered lists (``3. ``). A number
    written into a name (``float32``, ``GPT-2``, ``2-D``, ``124M``) is not counted. Every other
    number must be glued from a cell, or be a
    constant listed in ``allow`` (compared as written, e.g. ``"32"`` or ``"0.9"``). A chapter
    that is a folder is read page by page, each entry prefixed with its page
    (``"optimizers/momentum: line N: ..."``). ``tests/test_chapters.py`` runs it on every page.
    """
    pages = pages_of(name)
    if len(pages) == 1:
        return numbers_in_prose(chapter_path(pages[0]).read_text(), allow)
    return [
        f"{page}: {entry}"
        for page in pages
        for entry in numbers_in_prose(chapter_path(page).read_text(), allow)
    ]


def numbers_in_prose(page: str, allow: Iterable[str] = ()) -> list[str]:
    """:func:`typed_numbers` for the text of a MyST page."""
    allowed = set(allow)
    lines = page.splitlines()
    found: list[str] = []
    fence: str | None = None
    in_front_matter = bool(lines) and lines[0].strip() == "---"
    in_math = False
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if in_front_matter:
            in_front_matter = number == 1 or stripped != "---"
            continue
        if fence is not None:
            if _is_closing(line, fence):
                fence = None
            continue
        match = _FENCE.match(stripped)
        if match and match.group("info").strip():
            directive = re.match(r"\{([\w:-]+)\}", match.group("info").strip())
            if not (directive and directive.group(1) in _PROSE_DIRECTIVES):
                fence = match.group("fence")
            continue
        if stripped.startswith("$$"):
            in_math = not (in_math or (len(stripped) > 2 and stripped.endswith("$$")))
            continue
        if in_math or re.match(r"^\(.+\)=$", stripped) or stripped.startswith("<!--"):
            continue
        text = re.sub(r"^\*\*\d+\.", "**", stripped)  # exercise numbers
        text = re.sub(r"^\d+\.\s", "", text)  # the marker of an item of a numbered list
        text = _ROLE.sub(" ", text)
        text = re.sub(r"`[^`]*`", " ", text)  # inline code
        text = re.sub(r"\$[^$]*\$", " ", text)  # inline math
        text = _CITATION_LINK.sub(" ", text)  # [Author et al., 2020](url): a reference
        text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
        for token in _NUMBER.findall(text):
            if token not in allowed:
                found.append(f"line {number}: {token} in {stripped[:80]!r}")
    return found


#: Numbers a page's prose may type (constants of the argument, not results), by chapter; every
#: other number in prose is glued (:func:`typed_numbers`, run on every page by test_chapters.py).
PROSE_CONSTANTS: dict[str, set[str]] = {
    "hyperparameters": set(
        "0 1 2 3 4 5 6 8 9 16 20 25 32 64 95 256 1,024 0.5 0.95 0.999 2.1 2.3".split()
    ),
    "memory_hierarchy": set("1 2 4 6 12 16 32 64 100 128 256 300 512 1,024 4096 2.6".split()),
    "mixed_precision": set(
        (
            "0 0.01 0.1 0.5 0.9 1 1.5 2 2.9 3 4 5 6 7 8 10 11 12 14 15 16 23 32 50 64 100 128 "
            "256 448 80 1000 1024 4096 65504 65536 50,257 50,304"
        ).split()
    ),
    "optimizers": {"0", "0.1", "0.95", "1", "2", "4", "8", "20", "30", "50", "64", "95", "256"},
    "parallelism": set(
        "0 1 2 3 4 5 8 16 25 34 41 64 80 148 200 256 400 0.01 1.5 2,048 2,304 8,192 "
        "2.2.2 3.3.2 4.2.3".split()
    ),
    "profiling": {"1", "2", "3", "4", "5", "6", "7", "8", "64", "256", "3.14"},
    # the NanoGPT speedrun's published rules (KellerJordan/modded-nanogpt, README: 3.28 validation
    # loss on FineWeb, llm.c's trainer after 45 minutes on 8 H100s, a record's mean loss shown at
    # p < 0.01); 1 numbers each page's first exercise; 40 s is exercise 1's made-up one-off cost
    "speedrun": set("1 8 40 45 0.01 3.28".split()),
    "appendix": set("0 1 3 5 100".split()),
}
