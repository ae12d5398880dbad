"""The book's chapters and its built site, for the tests that check what ``make book`` produced.

The site tests (``test_site.py``, part of ``test_notebooks.py``) need ``_build/html``. They use it
when it is *current*: the stamp ``_build/.site-built``, which every HTML build writes when it
finishes (``book/_ext/build_support.py``), is newer than every source the site is built from
(``book/``, ``code/trainfast``, ``_config.yml``, ``_toc.yml``). Otherwise they are skipped with the
reason, since ``make test`` alone does not build the site (a build takes minutes); ``.ci/run`` runs
``make book`` first and sets ``TRAINFAST_BUILT_FIRST=1``, under which a missing or stale site fails
instead of skipping.

The browser tests start chromium one way, through :func:`chromium` here.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import importlib.util
import os
import shutil
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SITE_STAMP = ".site-built"  # build_support.SITE_STAMP (test_build.py checks they agree)
HTML = ROOT / "_build" / "html"
SOURCES = [ROOT / "book", ROOT / "code" / "trainfast", ROOT / "_config.yml", ROOT / "_toc.yml"]
#: Folders under the sources that are not sources (caches, run logs, generated downloads).
NOT_SOURCES = {"__pycache__", "wandb", ".ipynb_checkpoints", "downloads"}


def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def _toc() -> dict:
    return yaml.safe_load((ROOT / "_toc.yml").read_text()) or {}


def _toc_entries() -> list[dict]:
    """The chapter entries of ``_toc.yml`` (``chapters:``, or every part's), in reading order."""
    toc = _toc()
    return list(toc.get("chapters", [])) + [
        entry for part in toc.get("parts", []) for entry in part["chapters"]
    ]


def _page_name(file: str) -> str:
    return file.removeprefix("book/").removesuffix(".md")


def _is_chapter(file: str) -> bool:
    """A chapter of the book: ``book/<name>`` or ``book/<name>/index`` (not an appendix, not the
    API reference)."""
    parts = file.removeprefix("book/").split("/")
    return file.startswith("book/") and (
        len(parts) == 1 or (len(parts) == 2 and parts[1] == "index" and parts[0] != "api")
    )


def toc_chapters() -> list[str]:
    """Every chapter in ``_toc.yml`` by name (``optimizers``), intro and appendices excluded.

    A chapter is a page ``book/<name>.md`` or a folder ``book/<name>/`` whose ``index.md`` is
    listed with its section pages beneath it (``sections:``).
    """
    return [
        _page_name(entry["file"]).split("/")[0]
        for entry in _toc_entries()
        if _is_chapter(entry["file"])
    ]


def _sections(entry: dict) -> list[str]:
    found = []
    for section in entry.get("sections", []) or []:
        if "file" in section:
            found.append(_page_name(section["file"]))
            found += _sections(section)
    return found


def chapter_pages(name: str) -> list[str]:
    """The pages of chapter ``name`` in reading order, as names under ``book/`` without ``.md``:
    ``["optimizers/index", "optimizers/gradient_descent", ...]`` for a folder, ``["speedrun"]``
    for a chapter that is still one page."""
    for entry in _toc_entries():
        if _is_chapter(entry["file"]) and _page_name(entry["file"]).split("/")[0] == name:
            return [_page_name(entry["file"]), *_sections(entry)]
    raise KeyError(f"no chapter {name!r} in _toc.yml (chapters: {toc_chapters()})")


def toc_pages() -> list[str]:
    """Every page of every chapter (:func:`chapter_pages`), in reading order."""
    return [page for name in toc_chapters() for page in chapter_pages(name)]


def is_notebook(page: str) -> bool:
    """Page ``page`` (a name under ``book/``) is an executable notebook (its front matter names
    a kernel), not a page of prose alone."""
    text = (ROOT / "book" / f"{page}.md").read_text()
    return text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]


def notebook_pages() -> list[str]:
    """The pages of :func:`toc_pages` that execute (:func:`is_notebook`)."""
    return [page for page in toc_pages() if is_notebook(page)]


def chapter_of(page: str) -> str:
    """The chapter a page belongs to: ``optimizers`` for ``optimizers/momentum``."""
    return page.split("/")[0]


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return [p for p in root.rglob("*") if p.is_file() and not NOT_SOURCES & set(p.parts)]


def stale_reason(html: Path | None = None) -> str | None:
    """Why ``html`` (default ``_build/html``) is not a current build of the sources, or None."""
    html = html or HTML
    stamp = html.parent / SITE_STAMP
    if not (html / "searchindex.js").exists() or not stamp.exists():
        return f"no built site ({html.name}/searchindex.js or {SITE_STAMP}): run make book first"
    built = stamp.stat().st_mtime
    newer = [p for root in SOURCES for p in _files(root) if p.stat().st_mtime > built]
    if newer:
        return (
            f"the built site is older than {newer[0].relative_to(ROOT)} and {len(newer) - 1} "
            "other source files: run make book first"
        )
    return None


def built_site() -> Path:
    """``_build/html`` if current; otherwise skip, or fail under ``TRAINFAST_BUILT_FIRST=1``."""
    reason = stale_reason()
    if reason is not None:
        if os.environ.get("TRAINFAST_BUILT_FIRST") == "1":
            pytest.fail(f"TRAINFAST_BUILT_FIRST=1, but {reason}")
        pytest.skip(reason)
    return HTML


# --- the browser ---------------------------------------------------------------------------------

#: Debian's chromium; GitHub's Ubuntu runners ship Google Chrome instead.
CHROMIUM = next(
    filter(None, map(shutil.which, ["chromium", "chromium-browser", "google-chrome"])), None
)


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (no chromium, no Playwright), or None."""
    if CHROMIUM is None:
        return "Debian's chromium is not installed (.ci/run installs it as root)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (it is in requirements.txt)"
    return None


@contextlib.contextmanager
def chromium():
    """The one way the tests start a browser: the system chromium, headless, driven by Playwright.

    Skips (saying why) where there is no chromium or no Playwright.
    """
    reason = browser_missing()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield browser
        finally:
            browser.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(directory: Path):
    """``directory`` over HTTP on localhost; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
