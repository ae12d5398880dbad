"""Runs at the start of every kernel that executes a page for the book's build (as
``figure_text.py`` does; ``build_support.page_assets`` copies both).

The build machine has the CUDA toolkit (``nvcc``, for the kernels chapter's compile reports) but
no GPU, so the first ``torch.compile`` on its CPU imports ``torch.utils.cpp_extension``, which
logs "No CUDA runtime is found, using CUDA_HOME=..." to stderr, and the page showed it under a
cell (``tests/test_site_layout.py`` finds raw log lines). A reader's machine has a GPU with its
runtime, or no toolkit: neither logs it. So this one message of this one logger is dropped here,
and nothing else: a reader's own Jupyter or Colab never runs this file.
"""

import logging


class _NoCudaRuntimeOnTheBuildMachine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No CUDA runtime is found")


logging.getLogger("torch.utils.cpp_extension").addFilter(_NoCudaRuntimeOnTheBuildMachine())
