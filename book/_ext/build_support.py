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
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from collections.abc import Iterable
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.environment import BuildEnvironment
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


def setup(app: Sphinx) -> dict:
    app.add_config_value("build_support_watch", [], "env", [list])
    app.connect("config-inited", _on_config_inited)
    app.connect("builder-inited", _on_builder_inited)
    app.connect("env-get-outdated", _on_env_get_outdated)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
