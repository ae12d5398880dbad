"""The built site as a reader sees it, in Debian's chromium at 1400 px and on a 390 px phone.

At 1400 px: every figure is shown at its print size (never stretched beyond 1.1x, its text at
least 9 pt), has a numbered caption and alt text in words, and nothing is wider than its column
(code, tables, equations); no page logs a console error. On a phone no page is wider than the
screen and no figure's text shrinks below 7 pt. In what a reader reads: no visible ``glue(``
line, no machine path (a temporary folder, PyTorch CI's ``/__w/``), no ``nan`` table cell, no
raw logs, no empty table column, no prose line that MyST swallows as a comment (``%``), no
reStructuredText role in a code block (a docstring's ``:func:``), and no "1 block(s)".

Every check is one function run on the real pages and, first, on a tiny planted page with the
defect it exists to catch and on a clean one without it, so a check that can no longer see its
defect, or that sees defects where there are none, fails too. The real pages need a current
``_build/html`` (see book_site.py); the browser needs Playwright and ``chromium``
(``book_site.chromium``); each is skipped, saying why, without them.
"""

from __future__ import annotations

import base64
import html as html_text
import json
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import book_site
import pytest

sys.path.insert(0, str(book_site.ROOT / "book" / "_ext"))
import page_style  # noqa: E402  (how the build sizes figures: the PNG's resolution)

CHAPTERS = book_site.toc_pages()  # every page of every chapter (a section page is a page)
PAGES = ["intro", *CHAPTERS]
WIDE = {"width": 1400, "height": 2400}
PHONE = {"width": 390, "height": 844}
#: A figure shown larger than its print size by more than this is blurry and its text too big.
MAX_UPSCALE = 1.1
#: The smallest text a figure may show: in points on a wide screen, in CSS pixels on a phone.
MIN_TEXT_PT = 9.0
MIN_PHONE_TEXT_PX = 7.0

#: What a reader sees of the page's layout: the column, every figure (its file, its natural and
#: shown width, caption and alt), every code cell, table or display equation wider than the
#: space it has, and what sticks out of the screen sideways; and the texts the checks read.
MEASURE = """() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const style = getComputedStyle(article);
  const box = article.getBoundingClientRect();
  const column = box.width - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  const right = box.right - parseFloat(style.paddingRight);
  const describe = (e) => (e.textContent || e.getAttribute('src') || '').trim().slice(0, 70);
  const figures = Array.from(article.querySelectorAll('img'))
    .filter((img) => !img.closest('.sphinx-codeautolink-a, a.headerlink, .tfc'))
    .map((img) => {
      const figure = img.closest('figure');
      const caption = figure && figure.querySelector('figcaption');
      let scroller = null;  // a box that scrolls the figure sideways: part of it is hidden
      for (let p = img.parentElement; p && p !== article; p = p.parentElement) {
        if (p.scrollWidth > p.clientWidth + 1 && getComputedStyle(p).overflowX !== 'visible') {
          scroller = p;
          break;
        }
      }
      const r = img.getBoundingClientRect();
      return {
        src: img.currentSrc || img.src,
        alt: img.getAttribute('alt') || '',
        natural: img.naturalWidth,
        shown: r.width,
        past_column: Math.max(0, r.right - right,
                              box.left + parseFloat(style.paddingLeft) - r.left),
        scrolled: !!scroller,
        caption: caption ? caption.textContent.trim() : '',
        numbered: !!(caption && caption.querySelector('.caption-number')),
      };
    });
  const scrolls = (e) => {  // the element, or the container that scrolls it sideways
    for (let p = e; p && p !== document.body; p = p.parentElement) {
      if (p.scrollWidth > p.clientWidth + 1 && getComputedStyle(p).overflowX !== 'visible') {
        return p;
      }
    }
    return null;
  };
  const selectors = ['div.highlight pre', 'table', 'mjx-container[display="true"]', 'div.math'];
  const wide = [];
  for (const selector of selectors) {
    for (const e of article.querySelectorAll(selector)) {
      if (e.closest('.tfc')) continue;
      const scroller = scrolls(e) || e;
      const overflow = Math.max(scroller.scrollWidth - scroller.clientWidth,
                                e.getBoundingClientRect().right - right);
      if (overflow > 1) {
        wide.push(`${selector} ${Math.round(overflow)} px too wide: ${describe(e)}`);
      }
    }
  }
  // What sticks out of the screen sideways without a box that scrolls it: the innermost ones.
  const screen = document.documentElement.clientWidth;
  const out = [];
  for (const e of document.body.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || r.right <= screen + 1 || getComputedStyle(e).visibility === 'hidden') {
      continue;
    }
    if (r.left >= screen || scrolls(e.parentElement)) continue;  // off-canvas, or in a scroller
    const inner = Array.from(e.children).some((c) => c.getBoundingClientRect().right > screen + 1);
    if (!inner) out.push(`<${e.tagName.toLowerCase()} class="${e.className}"> to ` +
                         `${Math.round(r.right)} px: ${describe(e)}`);
  }
  const texts = (selector) => Array.from(article.querySelectorAll(selector))
    .map((e) => e.innerText || e.textContent);
  return {
    column: column, figures: figures, wide: wide,
    page_width: document.documentElement.scrollWidth, screen: screen, sticking_out: out,
    code_inputs: texts('.cell_input, .cell .cell_input'),
    outputs: texts('.cell_output, span.pasted-text, .pasted-inline, table, figcaption'),
    cells: texts('td, th').map((s) => s.trim()),
    imageless_figures: Array.from(article.querySelectorAll('figure'))
      .filter((f) => !f.querySelector('img, svg, video, iframe, canvas'))
      .map((f) => (f.id || '') + ': ' + f.textContent.trim().slice(0, 60)),
    tables: Array.from(article.querySelectorAll('table')).filter((t) => !t.closest('.tfc'))
      .map((t) => ({
      visible: t.checkVisibility ? t.checkVisibility() : !!t.offsetParent,
      rows: Array.from(t.querySelectorAll('tbody tr, tr')).filter((r) => r.querySelector('td'))
        .map((r) => Array.from(r.querySelectorAll('td')).map((c) => c.textContent.trim())),
      head: Array.from(t.querySelectorAll('th')).map((c) =>  // a name set as code is meant
        (c.querySelector('code') ? '`' : '') + c.textContent.trim()),
    })),
    bold_glue: Array.from(article.querySelectorAll('span.pasted-text'))
      .filter((e) => parseInt(getComputedStyle(e).fontWeight, 10) >= 600)
      .map((e) => e.textContent.trim().slice(0, 60)),
  };
}"""


@pytest.fixture(scope="module")
def site() -> Path:
    return book_site.built_site()


@pytest.fixture(scope="module")
def server(site):
    with book_site.serve(site) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    with book_site.chromium() as browser:
        yield browser


def listen(tab) -> list[str]:
    """A list that fills with ``tab``'s console errors, uncaught exceptions and failed loads."""
    errors: list[str] = []
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    tab.on(
        "response",
        lambda r: errors.append(f"{r.status}: {r.url}") if r.status >= 400 else None,
    )
    return errors


def open_page(tab, url: str, settle_ms: int = 200, then: str | None = None):
    """Go to ``url`` and wait for MathJax to typeset (a display equation's width counts), then
    ``settle_ms`` for late requests (a favicon); the value of the script ``then``, if given. A
    redirect page (the root index.html) navigates on: this waits for its target."""
    from playwright.sync_api import Error

    tab.goto(url, wait_until="load")
    for attempt in range(3):
        try:
            tab.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
            tab.wait_for_timeout(settle_ms)
            return tab.evaluate(then) if then else None
        except Error:
            if attempt == 2:
                raise
            tab.wait_for_load_state("load")
    raise AssertionError("unreachable")


def visit_all(
    browser, urls: dict[str, str], viewport: dict = WIDE, measure: bool = True, settle_ms: int = 200
) -> dict[str, tuple[dict | None, list[str]]]:
    """Open each of ``urls`` (key: url) in turn at ``viewport``; each page's layout (``MEASURE``,
    or None without ``measure``) and the console errors it logged. One tab for them all: the pages
    share its HTTP cache, so each loads the theme's scripts from it (a fresh tab per page took
    over twice as long)."""
    tab = browser.new_page(viewport=viewport)
    errors = listen(tab)
    found = {}
    try:
        for key, url in urls.items():
            errors.clear()
            layout = open_page(tab, url, settle_ms, then=MEASURE if measure else None)
            found[key] = (layout, list(errors))
    finally:
        tab.close()
    return found


def visit(browser, url: str, viewport: dict = WIDE) -> tuple[dict, list[str]]:
    """Open ``url`` at ``viewport``; its layout (``MEASURE``) and its console errors."""
    return visit_all(browser, {url: url}, viewport)[url]


# --- figures -------------------------------------------------------------------------------------


def smallest_figure_text_pt(rc: Path = book_site.ROOT / "book" / "_ext" / "matplotlibrc") -> float:
    """The smallest text size the book's matplotlibrc gives a figure (ticks, legend, labels)."""
    sizes = []
    for line in rc.read_text().splitlines():
        key, _, value = line.split("#", 1)[0].partition(":")
        if key.strip().endswith(("font.size", "labelsize", "legend.fontsize", "titlesize")):
            try:
                sizes.append(float(value))
            except ValueError:
                pass  # a relative size ("medium") is relative to font.size
    return min(sizes)


def image_file(src: str, site: Path | None, base: str | None) -> Path | bytes | None:
    """The file (or, for a ``data:`` URL, the bytes) behind an image's URL."""
    if src.startswith("data:"):
        header, _, payload = src.partition(",")
        return base64.b64decode(payload) if header.endswith(";base64") else None
    parts = urlsplit(src)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if site is not None and base is not None and src.startswith(base):
        return site / unquote(parts.path).lstrip("/")
    return None


def _png_bytes(figure: dict, site: Path | None, base: str | None) -> bytes | None:
    found = image_file(figure["src"], site, base)
    if isinstance(found, Path):
        found = found.read_bytes() if found.is_file() and found.suffix == ".png" else None
    if found and found[:8] == b"\x89PNG\r\n\x1a\n":
        return found
    return None


def print_scale(figure: dict, site: Path | None = None, base: str | None = None) -> float:
    """How large the page shows a figure relative to its print size (1 = one figure inch per CSS
    inch). A PNG's print size comes from the resolution it records (``page_style``); an image
    that records none (an SVG, a PNG without ``pHYs``) is at print size at its natural width."""
    png = _png_bytes(figure, site, base)
    dpi = page_style.png_info(png)[2] if png else None
    natural_print = figure["natural"] * page_style.CSS_DPI / (dpi or page_style.CSS_DPI)
    return figure["shown"] / natural_print if natural_print else 1.0


def smallest_text_pt(figure: dict, site: Path | None = None, base: str | None = None) -> float:
    """The smallest text of a figure at its print size, in points: what the figure's PNG records
    (``trainfast:smallest-text-pt``, written by ``book/_ext/kernel_startup/figure_text.py`` in
    the build's kernels), else the smallest size the book's matplotlibrc gives."""
    png = _png_bytes(figure, site, base)
    recorded = page_style.png_text(png).get(page_style.SMALLEST_TEXT_KEY) if png else None
    return float(recorded) if recorded else smallest_figure_text_pt()


#: CSS pixels per point (a point is 1/72 inch, a CSS pixel 1/96).
PX_PER_PT = 96 / 72


def figure_scale_problems(
    layout: dict, min_pt: float | None = None, site=None, base=None, min_px: float | None = None
) -> list[str]:
    """Figures shown above ``MAX_UPSCALE`` times their print size, whose smallest text comes out
    under ``min_pt`` points (or ``min_px`` CSS pixels), or that are wider than the column or
    cut off by a box that scrolls them sideways."""
    found = []
    for figure in layout["figures"]:
        if not figure["natural"]:
            continue  # not loaded: the console-error test reports it
        scale = print_scale(figure, site, base)
        smallest = smallest_text_pt(figure, site, base)
        name = figure["src"].rsplit("/", 1)[-1][:24]
        if scale > MAX_UPSCALE:
            found.append(f"{name}: shown at {scale:.2f}x its print size (blurry, text too big)")
        if min_pt is not None and smallest * scale < min_pt - 0.05:
            found.append(f"{name}: {smallest:g} pt text shown at {smallest * scale:.1f} pt")
        if min_px is not None and smallest * scale * PX_PER_PT < min_px - 0.05:
            found.append(
                f"{name}: {smallest:g} pt text shown at {smallest * scale * PX_PER_PT:.1f} px"
            )
        if figure.get("past_column", 0) > 1 or figure.get("scrolled"):
            found.append(
                f"{name}: {figure['shown']:.0f} px wide, wider than its column (part of it is "
                "off the screen or behind a sideways scroll)"
            )
    return found


def path_like(alt: str) -> bool:
    """A file name or path (one word with a slash or an image suffix), not a sentence that
    happens to hold a slash, such as "FLOP/s"."""
    alt = alt.strip()
    return not re.search(r"\s", alt) and bool(re.search(r"[/\\]|\.(png|svg|jpe?g|gif)$", alt, re.I))


def uncaptioned_figures(layout: dict) -> list[str]:
    """Figures without a numbered caption, or whose alt text is missing or a file name, and
    figures that hold no image (a cell's figure that came out as its text, ``<Figure size
    1344x960 with 2 Axes>``, when the PNG could not be drawn)."""
    found = [f"{figure}: a figure with no image" for figure in layout.get("imageless_figures", [])]
    for figure in layout["figures"]:
        name = figure["src"].rsplit("/", 1)[-1][:24]
        if not figure["numbered"] or len(figure["caption"]) < 10:
            found.append(f"{name}: no numbered caption")
        if len(figure["alt"].strip()) < 10 or path_like(figure["alt"]):
            found.append(f"{name}: alt text {figure['alt']!r} does not say what it shows")
    return found


# --- what a reader reads -------------------------------------------------------------------------

GLUE_LINE = re.compile(r"^\s*(?:\w+\.)*glue\(", re.M)
#: Paths of the machine that built the book, or of PyTorch's CI, in what the page shows.
MACHINE_PATH = re.compile(
    r"(?<![\w.])(/tmp/|/var/folders/|/private/var/|/__w/|/root/|/home/\w+/|/Users/\w+/"
    r"|[A-Z]:\\Users\\)"
)
NAN_CELL = re.compile(r"^(nan|NaN|<NA>|NaT|-?inf)$")


def visible_glue_lines(layout: dict) -> list[str]:
    """Lines of visible code cells that call ``glue(`` (build bookkeeping, not the lesson)."""
    return [
        match.group(0).strip() + "..."
        for code in layout["code_inputs"]
        for match in re.finditer(r"^\s*(?:\w+\.)*glue\(.{0,40}", code, re.M)
    ]


def machine_paths(layout: dict) -> list[str]:
    """Outputs, glued values, tables and captions that show a path of the build machine."""
    found = []
    for text in layout["outputs"]:
        for match in MACHINE_PATH.finditer(text):
            line = text[text.rfind("\n", 0, match.start()) + 1 :].split("\n", 1)[0]
            found.append(line.strip()[:120])
    return found


def nan_cells(layout: dict) -> list[str]:
    return [cell for cell in layout["cells"] if NAN_CELL.match(cell)]


#: The most rows a table a reader sees at once may have: a page shows the rows its argument
#: needs and puts a whole record one click away (``trainfast.records.full_record``, collapsed).
MAX_VISIBLE_TABLE_ROWS = 20
DASHES = {"–", "—", "-", ""}
#: Notes addressed to the book's maintainers rather than its readers.
MAINTAINER_NOTE = re.compile(r"Rows without a measurement|has not been measured yet|\bTODO\b")


def record_table_problems(layout: dict) -> list[str]:
    """Tables shown as a dump rather than read: a ``None`` cell, a row whose every cell but the
    first is a dash (nothing measured), a header that is a raw field name (``gb_per_s``, or
    ``bytes (bytes)``), a visible table of more than :data:`MAX_VISIBLE_TABLE_ROWS` rows, and a
    note to the maintainer under one."""
    found = []
    for table in layout["tables"]:
        first = (table["rows"][0][0] if table["rows"] and table["rows"][0] else "")[:40]
        for row in table["rows"]:
            if "None" in row:
                found.append(f"table at {first!r}: a cell reads None")
            if len(row) > 1 and all(cell in DASHES for cell in row[1:]):
                found.append(f"table at {first!r}: the row {row[0]!r} is only dashes")
        for head in table["head"]:
            raw = re.fullmatch(r"[a-z]+(?:_[a-z0-9]+)+(?: \(.*\))?", head)
            repeated = re.fullmatch(r"(\w+) \(\1\)", head)
            if raw or repeated:
                found.append(f"table at {first!r}: the header {head!r} is a field name")
        if table["visible"] and len(table["rows"]) > MAX_VISIBLE_TABLE_ROWS:
            found.append(
                f"table at {first!r}: {len(table['rows'])} rows shown at once (at most "
                f"{MAX_VISIBLE_TABLE_ROWS}: show the rows the argument needs, the rest collapsed)"
            )
    for text in layout["outputs"]:
        for match in MAINTAINER_NOTE.finditer(text):
            found.append(f"a note to the maintainer: {text[match.start() : match.start() + 70]!r}")
    return found


def too_wide_for_a_phone(layout: dict) -> list[str]:
    """The page is wider than the screen: what sticks out (the innermost elements)."""
    if layout["page_width"] <= layout["screen"] + 1:
        return []
    return [f"page {layout['page_width']} px wide on a {layout['screen']} px screen"] + layout[
        "sticking_out"
    ][:10]


def comment_lines(markdown: str) -> list[str]:
    """Prose lines that start with ``%``: MyST reads them as comments and drops them (outside
    code fences, directives and display math, where ``%`` is not MyST's)."""
    found, fence, math = [], None, False
    for number, line in enumerate(markdown.splitlines(), 1):
        stripped = line.lstrip()
        opener = re.match(r"(`{3,}|~{3,}|:{3,})", stripped)
        if fence is None and opener:
            fence = opener.group(1)
        elif fence is not None:
            if stripped.startswith(fence) and not stripped[len(fence) :].strip():
                fence = None
        elif math:
            math = not stripped.rstrip().endswith("$$")
        elif stripped.startswith("$$"):
            math = stripped.strip() == "$$" or not stripped.rstrip().endswith("$$")
        elif not math and stripped.startswith("%"):
            found.append(f"line {number}: {line.strip()[:80]}")
    return found


#: Figure text set small in the source (``fontsize=9``, ``"x-small"``): on a 390 px phone a
#: figure 7.5 inches wide (the widest the chapters draw) is shown at about half its print size,
#: so no chapter and no figure helper of the package sets text under 11 pt, which reads there at
#: about 7.5 px. (The phone test reads each figure's actual smallest text from its PNG; this one
#: names the line to change.)
MIN_SOURCE_FONT_PT = 11.0
SMALL_FONT = re.compile(
    r"\b(?:\w*fontsize|labelsize)\s*=\s*(?:(?P<number>\d+(?:\.\d+)?)\b|"
    r"[\"'](?P<name>xx?-small)[\"'])"
)


def small_font_settings(source: str, below: float = MIN_SOURCE_FONT_PT) -> list[str]:
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        if any(
            match.group("name") or float(match.group("number")) < below
            for match in SMALL_FONT.finditer(line)
        ):
            found.append(f"line {number}: {line.strip()[:90]}")
    return found


# --- the planted pages ---------------------------------------------------------------------------

LAYOUT_CSS = book_site.ROOT / "book" / "_static" / "layout.css"


def _png(path: Path, inches: float, dpi: int = 192, smallest_pt: float | None = None) -> str:
    """A blank PNG ``inches`` wide that records ``dpi`` and, if given, its smallest text in
    points, as the build's kernels write them for the book."""
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    if smallest_pt is not None:
        info.add_text(page_style.SMALLEST_TEXT_KEY, f"{smallest_pt:.2f}")
    Image.new("RGB", (round(inches * dpi), round(inches * dpi / 3)), "white").save(
        path, dpi=(dpi, dpi), pnginfo=info
    )
    return path.name


def _page(body: str, css: str = "") -> str:
    return f"""<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{LAYOUT_CSS.as_uri()}">
<style>span.pre {{ white-space: nowrap; }} span.pasted-text {{ font-weight: bold; }}
body {{ margin: 0; }} figure {{ margin: 1em 0; }}
article {{ max-width: 800px; padding: 0 20px; }} pre {{ overflow-x: auto; }} {css}</style></head>
<body><article class="bd-article">{body}</article></body></html>"""


def _figure(src: str, width: int, caption: str | None, alt: str) -> str:
    caption_html = (
        f'<figcaption><p><span class="caption-number">Fig. 1 </span>'
        f'<span class="caption-text">{caption}</span></p></figcaption>'
        if caption
        else ""
    )
    return (
        f'<div class="cell_output"><figure><img src="{src}" alt="{alt}" '
        f'style="width: {width}px">{caption_html}</figure></div>'
    )


def _long_table(rows: int) -> str:
    body = "".join(f"<tr><td>size {i}</td><td>{i * 1.5:.1f}</td></tr>" for i in range(rows))
    return f"<table><tr><th>size</th><th>time (ms)</th></tr>{body}</table>"


def planted_pages(folder: Path) -> tuple[Path, Path]:
    """Two pages: one with an instance of every defect the checks exist for, one without."""
    small, wide = _png(folder / "small.png", 2.0), _png(folder / "wide.png", 20.0)
    fits = _png(folder / "fits.png", 6.0)
    good_alt = "A line that falls from left to right."
    planted = _page(
        _figure(small, 800, "Blown up four times.", good_alt)  # upscaled 4x
        + _figure(wide, 1920, "Shrunk to 0.4x.", good_alt)  # its text under 9 pt
        + _figure(fits, 576, None, "_images/fits.png")  # no caption, alt is a file name
        + '<figure id="fig-text"><pre>&lt;Figure size 1344x960 with 2 Axes&gt;</pre>'
        + "<figcaption><p>Drawn as text.</p></figcaption></figure>"
        + '<div class="cell"><div class="cell_input"><pre>loss = train()\n'
        'glue("loss", loss, display=False)</pre></div></div>'
        + '<div class="cell_output"><pre>saved to /tmp/tmpk3j2x/trace.json\n'
        "  File /__w/pytorch/pytorch/torch/nn/x.py</pre></div>"
        + "<table><tr><th>layout</th><th>GB per device</th></tr>"
        + "<tr><td>tp=64</td><td>nan</td></tr></table>"
        + "<table><tr><th>kernel</th><th>gb_per_s (GB/s)</th><th>bytes (bytes)</th></tr>"
        + "<tr><td>copy</td><td>None</td><td>270532624</td></tr>"
        + "<tr><td>DDP</td><td>–</td><td>–</td></tr></table>"
        + _long_table(25)
        + '<div class="cell_output"><p>Rows without a measurement: `python -m trainfast'
        + ".measure --only ddp-overlap` measures them.</p></div>"
        + '<p>A glued <strong><span class="pasted-text">72.0%</span></strong> in bold.</p>'
        + '<p><span style="white-space: nowrap">a 600 px line that does not wrap: '
        + "x" * 80
        + "</span></p>",
    )
    clean = _page(
        _figure(fits, 576, "A figure at its print size.", good_alt)
        + _figure(
            _png(folder / "column.png", 6.5, smallest_pt=13), 624, "Drawn for a phone.", good_alt
        )
        + '<div class="cell"><div class="cell_input"><pre>loss = train()\nprint(loss)</pre>'
        "</div></div>"
        + '<div class="cell_output"><pre>saved to trace.json</pre></div>'
        + "<table><tr><th>layout</th><th>GB per device</th></tr>"
        + "<tr><td>tp=64</td><td>does not fit</td></tr></table>"
        + "<details><summary>The whole record: 25 rows</summary>"
        + _long_table(25)
        + "</details>"
        + '<p>A glued <span class="pasted-text">72.0%</span> at the body\'s weight (myst-nb '
        + "sets it bold, layout.css does not).</p>"
        + '<p>Long inline code wraps: <code class="docutils literal notranslate">'
        + '<span class="pre">torch.distributed.elastic.multiprocessing.errors.record_and_raise'
        + "</span></code>, and <a href='#'>https://docs.pytorch.org/docs/stable/generated/"
        + "torch.optim.lr_scheduler.OneCycleLR.html</a>.</p>",
    )
    (folder / "planted.html").write_text(planted)
    (folder / "clean.html").write_text(clean)
    return folder / "planted.html", folder / "clean.html"


def test_the_checks_see_each_planted_defect_and_pass_a_clean_page(browser, tmp_path):
    planted, clean = planted_pages(tmp_path)
    bad, _ = visit(browser, planted.as_uri())
    good, _ = visit(browser, clean.as_uri())
    scale = figure_scale_problems(bad, MIN_TEXT_PT)
    assert any(p.startswith("small.png: shown at 4.") for p in scale), scale
    assert any(p.startswith("wide.png") and "pt text shown at" in p for p in scale), scale
    assert figure_scale_problems(good, MIN_TEXT_PT) == []
    assert uncaptioned_figures(bad) == [
        "fig-text: <Figure size 1344x960 with 2 Axes>Drawn as text.: a figure with no image",
        "fits.png: no numbered caption",
        "fits.png: alt text '_images/fits.png' does not say what it shows",
    ]
    assert uncaptioned_figures(good) == []
    assert visible_glue_lines(bad) == ['glue("loss", loss, display=False)...']
    assert visible_glue_lines(good) == []
    found = machine_paths(bad)
    assert len(found) == 2 and "/tmp/tmpk3j2x" in found[0] and "/__w/" in found[1], found
    assert machine_paths(good) == []
    assert nan_cells(bad) == ["nan"] and nan_cells(good) == []
    tables = record_table_problems(bad)
    assert any("reads None" in p for p in tables), tables
    assert any("'DDP' is only dashes" in p for p in tables), tables
    assert any("'gb_per_s (GB/s)' is a field name" in p for p in tables), tables
    assert any("'bytes (bytes)' is a field name" in p for p in tables), tables
    assert any("25 rows shown at once" in p for p in tables), tables
    assert any("note to the maintainer" in p for p in tables), tables
    assert record_table_problems(good) == []
    assert bad["bold_glue"] == ["72.0%"] and good["bold_glue"] == []

    bad_phone, _ = visit(browser, planted.as_uri(), PHONE)
    good_phone, _ = visit(browser, clean.as_uri(), PHONE)
    wide = too_wide_for_a_phone(bad_phone)
    assert wide and "does not wrap" in "\n".join(wide), wide
    assert too_wide_for_a_phone(good_phone) == [], too_wide_for_a_phone(good_phone)
    assert figure_scale_problems(good_phone, min_px=MIN_PHONE_TEXT_PX) == []


def test_a_figure_too_wide_or_too_small_for_a_phone_is_caught(browser, tmp_path):
    """On a 390 px phone: a 9-inch figure with the matplotlibrc's 11 pt text, shrunk to the
    column, shows it under 7 px; the same figure with a page style that does not shrink it is
    wider than its column; a figure whose PNG records larger text passes."""
    _, clean = planted_pages(tmp_path)
    small_text = tmp_path / "small-text.html"
    nine_inches = _png(tmp_path / "nine.png", 9.0)  # no record: the matplotlibrc's sizes
    figure = _figure(nine_inches, 864, "Nine inches.", "A line that falls from left to right.")
    small_text.write_text(clean.read_text().replace("</article>", figure + "</article>"))
    layout, _ = visit(browser, small_text.as_uri(), PHONE)
    found = figure_scale_problems(layout, min_px=MIN_PHONE_TEXT_PX)
    assert any(p.startswith("nine.png") and " px" in p for p in found), found
    assert not any(p.startswith("column.png") for p in found), found

    unshrunk = tmp_path / "unshrunk.html"
    css = "<style>article.bd-article img { max-width: none !important; }</style></head>"
    unshrunk.write_text(small_text.read_text().replace("</head>", css))
    layout, _ = visit(browser, unshrunk.as_uri(), PHONE)
    found = figure_scale_problems(layout, min_px=MIN_PHONE_TEXT_PX)
    assert any(p.startswith("nine.png") and "wider than its column" in p for p in found), found


def test_the_source_checks_see_planted_lines():
    prose = (
        "The A100 reaches 70\n% of its peak.\n\n```{code-cell} ipython3\n% not prose\n```\n\n"
        "$$\n% a TeX comment\nx = 1\n$$\n\nFine.\n"
    )
    assert comment_lines(prose) == ["line 2: % of its peak."]
    assert comment_lines(prose.replace("\n% of", " % of")) == []
    source = (
        'ax.legend(fontsize=8)\nax.set_title("t", fontsize="x-small")\nax.legend()\n'
        'ax.text(0, 0, "1", fontsize=9)\nax.text(0, 0, "1", fontsize=10)\n'
    )
    assert [line[:6] for line in small_font_settings(source)] == [
        "line 1",
        "line 2",
        "line 4",
        "line 5",
    ]
    assert [line[:6] for line in small_font_settings(source, below=9)] == ["line 1", "line 2"]
    assert small_font_settings("ax.legend(fontsize=11)\nplt.figure(figsize=(9, 4))") == []


# --- the real pages ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chapter_layouts(site, server, browser) -> dict[str, tuple[dict, list[str]]]:
    """Each chapter page loaded once at 1400 px: its layout and console errors (the console-error
    test takes these errors instead of loading the chapters again)."""
    return visit_all(browser, {name: f"{server}/book/{name}.html" for name in PAGES})


@pytest.fixture(scope="module")
def phone_layouts(site, server, browser) -> dict[str, tuple[dict, list[str]]]:
    """Each chapter page loaded once on the phone: its layout and console errors."""
    return visit_all(browser, {name: f"{server}/book/{name}.html" for name in PAGES}, PHONE)


@pytest.mark.parametrize("name", PAGES)
def test_every_figure_shows_at_its_print_size(chapter_layouts, site, server, name):
    layout, _ = chapter_layouts[name]
    found = figure_scale_problems(layout, MIN_TEXT_PT, site, server)
    assert not found, f"{name} (column {layout['column']:.0f} px):\n" + "\n".join(found)


@pytest.mark.parametrize("name", PAGES)
def test_every_figure_has_a_numbered_caption_and_alt_text(chapter_layouts, name):
    found = uncaptioned_figures(chapter_layouts[name][0])
    assert not found, f"{name}: {len(found)} figures:\n" + "\n".join(found[:30])


@pytest.mark.parametrize("name", PAGES)
def test_no_visible_code_cell_glues(chapter_layouts, name):
    found = visible_glue_lines(chapter_layouts[name][0])
    assert not found, f"{name}: {len(found)} visible glue lines:\n" + "\n".join(found[:20])


@pytest.mark.parametrize("name", PAGES)
def test_no_output_shows_a_machine_path(chapter_layouts, name):
    found = machine_paths(chapter_layouts[name][0])
    assert not found, f"{name}: machine paths:\n" + "\n".join(found[:20])


@pytest.mark.parametrize("name", PAGES)
def test_no_table_cell_reads_nan(chapter_layouts, name):
    found = nan_cells(chapter_layouts[name][0])
    assert not found, f"{name}: {len(found)} cells read {sorted(set(found))}"


@pytest.mark.parametrize("name", PAGES)
def test_records_are_shown_as_a_reader_reads_them(chapter_layouts, name):
    found = record_table_problems(chapter_layouts[name][0])
    assert not found, f"{name}:\n" + "\n".join(found[:20])


@pytest.mark.parametrize("name", PAGES)
def test_glued_values_take_the_bodys_weight(chapter_layouts, name):
    bold = chapter_layouts[name][0]["bold_glue"]
    assert not bold, f"{name}: {len(bold)} bold glued values: {bold[:5]}"


@pytest.mark.parametrize("name", PAGES)
def test_no_page_is_wider_than_a_phone(phone_layouts, site, server, name):
    layout, _ = phone_layouts[name]
    found = too_wide_for_a_phone(layout) + figure_scale_problems(
        layout, site=site, base=server, min_px=MIN_PHONE_TEXT_PX
    )
    assert not found, f"{name} at {PHONE['width']} px:\n" + "\n".join(found)


@pytest.mark.parametrize("name", PAGES)
def test_no_prose_line_starts_with_a_percent_sign(name):
    found = comment_lines((book_site.ROOT / "book" / f"{name}.md").read_text())
    assert not found, f"book/{name}.md: MyST drops these lines as comments:\n" + "\n".join(found)


def test_no_figure_text_is_set_too_small():
    """Neither the chapters nor the package's figure helpers set text under 11 pt."""
    sources = [(book_site.ROOT / "book" / f"{name}.md", MIN_SOURCE_FONT_PT) for name in PAGES]
    package = sorted((book_site.ROOT / "code" / "trainfast").rglob("*.py"))
    sources += [(path, MIN_SOURCE_FONT_PT) for path in package]
    found = [
        f"{path.relative_to(book_site.ROOT)} {line}"
        for path, below in sources
        for line in small_font_settings(path.read_text(), below)
    ]
    assert not found, "figure text set too small:\n" + "\n".join(found[:30])


@pytest.mark.parametrize("name", PAGES)
def test_no_code_cell_table_or_equation_is_wider_than_its_column(chapter_layouts, name):
    layout, _ = chapter_layouts[name]
    wide = layout["wide"]
    assert not wide, f"{name}: {len(wide)} too wide:\n" + "\n".join(wide[:25])


def test_the_column_checks_see_planted_wide_code_and_tables(browser, tmp_path):
    page = tmp_path / "wide.html"
    page.write_text(
        _page(
            '<div class="highlight"><pre>x = 1  # ' + "y" * 200 + "</pre></div>"
            "<table><tr><td>" + "z" * 300 + "</td></tr></table>"
            "<script>const X = 1;</script><script>const X = 2;</script>"
        )
    )
    fine = tmp_path / "fine.html"
    fine.write_text(_page("<p>No script, no error.</p>"))
    # One tab for several pages (as the real pages are opened): each page's errors are its own.
    visits = visit_all(browser, {"wide": page.as_uri(), "fine": fine.as_uri()})
    layout, errors = visits["wide"]
    assert any(w.startswith("div.highlight pre") for w in layout["wide"]), layout["wide"]
    assert any(w.startswith("table") for w in layout["wide"]), layout["wide"]
    assert any("X" in e for e in errors), f"a redeclared const must be an error: {errors}"
    assert visits["fine"][1] == [], visits["fine"]


def console_scan_pages(site: Path) -> list[Path]:
    """The pages the console-error scan opens: every page but the highlighted sources. The
    128 pages under ``_modules`` (Sphinx's viewcode) are one template around highlighted code,
    with no script of their own, so its index and one module page stand for the rest (opening
    them all took 90 s of the scan's 130)."""
    static, sources = site / "_static", site / "_modules"
    pages = [p for p in sorted(site.rglob("*.html")) if static not in p.parents]
    kept_sources = [p for p in pages if sources in p.parents][:2]
    return [p for p in pages if sources not in p.parents] + kept_sources


def test_no_page_logs_a_console_error(site, server, browser, chapter_layouts, phone_layouts):
    """Every page, opened at 1400 px; the chapter pages' errors come from the layout fixtures'
    loads (at 1400 px and on the phone), the other pages are opened here."""
    pages = console_scan_pages(site)
    assert len(pages) > 40 and any("_modules" in p.parts for p in pages), pages
    chapters = {f"book/{name}.html": name for name in PAGES}
    assert set(chapters) <= {p.relative_to(site).as_posix() for p in pages}
    others = {
        path.relative_to(site).as_posix(): f"{server}/{path.relative_to(site).as_posix()}"
        for path in pages
        if path.relative_to(site).as_posix() not in chapters
    }
    visits = visit_all(browser, others, measure=False, settle_ms=100)
    for page, name in chapters.items():
        visits[page] = (None, chapter_layouts[name][1])
        visits[f"{page} on the phone"] = (None, phone_layouts[name][1])
    found = [f"{page}: {error}" for page, (_, errors) in visits.items() for error in errors]
    assert not found, f"{len(found)} console errors:\n" + "\n".join(found[:25])


# --- the executed chapters' outputs ------------------------------------------------------------

#: Output a reader should not see: log lines (glog's ``W1124 12:00:00``), warnings, progress
#: bars, and paths of the machine that built the book (a temporary folder) or of PyTorch's CI.
RAW_LOG = re.compile(
    r"^[WVIEF]\d{4} \d\d:\d\d:\d\d"  # torch's (glog-style) log lines
    r"|\w+Warning: |^WARNING[: ]"  # Python warnings and logging
    r"|\d+%\|[^|\n]*\|"  # a tqdm bar
    r"|/root/|/home/\w+/|/tmp/\w|/var/folders/|/__w/",  # the build machine's and CI's paths
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
                    {"output_type": "stream", "name": "stdout", "text": "in /tmp/tmpa1b2/rec\n"},
                    {"output_type": "stream", "name": "stdout", "text": "/__w/pytorch/x.py:1\n"},
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
    assert len(raw_logs(planted)) == 5


@pytest.mark.parametrize("name", [page for page in CHAPTERS if book_site.is_notebook(page)])
def test_no_executed_chapter_shows_raw_logs(site, name):
    notebook = site.parent / "jupyter_execute" / "book" / f"{name}.ipynb"
    found = raw_logs(json.loads(notebook.read_text()))
    assert not found, f"{name}: log lines in outputs:\n" + "\n".join(found[:20])


# --- code blocks and template phrases ----------------------------------------------------------

#: A reStructuredText role as a docstring writes it (``:func:`train```, ``:py:class:``,
#: ``:math:``): a code block shows it verbatim. Listings leave docstrings out
#: (``book/_ext/build_support/listings.py``); this catches one that comes back another way.
RST_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|math|ref|doc):`")
#: A count written by a template that did not know it: "1 block(s)" (``trainfast.validation.plural``
#: writes "1 block", "2 blocks").
TEMPLATE_PLURAL = re.compile(r"\b\d+ \w+\(s\)")
#: The same in source, before a build: ``f"{n} block(s)"``, ``f"{n} pass(es)"``.
TEMPLATE_PLURAL_SOURCE = re.compile(r"\}[ \w]*\w\((?:s|es)\)")


def _text(markup: str) -> str:
    return html_text.unescape(re.sub(r"<[^>]+>", "", markup))


def code_block_markup(page: str) -> list[str]:
    """Lines of the page's code blocks (listings, code cells, outputs: every ``<pre>``) that show
    a reStructuredText role."""
    return [
        line.strip()[:100]
        for block in re.findall(r"<pre\b.*?</pre>", page, flags=re.S)
        for line in _text(block).splitlines()
        if RST_ROLE.search(line)
    ]


def template_plurals(page: str) -> list[str]:
    """Each "1 block(s)" in the page's text (scripts and styles aside), with its context."""
    text = _text(re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S))
    return [
        " ".join(text[max(0, m.start() - 30) : m.end() + 30].split())
        for m in TEMPLATE_PLURAL.finditer(text)
    ]


def test_the_page_text_checks_see_planted_markup_and_template_plurals():
    planted = (
        '<div class="highlight"><pre><span></span><span class="k">def</span> <span class="nf">'
        'step</span>():\n    <span class="sd">&quot;&quot;&quot;One step of :func:`train`.'
        '&quot;&quot;&quot;</span>\n    <span class="n">y</span> = <span class="mi">1</span>'
        "</pre></div>"
        '<p>One SM holds <span class="pasted-text">1</span> block(s), limited by registers.</p>'
        '<pre>2 stage(s): 64 KiB</pre><script>const s = "3 call(s)";</script>'
    )
    clean = (
        '<div class="highlight"><pre><span class="k">def</span> step():\n    y = 1  # see train'
        "</pre></div><p>:func:`train` in prose is not a code block.</p>"
        "<p>One SM holds 1 block, 2 stages fit; the block(s) syntax in prose is no count.</p>"
    )
    assert code_block_markup(planted) == ['"""One step of :func:`train`."""']
    assert code_block_markup(clean) == []
    found = template_plurals(planted)
    assert len(found) == 2 and "1 block(s)" in found[0] and "2 stage(s)" in found[1], found
    assert template_plurals(clean) == []


def template_plural_sources(source: str) -> list[str]:
    return [
        f"line {number}: {line.strip()[:90]}"
        for number, line in enumerate(source.splitlines(), 1)
        if TEMPLATE_PLURAL_SOURCE.search(line)
    ]


def test_the_source_scan_sees_planted_template_plurals():
    source = 'print(f"{n} block(s)")\nx = f"{k} pass(es) over {m}"\ny = f"{plural(n, \'block\')}"\n'
    assert [line[:6] for line in template_plural_sources(source)] == ["line 1", "line 2"]
    assert template_plural_sources('ax.set_xlabel("time (s)")\nf"{t:.2f} s (s)"') == []


def test_no_source_writes_a_template_plural():
    sources = sorted((book_site.ROOT / "book").rglob("*.md"))
    sources += sorted((book_site.ROOT / "code" / "trainfast").rglob("*.py"))
    found = [
        f"{path.relative_to(book_site.ROOT)} {line}"
        for path in sources
        for line in template_plural_sources(path.read_text())
    ]
    assert not found, "write counts with trainfast.validation.plural:\n" + "\n".join(found)


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_code_block_shows_restructuredtext_markup(site, name):
    found = code_block_markup((site / "book" / f"{name}.html").read_text())
    assert not found, f"{name}: {len(found)} code lines with reST markup:\n" + "\n".join(found[:20])


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_page_counts_with_a_template_plural(site, name):
    found = template_plurals((site / "book" / f"{name}.html").read_text())
    assert not found, f"{name}: {len(found)} template plurals:\n" + "\n".join(found[:20])


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


def test_the_build_sizes_a_figure_from_the_resolution_its_png_records(tmp_path):
    """``page_style`` gives a 2x PNG (192 px per inch) half its pixel width, leaves a PNG that
    records no resolution, and an image with a width of its own, as they are."""
    from types import SimpleNamespace

    from docutils import nodes
    from PIL import Image

    Image.new("RGB", (1728, 400)).save(tmp_path / "drawn.png", dpi=(192, 192))
    Image.new("RGB", (300, 100)).save(tmp_path / "plain.png")
    doctree = nodes.document(None, None)
    drawn, plain = nodes.image(uri="drawn.png"), nodes.image(uri="plain.png")
    sized = nodes.image(uri="drawn.png", width="50%")
    doctree += [drawn, plain, sized]
    env = SimpleNamespace(docname="page", relfn2path=lambda uri, doc: (uri, str(tmp_path / uri)))
    page_style._size_figures(SimpleNamespace(env=env, srcdir=str(tmp_path)), doctree)
    assert drawn["width"] == "864px"  # 9 inches at 96 CSS px per inch
    assert "width" not in plain and sized["width"] == "50%"


def test_the_matplotlibrc_draws_at_2x_with_plain_numbers_on_a_small_log_range():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rc = book_site.ROOT / "book" / "_ext" / "matplotlibrc"
    with matplotlib.rc_context(fname=str(rc)):
        assert matplotlib.rcParams["figure.dpi"] == 2 * page_style.CSS_DPI
        fig, ax = plt.subplots()
        ax.plot([2, 50], [3, 40])
        ax.set_xscale("log")
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.get_xticklabels(minor=True) + ax.get_xticklabels()]
        plt.close(fig)
    assert {"$\\mathdefault{3}$", "$\\mathdefault{20}$"} <= set(labels), labels
    assert not [label for label in labels if "times" in label], labels  # no "3 × 10⁰"
    assert smallest_figure_text_pt(rc) >= 11
