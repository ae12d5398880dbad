"""sphinx-codeautolink's links written into the finished pages on every core, not one.

When the build finishes, sphinx-codeautolink parses each written page that has code (up to
0.7 MB of HTML), puts the links into its code blocks and writes it back, one page
after another: about 30 s of a build on one core while the other sat idle. The pages are
independent, so :func:`link_pages` gives the same work (codeautolink's own ``link_html``, with the
same arguments) to ``build_support_jobs`` forked processes, the largest pages first. A warning
that ``link_html`` gives in a worker (a block or a name it cannot match) is given again by the
build, so ``-W`` still fails on it; its links cache is written by the build, as before.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

from build_support.execution_cache import jobs_for

__all__ = ["link_pages"]


class _Recorder:
    """Stands in for codeautolink's logger in a worker: keeps each warning to give it again."""

    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, msg: str, **kwargs: Any) -> None:
        self.warnings.append((str(msg), kwargs))


#: What the forked workers inherit: each page's transforms and the arguments common to all.
_WORK: dict[str, Any] = {}


def _link_one(document: str) -> list[tuple[str, dict[str, Any]]]:
    """Run in a forked worker: codeautolink's ``link_html`` on one page; its warnings."""
    from sphinx_codeautolink.extension import block

    recorder = _Recorder()
    block.logger = recorder  # this process's copy of the module only
    block.link_html(document, transforms=_WORK["transforms"][document], **_WORK["common"])
    return recorder.warnings


def link_pages(app: Sphinx, state: Any) -> None:
    """What codeautolink's ``apply_links`` does for ``state`` (its extension object), with the
    pages shared among ``build_support_jobs`` processes."""
    from sphinx_codeautolink.extension import block

    documents = [
        doc
        for doc, transforms in state.cache.transforms.items()
        if transforms and str(Path(doc)) in state.outdated_docs
    ]
    common = {
        "out_dir": app.outdir,
        "inventory": state.inventory,
        "custom_blocks": state.custom_blocks,
        "search_css_classes": state.search_css_classes,
        "builder_name": app.builder.name,
        "disable_link_titles": state.disable_link_titles,
    }

    def page(doc: str) -> Path:
        return Path(app.outdir) / (doc + ".html")

    def size(doc: str) -> int:
        return page(doc).stat().st_size if page(doc).exists() else 0

    documents.sort(key=size, reverse=True)
    jobs = min(jobs_for(app), len(documents))
    if jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
        _WORK.update(transforms=state.cache.transforms, common=common)
        context = multiprocessing.get_context("fork")  # the workers inherit _WORK
        try:
            with ProcessPoolExecutor(jobs, mp_context=context) as pool:
                results = list(pool.map(_link_one, documents))
        finally:
            _WORK.clear()
        for warnings in results:
            for msg, kwargs in warnings:
                block.logger.warning(msg, **kwargs)
    else:
        for doc in documents:
            block.link_html(doc, transforms=state.cache.transforms[doc], **common)
    state.cache.write()


def _on_builder_inited(app: Sphinx) -> None:
    """Put :func:`link_pages` in the place of codeautolink's ``apply_links`` among the
    ``build-finished`` listeners (same id, same priority, same turn)."""
    if os.environ.get("TRAINFAST_SERIAL_LINKS"):
        return  # codeautolink's own serial pass, to compare
    listeners = app.events.listeners.get("build-finished", [])
    for index, listener in enumerate(listeners):
        state = getattr(listener.handler, "__self__", None)
        name = getattr(listener.handler, "__name__", "")
        if type(state).__name__ != "SphinxCodeAutoLink" or name != "apply_links":
            continue

        def apply_links(app: Sphinx, exception: Exception | None, state: Any = state) -> None:
            if not state.do_nothing and exception is None:
                link_pages(app, state)

        listeners[index] = listener._replace(handler=apply_links)


def setup(app: Sphinx) -> None:
    """Connect the links' events (called by the extension's ``setup``)."""
    app.connect("builder-inited", _on_builder_inited)
