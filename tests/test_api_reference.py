"""The API reference (book/api): a page per module, links from code to entries, and back.

The build test builds a small book (one chapter, not executed, and the reference) with the real
``_config.yml``, so it checks the same extensions and settings as ``make book``, in about half a
minute instead of executing every chapter.
"""

from __future__ import annotations

import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import book_site
import pytest
import trainfast
import trainfast.calculator
import yaml
from trainfast.distributed.step_time import estimate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import build_support  # noqa: E402

CHAPTER = "memory_hierarchy/accounting"  # lists trainfast.accounting.memory, cells import it


def test_reexported_names_resolve_where_they_are_defined():
    assert build_support.defined_at("trainfast.optim.AdamW", None, None) == (
        "trainfast.optim.adam.AdamW",
        True,
    )
    # a short name inside a package's docstring, as Sphinx sees it
    assert build_support.defined_at("Trainer", "trainfast.training", None) == (
        "trainfast.training.trainer.Trainer",
        True,
    )
    # a typo still warns
    assert build_support.defined_at("AdamX", "trainfast.optim", None) == (None, False)
    assert build_support.defined_at("trainfast.optim.AdamX", None, None) == (None, False)


def test_listings_of_package_files_get_their_module():
    code = ROOT / "code"
    assert build_support.listing_module(str(code / "trainfast/accounting/memory.py"), code) == (
        "trainfast.accounting.memory"
    )
    assert build_support.listing_module(str(code / "trainfast/optim/__init__.py"), code) == (
        "trainfast.optim"
    )
    assert build_support.listing_module(str(ROOT / "book/_ext/build_support.py"), code) is None
    assert "training_memory" in build_support.public_names("trainfast.accounting")


def test_the_teaching_chapter_comes_from_listings_and_imports_not_mentions():
    from build_support.api_reference import chapter_modules, reading_order

    code = ROOT / "code"
    book = ROOT / "book"
    names = [
        p.relative_to(book).with_suffix("").as_posix()
        for p in book.rglob("*.md")
        if "kernelspec:" in p.read_text()
        and p.relative_to(book).parts[0] not in ("api", "appendix")
    ]
    chapters = {
        name: chapter_modules((book / f"{name}.md").read_text(), book / f"{name}.md", code)
        for name in reading_order(ROOT, names)
    }
    # the pages come in reading order, a folder chapter's sections under it
    pages = list(chapters)
    assert pages.index("optimizers/gradient_descent") < pages.index("optimizers/adam")
    assert pages.index("optimizers/step_cost") < pages.index("hyperparameters/trainer")
    modules = ["trainfast", "trainfast.device", "trainfast.optim", "trainfast.optim.adam"]
    taught = build_support.teaching_chapters(modules, chapters)
    # every chapter's first cell imports the device helper: machinery, taught by none
    assert all("trainfast.device" in imported for _, imported in chapters.values())
    assert taught["trainfast.device"] is None
    assert taught["trainfast.optim.adam"] == "optimizers/adam"  # its listings are there
    # a synthetic book: a listing wins over an earlier import, an import over a mention
    text = (
        "Mentions trainfast.accounting three times: trainfast.accounting trainfast.accounting\n"
        "```{code-cell} ipython3\nfrom trainfast.optim import AdamW\n%time x = 1\n```\n"
    )
    first = chapter_modules(text, ROOT / "book" / "first.md", code)
    second = chapter_modules(
        "```{literalinclude} ../code/trainfast/optim/adam.py\n:pyobject: AdamW\n```\n",
        ROOT / "book" / "second.md",
        code,
    )
    assert first == (set(), {"trainfast.optim", "trainfast.optim.adam"})
    found = build_support.teaching_chapters(
        ["trainfast", "trainfast.optim", "trainfast.optim.adam", "trainfast.accounting"],
        {"first": first, "second": second},
    )
    assert found == {
        "trainfast": None,
        "trainfast.optim": "first",
        "trainfast.optim.adam": "second",
        "trainfast.accounting": None,
    }


def _reference_pages() -> list[str]:
    """Every public top-level module and subpackage of trainfast: each must have a page."""
    return sorted(
        f"trainfast.{m.name}"
        for m in pkgutil.iter_modules(trainfast.__path__)
        if not m.name.startswith("_")
    )


@pytest.fixture(scope="module")
def small_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str | None]:
    """The HTML of the reference and of ``CHAPTER``, and the log of the build that made it.

    Under ``.ci/run`` (``TRAINFAST_BUILT_FIRST=1``) that is ``make book``'s whole site, which it
    built with ``-W -n`` just before, so any warning failed it: the log is not kept (None).
    Elsewhere, a small build of its own."""
    if os.environ.get("TRAINFAST_BUILT_FIRST") == "1":
        return book_site.built_site(), None
    out = tmp_path_factory.mktemp("book")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    # paths in a configuration are relative to the file: make them absolute
    config["sphinx"]["local_extensions"] = {
        name: str(ROOT / path) for name, path in config["sphinx"]["local_extensions"].items()
    }
    config["bibtex_bibfiles"] = [str(ROOT / p) for p in config["bibtex_bibfiles"]]
    config["sphinx"]["config"]["templates_path"] = [
        str(ROOT / p) for p in config["sphinx"]["config"]["templates_path"]
    ]
    (out / "_config.yml").write_text(yaml.safe_dump(config))
    toc = {
        "format": "jb-book",
        "root": f"book/{CHAPTER}",
        "chapters": [{"file": "book/api/index", "sections": [{"glob": "book/api/generated/*"}]}],
    }
    (out / "_toc.yml").write_text(yaml.safe_dump(toc))
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "jupyter-book"),
            "build",
            str(ROOT),
            "-n",
            "--keep-going",
            "--config",
            str(out / "_config.yml"),
            "--toc",
            str(out / "_toc.yml"),
            "--path-output",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "code")},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out / "_build" / "html", result.stdout + result.stderr


def test_reference_builds_without_warnings(small_build):
    _, log = small_build
    if log is None:
        pytest.skip("make book built the site with -W -n: a warning would have failed it")
    warnings = [
        line
        for line in re.sub(r"\x1b\[[0-9;]*m", "", log).splitlines()
        if "WARNING" in line and "glue" not in line  # glue: the chapter is not executed here
    ]
    assert not warnings, "\n".join(warnings)


@pytest.mark.parametrize("module", _reference_pages())
def test_every_module_and_subpackage_has_a_page(small_build, module):
    html, _ = small_build
    page = html / "book" / "api" / "generated" / f"{module}.html"
    assert page.exists(), f"no reference page for {module}"
    assert f'id="module-{module}"' in page.read_text()


def test_subpackage_page_documents_its_modules(small_build):
    html, _ = small_build
    text = (html / "book" / "api" / "generated" / "trainfast.optim.html").read_text()
    assert 'id="trainfast.optim.adam.AdamW"' in text
    assert "_modules/trainfast/optim/adam.html" in text, "no [source] link (viewcode)"


def _links(text: str) -> set[str]:
    return set(re.findall(r'class="sphinx-codeautolink-a" href="([^"]+)"', text)) | set(
        re.findall(r'href="([^"]+)"[^>]*class="sphinx-codeautolink-a"', text)
    )


def test_names_in_listings_and_cells_link_to_their_entries(small_build):
    html, _ = small_build
    text = (html / "book" / f"{CHAPTER}.html").read_text()
    listing = text[text.index('<span class="nf">training_memory</span>') :]
    listing = listing[: listing.index("</pre>")]
    assert any(
        h.endswith("trainfast.transformer_shape.html#trainfast.transformer_shape.TransformerShape")
        for h in _links(listing)
    ), "the listing of training_memory does not link TransformerShape"
    cells = text[text.index("<h1") :]
    assert any(
        h.endswith("#trainfast.accounting.parameters.parameter_count") for h in _links(cells)
    )


def test_entries_list_the_sections_that_use_them(small_build):
    html, _ = small_build
    text = (html / "book" / "api" / "generated" / "trainfast.accounting.html").read_text()
    entry = text[text.index('id="trainfast.accounting.parameters.parameter_count"') :]
    entry = entry[: entry.index("</dd></dl>")]  # the last entry of its page
    assert re.search(rf'href="\.\./\.\./{CHAPTER}\.html#[\w-]+"', entry), (
        "parameter_count's entry does not link back to the chapter that uses it"
    )


def test_the_calculator_is_embedded_with_the_package_data(small_build):
    from build_support.page_assets import CALCULATOR_SCRIPTS as SCRIPTS

    html, _ = small_build
    text = (html / "book" / f"{CHAPTER}.html").read_text()
    assert 'class="trainfast-calculator"' in text
    up = r"\.\./" * (CHAPTER.count("/") + 1)  # the page's depth under book/
    loaded = [re.search(rf'<script src="{up}_static/{script}', text) for script in SCRIPTS]
    for script, found in zip(SCRIPTS, loaded, strict=True):
        assert found, f"{script} not loaded"
        assert (html / "_static" / script).exists()
    assert sorted(loaded, key=lambda m: m.start()) == loaded, "the scripts load out of order"
    other = (html / "book" / "api" / "index.html").read_text()
    assert "calculator.js" not in other, "pages without the widget should not load it"
    data = (html / "_static" / "calculator-data.js").read_text()
    assert data.startswith("window.TRAINFAST_CALCULATOR = ")
    assert str(estimate(trainfast.calculator.grid()[0]).step_s) in data


def _public_modules() -> list[str]:
    return ["trainfast"] + [
        m.name
        for m in pkgutil.walk_packages(trainfast.__path__, "trainfast.")
        if not any(part.startswith("_") for part in m.name.split("."))
    ]


def test_the_index_lists_every_module_with_its_summary_and_chapter(small_build):
    html, _ = small_build
    text = (html / "book" / "api" / "index.html").read_text()
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", text.split("trainfast-modules", 1)[1], re.S)
    by_module = {}
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        if cells:
            by_module[re.sub(r"<[^>]+>", "", cells[0]).strip()] = cells
    assert set(by_module) == set(_public_modules())
    chunked = by_module["trainfast.kernels.chunked_cross_entropy"]
    assert re.sub(r"<[^>]+>", "", chunked[1]).strip().startswith("Cross-entropy over the LM head")
    assert f"{CHAPTER}.html" in chunked[2]  # the one page of the small build teaches it


def test_signatures_are_short_and_parse(small_build):
    html, _ = small_build
    raw = []
    for page in sorted((html / "book" / "api" / "generated").glob("*.html")):
        for sig in re.findall(r'<dt class="sig sig-object py".*?</dt>', page.read_text(), re.S):
            text = re.sub(r"<[^>]+>", "", sig).replace("&lt;", "<").replace("&gt;", ">")
            if re.search(r"~[\w.]+|<required parameter>|<factory>|collections\.abc\.", text):
                raw.append(f"{page.name}: {' '.join(text.split())[:160]}")
    assert not raw, f"{len(raw)} signatures left raw:\n" + "\n".join(raw[:10])


def test_readable_signature_turns_defaults_into_python():
    from trainfast.profiling.case_study import CaseStudyConfig

    sig = "(shape: ~x.TransformerShape = <factory>, lr: float = <required parameter>)"
    assert build_support.readable_signature(sig, CaseStudyConfig) == (
        "(shape: ~x.TransformerShape = TransformerShape(...), lr: float)"
    )
    assert build_support.readable_signature("(f=<function cross_entropy>)", None) == (
        "(f=cross_entropy)"
    )


def test_repeated_inline_scripts_are_dropped_once_seen():
    script = "<script>const A = 1;</script>\n"
    page = "<head>\n" + script + "<script src='x.js'></script>\n" + script
    assert build_support.drop_repeated_inline_scripts(page).count("const A") == 1
    assert "x.js" in build_support.drop_repeated_inline_scripts(page)
