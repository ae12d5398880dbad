"""``python -m trainfast.gpu_pass``: everything the book needs from a GPU machine, in one command.

On a CUDA machine one pass runs, each as its own step:

* ``measure:<name>``: every registered benchmark (:data:`trainfast.measure.BENCHMARKS`) at full
  size, writing its record into ``--records`` (``book/records``) and a copy into ``OUT/records``;
* ``chapter:<name>``: every chapter in ``book/`` converted from MyST Markdown with jupytext and
  executed as a notebook with nbclient, saved as ``OUT/notebooks/<name>.ipynb``, with the
  environment line its first cell printed;
* ``pytest-gpu:<module>``: ``pytest -m gpu`` on each test module that has GPU tests, naming
  each test as it finishes and printing a failure's traceback at once (a step killed at its
  limit keeps them in its log);
* ``compile-report``: the live compile report beside the ahead-of-time one
  (``trainfast.kernels.compile_report``), or "not available" where the package lacks it.

Each step is a subprocess with its own time limit, so one hang cannot eat the budget: a step that
runs past it is killed (with its process group) and reported as timed out, a step that fails is
reported with the end of its output (the traceback), and the pass goes on. ``OUT/summary.json``
and ``OUT/summary.md`` say per step what passed, failed, timed out or was not available, how long
it took, and why; ``OUT/logs/<step>.log`` keeps each step's whole output. A second pass into the
same ``OUT`` keeps the steps it does not re-run, so a pass split with ``--only`` (the device tool
allows 10 minutes a command) adds up to one summary. ``--only`` runs the steps in the order it
names them (a kind's steps in pass order), so the most wanted go first when time is short.

The package's modules: :mod:`~trainfast.gpu_pass.steps` (one step under its limit),
:mod:`~trainfast.gpu_pass.plan` (which steps, their limits), :mod:`~trainfast.gpu_pass.summary`
(the summary, written atomically), :mod:`~trainfast.gpu_pass.step_commands` (what a step runs in
its own process) and :mod:`~trainfast.gpu_pass.run` (the pass and its command line).

Where not to use it: for a quick look at one benchmark, ``python -m trainfast.measure --only``
is simpler; the chapters' own tests (``tests/test_<chapter>.py -m chapter``) check more than
"every cell ran".
"""

from trainfast.gpu_pass.plan import (
    DEFAULT_TIMEOUTS,
    apply_timeouts,
    chapters,
    default_steps,
    gpu_test_files,
    pytest_command,
    select_steps,
)
from trainfast.gpu_pass.run import main, run_pass
from trainfast.gpu_pass.step_commands import compile_report_rows, execute_chapter
from trainfast.gpu_pass.steps import Status, Step, StepResult, run_step
from trainfast.gpu_pass.summary import SummaryError, read_summary, write_summary

__all__ = [
    "DEFAULT_TIMEOUTS",
    "Status",
    "Step",
    "StepResult",
    "SummaryError",
    "apply_timeouts",
    "chapters",
    "compile_report_rows",
    "default_steps",
    "execute_chapter",
    "gpu_test_files",
    "main",
    "pytest_command",
    "read_summary",
    "run_pass",
    "run_step",
    "select_steps",
    "write_summary",
]
