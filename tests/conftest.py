"""Shared pytest set-up: the chapter harness lives in tests/chapters.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# W&B must never stop to ask for a login during tests; a key in the environment still wins.
os.environ.setdefault("WANDB_MODE", "offline" if not os.environ.get("WANDB_API_KEY") else "online")
os.environ.setdefault("WANDB_SILENT", "true")

sys.path.insert(0, str(Path(__file__).parent))  # `import chapters` from any test module


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    from chapters import EXECUTION_TIMES

    if EXECUTION_TIMES:
        terminalreporter.section("chapters executed as notebooks on this machine")
        for name, seconds in EXECUTION_TIMES:
            terminalreporter.write_line(f"{name}: {seconds:.1f} s")
