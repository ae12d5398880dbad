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

Beyond numbers and flags: :func:`check_choice` for an option that must be one of a few names
(a typo such as ``goal='maximise'`` must not be read as some other option),
:func:`check_instance` for a dataclass a caller may have written as a dict, and
:func:`output_folder` and :func:`existing_folder` for paths, so a typo in a folder's name or a
file where a folder goes is named rather than read as "nothing there".

It also has :func:`plural`, the one way the package writes a count into a sentence ("1 block",
"2 blocks", never "1 block(s)").
"""

from __future__ import annotations

import math
import numbers
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

__all__ = [
    "check_choice",
    "check_counts",
    "check_flag",
    "check_instance",
    "check_int",
    "check_non_negative",
    "check_number",
    "check_positive",
    "check_positive_number",
    "existing_folder",
    "number_from_config",
    "output_folder",
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


def check_counts(*, minimum: int = 1, **counts: Any) -> None:
    """Each keyword argument an integer >= ``minimum`` (a count of elements, bytes, ranks or
    steps), by :func:`check_int`: one line for a function of several,
    ``check_counts(m=m, n=n, k=k)``."""
    for name, value in counts.items():
        check_int(name, value, minimum=minimum)


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


def check_choice(name: str, value: Any, choices: Collection[Any], *, note: str = "") -> Any:
    """Return ``value`` if it is one of ``choices``; else raise naming it and listing them.

    For string options such as ``goal`` or ``phase``, where the code would otherwise test one
    spelling and take every other string for the opposite (``goal='maximise'`` as maximise
    because it is not ``'minimize'``). ``note`` is appended (e.g. what torch would do).
    """
    try:
        known = value in choices
    except TypeError:  # an unhashable value asked of a set
        known = False
    if isinstance(value, bool) and not any(c is value for c in choices):
        known = False  # True == 1: a flag is not the option 1
    if not known:
        listed = ", ".join(repr(c) for c in choices)
        note = f"; {note}" if note else ""
        raise ValueError(f"Invalid {name}: {value!r:.80} (expected one of {listed}){note}")
    return value


def check_instance(
    name: str, value: Any, expected: type | tuple[type, ...], *, hint: str = ""
) -> Any:
    """Return ``value`` if it is an instance of ``expected``; else raise naming the type wanted.

    For the typed dataclasses the package passes around (``TransformerShape``,
    ``TrainingSetup``, ``Record``): a dict of the same fields would otherwise fail at its first
    attribute, with an ``AttributeError`` that names neither the argument nor the type. A
    dict gets ``hint`` (default: how to build the dataclass from its fields).
    """
    if isinstance(value, expected):
        return value
    kinds = expected if isinstance(expected, tuple) else (expected,)
    wanted = " or ".join(kind.__name__ for kind in kinds)
    article = "an" if wanted[0].lower() in "aeiou" else "a"
    if isinstance(value, dict):
        hint = f"; {hint or f'build one from a dict with {kinds[0].__name__}(**fields)'}"
    else:
        hint = ""
    raise ValueError(
        f"Invalid {name}: {value!r:.80} (expected {article} {wanted}, got a "
        f"{type(value).__name__}{hint})"
    )


def output_folder(name: str, path: Any) -> Path:
    """The folder ``path``, created with its parents if missing, for something to write into.

    A path that is an existing file, an empty string or not a path at all raises
    ``ValueError`` naming ``name`` and the path (``mkdir`` would say only ``FileExistsError``
    with the path, or for ``""`` nothing at all: the empty path is the current folder).
    """
    folder = _path(name, path, "a folder to write into")
    if folder.exists() and not folder.is_dir():
        raise ValueError(
            f"Invalid {name}: {str(path)!r} (expected a folder to write into; it is a file)"
        )
    for parent in folder.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(
                f"Invalid {name}: {str(path)!r} (expected a folder to write into; "
                f"{str(parent)!r} is a file)"
            )
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def existing_folder(name: str, path: Any) -> Path:
    """``path`` as a ``Path`` if it is a folder that exists; else raise naming it.

    A folder that is missing (a typo in its name) or a file must not read as an empty folder:
    a page that loads records from it would say "no records" when it meant "wrong path".
    """
    folder = _path(name, path, "an existing folder")
    if not folder.exists():
        where = "" if folder.is_absolute() else f", looked for from {str(Path.cwd())!r}"
        raise ValueError(
            f"Invalid {name}: {str(path)!r} (expected an existing folder; there is none{where})"
        )
    if not folder.is_dir():
        raise ValueError(
            f"Invalid {name}: {str(path)!r} (expected an existing folder; it is a file)"
        )
    return folder


def _path(name: str, path: Any, expected: str) -> Path:
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"Invalid {name}: {path!r:.80} (expected {expected})")
    return Path(path)


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
