"""The built site works offline: nothing is fetched from elsewhere, every internal link and anchor
resolves, and search finds the chapters. Needs a current ``_build/html`` (see book_site.py); the
browser tests also need Debian's ``chromium`` and Playwright (``book_site.chromium``)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import book_site
import pytest

CHAPTERS = book_site.toc_pages()  # every page of every chapter (a section page is a page)
#: Attributes by which a page makes the browser fetch something (links to follow are not fetches).
FETCHING = {
    tuple(pair.split("."))
    for pair in (
        "script.src link.href img.src iframe.src source.src video.src video.poster audio.src "
        "embed.src object.data input.src img.srcset source.srcset"
    ).split()
}
REMOTE = re.compile(r"^(https?:)?//", re.I)
CSS_REMOTE = re.compile(r"""(url\(\s*['"]?|@import\s+['"])(https?:)?//""", re.I)


class Page(HTMLParser):
    """The ids, followed links and fetched resources of one HTML page."""

    def __init__(self, path: Path) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.fetches: list[str] = []
        self.feed(path.read_text())

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if value is None:
                continue
            if key in ("id", "name") and tag != "meta":
                self.ids.add(value)
            if (tag, key) in FETCHING:
                if tag == "link" and dict(attrs).get("rel") in ("canonical", "alternate"):
                    continue
                self.fetches.append(value)
            elif key == "href":
                self.links.append(value)
            if key == "style" and CSS_REMOTE.search(value):
                self.fetches.append(value)


@pytest.fixture(scope="module")
def site() -> Path:
    return book_site.built_site()


@pytest.fixture(scope="module")
def pages(site) -> dict[Path, Page]:
    """Every page of the site (the theme's Jinja macro files in ``_static`` are not pages)."""
    static = site / "_static"
    return {p: Page(p) for p in sorted(site.rglob("*.html")) if static not in p.parents}


def test_no_page_or_stylesheet_fetches_from_another_host(site, pages):
    remote = [
        f"{path.relative_to(site)}: {url}"
        for path, page in pages.items()
        for url in page.fetches
        if REMOTE.match(url.strip()) or CSS_REMOTE.search(url)
    ]
    for css in sorted(site.rglob("*.css")):
        remote += [
            f"{css.relative_to(site)}: {m.group(0)}" for m in CSS_REMOTE.finditer(css.read_text())
        ]
    assert not remote, "fetched from elsewhere (a CDN?):\n" + "\n".join(remote[:20])
    chapter = pages[site / "book" / f"{_math_chapter()}.html"]
    local = [url for url in chapter.fetches if urlsplit(url).path.endswith("/_static/tex-svg.js")]
    assert local, "the chapter loads MathJax from the site's own _static"


def _target(site: Path, page: Path, url: str) -> tuple[Path, str] | None:
    """The file and fragment an internal ``url`` on ``page`` points at; None for external ones."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(("mailto:", "javascript:", "data:")):
        return None
    path = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
    if path.is_dir():
        path = path / "index.html"
    return path, unquote(parts.fragment)


def test_every_internal_link_and_anchor_resolves(site, pages):
    broken: list[str] = []
    for path, page in pages.items():
        for url in [*page.links, *page.fetches]:
            target = _target(site, path, url)
            if target is None or url in ("#", ""):
                continue
            file, fragment = target
            where = f"{path.relative_to(site)}: {url}"
            if not file.exists():
                broken.append(f"{where} (no file)")
            elif site.resolve() not in file.resolve().parents:
                broken.append(f"{where} (outside the site)")
            elif fragment and file.suffix == ".html" and fragment not in pages[file].ids:
                broken.append(f"{where} (no anchor #{fragment})")
    assert not broken, f"{len(broken)} broken internal links:\n" + "\n".join(broken[:30])


def test_a_page_without_an_icon_finds_one_at_the_site_root(site, pages):
    # A browser asks for /favicon.ico for a page that names no icon (the root index.html is
    # Sphinx's bare redirect page); a 404 there is a console error on the site's first page.
    bare = [p.relative_to(site) for p in pages if 'rel="icon"' not in p.read_text()]
    assert not bare or (site / "favicon.ico").is_file(), (
        f"{bare[:3]} name no icon and the site root has no favicon.ico"
    )


def _search_index(site: Path) -> dict:
    text = (site / "searchindex.js").read_text()
    match = re.fullmatch(r"\s*Search\.setIndex\((.*)\)\s*", text, flags=re.S)
    assert match, "searchindex.js is not Sphinx's Search.setIndex(...)"
    return json.loads(match.group(1))


#: Sphinx's smartquotes turn a title's ' and " into typographic quotes; back to the source's.
SMART_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def test_the_search_index_holds_every_chapter_and_its_words(site):
    index = _search_index(site)
    for name in CHAPTERS:
        docname = f"book/{name}"
        assert docname in index["docnames"], f"{docname} is not in searchindex.js"
        number = index["docnames"].index(docname)
        title = re.search(r"^# (.+)$", (book_site.ROOT / "book" / f"{name}.md").read_text(), re.M)
        # the index holds the title as HTML (code as <code>), with Sphinx's smart quotes
        plain = re.sub(r"<[^>]+>", "", index["titles"][number]).translate(SMART_QUOTES)
        assert plain == title.group(1).strip().replace("`", "")
        indexed = {
            term
            for term, docs in index["terms"].items()
            if number in (docs if isinstance(docs, list) else [docs])
        }
        # a page that teaches has hundreds of distinct words, a landing page about a hundred; a
        # short page (how to run the study) fewer, so at least half its source's distinct words
        source = (book_site.ROOT / "book" / f"{name}.md").read_text().lower()
        half = len(set(re.findall(r"[a-z]{4,}", source))) // 2
        least = min(200 if book_site.is_notebook(name) else 100, half)
        assert len(indexed) > least, f"{docname}: only {len(indexed)} words indexed"


# --- in a real browser -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    with book_site.chromium() as browser:
        yield browser


def load(browser, url: str) -> tuple[str, list[str]]:
    """The DOM of ``url`` after its scripts ran, and every request the page made to another host.

    Such a request is recorded and refused (nothing is fetched from elsewhere); requests the
    browser makes for itself are not the page's and are not seen.
    """
    remote: list[str] = []

    def route(request_route):
        host = urlsplit(request_route.request.url).hostname
        if request_route.request.url.startswith(("http:", "https:")) and host not in LOCAL:
            remote.append(request_route.request.url)
            request_route.abort()
        else:
            request_route.continue_()

    tab = browser.new_page()
    try:
        tab.route("**/*", route)
        tab.goto(url, wait_until="load")
        tab.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
        if "search.html" in url:  # the results are filled in after load
            tab.wait_for_selector("ul.search li a", timeout=15000)
        tab.wait_for_timeout(300)
        return tab.content(), remote
    finally:
        tab.close()


LOCAL = (None, "localhost", "127.0.0.1")


def test_the_request_log_sees_a_page_that_uses_a_cdn(browser, tmp_path):
    page = tmp_path / "cdn.html"
    page.write_text('<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-svg.js"></script>')
    assert load(browser, page.as_uri())[1] == [
        "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-svg.js"
    ]


@pytest.fixture(scope="module")
def server(site):
    with book_site.serve(site) as url:
        yield url


def _math_chapter() -> str:
    return next(n for n in CHAPTERS if "$" in (book_site.ROOT / "book" / f"{n}.md").read_text())


@pytest.mark.parametrize("origin", ["file", "server"])
def test_a_chapter_renders_its_math_offline(site, server, browser, origin):
    name = _math_chapter()
    url = (
        (site / "book" / f"{name}.html").as_uri()
        if origin == "file"
        else f"{server}/book/{name}.html"
    )
    dom, remote = load(browser, url)
    assert "<mjx-container" in dom, f"MathJax did not typeset {url}"
    assert not remote, f"{url} requested from other hosts: {remote}"


@pytest.mark.parametrize("origin", ["file", "server"])
def test_search_finds_a_chapter_offline(site, server, browser, origin):
    word = "optimizer"
    base = site.as_uri() if origin == "file" else server
    dom, remote = load(browser, f"{base}/search.html?q={word}")
    results = re.findall(r'<li[^>]*>\s*<a[^>]* href="([^"]+)"', dom.split('class="search"', 1)[-1])
    assert any("book/optimizers/" in href for href in results), (
        f"searching {word!r} ({origin}) found {results[:5]}"
    )
    assert not remote, f"search ({origin}) requested from other hosts: {remote}"


# --- prose that reads as generated --------------------------------------------------------------

#: Seams of text that code filled in without a person's eye: a count of one with a plural
#: ("1 epochs", "+1 points"), a count that repeats the one before it ("9 configs, of which 9 are
#: distinct"), and a clause that names its two arms twice ("between A and B, the difference
#: between A and B").
TEMPLATE_SEAMS = (
    re.compile(
        r"(?<![\d.,])[+-]?1 (?:epochs|times|steps|seeds|points|runs|configs|ranks|rows|"
        r"tokens|bytes|layers|processes|GPUs|cores|entries|changes|cases|passes|calls)\b"
    ),
    re.compile(r"\b(\d+) [a-z]+, of which \1 (?:are|were)\b"),
    re.compile(r"\bbetween ([^,;.]{2,40}) and ([^,;.]{2,40}), the difference between \1 and \2"),
)


def template_seams(text: str) -> list[str]:
    """Each place in ``text`` (a page's visible words) where one of :data:`TEMPLATE_SEAMS`
    matches, with a little of its context."""
    found = []
    for pattern in TEMPLATE_SEAMS:
        for match in pattern.finditer(text):
            start = max(0, match.start() - 30)
            found.append(" ".join(text[start : match.end() + 30].split()))
    return found


class _VisibleText(HTMLParser):
    """The text of a page's article without its code cells' source and its listings (code, not
    prose: a line ``rows.append(...)`` after ``- 1``, or a comment ``# N - 1 steps``, is no seam);
    outputs, captions and prose are kept."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.depth = 0  # inside <article>
        self.skipping: list[int] = []  # the open element depths of skipped subtrees
        self.level = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("br", "img", "hr", "meta", "link", "input", "wbr"):
            return
        self.level += 1
        classes = (dict(attrs).get("class") or "").split()
        if tag == "article":
            self.depth += 1
        listing = "output" not in classes and any(c.startswith("highlight-") for c in classes)
        if tag in ("script", "style") or "cell_input" in classes or listing:
            self.skipping.append(self.level)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("br", "img", "hr", "meta", "link", "input", "wbr"):
            return
        if self.skipping and self.skipping[-1] == self.level:
            self.skipping.pop()
        if tag == "article":
            self.depth -= 1
        self.level -= 1

    def handle_data(self, data: str) -> None:
        if self.depth > 0 and not self.skipping:
            self.parts.append(data)


def visible_text(page: Path) -> str:
    """The words a reader reads on a built page: its article, without tags, scripts and the
    source of its code cells (their outputs stay)."""
    parser = _VisibleText()
    parser.feed(page.read_text())
    return " ".join(" ".join(parser.parts).split())


def test_the_template_check_sees_each_planted_seam(tmp_path):
    planted = (
        "after 1 epochs: B_simple 103. It won by +1 points (95% interval). The 3 agents ran 9 "
        "configs, of which 9 are distinct. How far to trust it: between batch 8 and batch 64, the "
        "difference between batch 8 and batch 64, +7.1 points, is inside the noise."
    )
    found = template_seams(planted)
    assert len(found) == 4, found
    clean = (
        "after 1 epoch: 103. It won by +1.0 points and 11 points and 21 steps. The 3 agents ran "
        "each of the grid's 9 configs once. The difference between batch 8 and batch 64 is inside "
        "the noise."
    )
    assert template_seams(clean) == []
    page = tmp_path / "planted.html"
    page.write_text(
        '<html><body><nav>1 runs</nav><article><p>It took 2 runs.</p><div class="cell '
        'tag_hide-input"><div class="cell_input"><pre>n - 1 rows.append(x)</pre></div>'
        '<div class="cell_output"><pre>after 1 epochs</pre></div></div><div class="'
        'highlight-default notranslate"><pre># N - 1 steps per phase</pre></div><div class="'
        'output stream highlight-myst-ansi"><pre>ran 1 seeds</pre></div></article></body></html>'
    )
    assert visible_text(page) == "It took 2 runs. after 1 epochs ran 1 seeds"


@pytest.mark.parametrize(
    "name", ["intro", *CHAPTERS, "appendix/launching", "appendix/sweep_agents"]
)
def test_no_page_reads_as_filled_in_by_a_template(site, name):
    found = template_seams(visible_text(site / "book" / f"{name}.html"))
    assert not found, f"{name}: generated phrasing a person would not write:\n" + "\n".join(found)
