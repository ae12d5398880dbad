"""Sphinx extension: how the book's pages show figures and citations.

1. **Figures at their print size.** The chapters' matplotlib figures are PNGs drawn at 2x
   (``figure.dpi`` in ``book/_ext/matplotlibrc``); the PNG records its resolution (its ``pHYs``
   chunk). Each image that has no width of its own gets the width at which one inch of the
   figure is one CSS inch (96 px), so 11 pt text in the figure reads as 11 pt on the page, and
   the browser has two pixels per CSS pixel to draw it with. ``book/_static/layout.css`` only
   ever shrinks a figure to its column (never stretches it); ``tests/test_site_layout.py``
   checks the scale of every figure.

   A figure glued from another page (``{glued-figure}``, below) gets its width the same way.

2. **Citations by author and year, everywhere.** Each chapter's reference list labels its
   entries "Kingma and Ba, 2015" ("et al." from three authors or "and others" on;
   "NVIDIA, 2024a", "2024b" where labels would repeat) and sorts them by author, year and title,
   reading a corporate author (``{NVIDIA}``) by its name rather than after "Z"
   (``bibtex_default_style: author_year``). A citation in the text shows the same label in
   round brackets (``bibtex_reference_style: author_year_round``).

3. **A numbered figure glued from another page.** myst-nb's ``{glue:figure}`` (caption, name,
   alt text) reads only the page's own glue; its ``{glue}`` reads another page's but gives no
   caption, and alt text that is the file's path. ``{glued-figure} key`` with ``:doc:``,
   ``:name:`` and ``:alt:`` does both: the intro opens with the speedrun chapter's figure::

       ```{glued-figure} log_waterfall
       :doc: speedrun/log.md
       :name: fig-intro-waterfall
       :alt: What the figure shows, in words.

       The caption (its first paragraph; more paragraphs become the figure's legend).
       ```
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pybtex.plugin
import sphinxcontrib.bibtex.plugin
from docutils import nodes
from docutils.parsers.rst import directives
from myst_nb.ext.glue.crossref import read_glue_cache
from myst_nb.ext.glue.utils import PendingGlueReferenceError, create_pending_glue_ref
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle as AuthorYearTitleSorting
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.docutils import SphinxDirective
from sphinxcontrib.bibtex.style.referencing import BracketStyle, GroupReferenceStyle, PersonStyle
from sphinxcontrib.bibtex.style.referencing.basic_author_year import (
    BasicAuthorYearTextualReferenceStyle,
)
from sphinxcontrib.bibtex.style.referencing.basic_label import (
    BasicLabelParentheticalReferenceStyle,
)
from sphinxcontrib.bibtex.style.referencing.extra_author import ExtraAuthorReferenceStyle
from sphinxcontrib.bibtex.style.referencing.extra_empty import ExtraEmptyReferenceStyle
from sphinxcontrib.bibtex.style.referencing.extra_label import ExtraLabelReferenceStyle
from sphinxcontrib.bibtex.style.referencing.extra_year import ExtraYearReferenceStyle

#: CSS pixels per inch: an image of ``dpi`` pixels per inch is shown at ``96 / dpi`` px per pixel.
CSS_DPI = 96


def png_info(data: bytes) -> tuple[int, int, float | None]:
    """Width and height in pixels of a PNG (its bytes) and its resolution in pixels per inch
    (None if the file records none)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        if kind == b"pHYs":
            x, _, unit = struct.unpack(">IIB", data[at + 8 : at + 17])
            return width, height, (x * 0.0254 if unit == 1 and x else None)
        if kind in (b"IDAT", b"IEND"):
            break
        at += 12 + length
    return width, height, None


#: The PNG text chunk in which the build's kernels record a figure's smallest text, in points
#: (``book/_ext/kernel_startup/figure_text.py``).
SMALLEST_TEXT_KEY = "trainfast:smallest-text-pt"


def png_text(data: bytes) -> dict[str, str]:
    """The ``tEXt`` chunks of a PNG (its bytes) as ``{keyword: text}``."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    found: dict[str, str] = {}
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        if kind == b"tEXt":
            keyword, _, text = data[at + 8 : at + 8 + length].partition(b"\0")
            found[keyword.decode("latin-1")] = text.decode("latin-1")
        if kind == b"IEND":
            break
        at += 12 + length
    return found


def print_width(path: Path) -> int | None:
    """The CSS width (px) at which the PNG at ``path`` shows its drawing at its print size."""
    width, _, dpi = png_info(path.read_bytes())
    return None if dpi is None else round(width * CSS_DPI / dpi)


def _size_figures(app: Sphinx, doctree: nodes.document) -> None:
    for image in doctree.findall(nodes.image):
        uri = image.get("uri", "")
        if "width" in image or "height" in image or not uri.endswith(".png"):
            continue
        # before Sphinx's image collector the uri is relative to the page, after it to the source
        places = [Path(app.env.relfn2path(uri, app.env.docname)[1]), Path(app.srcdir) / uri]
        path = next((p for p in places if p.is_file()), None)
        width = None if path is None else print_width(path)
        if width is not None:
            image["width"] = f"{width}px"


class GluedFigure(SphinxDirective):
    """A figure glued from another page's notebook, with a numbered caption and alt text."""

    required_arguments = 1  # the glue key
    has_content = True
    option_spec = {
        "doc": directives.unchanged_required,
        "name": directives.unchanged,
        "alt": directives.unchanged_required,
    }

    def run(self) -> list[nodes.Node]:
        key = self.arguments[0]
        try:
            source, line = self.get_source_info()
            ref = create_pending_glue_ref(
                self.state.document, source, line, self.options["doc"], key
            )
        except (PendingGlueReferenceError, KeyError) as error:
            raise self.error(f"glued-figure {key}: {error} (it needs :doc:)") from None
        figure = nodes.figure("", ref, classes=["glued-figure"])
        figure["glue_doc"], figure["glue_key"] = ref.refdoc, ref.key
        figure["glue_alt"] = self.options["alt"]
        self.set_source_info(figure)
        self.add_name(figure)
        if self.content:
            parsed = nodes.Element()
            self.state.nested_parse(self.content, self.content_offset, parsed)
            first, *rest = parsed.children
            if not isinstance(first, nodes.paragraph):
                raise self.error("glued-figure: the caption must be a paragraph")
            figure += nodes.caption(first.rawsource, "", *first.children)
            if rest:
                figure += nodes.legend("", *rest)
        return [figure]


class SizeGluedFigures(SphinxPostTransform):
    """After myst-nb put the image in (its priority 5): the alt text and the print width, and
    the image file itself. myst-nb's cross-page glue points at ``_images/<sha256>.png`` and
    assumes the other page's own output wrote it there; a figure glued there with
    ``display=False`` (shown only on a landing page) was never written, and the landing page
    showed a missing image (a 404 the site tests caught). So the file is written here, under the
    name myst-nb gives it."""

    default_priority = 6

    def _write_image(self, data: bytes) -> None:
        builder = self.app.builder
        if not getattr(builder, "imagedir", None):
            return
        path = Path(builder.outdir) / builder.imagedir / f"{hashlib.sha256(data).hexdigest()}.png"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def apply(self, **kwargs) -> None:
        for figure in list(self.document.findall(nodes.figure)):
            if "glue_key" not in figure:
                continue
            for image in figure.findall(nodes.image):
                image["alt"] = figure["glue_alt"]
                glued = read_glue_cache(self.env.mystnb_config.output_folder, figure["glue_doc"])
                png = glued.get(figure["glue_key"], {}).get("data", {}).get("image/png")
                if png:
                    self._write_image(base64.b64decode(png))
                if png and "width" not in image:
                    width, _, dpi = png_info(base64.b64decode(png))
                    if dpi:
                        image["width"] = f"{round(width * CSS_DPI / dpi)}px"
            for key in ("glue_doc", "glue_key", "glue_alt"):
                del figure[key]


# --- citations -----------------------------------------------------------------------------------


def _names(entry) -> str:
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    last = [" ".join(p.prelast_names + p.last_names).strip("{}") for p in persons]
    if not last:
        return entry.key
    if len(last) > 2 or last[-1] == "others":  # BibTeX's "and others"
        return f"{last[0]} et al."
    if len(last) == 1:
        return last[0]
    if len(last) == 2:
        return f"{last[0]} and {last[1]}"
    return f"{last[0]} et al."


class AuthorYearLabels(BaseLabelStyle):
    """Labels "Kingma and Ba, 2015", "Micikevicius et al., 2018"; "2024a", "2024b" where two
    entries would share a label."""

    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        labels = [f"{_names(e)}, {e.fields.get('year', 'n.d.')}" for e in entries]
        counts = Counter(labels)
        seen: Counter = Counter()
        for label in labels:
            if counts[label] > 1:
                seen[label] += 1
                yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label] - 1]
            else:
                yield label


class AuthorYearSorting(AuthorYearTitleSorting):
    """pybtex's author-year-title order, reading ``{NVIDIA}`` as NVIDIA (not after "z")."""

    def person_key(self, person):
        return super().person_key(person).replace("{", "").replace("}", "")


class AuthorYearStyle(PlainStyle):
    default_label_style = "author_year"
    default_sorting_style = "author_year_plain"


def _round() -> BracketStyle:
    return BracketStyle(left="(", right=")")


@dataclass
class AuthorYearRoundReferences(GroupReferenceStyle):
    """In the text, ``{cite}`` (``{cite:p}``) shows the entry's label in round brackets,
    "(Kingma and Ba, 2015)", as the reference list does ("NVIDIA, 2024b" where one author has
    two entries in a year); ``{cite:t}`` reads "Kingma and Ba (2015)"."""

    bracket: BracketStyle = field(default_factory=_round)
    person: PersonStyle = field(default_factory=PersonStyle)

    def __post_init__(self):
        self.styles.extend(
            [
                BasicLabelParentheticalReferenceStyle(bracket=self.bracket),
                BasicAuthorYearTextualReferenceStyle(bracket=self.bracket, person=self.person),
                ExtraAuthorReferenceStyle(bracket=self.bracket, person=self.person),
                ExtraLabelReferenceStyle(bracket=self.bracket),
                ExtraYearReferenceStyle(bracket=self.bracket),
                ExtraEmptyReferenceStyle(),
            ]
        )
        super().__post_init__()


pybtex.plugin.register_plugin("pybtex.style.labels", "author_year", AuthorYearLabels)
pybtex.plugin.register_plugin("pybtex.style.sorting", "author_year_plain", AuthorYearSorting)
pybtex.plugin.register_plugin("pybtex.style.formatting", "author_year", AuthorYearStyle)
sphinxcontrib.bibtex.plugin.register_plugin(
    "sphinxcontrib.bibtex.style.referencing", "author_year_round", AuthorYearRoundReferences
)


def setup(app: Sphinx) -> dict:
    app.connect("doctree-read", _size_figures)
    app.add_directive("glued-figure", GluedFigure)
    app.add_post_transform(SizeGluedFigures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
