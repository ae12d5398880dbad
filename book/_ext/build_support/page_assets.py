"""What the HTML pages load: the theme's settings, a local MathJax, the calculator, one copy of
each inline script.

1. **Serve MathJax from the site itself.** Sphinx loads MathJax from a CDN by default; the
   ``django-static-mathjax`` wheel (in requirements.txt) ships MathJax 3.2.2, whose single-file
   SVG build we copy into ``_static``. Without that wheel the CDN default is kept.

2. **The calculator's data.** A page with a ``<div class="trainfast-calculator">`` gets the
   widget (``_static/calculator-accounting.js``, ``calculator-step.js`` and ``calculator.js``,
   hand-written) and its data, which the HTML build writes
   from the package (:func:`trainfast.calculator.write_script`) into
   ``_static/calculator-data.js``, so the widget's presets and test cases are always the
   package's.

3. **One copy of each inline script** (:func:`drop_repeated_inline_scripts`).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.config import Config

__all__ = ["CALCULATOR_MARK", "drop_repeated_inline_scripts", "kernel_profile"]

#: What every kernel the build starts runs first (see :func:`kernel_profile`).
KERNEL_STARTUP = Path(__file__).parent.with_name("kernel_startup")


def kernel_profile(build: Path) -> Path:
    """An IPython folder under ``build`` whose default profile runs the scripts of
    ``book/_ext/kernel_startup`` when a kernel starts (``IPYTHONDIR`` points kernels at it).

    Today that is two scripts: ``figure_text.py`` (each PNG a figure writes records its
    smallest text in points, which the layout tests read) and ``build_machine_logs.py`` (drops
    one log message of the build machine's CUDA toolkit without a GPU). The scripts are copied
    afresh at every build.
    """
    folder = build / "ipython"
    startup = folder / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    for old in startup.glob("*.py"):
        old.unlink()
    for script in sorted(KERNEL_STARTUP.glob("*.py")):
        (startup / f"50-{script.name}").write_text(script.read_text())
    return folder


def _on_config_inited(app: Sphinx, config: Config) -> None:
    # The theme's top bar held only a second search box (the sidebar has one): no top bar.
    config.html_theme_options = {**config.html_theme_options, "navbar_persistent": []}
    # pydata-sphinx-theme reads ``default_mode`` from the page context; without it every page
    # logged "Got invalid theme mode: . Resetting to auto." as a console error.
    config.html_context = {"default_mode": "auto", **config.html_context}
    # The kernels that execute the chapters inherit this: figures drawn for the page's column.
    os.environ.setdefault("MATPLOTLIBRC", str(Path(__file__).parent.with_name("matplotlibrc")))
    # ... and this: each figure's PNG records its smallest text (kernel_startup/figure_text.py).
    os.environ.setdefault("IPYTHONDIR", str(kernel_profile(Path(app.srcdir) / "_build")))
    spec = importlib.util.find_spec("mathjax")
    if spec is None or spec.origin is None:
        return  # keep Sphinx's CDN default
    bundle = Path(spec.origin).parent / "static" / "mathjax" / "es5" / "tex-svg.js"
    if bundle.exists():
        config.html_static_path = [*config.html_static_path, str(bundle)]
        config.mathjax_path = "tex-svg.js"


CALCULATOR_MARK = 'class="trainfast-calculator"'
#: The widget's scripts in the order they must load: its data, the accounting, the step model,
#: the widget itself.
CALCULATOR_SCRIPTS = (
    "calculator-data.js",
    "calculator-accounting.js",
    "calculator-step.js",
    "calculator.js",
)


def _add_calculator(
    app: Sphinx, pagename: str, templatename: str, context: dict, doctree: nodes.document | None
) -> None:
    if CALCULATOR_MARK in context.get("body", ""):
        app.add_css_file("calculator.css")
        for script in CALCULATOR_SCRIPTS:
            app.add_js_file(script)


def _write_calculator_data(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        from trainfast.calculator import write_script

        write_script(Path(app.outdir) / "_static" / "calculator-data.js")


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


def setup(app: Sphinx) -> None:
    """Connect the pages' events (called by the extension's ``setup``)."""
    app.connect("config-inited", _on_config_inited)
    app.add_css_file("layout.css")
    app.connect("html-page-context", _add_calculator)
    app.connect("build-finished", _write_calculator_data)
    app.connect("build-finished", _drop_repeated_scripts)
