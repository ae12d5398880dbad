"""Tests of the build itself: workflows, cache invalidation, packaging, the CI entry point."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import build_support  # noqa: E402


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in {BIN}: it is in requirements.txt")
    return str(path)


# --- workflows -------------------------------------------------------------------------------


def test_there_are_two_workflows():
    assert {p.name for p in WORKFLOWS} == {"ci.yml", "book.yml"}


def test_workflows_match_the_github_schema():
    result = subprocess.run(
        [
            _tool("check-jsonschema"),
            "--builtin-schema",
            "vendor.github-workflows",
            *map(str, WORKFLOWS),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflows_pass_zizmor_security_audit():
    result = subprocess.run(
        [_tool("zizmor"), "--offline", str(ROOT / ".github" / "workflows")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _load(name: str) -> dict:
    data = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def test_gpu_workflow_never_runs_code_from_pull_requests():
    book = _load("book.yml")
    triggers = set(book["on"])
    assert triggers <= {"push", "workflow_dispatch"}, triggers
    assert book["on"]["push"]["branches"] == ["main"]
    assert book["permissions"] == {}, (
        "the top level must grant nothing; jobs ask for what they need"
    )
    build = book["jobs"]["build"]
    assert build["runs-on"] == ["self-hosted", "linux", "gpu"]
    assert build["permissions"] == {"contents": "read"}
    deploy = book["jobs"]["deploy"]
    assert deploy["runs-on"] == "ubuntu-latest", "the job that can write to Pages is GitHub-hosted"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}


def test_only_a_github_hosted_job_on_pushes_to_main_writes_the_notebooks_branch():
    book = _load("book.yml")
    writers = {
        name: job
        for name, job in book["jobs"].items()
        if job.get("permissions", {}).get("contents") == "write"
    }
    assert set(writers) == {"notebooks"}, f"only the notebooks job may write: {set(writers)}"
    job = writers["notebooks"]
    assert job["needs"] == "build", "it publishes only what a successful build produced"
    assert job["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert job["runs-on"] == "ubuntu-latest" and "self-hosted" not in str(job["runs-on"])
    assert job["permissions"] == {"contents": "write"}
    script = "\n".join(step.get("run", "") for step in job["steps"])
    assert "HEAD:notebooks" in script and "${{" not in script, "no expressions inside run:"
    steps = book["jobs"]["build"]["steps"]
    uploads = [s for s in steps if s.get("with", {}).get("name") == "notebooks"]
    assert uploads and uploads[0]["with"]["path"] == "_build/html/notebooks"


def test_pull_request_workflow_is_read_only_and_runs_the_readme_commands():
    ci = _load("ci.yml")
    assert "pull_request" in ci["on"] and "pull_request_target" not in ci["on"]
    assert ci["permissions"] == {"contents": "read"}
    runs = "\n".join(step.get("run", "") for job in ci["jobs"].values() for step in job["steps"])
    assert "make test" in runs and "make book" in runs and "ruff check" in runs
    for job in ci["jobs"].values():
        assert "self-hosted" not in str(job["runs-on"])


def test_ci_script_runs_readme_commands():
    script = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    for command in ("make book", "make test"):
        assert command in readme
        assert command in script


# --- packaging -------------------------------------------------------------------------------


def test_the_supported_versions_are_stated_and_run_in_ci():
    from trainfast.versions import TORCH_FLOOR

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch>={}.{}".format(*TORCH_FLOOR) in project["dependencies"]
    job = _load("ci.yml")["jobs"]["package-tests"]
    torches = [entry["torch"] for entry in job["strategy"]["matrix"]["include"]]
    assert [t.rsplit(".", 1)[0] for t in torches] == ["2.4", "2.11"]
    assert "self-hosted" not in str(job["runs-on"])
    assert ".ci/package-tests" in "\n".join(step.get("run", "") for step in job["steps"])
    readme = (ROOT / "README.md").read_text().split("### Supported versions", 1)[1]
    table = readme.split("\n\n", 2)[1]
    for torch_version in torches + ["2.14.1"]:
        assert f"| {torch_version} " in table, f"README's matrix lacks torch {torch_version}"
    pins = (ROOT / "requirements.txt").read_text()
    assert "torch==2.14.1" in pins and "numpy==1.26.4" in pins


@pytest.mark.parametrize(
    ("triton", "numpy", "fails"),
    [
        ("3.6.0", "2.4.1", True),
        ("3.0.0", "2.0.0", True),
        ("3.6.0", "1.26.4", False),
        ("3.8.0", "1.26.4", False),
        ("3.8.0", "2.4.1", False),  # not known to fail: no error
    ],
)
def test_a_known_bad_interpreter_combination_is_named(triton, numpy, fails):
    from trainfast.versions import interpreter_problem

    problem = interpreter_problem(triton, numpy)
    assert (problem is not None) == fails
    if fails:
        assert f"Triton {triton}" in problem and f"NumPy {numpy}" in problem
        assert "numpy<2" in problem
    with pytest.raises(ValueError, match="'three'"):
        interpreter_problem("three", numpy)


@pytest.mark.parametrize("triton,too_old", [("3.0.0", True), ("3.5.1", True), ("3.6.0", False)])
def test_a_triton_too_old_for_the_compile_report_is_named(triton, too_old):
    from trainfast.versions import compile_report_problem

    problem = compile_report_problem(triton)
    assert (problem is not None) == too_old
    if too_old:
        assert f"Triton {triton}" in problem and "3.6 or newer" in problem


def test_no_triton_kernel_module_turns_its_annotations_into_strings():
    """Triton 3.0's interpreter (torch 2.4's) reads ``BLOCK: tl.constexpr`` as a constexpr only
    when the annotation is the object, not the string that ``from __future__ import
    annotations`` makes of it: every ``tl.arange(0, BLOCK)`` then fails."""
    for path in sorted((ROOT / "code" / "trainfast").rglob("*.py")):
        text = path.read_text()
        if "@triton.jit" in text:
            assert "from __future__ import annotations" not in text, path.name


def test_package_declares_a_torch_range_and_ships_py_typed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_requirement = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert torch_requirement == "torch>=2.4"
    assert (ROOT / "code" / "trainfast" / "py.typed").exists()


def test_requirements_pin_every_package():
    lines = [
        line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
    ]
    unpinned = [line for line in lines if line and "==" not in line]
    assert not unpinned, f"requirements.txt must pin exact versions: {unpinned}"


def test_every_module_lists_its_public_names():
    import importlib
    import pkgutil

    import trainfast

    missing, broken = [], []
    for info in pkgutil.walk_packages(trainfast.__path__, prefix="trainfast."):
        if info.name.rsplit(".", 1)[-1].startswith("_") or info.name == "trainfast.measure":
            continue
        module = importlib.import_module(info.name)
        if not hasattr(module, "__all__"):
            missing.append(info.name)
            continue
        broken += [f"{info.name}.{n}" for n in module.__all__ if not hasattr(module, n)]
    assert not missing, f"modules without __all__: {missing}"
    assert not broken, f"__all__ names that do not exist: {broken}"


# --- cache invalidation ----------------------------------------------------------------------


def test_source_hash_ignores_bytecode_and_sees_edits(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    before = build_support.source_hash([package])
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert build_support.source_hash([package]) == before
    (package / "a.py").write_text("x = 2\n")
    assert build_support.source_hash([package]) != before


def test_invalidate_empties_the_cache_only_when_sources_change(tmp_path):
    package, cache = tmp_path / "pkg", tmp_path / "cache"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    assert build_support.invalidate_if_changed(cache, [package])  # no stamp yet: untrusted
    (cache / "executed").mkdir()
    assert not build_support.invalidate_if_changed(cache, [package])
    assert (cache / "executed").exists()
    (package / "b.py").write_text("y = 1\n")
    assert build_support.invalidate_if_changed(cache, [package])
    assert not (cache / "executed").exists()


TINY_CONFIG = """\
title: tiny
only_build_toc_files: true
execute:
  execute_notebooks: cache
  cache: _build/.jupyter_cache
sphinx:
  local_extensions:
    build_support: {ext}
  config:
    nb_execution_raise_on_error: true
    build_support_watch: [pkg]
"""

TINY_CHAPTER = """\
---
jupytext:
  text_representation:
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
# Tiny

```{code-cell} ipython3
import importlib.util, pathlib, sys
sys.path.insert(0, str(pathlib.Path.cwd() / "pkg"))
import value
print("VALUE", value.VALUE)
```
"""


def _build_tiny(book: Path) -> str:
    result = subprocess.run(
        [_tool("jupyter-book"), "build", str(book), "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        cwd=book,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return (book / "_build" / "html" / "chapter.html").read_text()


def test_a_package_change_re_executes_an_unchanged_chapter(tmp_path):
    """Build with a package, then change only the package: the chapter's cells are unchanged
    (jupyter-cache would serve the first execution), yet the page must show the new value."""
    book = tmp_path / "book"
    (book / "pkg").mkdir(parents=True)
    (book / "pkg" / "value.py").write_text("VALUE = 'first'\n")
    (book / "_config.yml").write_text(TINY_CONFIG.format(ext=ROOT / "book" / "_ext"))
    (book / "_toc.yml").write_text("format: jb-book\nroot: chapter\n")
    (book / "chapter.md").write_text(TINY_CHAPTER)

    assert "VALUE first" in _build_tiny(book)
    (book / "pkg" / "value.py").write_text("VALUE = 'second'\n")
    assert "VALUE second" in _build_tiny(book)
    shutil.rmtree(book / "_build")


def _timed_chapter(name: str, last_cell: str) -> str:
    """A chapter that appends when it starts and ends to ``runs.txt``, then runs ``last_cell``."""
    log = (
        "import time, pathlib\n"
        "start = time.time()\n"
        "time.sleep(3)\n"
        "with open('runs.txt', 'a') as f:\n"
        f"    f.write(f'{name} {{start}} {{time.time()}}\\n')"
    )
    return TINY_CHAPTER.split("# Tiny")[0] + (
        f"# {name}\n\n```{{code-cell}} ipython3\n{log}\n```\n\n"
        f"Text.\n\n```{{code-cell}} ipython3\n{last_cell}\n```\n"
    )


def test_chapters_execute_in_parallel_once_and_a_cell_error_names_chapter_and_cell(tmp_path):
    """Two chapters execute at the same time while Sphinx reads the other pages; the one whose
    second cell raises fails the build, named with its cell; the other is cached and not run
    again."""
    book = tmp_path / "book"
    (book / "pkg").mkdir(parents=True)
    (book / "_config.yml").write_text(
        TINY_CONFIG.format(ext=ROOT / "book" / "_ext") + "    build_support_jobs: 2\n"
    )
    (book / "_toc.yml").write_text(
        "format: jb-book\nroot: chapter\nchapters:\n  - file: broken\n  - file: notes\n"
    )
    (book / "chapter.md").write_text(_timed_chapter("chapter", "print('fine')"))
    (book / "broken.md").write_text(_timed_chapter("broken", "x = 1\n1 / 0"))
    (book / "notes.md").write_text("# Notes\n\nNo code.\n")
    command = [_tool("jupyter-book"), "build", str(book), "-W", "-n", "--keep-going"]
    failed = subprocess.run(command, capture_output=True, text=True, cwd=book, timeout=600)
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0
    assert "broken.md: code cell 2 (broken.md, line 23: `x = 1`) raised ZeroDivisionError" in (
        output
    ), output[-3000:]
    runs = {
        line.split()[0]: line.split()[1:]
        for line in (book / "runs.txt").read_text().split("\n")
        if line
    }
    (a_start, a_end), (b_start, b_end) = [map(float, runs[n]) for n in ("chapter", "broken")]
    assert max(a_start, b_start) < min(a_end, b_end), "the two chapters did not run at once"
    # the page without code was read while the chapters ran (each takes 3 s), not after
    lines = failed.stdout.splitlines()
    read_notes = [
        i for i, line in enumerate(lines) if "reading sources" in line and "notes" in line
    ]
    done = [i for i, line in enumerate(lines) if ": executed in" in line or ": failed in" in line]
    assert read_notes and done and read_notes[0] < done[0], "\n".join(lines[-40:])

    (book / "broken.md").write_text(_timed_chapter("broken", "print('fixed')"))
    assert "fine" in _build_tiny(book)
    names = [line.split()[0] for line in (book / "runs.txt").read_text().splitlines()]
    assert sorted(names) == ["broken", "broken", "chapter"]  # the good chapter ran once
    shutil.rmtree(book / "_build")


def test_unknown_watch_path_fails_the_build_loudly(tmp_path):
    class App:
        srcdir = str(tmp_path)

        class config:  # noqa: N801 - mimics sphinx.config.Config's attribute access
            build_support_watch = ["does-not-exist"]
            nb_execution_cache_path = ""

    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        build_support._on_builder_inited(App())  # type: ignore[arg-type]


def _book_pages() -> list[Path]:
    """Every MyST page under ``book/``: chapters, section pages in chapter folders, appendices
    (not the API reference, whose pages are generated)."""
    return sorted(
        p for p in (ROOT / "book").rglob("*.md") if p.relative_to(ROOT / "book").parts[0] != "api"
    )


def test_chapter_sources_are_valid_yaml_front_matter():
    for chapter in _book_pages():
        text = chapter.read_text()
        if text.startswith("---"):
            front = yaml.safe_load(text.split("---")[1])
            assert front["kernelspec"]["name"] == "python3", chapter.name


def test_every_executable_chapter_has_a_test_module():
    """``test_<chapter>.py`` for a chapter on one page and for a chapter that is a folder."""
    for page in _book_pages():
        relative = page.relative_to(ROOT / "book")
        if relative.parts[0] == "appendix" or "kernelspec:" not in page.read_text():
            continue
        chapter = relative.parts[0].removesuffix(".md")
        assert (ROOT / "tests" / f"test_{chapter}.py").exists(), str(relative)


def _toc_files(entries: list[dict]) -> set[str]:
    found = set()
    for entry in entries or []:
        if "file" in entry:
            found.add(entry["file"])
        found |= _toc_files(entry.get("sections", []))
    return found


def test_every_chapter_is_in_the_table_of_contents():
    """Every page under ``book/`` is in ``_toc.yml`` (a section page under its chapter's
    ``sections:``), and everything ``_toc.yml`` lists exists."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    listed = {toc["root"]} | _toc_files(toc.get("chapters", []))
    on_disk = {
        f"book/{p.relative_to(ROOT / 'book').with_suffix('').as_posix()}" for p in _book_pages()
    }
    missing = {f for f in listed if not any((ROOT / f"{f}{s}").exists() for s in (".md", ".rst"))}
    assert on_disk <= listed and not missing, (
        f"not in _toc.yml: {on_disk - listed}; missing: {missing}"
    )


# --- the built site's freshness --------------------------------------------------------------


def test_the_site_counts_as_stale_when_a_source_is_newer(tmp_path, monkeypatch):
    import os

    import book_site

    html, source = tmp_path / "html", tmp_path / "book" / "a.md"
    source.parent.mkdir()
    source.write_text("# A\n")
    monkeypatch.setattr(book_site, "ROOT", tmp_path)
    monkeypatch.setattr(book_site, "SOURCES", [source.parent])
    assert book_site.SITE_STAMP == build_support.SITE_STAMP
    assert "no built site" in book_site.stale_reason(html)
    html.mkdir()
    (html / "searchindex.js").write_text("Search.setIndex({})")
    stamp = tmp_path / build_support.SITE_STAMP
    stamp.write_text("")
    os.utime(source, (1, 1))
    assert book_site.stale_reason(html) is None
    source.touch()
    os.utime(stamp, (2, 2))
    assert "older than book/a.md" in book_site.stale_reason(html)
    monkeypatch.setenv("TRAINFAST_BUILT_FIRST", "1")
    monkeypatch.setattr(book_site, "HTML", html)
    with pytest.raises(pytest.fail.Exception, match="TRAINFAST_BUILT_FIRST=1"):
        book_site.built_site()


def test_importing_the_kernels_on_a_known_bad_combination_names_the_versions():
    script = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "import numpy, triton\n"
        "numpy.__version__, triton.__version__ = '2.4.1', '3.6.0'\n"
        "import trainfast.kernels.triton_runtime\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT / "code")},
    )
    assert run.returncode != 0
    assert "ImportError: Triton 3.6.0's CPU interpreter" in run.stderr, run.stderr[-2000:]
    assert "NumPy 2.4.1" in run.stderr


def test_each_exclusive_group_reaches_xdist(request):
    # Under `--dist loadgroup` xdist reads an item's group into its node id ("...@chromium") in
    # its own collection hook; conftest must mark the groups before that, or they are ignored.
    from conftest import exclusive_group

    if not getattr(request.config.option, "loadgroup", False):  # set in xdist's workers only
        pytest.skip("not running under pytest-xdist's --dist loadgroup")
    grouped = [(i, exclusive_group(i)) for i in request.session.items]
    lost = [i.nodeid for i, group in grouped if group and not i.nodeid.endswith(f"@{group}")]
    assert grouped and not lost, f"{len(lost)} items lost their group, e.g. {lost[:3]}"


def test_code_links_worker_warnings_reach_the_build(tmp_path, monkeypatch):
    """codeautolink's pages are linked in forked workers (build_support.code_links); a warning a
    worker gives (here: a code block the page does not have) must reach the build's logger, or
    ``-W`` would no longer fail on it."""
    from types import SimpleNamespace

    from build_support import code_links
    from sphinx_codeautolink.extension import block
    from sphinx_codeautolink.extension.backref import CodeExample

    pages = ["one", "two"]
    for page in pages:
        (tmp_path / f"{page}.html").write_text("<html><body><p>no code here</p></body></html>")
    transforms = {
        page: [block.SourceTransform("x = 1", [], CodeExample(page, "id", []), 1)] for page in pages
    }
    written = []
    state = SimpleNamespace(
        cache=SimpleNamespace(transforms=transforms, write=lambda: written.append(True)),
        outdated_docs=set(pages),
        inventory={},
        custom_blocks={},
        search_css_classes=[],
        disable_link_titles=False,
    )
    app = SimpleNamespace(
        outdir=str(tmp_path),
        builder=SimpleNamespace(name="html"),
        config=SimpleNamespace(build_support_jobs=2),
    )
    given = []
    recorder = SimpleNamespace(warning=lambda msg, **kwargs: given.append(kwargs["location"]))
    monkeypatch.setattr(block, "logger", recorder)
    code_links.link_pages(app, state)
    assert sorted(given) == pages
    assert written == [True]


def test_the_build_kernels_record_each_figures_smallest_text(tmp_path, monkeypatch):
    """A kernel started as the build starts them (IPYTHONDIR from page_assets.kernel_profile)
    still draws its figures as PNGs, each recording its smallest visible text in points, which
    the phone test reads; a figure drawn as text ("<Figure size ...>") would make that test see
    no figure at all."""
    import base64

    import nbformat
    from nbclient import NotebookClient

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import page_style
    from build_support.page_assets import kernel_profile

    monkeypatch.setenv("IPYTHONDIR", str(kernel_profile(tmp_path)))
    monkeypatch.setenv("MATPLOTLIBRC", str(ROOT / "book" / "_ext" / "matplotlibrc"))
    code = (
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.plot([1, 2], label='a line')\n"
        "ax.legend(fontsize=10)\n"
        "ax.text(1, 1.5, 'small', fontsize=9)\n"
        "ax.text(1, 1.2, 'hidden', fontsize=4, visible=False)\n"
    )
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    NotebookClient(notebook, kernel_name="python3", timeout=120).execute()
    images = [o for o in notebook.cells[0].outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1, notebook.cells[0].outputs
    png = base64.b64decode(images[0]["data"]["image/png"])
    assert page_style.png_text(png)[page_style.SMALLEST_TEXT_KEY] == "9.00"
    assert page_style.png_info(png)[2] == pytest.approx(192, rel=0.01)  # drawn at 2x still
