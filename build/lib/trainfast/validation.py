"""Checks of arguments, shared by every public entry point of the package.

Bad input fails early with a message that names the value, as torch's optimizers do
(``ValueError: Invalid learning rate: -1``). Each check raises ``ValueError`` with the same
shape of message, ``Invalid <name>: <value!r> (expected ...)``, whatever was wrong: the type,
the value or the range. The module imports nothing from the package, so anything may import it.

Three rules hold in every check, because each let a bad value through somewhere before:

- **Numbers are finite** unless the caller allows infinity: ``inf`` passes ``x > 0`` and NaN
  passes ``not x > 0``-style tests written the other way round (``x <= 0`` is false for NaN).
- **A bool is not a number** and a float is not an int: ``epochs=1.5`` or ``zero_stage=True``
  is refused here, not later inside ``range()``.
- **A string is not a number or a flag** (``is_causal='no'`` would be truthy). Strings from
  config files go through :func:`number_from_config`, the one rule that converts them.

It also has :func:`plural`, the one way the package writes a count into a sentence ("1 block",
"2 blocks", never "1 block(s)").
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

__all__ = [
    "check_flag",
    "check_int",
    "check_non_negative",
    "check_number",
    "check_positive",
    "check_positive_number",
    "number_from_config",
    "plural",
]


def _fail(name: str, value: Any, expected: str, note: str = "") -> None:
    hint = ""
    if isinstance(value, str):
        hint = "; got a string: write the number without quotes"
    elif isinstance(value, bool):
        hint = "; got a bool"
    raise ValueError(f"Invalid {name}: {value!r} (expected {expected}{hint}){note}")


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """Return ``value`` as an ``int`` if it is one (not a bool, not a float) within the bounds.

    Integer-valued NumPy scalars count as ints; ``1.0`` does not (``epochs=1.5`` and
    ``epochs=1.0`` are both refused, so the rule has no exceptions).
    """
    if minimum is not None and maximum is not None:
        expected = f"an integer from {minimum} to {maximum}"
    elif minimum is not None:
        expected = f"an integer >= {minimum}"
    elif maximum is not None:
        expected = f"an integer <= {maximum}"
    else:
        expected = "an integer"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(name, value, expected)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        _fail(name, value, expected)
    return int(value)


def check_positive(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an ``int`` >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        _fail(name, value, "a positive integer")


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    allow_inf: bool = False,
    note: str = "",
) -> float:
    """Return ``value`` as a ``float`` if it is a real number in range; else raise.

    ``minimum``/``maximum`` are inclusive bounds, ``above``/``below`` exclusive ones. NaN is
    always refused, infinity unless ``allow_inf``. ``note`` is appended to the message (e.g.
    "torch.optim.SGD would accept it, ...", where the package promises more than torch does).
    """
    parts = []
    if minimum is not None:
        parts.append(f">= {minimum:g}")
    if above is not None:
        parts.append(f"> {above:g}")
    if maximum is not None:
        parts.append(f"<= {maximum:g}")
    if below is not None:
        parts.append(f"< {below:g}")
    finite = "" if allow_inf else "finite "
    expected = f"a {finite}number" + (f" {' and '.join(parts)}" if parts else "")
    note = f"; {note}" if note else ""
    if not _is_real(value):
        _fail(name, value, expected, note)
    x = float(value)
    if math.isnan(x) or (math.isinf(x) and not allow_inf):
        _fail(name, value, expected, note)
    if (
        (minimum is not None and not x >= minimum)
        or (maximum is not None and not x <= maximum)
        or (above is not None and not x > above)
        or (below is not None and not x < below)
    ):
        _fail(name, value, expected, note)
    return x


def check_positive_number(name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number > 0."""
    if not _is_real(value) or not 0 < float(value) < math.inf:  # NaN fails "0 < x" too
        _fail(name, value, "a positive number")


def check_non_negative(name: str, value: Any, *, note: str = "") -> float:
    """Return ``value`` as a ``float`` if it is a finite number >= 0; else raise naming it."""
    return check_number(name, value, minimum=0, note=note)


def check_flag(name: str, value: Any) -> bool:
    """Return ``value`` if it is a ``bool``: a string such as ``'no'`` would be truthy."""
    if not isinstance(value, bool):
        raise ValueError(f"Invalid {name}: {value!r} (expected True or False)")
    return value


_INT_TEXT = re.compile(r"[+-]?\d+")
_FLOAT_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def number_from_config(name: str, value: Any, *, integer: bool = False) -> Any:
    """The one rule for numbers written as text in config files (YAML reads ``1e-3`` as a string).

    A string that is a plain decimal number (``'1e-3'``, ``'0.5'``, ``'32'``) becomes a
    ``float``, or with ``integer=True``, if it is made of digits only, an ``int``. Any
    other string (typos such as ``'1e-3x'``, ``'nan'``, ``'inf'``, ``'fast'``) raises
    ``ValueError`` naming ``name`` and the value. A value that is not a string comes back as it
    is, for the caller's own check.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if integer and _INT_TEXT.fullmatch(text):
        return int(text)
    if not integer and _FLOAT_TEXT.fullmatch(text):
        return float(text)
    expected = "an integer" if integer else "a number"
    raise ValueError(
        f"Invalid {name}: {value!r} (expected {expected}; a string from a config file is "
        f"converted only when it is a plain decimal {'integer' if integer else 'number'})"
    )


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """``count`` and ``noun``, as a sentence reads them: ``plural(1, "block")`` is ``"1 block"``,
    ``plural(3, "graph break")`` is ``"3 graph breaks"`` (thousands separated, ``"1,024
    blocks"``). ``plural_noun`` is the plural where adding "s" does not make it
    (``plural(2, "matrix", "matrices")``). ``count`` must be a non-negative integer."""
    count = check_int("count", count, minimum=0)
    return f"{count:,} {noun if count == 1 else plural_noun or noun + 's'}"
