"""Checks of numeric arguments, shared by the package's dataclasses and functions.

Bad input fails early with a message that names the value, as torch's optimizers do
(``ValueError: Invalid learning rate: -1``). :mod:`trainfast.transformer`,
:mod:`trainfast.accounting` and :mod:`trainfast.distributed.step_time` call these; the module
imports nothing from the package, so anything may import it.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_positive", "check_positive_number"]


def check_positive(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an ``int`` >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Invalid {name}: {value!r} (expected a positive integer)")


def check_positive_number(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"Invalid {name}: {value!r} (expected a positive number)")
