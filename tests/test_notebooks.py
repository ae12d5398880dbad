"""The notebooks the build writes for every notebook page (a chapter on one page, or each section
page of a chapter that is a folder): executed, clean (installs the package first), exercises
(solutions stubbed, checks kept; only for a page with exercises); Binder's environment files; and
the Colab/Binder buttons that open them."""

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

PAGES = book_site.notebook_pages()
#: The pages with exercises (an exercise notebook is offered only for them).
EXERCISE_PAGES = [
    page for page in PAGES if build_support.has_solutions(chapters.read_chapter(page))
]
REPOSITORY = book_site.config()["repository"]["url"]
GPU_NOTEBOOKS = book_site.config()["sphinx"]["config"]["build_support_gpu_notebooks"]


def _clean(name: str) -> nbformat.NotebookNode:
    return build_support.clean_notebook(
        chapters.chapter_path(name),
        REPOSITORY,
        gpu=build_support.is_gpu_notebook(f"book/{name}", GPU_NOTEBOOKS),
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


@pytest.mark.parametrize("name", PAGES)
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
    chapter = f"book/{book_site.chapter_of(name)}"
    wants_gpu = f"book/{name}" in GPU_NOTEBOOKS or chapter in GPU_NOTEBOOKS
    assert (notebook.metadata.get("accelerator") == "GPU") == wants_gpu


def test_a_section_page_opens_on_a_gpu_where_its_chapter_does():
    listed = ["book/memory_hierarchy", "book/profiling"]
    assert build_support.is_gpu_notebook("book/memory_hierarchy", listed)
    assert build_support.is_gpu_notebook("book/memory_hierarchy/roofline", listed)
    assert not build_support.is_gpu_notebook("book/memory_hierarchy_notes", listed)
    assert not build_support.is_gpu_notebook("book/optimizers/adam", listed)


@pytest.mark.parametrize("name", EXERCISE_PAGES)
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


@pytest.mark.parametrize("name", EXERCISE_PAGES)
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


@pytest.mark.parametrize("name", PAGES)
def test_launch_buttons_open_a_notebook_the_build_produced(site, name):
    page = site / "book" / f"{name}.html"
    targets = [t for href in _hrefs(page) if (t := launch_targets(href))]
    assert len(targets) == 2, f"{page.name}: expected a Colab and a Binder button, got {targets}"
    for target in targets:
        assert target == f"book/{name}.ipynb"
        notebook = nbformat.read(site / build_support.NOTEBOOKS_DIR / target, as_version=4)
        assert build_support.INSTALL_TAG in notebook.cells[0].metadata["tags"]


@pytest.mark.parametrize("name", PAGES)
def test_the_page_offers_its_notebooks_and_each_is_valid(site, name):
    """Executed and clean notebooks on every notebook page; an exercise notebook only on a page
    with exercises (on one without, it would be the clean notebook again)."""
    page = site / "book" / f"{name}.html"
    hrefs = set(_hrefs(page))
    up = "../" * (name.count("/") + 1)  # from book/<page>.html to the site's root
    offered = {
        "executed": f"{up}_sources/book/{name}.ipynb",
        "clean": f"{up}notebooks/book/{name}.ipynb",
    }
    exercises_href = f"{up}notebooks/book/{name}-exercises.ipynb"
    if name in EXERCISE_PAGES:
        offered["exercises"] = exercises_href
    else:
        assert exercises_href not in hrefs, f"{page.name} offers an exercise notebook, no exercises"
        assert not (page.parent / exercises_href).exists()
    for kind, href in offered.items():
        assert href in hrefs, f"{page.name} does not offer the {kind} notebook ({href})"
        notebook = nbformat.read(page.parent / href, as_version=4)
        nbformat.validate(notebook)
        has_outputs = any(c.get("outputs") for c in notebook.cells if c.cell_type == "code")
        assert has_outputs == (kind == "executed"), kind
    if "exercises" in offered:
        exercises = nbformat.read(page.parent / offered["exercises"], as_version=4)
        assert not _tagged(exercises, build_support.SOLUTION_TAG)


@pytest.mark.parametrize("name", PAGES)
def test_the_executed_download_holds_no_stderr_the_page_hides(site, name):
    executed = nbformat.read(site / "_sources" / "book" / f"{name}.ipynb", as_version=4)
    hidden = [
        cell.source.splitlines()[0][:60]
        for cell in _tagged(executed, "remove-stderr")
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream" and output.get("name") == "stderr"
    ]
    assert hidden == [], f"{name}: stderr the page hides is in the download: {hidden}"


def test_hidden_stderr_is_dropped_and_the_rest_kept():
    cell = nbformat.v4.new_code_cell("import noisy", metadata={"tags": ["remove-stderr"]})
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="USDT: profiler_start\n"),
        nbformat.v4.new_output("stream", name="stdout", text="42\n"),
    ]
    shown = nbformat.v4.new_code_cell("print(1)")
    shown.outputs = [nbformat.v4.new_output("stream", name="stderr", text="a warning\n")]
    notebook = nbformat.v4.new_notebook(cells=[cell, shown])
    cleaned = build_support.without_hidden_stderr(notebook)
    assert [o["text"] for o in cleaned.cells[0].outputs] == ["42\n"]
    assert cleaned.cells[1].outputs == shown.outputs  # stderr the page shows stays
    assert len(notebook.cells[0].outputs) == 2  # a copy


def test_the_notebooks_branch_tree_holds_only_valid_notebooks_and_the_records(site):
    tree = site / build_support.NOTEBOOKS_DIR
    notebooks = sorted(tree.rglob("*.ipynb"))
    expected = {f"book/{name}.ipynb" for name in PAGES}
    expected |= {f"book/{name}-exercises.ipynb" for name in EXERCISE_PAGES}
    assert {p.relative_to(tree).as_posix() for p in notebooks} >= expected
    for path in notebooks:
        nbformat.validate(nbformat.read(path, as_version=4))
    records = {p.name for p in (book_site.ROOT / "book" / "records").glob("*.json")}
    assert records <= {p.name for p in (tree / "book" / "records").glob("*.json")}
    for name, text in build_support.binder_files(REPOSITORY).items():
        assert (tree / name).read_text() == text, f"{name}: Binder's environment file"


def test_binder_installs_the_package_and_a_cpu_torch_once():
    files = build_support.binder_files("https://github.com/org/book")
    requirements = files["requirements.txt"].splitlines()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in requirements
    assert "trainfast[book] @ git+https://github.com/org/book" in requirements
    assert files["runtime.txt"].strip().startswith("python-3.")


# --- a clean notebook run as Colab runs it ---------------------------------------------------

#: Pages whose clean notebook is run the way Colab runs it (below): one that reads records
#: from a section page's folder, and the launching appendix, which starts torchrun.
AS_COLAB = ["optimizers/step_cost", "appendix/launching"]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A Python without ``trainfast``, as on Colab: a virtual environment that sees the book
    environment's packages (torch, ipykernel, pip) through a ``.pth`` line, which does not run
    that environment's own ``.pth`` files, so the editable install of ``trainfast`` is not there."""
    import subprocess
    import sysconfig

    folder = tmp_path_factory.mktemp("colab") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "book-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('trainfast'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "None", "the bare Python must not see trainfast"
    return python


def as_colab(notebook: nbformat.NotebookNode, root: Path, scratch: Path) -> None:
    """Point ``notebook``'s install cell at the working tree instead of GitHub: the package from
    ``root`` (its dependencies are already there) and the records from a clone of it."""
    cell = notebook.cells[0]
    assert build_support.INSTALL_TAG in cell.metadata["tags"]
    source = cell.source.replace(
        f'"trainfast[book] @ git+{REPOSITORY}"', f'--no-deps --no-build-isolation "{root}"'
    )
    source = source.replace(REPOSITORY, f"file://{root}").replace("/tmp/train-faster", str(scratch))
    assert str(root) in source and REPOSITORY not in source, source
    cell.source = source


@pytest.mark.xdist_group("ports")  # the launching appendix starts torchrun, which takes ports
@pytest.mark.parametrize("name", AS_COLAB)
def test_a_clean_notebook_runs_as_colab_runs_it(bare_python, tmp_path, name):
    """A fresh folder holding nothing but the page's clean notebook, a Python without the
    package: the first cell installs it (here from the working tree) and fetches the records, and
    every cell then runs, reading the records it needs. The launching appendix once read
    ``../records``, which on Colab is not there."""
    from jupyter_client.manager import KernelManager

    folder = tmp_path / "content"
    folder.mkdir()
    notebook = _clean(name)
    as_colab(notebook, book_site.ROOT, tmp_path / "clone")
    nbformat.write(notebook, folder / f"{name.replace('/', '-')}.ipynb")
    kernel = KernelManager(kernel_name="python3")
    kernel.kernel_spec.argv[0] = str(bare_python)
    client = NotebookClient(
        notebook, km=kernel, timeout=600, resources={"metadata": {"path": str(folder)}}
    )
    client.execute()
    assert (folder / "records").is_dir(), "the install cell fetched no records"
    assert not chapters.cell_errors(notebook)
