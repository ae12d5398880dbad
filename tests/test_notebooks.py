"""The notebooks the build writes for every chapter: executed, clean (installs the package first),
exercises (solutions stubbed, checks kept); and the Colab/Binder buttons that open them."""

from __future__ import annotations

import ast
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import book_site
import chapters
import nbformat
import pytest
from nbclient import NotebookClient

sys.path.insert(0, str(book_site.ROOT / "book" / "_ext"))
import build_support  # noqa: E402

CHAPTERS = book_site.toc_chapters()
REPOSITORY = book_site.config()["repository"]["url"]
GPU_NOTEBOOKS = book_site.config()["sphinx"]["config"]["build_support_gpu_notebooks"]


def _clean(name: str) -> nbformat.NotebookNode:
    return build_support.clean_notebook(
        chapters.chapter_path(name), REPOSITORY, gpu=f"book/{name}" in GPU_NOTEBOOKS
    )


def _tagged(notebook: nbformat.NotebookNode, tag: str) -> list[nbformat.NotebookNode]:
    return [
        c for c in notebook.cells if c.cell_type == "code" and tag in c.metadata.get("tags", [])
    ]


def solution_lines(source: str) -> set[str]:
    """The stripped lines of a solution cell that are solution: function bodies (docstrings
    aside) and statements other than imports, definitions and ``check_...`` calls."""
    tree = ast.parse(source)
    lines = source.splitlines()
    spans: list[tuple[int, int]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for item in ast.walk(node):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    body = item.body
                    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                        body = body[1:]
                    spans += [(stmt.lineno, stmt.end_lineno) for stmt in body]
        elif not isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", "").startswith("check_")
        ):
            spans.append((node.lineno, node.end_lineno))
    found = {lines[i - 1].strip() for start, end in spans for i in range(start, end + 1)}
    return {line for line in found if re.search(r"\w", line)}  # not bare brackets


# --- the transform itself ---------------------------------------------------------------------

SOLUTION = '''from trainfast.demo.exercises import check_double


def double(x: int) -> int:
    """Twice x."""
    y = x + x  # the answer
    return y


def square(x): return x * x


answer = 42
print("done")


check_double(double)
'''


def test_stub_keeps_imports_signatures_docstrings_and_checks_and_nothing_else():
    stub = build_support.stub_solution(SOLUTION)
    assert stub.startswith("from trainfast.demo.exercises import check_double\n")
    assert 'def double(x: int) -> int:\n    """Twice x."""\n    raise NotImplementedError' in stub
    assert "def square(x):\n    raise NotImplementedError" in stub
    assert "answer = ...  # your answer here" in stub and "# your code here" in stub
    assert stub.rstrip().endswith("check_double(double)")
    assert solution_lines(SOLUTION) == {
        "y = x + x  # the answer",
        "return y",
        "def square(x): return x * x",
        "answer = 42",
        'print("done")',
    }
    assert not solution_lines(SOLUTION) & {line.strip() for line in stub.splitlines()}


def test_a_stubbed_function_raises_when_the_check_calls_it():
    stub = build_support.stub_solution(SOLUTION).replace(
        "from trainfast.demo.exercises import check_double", ""
    )
    with pytest.raises(NotImplementedError, match="your code here"):
        exec(stub, {"check_double": lambda f: f(1)})


def test_a_solution_cell_that_is_not_python_is_refused():
    with pytest.raises(ValueError, match="not plain Python"):
        build_support.stub_solution("%timeit f()\n")


# --- each chapter's clean and exercise notebooks -----------------------------------------------


@pytest.mark.parametrize("name", CHAPTERS)
def test_clean_notebook_is_valid_and_installs_the_package_first(name):
    notebook = _clean(name)
    nbformat.validate(notebook)
    first = notebook.cells[0]
    assert first.cell_type == "code" and build_support.INSTALL_TAG in first.metadata["tags"]
    assert f'%pip install --quiet "trainfast[book] @ git+{REPOSITORY}"' in first.source
    assert 'if importlib.util.find_spec("trainfast") is None:' in first.source
    assert not _tagged(notebook, build_support.INSTALL_TAG)[1:], "one install cell"
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code")
    assert "jupytext" not in notebook.metadata
    wants_gpu = f"book/{name}" in GPU_NOTEBOOKS
    assert (notebook.metadata.get("accelerator") == "GPU") == wants_gpu


@pytest.mark.parametrize("name", CHAPTERS)
def test_exercise_notebook_has_no_solution_code_and_keeps_every_check(name):
    clean = _clean(name)
    exercises = build_support.exercise_notebook(clean)
    nbformat.validate(exercises)
    assert len(exercises.cells) == len(clean.cells)
    assert not _tagged(exercises, build_support.SOLUTION_TAG)
    pairs = [
        (a, b)
        for a, b in zip(clean.cells, exercises.cells, strict=True)
        if build_support.SOLUTION_TAG in a.metadata.get("tags", [])
    ]
    assert len(pairs) == len(_tagged(exercises, build_support.EXERCISE_TAG))
    for solution, exercise in pairs:
        kept = {line.strip() for line in exercise.source.splitlines()}
        leaked = solution_lines(solution.source) & kept
        assert not leaked, f"solution code in the exercise notebook: {sorted(leaked)}"
        checks = re.findall(r"^check_\w+\(.*$", solution.source, flags=re.M)
        assert checks and all(check in exercise.source for check in checks)
    for a, b in zip(clean.cells, exercises.cells, strict=True):
        if build_support.SOLUTION_TAG not in a.metadata.get("tags", []):
            assert a == b, "only solution cells change"


def _imports(notebook: nbformat.NotebookNode) -> str:
    """Every top-level import of the chapter's code cells other than solutions, in order."""
    found: list[str] = []
    for cell in notebook.cells:
        if cell.cell_type != "code" or build_support.SOLUTION_TAG in cell.metadata.get("tags", []):
            continue
        if build_support.INSTALL_TAG in cell.metadata.get("tags", []):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        found += [
            ast.get_source_segment(cell.source, node)
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
        ]
    return "\n".join(dict.fromkeys(found))


@pytest.fixture(scope="module")
def stub_kernel():
    """One kernel, in ``book/``, for this module's stub runs: :func:`stub_errors` empties its
    namespace before each run, and each kernel start and ``import torch`` cost seconds."""
    starter = NotebookClient(
        nbformat.v4.new_notebook(),
        kernel_name="python3",
        resources={"metadata": {"path": str(chapters.BOOK)}},
    )
    kernel = starter.create_kernel_manager()
    starter.start_new_kernel()
    try:
        yield kernel
    finally:
        starter._cleanup_kernel()  # noqa: SLF001 (nbclient's own shutdown of the kernel it started)


def stub_errors(exercises: nbformat.NotebookNode, kernel) -> list[str | None]:
    """Run each stubbed exercise cell of ``exercises`` after the chapter's imports in ``kernel``
    (``stub_kernel``), its namespace emptied first (``%reset -f``: what an earlier run defined is
    gone, modules stay imported); return, per cell, the name of the exception it raised (None if
    none).

    The rest of the chapter is not executed: an exercise uses only what its cell imports, the
    chapter's imports, and the check. A cell that needs more raises NameError, which the test
    below does not accept as a caught stub.
    """
    # %reset also drops the module attributes a fresh kernel's namespace has (None there), and
    # multiprocessing reads __spec__ to start a rank (trainfast.distributed.spawn)
    reset = "%reset -f\n__spec__ = __loader__ = __package__ = None\n"
    prelude = reset + "import torch\ntorch.set_num_threads(1)\n" + _imports(exercises)
    stubs = _tagged(exercises, build_support.EXERCISE_TAG)
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(prelude), *stubs], metadata=exercises.metadata
    )
    client = NotebookClient(
        notebook,
        km=kernel,
        timeout=600,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(chapters.BOOK)}},
    )
    try:
        client.execute()
    finally:
        if client.kc is not None:
            client.kc.stop_channels()
    assert not chapters.cell_errors(nbformat.v4.new_notebook(cells=notebook.cells[:1]))
    return [
        next((o.ename for o in cell.outputs if o.output_type == "error"), None)
        for cell in notebook.cells[1:]
    ]


CAUGHT = {"AssertionError", "NotImplementedError"}


@pytest.mark.parametrize("name", CHAPTERS)
def test_the_checks_fail_on_the_exercise_stubs(stub_kernel, name):
    """Every stubbed exercise must raise the check's AssertionError or the stub's
    NotImplementedError, so a check catches a missing solution."""
    exercises = build_support.exercise_notebook(_clean(name))
    stubs = _tagged(exercises, build_support.EXERCISE_TAG)
    if not stubs:
        pytest.skip(f"{name} has no cell tagged solution yet (test_exercises.py reports it)")
    errors = stub_errors(exercises, stub_kernel)
    for number, (cell, error) in enumerate(zip(stubs, errors, strict=True), 1):
        assert error is not None, f"{name}: exercise {number} passed with a stub:\n{cell.source}"
        assert error in CAUGHT, f"{name}: exercise {number} failed for another reason: {error}"


def test_the_stub_test_sees_a_check_that_does_not_check(stub_kernel):
    """A "check" that never calls the reader's function passes with the stub (None), which the
    test above rejects; one that calls it raises the stub's NotImplementedError."""
    solutions = [
        "from builtins import print as check_nothing\n\n\n"
        "def answer():\n    return 42\n\n\ncheck_nothing(answer)\n",
        "from trainfast.checks import report as check_report\n\n\n"
        "def answer():\n    return 42\n\n\n"
        "check_report([('42', None if answer() == 42 else 'no')])\n",
    ]
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(s, metadata={"tags": [build_support.SOLUTION_TAG]})
            for s in solutions
        ]
    )
    assert stub_errors(build_support.exercise_notebook(notebook), stub_kernel) == [
        None,
        "NotImplementedError",
    ]


def test_a_stub_run_does_not_see_what_an_earlier_run_in_its_kernel_defined(stub_kernel):
    """The chapters' stub runs share a kernel: a name one of them defined (``answer``) must be a
    NameError in the next, as it would be in a kernel of its own."""
    defines = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "from builtins import print as check_nothing\n\n\nanswer = 42\n\n\n"
                "check_nothing(answer)\n",
                metadata={"tags": [build_support.EXERCISE_TAG]},
            )
        ]
    )
    uses = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "print(answer)\n", metadata={"tags": [build_support.EXERCISE_TAG]}
            )
        ]
    )
    assert stub_errors(defines, stub_kernel) == [None]
    assert stub_errors(uses, stub_kernel) == ["NameError"]


# --- what the build produced -------------------------------------------------------------------


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.hrefs += [value for key, value in attrs if key == "href" and value]


def _hrefs(page: Path) -> list[str]:
    parser = _Links()
    parser.feed(page.read_text())
    return parser.hrefs


@pytest.fixture(scope="module")
def site() -> Path:
    return book_site.built_site()


def launch_targets(href: str) -> str | None:
    """The notebooks-branch path a Colab or Binder URL opens, or None for other links."""
    url = urlparse(href)
    if url.netloc == "colab.research.google.com":
        match = re.fullmatch(r"/github/[^/]+/[^/]+/blob/([^/]+)/(.+)", url.path)
        assert match and match.group(1) == build_support.NOTEBOOKS_BRANCH, href
        return match.group(2)
    if url.netloc == "mybinder.org":
        assert url.path.endswith(f"/{build_support.NOTEBOOKS_BRANCH}"), href
        return parse_qs(url.query)["urlpath"][0].removeprefix("tree/")
    return None


@pytest.mark.parametrize("name", CHAPTERS)
def test_launch_buttons_open_a_notebook_the_build_produced(site, name):
    page = site / "book" / f"{name}.html"
    targets = [t for href in _hrefs(page) if (t := launch_targets(href))]
    assert len(targets) == 2, f"{page.name}: expected a Colab and a Binder button, got {targets}"
    for target in targets:
        assert target == f"book/{name}.ipynb"
        notebook = nbformat.read(site / build_support.NOTEBOOKS_DIR / target, as_version=4)
        assert build_support.INSTALL_TAG in notebook.cells[0].metadata["tags"]


@pytest.mark.parametrize("name", CHAPTERS)
def test_the_page_offers_three_notebooks_and_each_is_valid(site, name):
    page = site / "book" / f"{name}.html"
    hrefs = set(_hrefs(page))
    offered = {
        "executed": f"../_sources/book/{name}.ipynb",
        "clean": f"../notebooks/book/{name}.ipynb",
        "exercises": f"../notebooks/book/{name}-exercises.ipynb",
    }
    for kind, href in offered.items():
        assert href in hrefs, f"{page.name} does not offer the {kind} notebook ({href})"
        notebook = nbformat.read(page.parent / href, as_version=4)
        nbformat.validate(notebook)
        has_outputs = any(c.get("outputs") for c in notebook.cells if c.cell_type == "code")
        assert has_outputs == (kind == "executed"), kind
    exercises = nbformat.read(page.parent / offered["exercises"], as_version=4)
    assert not _tagged(exercises, build_support.SOLUTION_TAG)


def test_the_notebooks_branch_tree_holds_only_valid_notebooks_and_the_records(site):
    tree = site / build_support.NOTEBOOKS_DIR
    notebooks = sorted(tree.rglob("*.ipynb"))
    assert {p.relative_to(tree).as_posix() for p in notebooks} >= {
        f"book/{name}{suffix}.ipynb" for name in CHAPTERS for suffix in ("", "-exercises")
    }
    for path in notebooks:
        nbformat.validate(nbformat.read(path, as_version=4))
    records = {p.name for p in (book_site.ROOT / "book" / "records").glob("*.json")}
    assert records <= {p.name for p in (tree / "book" / "records").glob("*.json")}
