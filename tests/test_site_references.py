"""Citations read one way: works are cited with ``{cite}`` (never typed by hand as
"[Goyal et al., 2017](https://...)"), every chapter ends with a "References" section that lists
the works it cites, each cited key is in ``book/references.bib``, the entries render without
raw LaTeX or wrong capitals, and the lists are sorted and labelled by author and year
(``book/_ext/page_style.py``). Each check is proven on a planted instance first."""

from __future__ import annotations

import re
import sys

import book_site
import pytest
from pybtex.database import parse_string

sys.path.insert(0, str(book_site.ROOT / "book" / "_ext"))
import page_style  # noqa: E402

BIB = book_site.ROOT / "book" / "references.bib"
CHAPTERS = book_site.toc_pages()  # every page of every chapter (a section page is a page)
ENDING = re.compile(
    r"\n## References\n\n```\{bibliography\}\n:filter: docname in docnames\n"
    r"(:keyprefix: (\S+)\n)?```\n*$"
)
CITE = re.compile(r"\{cite(?::\w+)?\}`([^`]+)`")


def reference_problems(markdown: str, keys: set[str]) -> list[str]:
    """What is wrong with a page's citations: no References section at its very end, or a
    cited key that the bibliography does not have. A page that cites nothing (a chapter's landing
    page, a section that needs no source) has no References section either."""
    ending = ENDING.search(markdown)
    if ending is None and not CITE.findall(markdown):
        return []
    if ending is None:
        return ["the chapter does not end with '## References' and its bibliography directive"]
    prefix = ending.group(2) or ""
    cited = {key.strip() for group in CITE.findall(markdown) for key in group.split(",")}
    problems = [
        f"cites {key!r}, which is not in book/references.bib"
        for key in sorted(cited)
        if key.removeprefix(prefix) not in keys
    ]
    if not cited:
        problems.append("its References section lists nothing: the chapter cites no work")
    return problems


#: A citation typed by hand: "[Goyal et al., 2017](https://...)", "Kaplan et al. (2020)",
#: "Bergstra and Bengio (2012)"; the book cites with ``{cite}`` and a references.bib entry.
HAND_CITATION = re.compile(
    r"\[[A-Z][^\]]{0,80}\b(?:19|20)\d\d[a-z]?\]\(https?://"
    r"|\b[A-Z][\w'-]+(?: et al\.| and [A-Z][\w'-]+)(?:,\s*| \()(?:19|20)\d\d[a-z]?\b"
)


def hand_written_citations(markdown: str) -> list[str]:
    """Prose lines (outside code fences) that cite a work by hand instead of with ``{cite}``."""
    found, fence = [], None
    for number, line in enumerate(markdown.splitlines(), 1):
        opener = re.match(r"\s*(`{3,}|~{3,})", line)
        if opener and (fence is None or line.strip() == fence):
            fence = opener.group(1) if fence is None else None
            continue
        if fence is None and HAND_CITATION.search(CITE.sub("", line)):
            found.append(f"line {number}: {line.strip()[:90]}")
    return found


#: LaTeX a BibTeX field may hold and pybtex renders: escaped underscores and the like. Anything
#: else (math, \texttt, \emph) shows raw on the page.
RAW_LATEX = re.compile(r"\$|\\(?![_&%#{}]|url\b)[A-Za-z]+")


#: A word with a capital after its first letter: an acronym (``GPU``), an identifier
#: (``InterpretedFunction``), a constant (``TRITON_INTERPRET``).
INNER_CAPITAL = re.compile(r"\w+[A-Z]\w*")


def unbraced(title: str) -> str:
    """The parts of a BibTeX title outside braces: the words the style sets in sentence case."""
    kept, depth = [], 0
    for char in title:
        depth += (char == "{") - (char == "}")
        kept.append(char if depth == 0 and char not in "{}" else " ")
    return "".join(kept)


def field_problems(bibtex: str) -> list[str]:
    """Fields that would render raw LaTeX; titles that start with a lowercase name (a package,
    ``torch.optim.AdamW``) without braces, which the style would capitalise; and unbraced title
    words with inner capitals (``BFLOAT16``, ``InterpretedFunction``), which it would lowercase."""
    problems = []
    for key, entry in parse_string(bibtex, "bibtex").entries.items():
        for name, value in entry.fields.items():
            if name != "url" and RAW_LATEX.search(value):
                problems.append(f"{key}.{name}: raw LaTeX in {value[:60]!r}")
        title = entry.fields.get("title", "")
        if title[:1].islower():
            problems.append(f"{key}.title: {title[:40]!r} would print as {title[:1].upper()!r}...")
        lowered = INNER_CAPITAL.findall(unbraced(title).replace("\\_", "_"))
        if lowered:
            words = ", ".join(lowered)
            problems.append(f"{key}.title: would print {words} in lowercase (brace it)")
    return problems


def rendered_labels(bibtex: str) -> list[str]:
    """The reference list's labels, in its order, as the book's style writes them."""
    style = page_style.AuthorYearStyle()
    entries = style.sort(parse_string(bibtex, "bibtex").entries.values())
    return list(style.format_labels(entries))


PLANTED_BIB = r"""
@misc{b, title = {{CUDA} semantics}, author = {{NVIDIA}}, year = {2024}}
@misc{a, title = {torch.optim.AdamW}, author = {{PyTorch Contributors}}, year = {2024}}
@article{c, title = {A Proof for the Queuing Formula: {$L = \lambda W$}},
         author = {Little, John D. C.}, year = {1961}}
@misc{d, title = {{cuBLAS}: epilogues (\texttt{cublasLtEpilogue\_t})}, author = {{NVIDIA}},
      year = {2024}}
@misc{e, title = {{nanoGPT}}, author = {Karpathy, Andrej}, year = {2022}}
@misc{f, title = {Zeta}, author = {Zhang, Biao and Sennrich, Rico and Smith, Ann}, year = {2019}}
@misc{g, title = {Herd}, author = {Dubey, Abhimanyu and others}, year = {2024}}
@misc{h, title = {Under TRITON\_INTERPRET=1 the {InterpretedFunction}, not the {JITFunction}},
      author = {{PyTorch Contributors}}, year = {2025}}
@misc{i, title = {A Study of BFLOAT16 and {FP8} for {Deep} Learning}, author = {{NVIDIA}},
      year = {2025}}
"""


def test_the_reference_checks_see_planted_mistakes():
    chapter = "Adam {cite}`kingma2015adam`, and {cite}`nosuchkey`.\n"
    ending = "\n## References\n\n```{bibliography}\n:filter: docname in docnames\n```\n"
    keys = {"kingma2015adam"}
    assert reference_problems(chapter, keys) == [
        "the chapter does not end with '## References' and its bibliography directive"
    ]
    assert reference_problems(chapter + ending, keys) == [
        "cites 'nosuchkey', which is not in book/references.bib"
    ]
    assert reference_problems(chapter.replace(", and {cite}`nosuchkey`", "") + ending, keys) == []
    assert reference_problems("No citations.\n", keys) == []  # a landing page, say
    assert reference_problems("No citations.\n" + ending, keys) == [
        "its References section lists nothing: the chapter cites no work"
    ]
    assert field_problems(PLANTED_BIB) == [
        "a.title: 'torch.optim.AdamW' would print as 'T'...",
        "a.title: would print AdamW in lowercase (brace it)",
        "c.title: raw LaTeX in 'A Proof for the Queuing Formula: {$L = \\\\lambda W$}'",
        "d.title: raw LaTeX in '{cuBLAS}: epilogues (\\\\texttt{cublasLtEpilogue\\\\_t})'",
        "h.title: would print TRITON_INTERPRET in lowercase (brace it)",
        "i.title: would print BFLOAT16 in lowercase (brace it)",
    ]


def test_the_citation_style_check_sees_citations_typed_by_hand():
    planted = (
        "As [Goyal et al., 2017](https://arxiv.org/abs/1706.02677) found,\n"
        "and as Kaplan et al. (2020) and Bergstra and Bengio (2012) did,\n"
        "```{code-cell} ipython3\n# Smith et al. (2019) in code is not prose\n```\n"
        "Adam {cite}`kingma2015adam`; in 2015 and 2019 the batch grew.\n"
    )
    assert hand_written_citations(planted) == [
        "line 1: As [Goyal et al., 2017](https://arxiv.org/abs/1706.02677) found,",
        "line 2: and as Kaplan et al. (2020) and Bergstra and Bengio (2012) did,",
    ]


@pytest.mark.parametrize("name", ["intro", *CHAPTERS])
def test_every_chapter_cites_with_the_bibliography(name):
    found = hand_written_citations((book_site.ROOT / "book" / f"{name}.md").read_text())
    assert not found, (
        f"book/{name}.md cites by hand (use {{cite}} and a references.bib entry, so the "
        "reference list has it):\n" + "\n".join(found[:30])
    )


def test_reference_lists_are_sorted_and_labelled_by_author_and_year():
    assert rendered_labels(PLANTED_BIB) == [
        "Dubey et al., 2024",
        "Karpathy, 2022",
        "Little, 1961",
        "NVIDIA, 2024a",
        "NVIDIA, 2024b",
        "NVIDIA, 2025",
        "PyTorch Contributors, 2024",
        "PyTorch Contributors, 2025",
        "Zhang et al., 2019",
    ]


def test_the_bibliography_renders_without_raw_latex_or_wrong_capitals():
    problems = field_problems(BIB.read_text())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_page_ends_with_the_works_it_cites(name):
    keys = set(parse_string(BIB.read_text(), "bibtex").entries.keys())
    problems = reference_problems((book_site.ROOT / "book" / f"{name}.md").read_text(), keys)
    assert not problems, f"book/{name}.md:\n" + "\n".join(problems)


def test_the_book_cites_by_author_and_year():
    config = book_site.config()["sphinx"]["config"]
    assert config["bibtex_reference_style"] == "author_year_round"
    assert config["bibtex_default_style"] == "author_year"
    assert "page_style" in book_site.config()["sphinx"]["local_extensions"]
