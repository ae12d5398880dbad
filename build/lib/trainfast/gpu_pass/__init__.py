"""``python -m trainfast.gpu_pass``: everything the book needs from a GPU machine, planned to fit.

On a CUDA machine one pass runs, each as its own step:

* ``page:<page>``: every executable page of the book (``_toc.yml``'s chapters and their
  sections, :func:`~trainfast.gpu_pass.pages.executable_pages`) converted from MyST Markdown
  with jupytext and executed as a notebook with nbclient, saved as
  ``OUT/notebooks/<page>.ipynb``, with the environment line it printed;
* ``pytest-gpu:<module>``: ``pytest -m gpu`` on each test module that has GPU tests, naming
  each test as it finishes and printing a failure's traceback at once (a step killed at its
  limit keeps them in its log), each test's result read from its JUnit XML;
* ``measure:<name>``: every registered benchmark (:data:`trainfast.measure.BENCHMARKS`) at full
  size, writing its record into ``--records`` (``book/records``) and a copy into ``OUT/records``;
* ``compile-report``: the live compile report beside the ahead-of-time one
  (``trainfast.kernels.compile_report``), or "not available" where the package lacks it.

``--plan --budget SECONDS`` prints the pass as it fits SECONDS of device time
(:mod:`~trainfast.gpu_pass.schedule`): two commands, the most wanted steps first, each step
with its estimate and where the estimate comes from (:mod:`~trainfast.gpu_pass.estimates`), and
refuses a plan that does not fit. ``--command 1`` and ``--command 2`` run them
(``.ci/gpu-call.sh 1``, ``2``); ``--device cpu`` is the dry run of the same plan.

Each step is a subprocess with its own time limit, so one hang cannot eat the budget: a step that
runs past it is killed (with its process group) and reported as timed out, a step that fails is
reported with the end of its output (the traceback), and the pass goes on. ``OUT/summary.json``
and ``OUT/summary.md`` say per step what passed, failed, timed out, was not available or was not
run, how long it took, and why; ``OUT/logs/<step>.log`` keeps each step's whole output. The pass
record, ``book/records/gpu-pass--cuda--<gpu>.json`` (:mod:`~trainfast.gpu_pass.pass_record`),
is the committed evidence: a row per step, kept across passes, from which
:func:`~trainfast.gpu_pass.pass_record.last_gpu_execution` tells a page when it last executed on
a GPU. A second pass into the same ``OUT`` keeps the steps it does not re-run, so a pass split
over commands adds up to one summary. ``--only`` runs the steps in the order it names them (a
kind's steps in pass order).

The package's modules: :mod:`~trainfast.gpu_pass.steps` (one step under its limit),
:mod:`~trainfast.gpu_pass.pages` (the book's pages), :mod:`~trainfast.gpu_pass.plan` (which
steps, their limits), :mod:`~trainfast.gpu_pass.estimates` and
:mod:`~trainfast.gpu_pass.schedule` (how long, and the commands that fit),
:mod:`~trainfast.gpu_pass.summary` (the summary, written atomically),
:mod:`~trainfast.gpu_pass.junit` (the tests' results), :mod:`~trainfast.gpu_pass.pass_record`
(the record), :mod:`~trainfast.gpu_pass.step_commands` (what a step runs in its own process) and
:mod:`~trainfast.gpu_pass.run` (the pass and its command line).

Where not to use it: for a quick look at one benchmark, ``python -m trainfast.measure --only``
is simpler; the pages' own tests (``tests/test_<chapter>.py -m chapter``) check more than
"every cell ran".
"""

from trainfast.gpu_pass.estimates import ESTIMATES, OVERHEADS, Estimate, estimate_for
from trainfast.gpu_pass.pages import executable_pages, page_chapter, toc_pages
from trainfast.gpu_pass.pass_record import PageExecution, last_gpu_execution, write_pass_record
from trainfast.gpu_pass.plan import (
    DEFAULT_TIMEOUTS,
    LIMITS,
    apply_timeouts,
    default_steps,
    gpu_test_files,
    pytest_command,
    select_steps,
)
from trainfast.gpu_pass.run import main, run_pass
from trainfast.gpu_pass.schedule import (
    DEVICE_SECONDS,
    PassPlan,
    PlanDoesNotFit,
    plan_pass,
)
from trainfast.gpu_pass.step_commands import compile_report_rows, execute_chapter
from trainfast.gpu_pass.steps import Status, Step, StepResult, run_step
from trainfast.gpu_pass.summary import SummaryError, read_summary, write_summary

__all__ = [
    "DEFAULT_TIMEOUTS",
    "DEVICE_SECONDS",
    "ESTIMATES",
    "LIMITS",
    "OVERHEADS",
    "Estimate",
    "PageExecution",
    "PassPlan",
    "PlanDoesNotFit",
    "Status",
    "Step",
    "StepResult",
    "SummaryError",
    "apply_timeouts",
    "compile_report_rows",
    "default_steps",
    "estimate_for",
    "executable_pages",
    "execute_chapter",
    "gpu_test_files",
    "last_gpu_execution",
    "main",
    "page_chapter",
    "plan_pass",
    "pytest_command",
    "read_summary",
    "run_pass",
    "run_step",
    "select_steps",
    "toc_pages",
    "write_pass_record",
    "write_summary",
]
