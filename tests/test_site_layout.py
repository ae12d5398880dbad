"""The built site as a reader sees it, in Debian's chromium at 1400 px: figures fill their column,
nothing is wider than its column (code, tables, equations), no page logs a console error, the
executed chapters show no raw logs, and no table has an empty column.

Every check is one function run on the real pages and, first, on a tiny planted page with the
defect it exists to catch, so a check that can no longer see its defect fails too. Needs a
current ``_build/html`` (see book_site.py), Playwright and ``chromium``; skipped, saying why,
without them.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import threading
from pathlib import Path

import book_site
import pytest

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (it is in requirements.txt)"
)
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no system chromium (apt-get install -y chromium)", allow_module_level=True)

CHAPTERS = book_site.toc_chapters()
WIDTH, HEIGHT = 1400, 2400
#: A figure narrower than this share of its column is too small to read (split it instead).
MIN_FIGURE_SHARE = 0.9

#: What a reader sees of the page's layout: the column, every figure's width, and every code
#: cell, table or display equation wider than the space it has (it scrolls or is cut off).
MEASURE = """() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const style = getComputedStyle(article);
  const box = article.getBoundingClientRect();
  const column = box.width - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  const right = box.right - parseFloat(style.paddingRight);
  const describe = (e) => (e.textContent || e.getAttribute('src') || '').trim().slice(0, 70);
  const figures = Array.from(article.querySelectorAll('img'))
    .filter((img) => !img.closest('.sphinx-codeautolink-a, a.headerlink, .tfc'))
    .map((img) => ({
      what: img.getAttribute('src'),
      share: img.getBoundingClientRect().width / column,
    }));
  const selectors = ['div.highlight pre', 'table', 'mjx-container[display="true"]', 'div.math'];
  const wide = [];
  for (const selector of selectors) {
    for (const e of article.querySelectorAll(selector)) {
      if (e.closest('.tfc')) continue;
      let scroller = e;  // the element, or the container that scrolls it sideways
      for (let p = e; p && p !== article; p = p.parentElement) {
        if (p.scrollWidth > p.clientWidth + 1 && getComputedStyle(p).overflowX !== 'visible') {
          scroller = p;
          break;
        }
      }
      const overflow = Math.max(scroller.scrollWidth - scroller.clientWidth,
                                e.getBoundingClientRect().right - right);
      if (overflow > 1) {
        wide.push(`${selector} ${Math.round(overflow)} px too wide: ${describe(e)}`);
      }
    }
  }
  return { column: column, figures: figures, wide: wide };
}"""


@pytest.fixture(scope="module")
def site() -> Path:
    return book_site.built_site()


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


def visit(browser, url: str) -> tuple[dict, list[str]]:
    """Open ``url`` at 1400 px; its layout (``MEASURE``) and its console errors."""
    tab = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    tab.on(
        "response",
        lambda r: errors.append(f"{r.status}: {r.url}") if r.status >= 400 else None,
    )
    try:
        tab.goto(url, wait_until="load")
        for attempt in range(3):  # a redirect page (/index.html) navigates on: measure its target
            try:
                # MathJax typesets after load: wait for it, a display equation's width counts
                tab.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
                tab.wait_for_timeout(200)
                return tab.evaluate(MEASURE), errors
            except sync_api.Error:
                if attempt == 2:
                    raise
                tab.wait_for_load_state("load")
        raise AssertionError("unreachable")
    finally:
        tab.close()


def small_figures(layout: dict) -> list[str]:
    return [
        f"{f['what']} at {f['share']:.0%} of the column"
        for f in layout["figures"]
        if f["share"] < MIN_FIGURE_SHARE
    ]


PLANTED = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<style>article { width: 800px; padding: 0 20px; } pre { overflow-x: auto; }</style></head>
<body><article class="bd-article">
<div class="cell_output"><img src="data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'
 width='400' height='100'/%3E"></div>
<div class="highlight"><pre>{long_line}</pre></div>
<table><tr><td>{long_cell}</td></tr></table>
</article><script>const X = 1;</script><script>const X = 2;</script></body></html>"""


def test_the_checks_see_each_planted_defect(browser, tmp_path):
    page = tmp_path / "planted.html"
    planted = PLANTED.replace("{long_line}", "x = 1  # " + "y" * 200)
    page.write_text(planted.replace("{long_cell}", "z" * 300))
    layout, errors = visit(browser, page.as_uri())
    assert small_figures(layout), "a figure at half the column must be flagged"
    assert any(w.startswith("div.highlight pre") for w in layout["wide"]), layout["wide"]
    assert any(w.startswith("table") for w in layout["wide"]), layout["wide"]
    assert any("X" in e for e in errors), f"a redeclared const must be an error: {errors}"


@pytest.fixture(scope="module")
def chapter_layouts(site, server, browser) -> dict[str, tuple[dict, list[str]]]:
    return {name: visit(browser, f"{server}/book/{name}.html") for name in ["intro", *CHAPTERS]}


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_chapter_figure_fills_most_of_its_column(chapter_layouts, name):
    layout, _ = chapter_layouts[name]
    small = small_figures(layout)
    assert not small, f"{name} (column {layout['column']:.0f} px):\n" + "\n".join(small)


@pytest.mark.parametrize("name", ["intro", *CHAPTERS])
def test_no_code_cell_table_or_equation_is_wider_than_its_column(chapter_layouts, name):
    layout, _ = chapter_layouts[name]
    wide = layout["wide"]
    assert not wide, f"{name}: {len(wide)} too wide:\n" + "\n".join(wide[:25])


def test_no_page_logs_a_console_error(site, server, browser):
    static = site / "_static"
    pages = [p for p in sorted(site.rglob("*.html")) if static not in p.parents]
    found = []
    for path in pages:
        _, errors = visit(browser, f"{server}/{path.relative_to(site).as_posix()}")
        found += [f"{path.relative_to(site)}: {error}" for error in errors]
    assert not found, f"{len(found)} console errors:\n" + "\n".join(found[:25])


# --- the executed chapters' outputs ------------------------------------------------------------

#: Output a reader should not see: log lines (glog's ``W1124 12:00:00``), warnings, progress
#: bars, and paths of the machine that built the book.
RAW_LOG = re.compile(
    r"^[WVIEF]\d{4} \d\d:\d\d:\d\d"  # torch's (glog-style) log lines
    r"|\w+Warning: |^WARNING[: ]"  # Python warnings and logging
    r"|\d+%\|[^|\n]*\|"  # a tqdm bar
    r"|/root/|/home/\w+/|/tmp/ipykernel",  # the build machine's paths
    re.M,
)


def raw_logs(notebook: dict) -> list[str]:
    """Shown outputs of a notebook that match ``RAW_LOG``, as ``cell <i>: <line>``. Outputs the
    page hides (tags ``remove-output``, ``remove-stderr`` for stderr, ``remove-cell``) are
    skipped."""
    found = []
    for i, cell in enumerate(notebook["cells"]):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] != "code" or tags & {"remove-output", "remove-cell"}:
            continue
        for output in cell.get("outputs", []):
            if output.get("name") == "stderr" and "remove-stderr" in tags:
                continue
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            text = "".join(text) if isinstance(text, list) else text
            for match in RAW_LOG.finditer(text):
                line = text[text.rfind("\n", 0, match.start()) + 1 :].split("\n", 1)[0]
                found.append(f"cell {i}: {line[:120]}")
    return found


def test_the_output_scan_sees_planted_logs():
    planted = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "outputs": [
                    {
                        "output_type": "stream",
                        "name": "stderr",
                        "text": "W1124 10:00:00.1 1 torch/_dynamo/x.py:1] Graph break\n",
                    },
                    {"output_type": "stream", "name": "stderr", "text": "40%|████      | 4/10\n"},
                    {"output_type": "stream", "name": "stdout", "text": "from /root/.cache/x\n"},
                ],
            },
            {
                "cell_type": "code",
                "metadata": {"tags": ["remove-stderr"]},
                "outputs": [
                    {"output_type": "stream", "name": "stderr", "text": "W1124 10:00:00 hidden\n"},
                ],
            },
        ]
    }
    assert len(raw_logs(planted)) == 3


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_executed_chapter_shows_raw_logs(site, name):
    notebook = site.parent / "jupyter_execute" / "book" / f"{name}.ipynb"
    found = raw_logs(json.loads(notebook.read_text()))
    assert not found, f"{name}: log lines in outputs:\n" + "\n".join(found[:20])


# --- tables ------------------------------------------------------------------------------------

EMPTY = re.compile(r"^\s*(|—|-|nan|None|not recorded yet)\s*$", re.I)


def empty_columns(html: str) -> list[str]:
    """Columns of the page's tables in which no body cell holds anything (header: why)."""
    found = []
    for table in re.findall(r"<table.*?</table>", html, flags=re.S):
        header = [
            re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<th.*?</th>", table, re.S)
        ]
        body = table.split("<tbody", 1)[-1]
        rows = [
            [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td.*?</td>", row, re.S)]
            for row in re.findall(r"<tr.*?</tr>", body, flags=re.S)
        ]
        rows = [row for row in rows if row]
        for column in range(max(map(len, rows), default=0)):
            cells = [row[column] for row in rows if column < len(row)]
            if cells and all(EMPTY.match(c) for c in cells):
                name = header[column] if column < len(header) else f"column {column + 1}"
                found.append(f"{name!r}: {cells[0]!r} in every row")
    return found


def test_the_table_check_sees_a_planted_empty_column():
    planted = (
        "<table><thead><tr><th>way</th><th>peak</th></tr></thead><tbody>"
        "<tr><td>a</td><td>not recorded yet</td></tr><tr><td>b</td><td></td></tr></tbody></table>"
    )
    assert empty_columns(planted) == ["'peak': 'not recorded yet' in every row"]


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_table_has_an_empty_column(site, name):
    found = empty_columns((site / "book" / f"{name}.html").read_text())
    assert not found, f"{name}: empty columns:\n" + "\n".join(found)
