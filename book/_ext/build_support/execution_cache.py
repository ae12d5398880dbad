"""The execution cache: chapters re-execute when the package changes, and execute in parallel.

1. **Re-execute chapters when the package changes.** myst-nb's execution cache (jupyter-cache)
   keys a notebook on its own code cells, and Sphinx re-reads only pages whose source changed.
   A change to ``code/trainfast`` would therefore publish stale outputs.
   :func:`invalidate_if_changed` hashes the files named in ``build_support_watch``; when the
   hash differs from the one stored beside the cache, it empties the cache and every page is
   marked outdated, so every chapter runs again. Every chapter imports the package, so "every
   chapter" is the right granularity.

2. **Execute the outdated chapters in parallel, while Sphinx reads the other pages.** myst-nb
   executes a chapter while Sphinx reads it, one after another (Jupyter Book never passes
   ``-j``), so one of two cores sat idle for most of a build. Just before Sphinx reads the pages
   (``env-before-read-docs``), :class:`ChapterExecutions` starts every notebook page that the
   cache does not match, ``build_support_jobs`` at a time (default: the CPU count), each in its
   own process exactly as myst-nb would (jupyter-cache's ``single_nb_execution``, in the
   chapter's folder), and moves those pages to the end of Sphinx's reading order. Sphinx reads
   the API reference and the other pages meanwhile; when it reaches a chapter (``source-read``)
   it waits for that chapter's execution and stores the result in the same cache. myst-nb then
   finds every chapter there and executes none, and the tests take the same executed notebooks
   (``tests/chapters.py``), so each chapter still executes once per CI run. A cell that raises
   fails the build with :class:`ChapterExecutionError`, which names the chapter, the cell and
   its line, after every other chapter finished and the ones that succeeded were cached.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.errors import SphinxError
from sphinx.util import logging

logger = logging.getLogger(__name__)

__all__ = [
    "STAMP_NAME",
    "ChapterExecutionError",
    "ChapterExecutions",
    "ExecutedChapter",
    "cache_dir",
    "become_subreaper",
    "children_cpu_seconds",
    "execute_one",
    "invalidate_if_changed",
    "reap_children",
    "source_hash",
]

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


def cache_dir(app: Sphinx) -> Path:
    """myst-nb's execution cache folder (jupyter-cache), as an absolute path."""
    root = Path(app.srcdir)
    folder = Path(app.config.nb_execution_cache_path or root / "_build" / ".jupyter_cache")
    return folder if folder.is_absolute() else root / folder


def _on_builder_inited(app: Sphinx) -> None:
    root = Path(app.srcdir)
    watched = [root / p for p in app.config.build_support_watch]
    missing = [str(p) for p in watched if not p.exists()]
    if missing:
        raise FileNotFoundError(f"build_support_watch names paths that do not exist: {missing}")
    if not watched:
        app.env.build_support_changed = False  # type: ignore[attr-defined]
        return
    changed = invalidate_if_changed(cache_dir(app), watched)
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


class ChapterExecutionError(SphinxError):
    """A chapter's cell raised while the build executed it (the message names chapter and cell)."""

    category = "Chapter execution error"


@dataclass
class ExecutedChapter:
    """What a worker sends back: the executed notebook (as JSON), its wall-clock seconds and
    its kernel's CPU seconds, or the error."""

    path: str
    notebook: str
    seconds: float
    error: str | None = None
    cpu_seconds: float | None = None


def children_cpu_seconds() -> float:
    """User plus system CPU seconds of this process's children that have ended and been waited
    for, their own waited-for children included (``getrusage(RUSAGE_CHILDREN)``).

    The difference across one notebook's execution (:func:`execute_one`) is its kernel's CPU
    time: jupyter_client waits for the kernel when it shuts it down, a kernel waits for the
    processes it starts (gloo ranks, a ``torch.compile`` worker pool), and the processes it
    leaves behind (multiprocessing's fork server, which starts the ranks of
    ``trainfast.distributed.spawn``) are waited for by :func:`execute_one`, their reaper.
    Unlike wall time it does not grow when other work shares the cores, so a page's budget is
    set in it (``tests/test_chapters.py``).
    """
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux's
    ``PR_SET_CHILD_SUBREAPER``), so that a process a kernel leaves running when it exits is
    re-parented here, not to ``init``, and its CPU time can be counted; False where the system
    cannot (then such time is lost, as before)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_children(timeout: float = 10.0) -> int:
    """Wait, up to ``timeout`` seconds in all, for every child of this process to end (with
    :func:`become_subreaper`, the orphans of a kernel too), so their CPU time joins
    :func:`children_cpu_seconds`. Returns how many it reaped; children still running at the end
    are left alone. Meant for a process whose every child is a page's (a build worker)."""
    import time

    reaped, deadline = 0, time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped  # no children left
        if pid:
            reaped += 1
            continue
        if time.monotonic() > deadline:
            return reaped
        time.sleep(0.05)


def page_label(path: str | Path) -> str:
    """How the build names a page in its log: ``optimizers/momentum`` for a section page,
    ``speedrun`` for a chapter that is one page (the path under ``book/``, without ``.md``)."""
    path = Path(path)
    parts = path.with_suffix("").parts
    return "/".join(parts[parts.index("book") + 1 :]) if "book" in parts else path.stem


def read_notebook(path: Path):  # noqa: ANN201 - nbformat.NotebookNode
    """Chapter ``path`` as a notebook, read as myst-nb reads it (with each cell's line)."""
    from myst_nb.core.read import read_myst_markdown_notebook

    return read_myst_markdown_notebook(path.read_text(), path=path, add_source_map=True)


def _failed_cell(notebook, path: Path) -> str:  # noqa: ANN001
    """ "code cell N (line L)" of the first cell with an error output, and its error."""
    lines = notebook.metadata.get("source_map", [])
    number = 0
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        number += 1
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                line = f", line {lines[index] + 1}" if index < len(lines) else ""
                first = (cell.source.strip().splitlines() or [""])[0][:80]
                return (
                    f"{path}: code cell {number} ({path.name}{line}: `{first}`) raised "
                    f"{output.get('ename')}: {output.get('evalue')}"
                )
    return f"{path}: execution failed before any cell raised"


def execute_one(path: str, timeout: int | None, allow_errors: bool) -> ExecutedChapter:
    """Execute page ``path`` in its folder as myst-nb's cache mode does, and measure its CPU
    time (:func:`children_cpu_seconds`); runs in a worker process of its own, every child of
    which is the page's (the build's pool, or ``tests/chapters.py``)."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    chapter = Path(path)
    notebook = read_notebook(chapter)
    become_subreaper()
    cpu_before = children_cpu_seconds()
    result = single_nb_execution(
        notebook,
        cwd=str(chapter.parent),
        allow_errors=allow_errors,
        timeout=timeout,
        meta_override=True,
    )
    reap_children()
    cpu_seconds = children_cpu_seconds() - cpu_before
    error = None
    if result.err is not None:
        error = _failed_cell(notebook, chapter)
        if error.endswith("before any cell raised"):
            error += f" ({type(result.err).__name__}: {result.err})"
    return ExecutedChapter(path, nbformat.writes(notebook), result.time, error, cpu_seconds)


def _store(cache: Path, outcome: ExecutedChapter) -> None:
    """Put a successful ``outcome`` into jupyter-cache ``cache``, as myst-nb's would be."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    jcache = get_cache(cache)
    record = jcache.add_nb_to_project(outcome.path)
    jcache.cache_notebook_bundle(
        CacheBundleIn(
            nbformat.reads(outcome.notebook, as_version=4),
            record.uri,
            data={"execution_seconds": outcome.seconds, "cpu_seconds": outcome.cpu_seconds},
        ),
        check_validity=False,
        overwrite=True,
    )


class ChapterExecutions:
    """Chapters executing ``jobs`` at a time in worker processes, collected one by one.

    Workers only execute; this process writes the cache, one notebook at a time, as each
    chapter is collected with :meth:`collect` (Sphinx: when it reaches the page). A failed
    chapter is reported by :meth:`collect` only after every chapter finished, so the others are
    cached first and every failure is named at once.
    """

    def __init__(
        self,
        pages: dict[str, Path],
        cache: Path,
        jobs: int,
        timeout: int | None = None,
        allow_errors: bool = False,
    ) -> None:
        self.cache = cache
        self.outcomes: dict[str, ExecutedChapter] = {}
        self._pool = ProcessPoolExecutor(
            max(1, min(jobs, len(pages))), mp_context=get_context("spawn")
        )
        self._futures = {
            name: self._pool.submit(execute_one, str(path), timeout, allow_errors)
            for name, path in pages.items()
        }

    def collect(self, name: str) -> ExecutedChapter | None:
        """Wait for chapter ``name`` and cache it; None if it is not one of these chapters.

        Raises :class:`ChapterExecutionError` naming every failed chapter once all are done.
        """
        future = self._futures.pop(name, None)
        if future is None:
            return self.outcomes.get(name)
        outcome = self.outcomes[name] = future.result()
        state = "failed" if outcome.error else "executed"
        cpu = "" if outcome.cpu_seconds is None else f", {outcome.cpu_seconds:.1f} s of CPU"
        logger.info(
            f"[build_support] {page_label(outcome.path)}: {state} in {outcome.seconds:.1f} s{cpu}"
        )
        if outcome.error is None:
            _store(self.cache, outcome)
            return outcome
        self.collect_all()
        raise ChapterExecutionError(self.failures())

    def collect_all(self) -> list[ExecutedChapter]:
        """Wait for every chapter still running (caching each success); all outcomes, in order."""
        for name in list(self._futures):
            future = self._futures.pop(name)
            outcome = self.outcomes[name] = future.result()
            if outcome.error is None:
                _store(self.cache, outcome)
        self._pool.shutdown()
        return list(self.outcomes.values())

    def failures(self) -> str:
        """Every failed chapter's error, one a line ("" when none failed)."""
        return "\n".join(o.error for o in self.outcomes.values() if o.error)

    def cancel(self) -> None:
        """Start nothing more (the build stopped); chapters already running finish."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def outdated_notebooks(paths: Iterable[Path], cache: Path) -> list[Path]:
    """The notebook pages among ``paths`` that the cache ``cache`` holds no current result for."""
    from jupyter_cache import get_cache

    jcache = get_cache(cache)
    outdated = []
    for path in paths:
        try:
            jcache.match_cache_notebook(read_notebook(path))
        except KeyError:
            outdated.append(path)
    return outdated


def is_notebook_page(path: Path) -> bool:
    """A MyST Markdown page that myst-nb reads as a notebook (front matter with a kernelspec)."""
    if path.suffix != ".md":
        return False
    text = path.read_text()
    return text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]


def jobs_for(app: Sphinx) -> int:
    """``build_support_jobs``, else ``TRAINFAST_BUILD_JOBS``, else the CPU count (at least 1)."""
    setting = app.config.build_support_jobs or os.environ.get("TRAINFAST_BUILD_JOBS") or 0
    try:
        jobs = int(setting)
    except ValueError:
        raise ValueError(f"build_support_jobs must be a whole number, got {setting!r}") from None
    return max(1, jobs or os.cpu_count() or 1)


def _on_env_before_read_docs(app: Sphinx, env: BuildEnvironment, docnames: list[str]) -> None:
    if app.config.nb_execution_mode != "cache":
        return  # "off", "force", "auto", "inline": myst-nb does what was asked, as before
    import fnmatch

    excluded = app.config.nb_execution_excludepatterns or []
    pages = {name: Path(env.doc2path(name)) for name in sorted(docnames)}
    pages = {
        name: path
        for name, path in pages.items()
        if is_notebook_page(path) and not any(fnmatch.fnmatch(str(path), x) for x in excluded)
    }
    cache = cache_dir(app)
    outdated = set(outdated_notebooks(pages.values(), cache))
    pages = {name: path for name, path in pages.items() if path in outdated}
    if not pages:
        return
    jobs = jobs_for(app)
    names = ", ".join(page_label(path) for path in pages.values())
    logger.info(f"[build_support] executing {len(pages)} pages, {jobs} at a time: {names}")
    timeout = app.config.nb_execution_timeout
    executions = ChapterExecutions(
        pages, cache, jobs, timeout, bool(app.config.nb_execution_allow_errors)
    )
    if app.parallel > 1:  # Sphinx reads in forked processes, which cannot wait for these
        executions.collect_all()
        if executions.failures():
            raise ChapterExecutionError(executions.failures())
        return
    app.build_support_executions = executions  # type: ignore[attr-defined]
    # read everything else while the chapters run, then the chapters in the order they started
    docnames[:] = [n for n in docnames if n not in pages] + [n for n in docnames if n in pages]


def _executions(app: Sphinx) -> ChapterExecutions | None:
    return getattr(app, "build_support_executions", None)


def _on_source_read(app: Sphinx, docname: str, source: list[str]) -> None:  # noqa: ARG001
    """Sphinx reached a page: if it is a chapter still executing, wait for it and cache it."""
    executions = _executions(app)
    if executions is not None:
        executions.collect(docname)


def _on_env_updated(app: Sphinx, env: BuildEnvironment) -> list[str]:
    """Every page was read: no chapter may still be running (one Sphinx did not read)."""
    executions = _executions(app)
    if executions is not None:
        executions.collect_all()
        app.build_support_executions = None  # type: ignore[attr-defined]
    return []


def _on_build_finished(app: Sphinx, exception: Exception | None) -> None:  # noqa: ARG001
    executions = _executions(app)
    if executions is not None:  # the build stopped before it read every page
        executions.cancel()
        app.build_support_executions = None  # type: ignore[attr-defined]


def setup(app: Sphinx) -> None:
    """Connect the cache's events (called by the extension's ``setup``)."""
    app.add_config_value("build_support_watch", [], "env", [list])
    app.add_config_value("build_support_jobs", 0, "", [int])
    app.connect("builder-inited", _on_builder_inited)
    app.connect("env-get-outdated", _on_env_get_outdated)
    app.connect("env-before-read-docs", _on_env_before_read_docs)
    app.connect("source-read", _on_source_read)
    app.connect("env-updated", _on_env_updated)
    app.connect("build-finished", _on_build_finished)
