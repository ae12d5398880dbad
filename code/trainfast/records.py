"""Measurement records with provenance: write them, load them, render them.

A chapter that quotes a GPU number cannot measure it during a CPU build. Instead
``python -m trainfast.measure`` runs the benchmark on a machine that has the device and writes
a :class:`Record`: the table of results plus where, when, with what and by which command it was
measured. The chapter loads the record and renders it with that provenance beside it. Records
are produced by the script, never typed in by hand.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainfast.device import Environment, describe_environment

__all__ = ["Record", "load_records", "make_record", "provenance", "to_markdown", "write_record"]

SCHEMA_VERSION = 1
_REQUIRED = ("name", "description", "columns", "rows", "environment", "created", "command")


@dataclass
class Record:
    """One benchmark's results on one machine.

    ``rows`` are dicts keyed by ``columns`` (in that order when rendered); ``units`` maps a
    column to its unit, shown in the table header.
    """

    name: str
    description: str
    columns: list[str]
    rows: list[dict[str, Any]]
    environment: dict[str, str | None]
    created: str  # ISO 8601, UTC
    command: str
    units: dict[str, str] = field(default_factory=dict)
    trainfast_version: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            missing = [c for c in self.columns if c not in row]
            if missing:
                raise ValueError(f"Record {self.name!r}: row {i} lacks columns {missing}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> Record:
        missing = [key for key in _REQUIRED if key not in data]
        if missing:
            raise ValueError(f"{source}: not a measurement record, missing keys {missing}")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def make_record(
    name: str,
    description: str,
    rows: list[dict[str, Any]],
    *,
    units: dict[str, str] | None = None,
    environment: Environment | None = None,
    command: str | None = None,
) -> Record:
    """Build a :class:`Record` stamped with this machine's environment, the time and command."""
    from trainfast import __version__

    if not rows:
        raise ValueError(f"Record {name!r} has no rows")
    env = environment or describe_environment()
    return Record(
        name=name,
        description=description,
        columns=list(rows[0]),
        rows=rows,
        environment=env.as_dict(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=command or shlex.join([Path(sys.executable).name, *sys.argv]),
        units=dict(units or {}),
        trainfast_version=__version__,
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_record(record: Record, directory: str | Path) -> Path:
    """Write ``record`` as JSON to ``directory/<name>--<device>--<device name>.json``.

    One file per benchmark and machine kind: measuring again on the same kind of machine
    replaces the old record; other machines' records stay.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    env = record.environment
    stem = "--".join(_slug(s) for s in (record.name, env["device"] or "", env["device_name"] or ""))
    path = directory / f"{stem}.json"
    path.write_text(json.dumps(asdict(record), indent=2) + "\n")
    return path


def load_records(directory: str | Path, name: str | None = None) -> list[Record]:
    """All records in ``directory`` (those named ``name`` if given), GPU ones first.

    A missing directory gives an empty list; a file that is not a record raises ``ValueError``
    naming the file.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    records = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from error
        record = Record.from_dict(data, source=str(path))
        if name is None or record.name == name:
            records.append(record)
    return sorted(records, key=lambda r: (r.environment["device"] == "cpu", r.created))


def provenance(record: Record) -> str:
    """A sentence saying where, with what and when ``record`` was measured."""
    env = record.environment
    versions = f"torch {env['torch_version']}"
    if env.get("cuda_version"):
        versions += f", CUDA {env['cuda_version']}"
    if env.get("driver_version"):
        versions += f", driver {env['driver_version']}"
    return (
        f"Measured on {env['device_name']} ({env['device']}) with {versions}, "
        f"Python {env['python_version']}, on {record.created[:10]}, by `{record.command}`."
    )


def _column_format(values: list[Any]) -> Callable[[Any], str]:
    """One number format for a whole column, so ``19,585`` never sits above ``8.83e+03``.

    Floats get thousands separators and as many decimals as the smallest nonzero magnitude
    needs for three significant digits (at most four; fewer where the last one is zero in every
    row); a column with magnitudes below 0.001 uses ``1.23e-05``. Other values show as they are.
    """
    floats = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v)]
    nonzero = [v for v in floats if v > 0]
    if not floats:
        return str
    if nonzero and min(nonzero) < 1e-3:
        return lambda v: f"{v:.2e}" if isinstance(v, float) else str(v)
    smallest = min(nonzero, default=1.0)
    decimals = min(4, max(0, 2 - math.floor(math.log10(smallest))))
    while decimals > 0 and all(f"{v:.{decimals}f}".endswith("0") for v in floats):
        decimals -= 1  # a decimal that is zero in every row says nothing
    return lambda v: f"{v:,.{decimals}f}" if isinstance(v, float) and math.isfinite(v) else str(v)


def to_markdown(
    record: Record, columns: list[str] | None = None, labels: dict[str, str] | None = None
) -> str:
    """The record as a Markdown table followed by its provenance, for ``IPython.display``.

    ``columns`` picks and orders the columns shown (default: all); an unknown one raises
    ``ValueError`` naming it. ``labels`` gives a column the header a reader should see
    (``{"ratio": "ours / torch"}``); a column without one shows its name and its unit. Each
    column has one number format (:func:`_column_format`).
    """
    columns = list(columns or record.columns)
    labels = labels or {}
    unknown = [c for c in [*columns, *labels] if c not in record.columns]
    if unknown:
        raise ValueError(f"Record {record.name!r} has no columns {unknown}")
    header = [
        labels.get(c, f"{c} ({record.units[c]})" if c in record.units else c) for c in columns
    ]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    formats = {c: _column_format([row[c] for row in record.rows]) for c in columns}
    for row in record.rows:
        lines.append("| " + " | ".join(formats[c](row[c]) for c in columns) + " |")
    return "\n".join(lines) + f"\n\n*{record.description} {provenance(record)}*\n"
