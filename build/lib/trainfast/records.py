"""Measurement records with provenance: write them, load them, render them.

A chapter that quotes a GPU number cannot measure it during a CPU build. Instead
``python -m trainfast.measure`` runs the benchmark on a machine that has the device and writes
a :class:`Record`: the table of results plus where, when, with what and by which command it was
measured. The chapter loads the record and renders it with that provenance beside it. Records
are produced by the script, never typed in by hand.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from trainfast.device import Environment, describe_environment, pick_device
from trainfast.files import read_json, write_json_atomically
from trainfast.timing import readable_seconds
from trainfast.validation import check_instance, existing_folder, output_folder
from trainfast.versions import source_commit

__all__ = [
    "OFF_BY",
    "GPUFigure",
    "Prediction",
    "Published",
    "Record",
    "SectionRecords",
    "column_label",
    "full_record",
    "gpu_figures_table",
    "load_records",
    "make_record",
    "provenance",
    "records_by_gpu",
    "records_for",
    "section_records",
    "to_markdown",
    "write_record",
]

SCHEMA_VERSION = 1
_REQUIRED = ("name", "description", "columns", "rows", "environment", "created", "command")
_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "description": (str,),
    "columns": (list,),
    "rows": (list,),
    "environment": (dict,),
    "created": (str,),
    "command": (str,),
    "units": (dict,),
    "trainfast_version": (str,),
    "source_commit": (str,),
    "schema_version": (int,),
}
#: How a record read as JSON becomes one (the hint of a dict passed where a Record goes).
_FROM_DICT = "Record.from_dict(data) reads one, checking its keys"


@dataclass
class Record:
    """One benchmark's results on one machine.

    ``rows`` are dicts keyed by ``columns`` (in that order when rendered); ``units`` maps a
    column to its unit, shown in the table header. ``source_commit`` is the commit of the code
    that measured it (:func:`trainfast.versions.source_commit`; empty where unknown and in
    records older than it).
    """

    name: str
    description: str
    columns: list[str]
    rows: list[dict[str, Any]]
    environment: dict[str, Any]  # Environment.as_dict(): strings, and the gpu and cpu properties
    created: str  # ISO 8601, UTC
    command: str
    units: dict[str, str] = field(default_factory=dict)
    trainfast_version: str = ""
    source_commit: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            missing = [c for c in self.columns if c not in row]
            if missing:
                raise ValueError(f"Record {self.name!r}: row {i} lacks columns {missing}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> Record:
        """A record from its JSON form; a missing key or a value of the wrong type raises
        ``ValueError`` naming ``source`` (the file) and the key."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: not a measurement record (a {type(data).__name__})")
        missing = [key for key in _REQUIRED if key not in data]
        if missing:
            raise ValueError(f"{source}: not a measurement record, missing keys {missing}")
        for key, expected in _TYPES.items():
            if key in data and not isinstance(data[key], expected):
                raise ValueError(
                    f"{source}: invalid {key!r}: {data[key]!r:.80} (expected "
                    f"{' or '.join(t.__name__ for t in expected)})"
                )
        for kind, key in (("column", "columns"), ("row", "rows")):
            wrong = [x for x in data[key] if not isinstance(x, str if kind == "column" else dict)]
            if wrong:
                raise ValueError(f"{source}: invalid {kind} in {key!r}: {wrong[0]!r:.80}")
        lacking = [key for key in ("device", "device_name") if key not in data["environment"]]
        if lacking:  # every record says what it was measured on (device.Environment's fields)
            raise ValueError(
                f"{source}: invalid 'environment': it lacks {lacking} (expected the fields of "
                "trainfast.device.Environment, as make_record writes them)"
            )
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def device(self) -> str:
        """The kind of device measured: ``"cuda"``, ``"mps"`` or ``"cpu"``."""
        return str(self.environment["device"])

    @property
    def device_name(self) -> str:
        """The card's or processor's name, e.g. ``NVIDIA H100 80GB HBM3``."""
        return str(self.environment["device_name"])

    def column(self, name: str) -> list[Any]:
        """The values of column ``name``, one per row; an unknown column raises ``ValueError``."""
        if name not in self.columns:
            raise ValueError(f"Record {self.name!r} has no column {name!r} (has {self.columns})")
        return [row[name] for row in self.rows]


def make_record(
    name: str,
    description: str,
    rows: list[dict[str, Any]],
    *,
    units: dict[str, str] | None = None,
    device: torch.device | str | None = None,
    environment: Environment | None = None,
    command: str | None = None,
) -> Record:
    """Build a :class:`Record` stamped with the environment, the time and the command.

    The environment is that of ``device``, the device the benchmark ran on (default:
    :func:`~trainfast.device.pick_device`'s choice); pass ``environment`` only to stamp one
    described elsewhere. Giving both raises ``ValueError``.
    """
    from trainfast import __version__

    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise ValueError(
            f"Invalid rows: {rows!r:.80} (expected a list of dicts, one per row, keyed by column)"
        )
    if not rows:
        raise ValueError(f"Record {name!r} has no rows")
    if device is not None and environment is not None:
        raise ValueError(f"Record {name!r}: give device ({device!r}) or environment, not both")
    env = environment or describe_environment(None if device is None else pick_device(device))
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
        source_commit=source_commit(),
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def write_record(record: Record, directory: str | Path) -> Path:
    """Write ``record`` as JSON to ``directory/<name>--<device>--<device name>.json``.

    One file per benchmark and machine kind: measuring again on the same kind of machine
    replaces the old record; other machines' records stay.
    """
    check_instance("record", record, Record, hint=_FROM_DICT)
    directory = output_folder("directory", directory)
    env = record.environment
    stem = "--".join(_slug(s) for s in (record.name, env["device"] or "", env["device_name"] or ""))
    path = directory / f"{stem}.json"
    return write_json_atomically(path, asdict(record), indent=2)


def load_records(directory: str | Path, name: str | None = None) -> list[Record]:
    """All records in ``directory`` (those named ``name`` if given), GPU ones first.

    A folder with no record gives an empty list; a folder that does not exist (a typo) or is a
    file raises ``ValueError`` naming it, so it is never read as "no records"; so does a file
    that is not a record, naming the file. :func:`records_for` finds the book's folder.
    """
    directory = existing_folder("directory", directory)
    records = []
    for path in sorted(directory.glob("*.json")):
        data = read_json(path)
        record = Record.from_dict(data, source=str(path))
        if name is None or record.name == name:
            records.append(record)
    return sorted(records, key=lambda r: (r.environment["device"] == "cpu", r.created))


def _book_records() -> Path:
    """The book's ``records`` folder, from a page's folder, the repo root or the package;
    ``ValueError`` listing where it looked if there is none (a package installed without the
    book), rather than an empty list that reads as "not measured"."""
    here = Path.cwd()
    candidates = [
        here / "records",  # a chapter runs in book/ (a notebook on Colab: its copy beside it)
        *([here.parent / "records"] if here.parent.name == "book" else []),  # book/<chapter>/
        here / "book" / "records",  # the repository root
        here.parent / "book" / "records",  # tests/ or another sibling of book/
        Path(__file__).resolve().parents[2] / "book" / "records",  # this checkout's book
    ]
    found = next((c for c in candidates if c.is_dir()), None)
    if found is None:
        raise ValueError(
            f"No book records folder: looked in {[str(c) for c in candidates]} (pass "
            "directory= to read records from elsewhere)"
        )
    return found


_DEVICE_KINDS = ("cuda", "mps", "cpu")


def records_for(
    name: str,
    device: torch.device | str | None = "cuda",
    directory: str | Path | None = None,
    gpu: str | None = None,
) -> list[Record]:
    """The records of benchmark ``name`` measured on ``device``'s kind, newest first.

    ``device`` is a kind (``"cuda"``, ``"mps"``, ``"cpu"``) or a :class:`torch.device`; None
    takes every kind. ``gpu`` keeps only the records of that device name (``"NVIDIA H200"``,
    as :attr:`Record.device_name` has it): a figure or comparison never mixes GPUs, and the
    newest record of a benchmark may be another GPU's than the section's
    (:func:`section_records` picks one GPU for a section). ``directory`` defaults to the
    book's ``book/records``, found from a chapter's working directory, the repository root, or
    the package's own checkout. This is the one place chapters filter records by device, so a
    GPU cell reads the same way whether or not a GPU record exists: an empty list means "not
    measured on this kind".
    """
    kind = device.type if isinstance(device, torch.device) else device
    if kind is not None and kind not in _DEVICE_KINDS:
        raise ValueError(f"Unknown device kind: {kind!r} (expected one of {_DEVICE_KINDS})")
    if gpu is not None and (not isinstance(gpu, str) or not gpu.strip()):
        raise ValueError(f"Invalid gpu: {gpu!r} (expected a device name, e.g. 'NVIDIA H200')")
    records = load_records(_book_records() if directory is None else directory, name)
    chosen = [
        r
        for r in records
        if (kind is None or r.device == kind) and (gpu is None or r.device_name == gpu)
    ]
    return sorted(chosen, key=lambda r: r.created, reverse=True)


def records_by_gpu(name: str, directory: str | Path | None = None) -> dict[str, list[Record]]:
    """Benchmark ``name``'s CUDA records grouped by GPU (device name), each group newest first,
    the GPU with the newest record first. Where two GPUs measured it, a page can show both side
    by side, each beside its own GPU's prediction."""
    groups: dict[str, list[Record]] = {}
    for record in records_for(name, "cuda", directory):
        groups.setdefault(record.device_name, []).append(record)
    return groups


@dataclass(frozen=True)
class SectionRecords:
    """The GPU records one section shows: all from one GPU, chosen by :func:`section_records`.

    ``gpu`` is its device name (None where no GPU measured any of the benchmarks);
    ``records[name]`` that GPU's records of benchmark ``name``, newest first (empty where it
    did not measure it); ``coverage`` how many of the section's benchmarks each GPU measured,
    for the sentence that says which GPU the section's records come from.
    """

    gpu: str | None
    records: dict[str, list[Record]]
    coverage: dict[str, int]

    def __getitem__(self, name: str) -> list[Record]:
        if name not in self.records:
            raise ValueError(
                f"Benchmark {name!r} is not one of this section's {list(self.records)}"
            )
        return self.records[name]

    @property
    def other_gpus(self) -> list[str]:
        """The other GPUs that measured some of the section's benchmarks."""
        return [gpu for gpu in self.coverage if gpu != self.gpu]

    def sentence(self) -> str:
        """Which GPU the section's records come from, and which other GPUs measured how many of
        its benchmarks: for the section's prose, so a reader knows one GPU is shown."""
        total = len(self.records)
        if self.gpu is None:
            return "No GPU has measured this section's benchmarks yet."
        text = (
            f"This section's GPU records come from the {self.gpu} "
            f"({self.coverage[self.gpu]} of its {total} benchmarks)."
        )
        others = [f"the {gpu} measured {self.coverage[gpu]}" for gpu in self.other_gpus]
        if others:
            text += " Of the same benchmarks, " + "; ".join(others) + "."
        return text


def section_records(
    names: Sequence[str], directory: str | Path | None = None, gpu: str | None = None
) -> SectionRecords:
    """One GPU's records of the benchmarks ``names`` that a section shows.

    The GPU is ``gpu`` if given, else the one that measured the most of them, the newest
    record breaking a tie: so a partial pass on a new GPU (the H200 re-measuring two of a
    section's five benchmarks) leaves the section on the GPU that measured all five, until the
    new one covers as many, and no section mixes GPUs. An empty ``names`` raises ``ValueError``.
    """
    names = list(names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"Invalid names: {names!r} (expected one or more benchmark names)")
    grouped = {name: records_by_gpu(name, directory) for name in names}
    coverage: dict[str, int] = {}
    newest: dict[str, str] = {}
    for groups in grouped.values():
        for device_name, records in groups.items():
            coverage[device_name] = coverage.get(device_name, 0) + 1
            newest[device_name] = max(newest.get(device_name, ""), records[0].created)
    if gpu is None and coverage:
        gpu = max(coverage, key=lambda g: (coverage[g], newest[g]))
    ordered = dict(sorted(coverage.items(), key=lambda item: (item[0] != gpu, -item[1], item[0])))
    chosen = {name: list(groups.get(gpu, [])) if gpu else [] for name, groups in grouped.items()}
    return SectionRecords(gpu, chosen, ordered)


def provenance(record: Record) -> str:
    """A sentence saying where, with what and when ``record`` was measured.

    A CPU record made since its environment names the processor
    (:func:`~trainfast.device.cpu_properties`) says its family, model and bf16 flags too: "AMD
    EPYC" alone does not say which kind of core ran it."""
    check_instance("record", record, Record, hint=_FROM_DICT)
    env = record.environment
    versions = f"torch {env['torch_version']}"
    if env.get("cuda_version"):
        versions += f", CUDA {env['cuda_version']}"
    if env.get("driver_version"):
        versions += f", driver {env['driver_version']}"
    return (
        f"Measured on {env['device_name']} ({_device_text(env)}) with {versions}, "
        f"Python {env['python_version']}, on {record.created[:10]}, by `{_shown_command(record)}`."
    )


def _device_text(env: dict[str, Any]) -> str:
    """``cpu``, or for a CPU record that names its processor ``cpu, family 25 model 17, with
    avx512f, avx512_bf16``."""
    cpu = env.get("cpu")
    if env.get("device") != "cpu" or not isinstance(cpu, dict):
        return str(env["device"])
    parts = [str(env["device"])]
    if cpu.get("cpu_family") is not None and cpu.get("model") is not None:
        parts.append(f"family {cpu['cpu_family']} model {cpu['model']}")
    flags = cpu.get("flags")
    if isinstance(flags, list):
        parts.append(f"with {', '.join(flags)}" if flags else "no AVX2, AVX-512, AMX or Arm bf16")
    return ", ".join(parts)


def _shown_command(record: Record) -> str:
    """The record's command with an absolute ``--out`` folder shown as ``DIR``: where the
    measuring machine wrote the file says nothing about the measurement. Commands joined by
    `` & `` (studies run side by side) are each shown so, joined again by `` & ``."""
    shown = []
    for command in record.command.split(" & "):
        try:
            words = shlex.split(command)
        except ValueError:
            return record.command
        for i, word in enumerate(words[:-1]):
            if word == "--out" and words[i + 1].startswith("/"):
                words[i + 1] = "DIR"
        shown.append(shlex.join(words))
    return " & ".join(shown)


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


def column_label(name: str, unit: str | None) -> str:
    """The header a column gets without a label of its own: its name in words and its unit
    (``"step time (ms)"`` for ``step_time`` in ``ms``), the unit alone where the name only
    spells it (``"GB/s"`` for ``gb_per_s``, ``"ms"`` for ``ms``)."""
    words = name.replace("_", " ").strip()

    def spelled(text: str) -> str:
        return re.sub(r"[^a-z0-9]", "", text.lower().replace("per", ""))

    if not unit:
        return words
    if spelled(name) == spelled(unit):
        return unit
    return f"{words} ({unit})"


#: Units of byte counts, which :func:`to_markdown` writes as KiB, MiB or GiB.
BYTE_UNITS = ("bytes", "B")
_BINARY = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def _bytes_text(value: float) -> str:
    """One count of bytes in its own unit, three significant digits: ``258 MiB``, ``1,000 B``."""
    unit, scale = next(((u, f) for u, f in _BINARY if abs(value) >= f), ("B", 1))
    if scale == 1:
        return f"{value:,.0f} B"
    return f"{value / scale:.3g} {unit}"


def _readable_bytes(name: str, values: list[Any]) -> tuple[str, list[str]]:
    """The header and cells of a column of byte counts (``270532624`` reads ``258``, under
    ``(MiB)``): the largest of B, KiB, MiB and GiB in which the largest count is at least 1,
    or, where the counts span more than a thousandfold, each count in its own unit and the header
    without one. ``name`` is the header's words (empty: the unit alone)."""
    counts = [abs(v) for v in values if _is_number(v)]
    largest, smallest = max(counts, default=0), min((c for c in counts if c), default=0)
    unit, scale = next(((u, f) for u, f in _BINARY if largest >= f), ("B", 1))
    if smallest and smallest / scale < 1e-3:
        return name or "bytes", [_bytes_text(v) if _is_number(v) else str(v) for v in values]
    header = f"{name} ({unit})" if name else unit
    if scale == 1:
        return header, [f"{v:,.0f}" if _is_number(v) else str(v) for v in values]
    scaled = [float(v) / scale if _is_number(v) else v for v in values]
    return header, list(map(_column_format(scaled), scaled))


def to_markdown(
    record: Record,
    columns: list[str] | None = None,
    labels: dict[str, str] | None = None,
    rows: Callable[[dict], bool] | Sequence[int] | None = None,
) -> str:
    """The record as a Markdown table followed by its provenance, for ``IPython.display``.

    ``columns`` picks and orders the columns shown (default: all); an unknown one raises
    ``ValueError`` naming it. ``labels`` gives a column the header a reader should see
    (``{"ratio": "ours / torch"}``); a column without one shows its name in words and its unit
    (:func:`column_label`). ``rows`` picks the rows a page's argument needs: a test on a row
    (``lambda row: row["size"] >= 4096``) or their indices; default all, and a selection that
    keeps none raises ``ValueError``, since an empty table says nothing. Each column has one
    number format (:func:`_column_format`); a missing value (None) shows as a dash.

    Times are shown in a unit a person reads (:func:`_readable_times`): a column in seconds
    (unit ``"s"``) whose values are all under a second is shown in ms, µs or ns, its header's
    ``(s)`` changed to match; one whose values span from under a millisecond to seconds shows
    each value in its own unit (``752 µs``, ``6.3 s``), its header without a unit. A column
    whose label does not end in ``(s)`` keeps its seconds, since its header's unit is unknown.
    Byte counts (unit ``"bytes"``) are shown in KiB, MiB or GiB (:func:`_readable_bytes`),
    unless the column's label names another unit (a label ending in ``(bytes)`` gets the
    readable one).
    """
    check_instance("record", record, Record, hint=_FROM_DICT)
    columns = list(columns or record.columns)
    labels = labels or {}
    unknown = [c for c in [*columns, *labels] if c not in record.columns]
    if unknown:
        raise ValueError(f"Record {record.name!r} has no columns {unknown}")
    shown_rows = _selected_rows(record, rows)
    header, cells = [], {}
    for c in columns:
        unit = record.units.get(c)
        name = labels.get(c, column_label(c, unit))
        values = [row.get(c) for row in shown_rows]
        if unit == "s" and name.endswith(" (s)"):
            name, cells[c] = _readable_times(name.removesuffix(" (s)"), values)
        elif unit in BYTE_UNITS and (c not in labels or name.endswith((" (bytes)", " (B)"))):
            words = c.replace("_", " ") if c not in labels else name.rsplit(" (", 1)[0]
            name, cells[c] = _readable_bytes("" if words in ("bytes", "B") else words, values)
        else:
            cells[c] = list(map(_column_format(values), values))
        cells[c] = ["–" if v is None else text for v, text in zip(values, cells[c], strict=True)]
        header.append(name)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for i in range(len(shown_rows)):
        lines.append("| " + " | ".join(_flags_as_code(cells[c][i]) for c in columns) + " |")
    description = _flags_as_code(record.description)
    return "\n".join(lines) + f"\n\n*{description} {provenance(record)}*\n"


def _selected_rows(
    record: Record, rows: Callable[[dict], bool] | Sequence[int] | None
) -> list[dict]:
    if rows is None:
        return list(record.rows)
    if callable(rows):
        chosen = [row for row in record.rows if rows(row)]
    else:
        count = len(record.rows)
        bad = [i for i in rows if not isinstance(i, int) or not -count <= i < count]
        if bad:
            raise ValueError(
                f"Record {record.name!r} has {len(record.rows)} rows; no row {bad[0]!r}"
            )
        chosen = [record.rows[i] for i in rows]
    if not chosen:
        raise ValueError(f"Record {record.name!r}: the row selection keeps none of its rows")
    return chosen


def full_record(
    record: Record,
    columns: list[str] | None = None,
    labels: dict[str, str] | None = None,
    title: str | None = None,
) -> str:
    """The whole of ``record`` one click away: a collapsed dropdown (MyST, for
    ``IPython.display.Markdown``) holding :func:`to_markdown` of every row, titled with how many
    rows it holds. A page shows the few rows its argument needs and puts this under them."""
    count = len(record.rows)
    title = title or f"The whole record: {count} row{'s' if count != 1 else ''}"
    table = to_markdown(record, columns=columns, labels=labels)
    return f":::{{dropdown}} {title}\n\n{table}\n:::\n"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _readable_times(name: str, seconds: list[Any]) -> tuple[str, list[str]]:
    """The header (``name`` and a unit) and cells of a column of times in ``seconds``.

    All under a second: in ms, µs or ns, the largest unit in which the longest time is at
    least 1 (``4.19e-04`` s reads ``0.419`` ms beside ``2.1`` ms). From under a millisecond to a
    second or more (one unit would need ``1.23e-05``): each value in its own unit
    (:func:`~trainfast.timing.readable_seconds`: ``752 µs``, ``6.3 s``), the header without
    one. Otherwise in seconds. Values that are not finite numbers show as they are."""
    nonzero = [abs(v) for v in seconds if _is_number(v) and v != 0]
    longest, shortest = max(nonzero, default=1.0), min(nonzero, default=1.0)
    unit, scale = "s", 1.0
    if longest < 1:
        unit, scale = next(
            ((u, f) for u, f in (("ms", 1e-3), ("µs", 1e-6)) if longest >= f), ("ns", 1e-9)
        )
    if shortest / scale >= 1e-3:
        scaled = [v / scale if _is_number(v) and scale != 1 else v for v in seconds]
        return f"{name} ({unit})", list(map(_column_format(scaled), scaled))
    return name, [readable_seconds(v) if _is_number(v) else str(v) for v in seconds]


_FLAG = re.compile(r"(?<![\w`-])(--[A-Za-z][\w-]*)")


def _flags_as_code(text: str) -> str:
    """``text`` with each command-line flag (``--max-restarts``) in a code span, where Markdown's
    typography cannot turn its two hyphens into a dash and the reader can copy it."""
    return _FLAG.sub(r"`\1`", text)


@dataclass(frozen=True)
class Prediction:
    """A figure the book's own model predicts, e.g. an H100's copy bandwidth from its roofline.

    ``model`` says what produced it, in words a reader can follow to the code (it is shown as
    "predicted by the book's model (<model>)").
    """

    value: float
    unit: str
    model: str


@dataclass(frozen=True)
class Published:
    """A figure a primary source publishes, e.g. a datasheet peak or a paper's throughput table.

    ``source`` names it for the reader; ``citation`` is its key in ``book/references.bib``
    (rendered as a MyST ``{cite}`` role) or empty where the source has no entry there.
    """

    value: float
    unit: str
    source: str
    citation: str = ""


def _number(value: float, unit: str) -> str:
    value = float(value)
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


@dataclass(frozen=True)
class GPUFigure:
    """One row of a section's GPU table: a figure, its records, and what the book expects of it.

    ``records`` come from :func:`records_for` (newest first; empty where this kind of device has
    not measured it); ``measured(record)`` extracts the figure in ``unit``. ``prediction`` is the
    book's own model, ``published`` a primary source; either may be absent. ``benchmark`` names
    the ``python -m trainfast.measure`` benchmark that measures it. ``explain(record)`` says,
    from the record, which assumption of the model failed; the table prints it when the
    measurement is off the prediction by more than :data:`OFF_BY` either way. ``machine`` is
    what the benchmark needs to measure it (``"a machine with 2 or more GPUs"``, say).
    """

    what: str
    unit: str
    records: Sequence[Record] = ()
    measured: Callable[[Record], float] | None = None
    prediction: Prediction | None = None
    published: Published | None = None
    benchmark: str | None = None
    explain: Callable[[Record], str] | None = None
    machine: str = "a CUDA machine"

    def __post_init__(self) -> None:
        if not self.what:
            raise ValueError(f"GPUFigure needs a description of the figure, got {self.what!r}")
        if self.records and self.measured is None:
            raise ValueError(f"GPUFigure {self.what!r} has records but no `measured` extractor")
        for label, given in (("prediction", self.prediction), ("published", self.published)):
            if given is not None and given.unit != self.unit:
                raise ValueError(
                    f"GPUFigure {self.what!r}: the {label} is in {given.unit!r}, "
                    f"the figure in {self.unit!r}"
                )


def _ratio_text(ratio: float) -> str:
    """Two decimals, or two significant digits under 0.1 (0.0052, not 0.01)."""
    return f"{ratio:.2f}" if abs(ratio) >= 0.1 else f"{ratio:.2g}"


#: How far a measurement may lie from the book's prediction, either way, before the table must say
#: which assumption of the model failed (a GPUFigure's ``explain``).
OFF_BY = 1.5


def gpu_figures_table(figures: Sequence[GPUFigure]) -> str:
    """One Markdown table for a section's GPU figures: measured, predicted and published apart.

    Each row is one :class:`GPUFigure`. "Measured" comes from its newest record (a footnote-like
    line under the table gives each record's provenance once); "predicted" is labelled with the
    book's model; "published" names and cites its source; "measured / predicted" appears where
    both exist. Under the table, each row whose measurement is off its prediction by more than
    :data:`OFF_BY` either way gets a line with the figure's ``explain`` (or says that no reason is
    given). The three kinds never share a cell, so none reads as another. A figure with none of
    the three is left out (a row of dashes says nothing to a reader; the benchmark that would
    measure it is the figure's ``benchmark``, for the GPU pass, not for the page), and a table
    with no row left is the empty string.
    """
    if not figures:
        raise ValueError("gpu_figures_table needs at least one GPUFigure")
    figures = [
        f for f in figures if f.records or f.prediction is not None or f.published is not None
    ]
    if not figures:
        return ""
    header = ["Figure", "Measured", "Predicted (book's model)", "Published", "Measured / predicted"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    sources: list[Record] = []
    off: list[str] = []
    for figure in figures:
        measured, ratio = "–", "–"
        if figure.records:
            record = figure.records[0]
            value = float(figure.measured(record))  # type: ignore[misc]
            if record not in sources:
                sources.append(record)
            measured = f"{_number(value, figure.unit)} [{sources.index(record) + 1}]"
            if figure.prediction is not None and figure.prediction.value:
                factor = value / figure.prediction.value
                ratio = _ratio_text(factor)
                if not 1 / OFF_BY <= factor <= OFF_BY:
                    reason = (
                        figure.explain(record)
                        if figure.explain is not None
                        else "The book does not yet say which assumption of its model failed."
                    )
                    off.append(
                        f"**Off by more than {OFF_BY:g}×:** {figure.what}, measured / predicted "
                        f"{ratio} ({figure.prediction.model}). {reason}"
                    )
        predicted = (
            f"{_number(figure.prediction.value, figure.unit)} ({figure.prediction.model})"
            if figure.prediction is not None
            else "–"
        )
        published = "–"
        if figure.published is not None:
            cite = f" {{cite}}`{figure.published.citation}`" if figure.published.citation else ""
            published = (
                f"{_number(figure.published.value, figure.unit)} ({figure.published.source}{cite})"
            )
        lines.append(f"| {figure.what} | {measured} | {predicted} | {published} | {ratio} |")
    text = "\n".join(lines) + "\n"
    for number, record in enumerate(sources, start=1):
        text += f"\n[{number}] {provenance(record)}\n"
    for line in off:
        text += f"\n{line}\n"
    return text
