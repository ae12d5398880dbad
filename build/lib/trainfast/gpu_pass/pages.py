"""The book's executable pages, in reading order, from its table of contents.

A page is named by its path under ``book/`` without ``.md``: ``optimizers`` for a chapter that
is one page, ``optimizers/index`` and ``optimizers/momentum`` for a chapter that is a folder of
section pages (``_toc.yml`` lists a chapter's ``file`` and, beneath it, its ``sections``). A page
is *executable* when it is a MyST notebook (its front matter has a ``kernelspec``); other pages
(``.rst``, plain Markdown) are left out. The chapter
of a page is its folder, or the page itself where the chapter is one file.

:func:`executable_pages` is the one enumeration of them, for the GPU pass (a step per page) and
for anything else that needs the list (tests, the build's helpers).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["executable_pages", "is_notebook", "page_chapter", "toc_pages"]


#: the sources a table-of-contents entry may name: MyST Markdown (a notebook or not), a
#: reStructuredText page (the API reference's), or a stored notebook (none is executed here)
_SUFFIXES = (".md", ".rst", ".ipynb")


def is_notebook(path: Path) -> bool:
    """Whether the MyST page at ``path`` is a notebook: a ``kernelspec`` in its front matter."""
    text = path.read_text()
    if not text.startswith("---"):
        return False
    return "kernelspec:" in text.split("\n---", 1)[0]


def _entries(entries: Any) -> Iterator[dict[str, Any]]:
    """Every entry of a table-of-contents list, each followed by its ``sections`` (depth first)."""
    for entry in entries or []:
        if not isinstance(entry, dict):
            raise ValueError(f"_toc.yml: an entry is not a mapping: {entry!r}")
        yield entry
        yield from _entries(entry.get("sections"))


def toc_pages(root: Path) -> list[str]:
    """Every page ``root/_toc.yml`` lists under ``book/``, in its order, as a name under ``book/``:
    the root, each chapter's ``file`` and then its ``sections`` (nested ones too), of ``chapters``
    or of each of ``parts``; a ``glob`` entry gives its matching pages, sorted. A missing file
    raises ``FileNotFoundError`` naming it, one that is not a table of contents ``ValueError``."""
    import yaml

    path = root / "_toc.yml"
    toc = yaml.safe_load(path.read_text())
    if not isinstance(toc, dict):
        raise ValueError(f"{path}: not a table of contents (a {type(toc).__name__})")
    lists = [toc.get("chapters")] + [part.get("chapters") for part in toc.get("parts") or []]
    files: list[str] = [toc["root"]] if toc.get("root") else []
    for entries in lists:
        for entry in _entries(entries):
            if "file" in entry:
                files.append(str(entry["file"]))
            elif "glob" in entry:
                matches = sorted(root.glob(f"{entry['glob']}.md"))
                files += [str(p.relative_to(root).with_suffix("")) for p in matches]
    pages = []
    for file in files:
        file = file.removesuffix(".md")
        if file.startswith("book/") and file not in pages:
            pages.append(file.removeprefix("book/"))
    return pages


def executable_pages(root: Path) -> list[str]:
    """The pages of :func:`toc_pages` that are notebooks, in the book's order.

    ``root`` is the repository (it holds ``_toc.yml`` and ``book/``). A page the table lists
    that does not exist raises ``FileNotFoundError`` naming it: a pass that silently skipped it
    would report the book as executed. Without a ``_toc.yml`` (a folder that is not the book's,
    as in a test), every notebook under ``root/book``, sorted.
    """
    if not (root / "_toc.yml").exists():
        book = root / "book"
        found = sorted(book.rglob("*.md")) if book.is_dir() else []
        return [str(p.relative_to(book).with_suffix("")) for p in found if is_notebook(p)]
    pages = []
    for page in toc_pages(root):
        found = [root / "book" / f"{page}{suffix}" for suffix in _SUFFIXES]
        path = next((p for p in found if p.exists()), None)
        if path is None:
            raise FileNotFoundError(
                f"_toc.yml lists book/{page}, but none of {[p.name for p in found]} exists"
            )
        if path.suffix == ".md" and is_notebook(path):
            pages.append(page)
    return pages


def page_chapter(page: str) -> str:
    """The chapter of ``page``: its folder (``optimizers`` for ``optimizers/momentum``), or the
    page itself for a chapter of one page."""
    return page.split("/", 1)[0]
