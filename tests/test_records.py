"""The foundation every chapter uses: device choice, measurement records, the measure script."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from trainfast.device import (
    CPU_FLAGS,
    cpu_properties,
    describe_environment,
    environment_line,
    gpu_properties,
    pick_device,
)
from trainfast.measure import BENCHMARKS, CUDA_ONLY, main
from trainfast.records import (
    OFF_BY,
    GPUFigure,
    Prediction,
    Published,
    Record,
    column_label,
    full_record,
    gpu_figures_table,
    load_records,
    make_record,
    provenance,
    records_by_gpu,
    records_for,
    section_records,
    to_markdown,
    write_record,
)
from trainfast.versions import source_commit


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"),
    [(True, True, "cuda"), (True, False, "cuda"), (False, True, "mps"), (False, False, "cpu")],
)
def test_pick_device_prefers_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert pick_device().type == expected
    assert pick_device("cpu") == torch.device("cpu")


def test_pick_device_rejects_unknown_and_unavailable_kinds():
    with pytest.raises(ValueError, match="'tpu'"):
        pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' is not available"):
            pick_device("cuda")


def test_environment_line_names_device_and_versions():
    line = environment_line(torch.device("cpu"))
    assert line.startswith("device: cpu")
    assert f"torch {torch.__version__}" in line
    assert describe_environment(torch.device("cpu")).cuda_version is None


def _record(name: str = "demo", device: str = "cpu") -> Record:
    record = make_record(
        name,
        "A demo.",
        [{"size": 1, "ms": 0.5}, {"size": 2, "ms": 1.25}],
        units={"ms": "ms"},
        device="cpu",
    )
    record.environment["device"] = device
    return record


def test_make_record_describes_the_device_it_is_given():
    record = make_record("x", "d", [{"a": 1}], device="cpu")
    assert record.device == "cpu" and record.environment["cuda_version"] is None
    assert record.device_name == describe_environment(torch.device("cpu")).device_name
    with pytest.raises(ValueError, match="not both"):
        make_record("x", "d", [{"a": 1}], device="cpu", environment=describe_environment())


def test_record_column_reads_a_column_and_names_an_unknown_one():
    record = _record()
    assert record.column("ms") == [0.5, 1.25] and record.column("size") == [1, 2]
    with pytest.raises(ValueError, match="no column 'speed'"):
        record.column("speed")


def test_records_for_filters_by_device_kind_newest_first(tmp_path):
    old_gpu, new_gpu = _record("a", device="cuda"), _record("a", device="cuda")
    old_gpu.environment["device_name"], new_gpu.environment["device_name"] = "Old GPU", "New GPU"
    old_gpu.created, new_gpu.created = "2025-01-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00"
    for record in (old_gpu, new_gpu, _record("a"), _record("b", device="cuda")):
        write_record(record, tmp_path)
    names = [r.device_name for r in records_for("a", "cuda", tmp_path)]
    assert names == ["New GPU", "Old GPU"]
    assert [r.device for r in records_for("a", torch.device("cpu"), tmp_path)] == ["cpu"]
    assert len(records_for("a", None, tmp_path)) == 3
    assert records_for("a", "mps", tmp_path) == []
    with pytest.raises(ValueError, match="'tpu'"):
        records_for("a", "tpu", tmp_path)


def test_records_for_finds_the_books_records_from_the_repository_root(monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    found = records_for("ddp-overlap", "cpu")
    monkeypatch.chdir(Path(__file__).resolve().parents[1] / "book")
    assert [r.created for r in records_for("ddp-overlap", "cpu")] == [r.created for r in found]
    assert found, "book/records holds a CPU record of ddp-overlap"


_PREDICTION = Prediction(2.0, "ms", "two bytes over the bandwidth")
_PUBLISHED = Published(1.5, "ms", "a datasheet", "nvidia2022h100")


def test_records_round_trip_with_provenance(tmp_path):
    record = _record()
    path = write_record(record, tmp_path)
    assert path.name.startswith("demo--cpu--")
    (loaded,) = load_records(tmp_path, "demo")
    assert loaded == record
    assert record.environment["torch_version"] == torch.__version__
    assert record.created[:4].isdigit() and "T" in record.created
    text = to_markdown(loaded)
    assert "| size | ms |" in text and "| 2 | 1.25 |" in text
    assert provenance(loaded) in text and torch.__version__ in text


def test_to_markdown_can_pick_columns():
    text = to_markdown(_record(), columns=["ms"])
    assert text.startswith("| ms |\n|---|\n| 0.50 |")
    with pytest.raises(ValueError, match="no columns \\['speed'\\]"):
        to_markdown(_record(), columns=["speed"])


def test_to_markdown_writes_headers_and_byte_counts_as_a_reader_reads_them():
    """No raw field names ("bytes (bytes)", "gb_per_s (GB/s)"), no unformatted byte counts
    (``270532624``) and no ``None`` cell (the sections issue's record tables)."""
    record = make_record(
        "memory",
        "Bytes.",
        [
            {"kernel": "copy", "bytes": 270532624, "saved_bytes": 3 * 2**30, "gb_per_s": None},
            {"kernel": "add", "bytes": 135266312, "saved_bytes": 2 * 2**30, "gb_per_s": 2890.0},
        ],
        units={"bytes": "bytes", "saved_bytes": "bytes", "gb_per_s": "GB/s"},
        device="cpu",
    )
    lines = to_markdown(record).splitlines()
    assert lines[0] == "| kernel | MiB | saved bytes (GiB) | GB/s |"
    assert lines[2] == "| copy | 258 | 3 | – |"
    assert lines[3] == "| add | 129 | 2 | 2,890 |"
    assert column_label("step_time", "ms") == "step time (ms)"
    assert column_label("bytes", "bytes") == "bytes"
    spread = make_record(
        "spread", "Spread.", [{"bytes": 1000}, {"bytes": 3 * 2**30}], units={"bytes": "bytes"},
        device="cpu",
    )  # fmt: skip
    assert to_markdown(spread).splitlines()[:4] == [
        "| bytes |",
        "|---|",
        "| 1,000 B |",
        "| 3 GiB |",
    ]


def test_to_markdown_shows_the_rows_a_page_needs_and_full_record_the_rest():
    record = _record()
    picked = to_markdown(record, rows=lambda row: row["size"] > 1)
    assert "| 2 | 1.25 |" in picked and "| 1 | 0.50 |" not in picked
    assert to_markdown(record, rows=[1]) == picked
    with pytest.raises(ValueError, match="keeps none"):
        to_markdown(record, rows=lambda row: False)
    with pytest.raises(ValueError, match="has 2 rows; no row 5"):
        to_markdown(record, rows=[5])
    whole = full_record(record)
    assert whole.startswith(":::{dropdown} The whole record: 2 rows\n")
    assert "| 1 | 0.50 |" in whole and "| 2 | 1.25 |" in whole and whole.endswith(":::\n")


def test_to_markdown_sets_command_line_flags_in_code():
    """Markdown's typography turns "--" into a dash: a flag in a cell or the description must
    reach the page as code, copyable."""
    record = make_record(
        "flags",
        "Runs of torchrun --standalone; a range 1--2 stays text.",
        [{"launcher": "torchrun --max-restarts 1, rank 1 fails", "ms": 1.0}],
        units={"ms": "ms"},
        device="cpu",
    )
    text = to_markdown(record)
    assert "| torchrun `--max-restarts` 1, rank 1 fails |" in text
    assert "torchrun `--standalone`;" in text and "1--2" in text


def test_load_records_filters_by_name_and_puts_gpu_records_first(tmp_path):
    write_record(_record("a"), tmp_path)
    gpu = _record("a", device="cuda")
    gpu.environment["device_name"] = "Some GPU"
    write_record(gpu, tmp_path)
    write_record(_record("b"), tmp_path)
    records = load_records(tmp_path, "a")
    assert [r.environment["device"] for r in records] == ["cuda", "cpu"]
    assert load_records(tmp_path, "c") == []  # a folder without them: none measured


def test_a_file_that_is_not_a_record_is_named_in_the_error(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValueError, match="bad.json.*missing keys"):
        load_records(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not valid JSON"):
        load_records(tmp_path)


def test_rows_must_have_every_column():
    with pytest.raises(ValueError, match="row 1 lacks columns \\['ms'\\]"):
        make_record("x", "d", [{"size": 1, "ms": 1.0}, {"size": 2}])
    with pytest.raises(ValueError, match="'x' has no rows"):
        make_record("x", "d", [])


def test_measure_lists_and_rejects_unknown_benchmarks(capsys):
    assert main(["--out", "unused", "--list"]) == 0
    assert capsys.readouterr().out.split() == list(BENCHMARKS)
    with pytest.raises(ValueError, match="'nope'"):
        main(["--out", "unused", "--only", "nope"])


@pytest.mark.parametrize("name", sorted(set(BENCHMARKS) - CUDA_ONLY))
def test_measure_writes_a_record_per_benchmark(tmp_path, monkeypatch, name):
    # The CLI and the record are under test here, not the sizes: keep the optimizer benchmark tiny.
    monkeypatch.setattr(
        "trainfast.optim.benchmarks.transformer_shapes", lambda w, d: [(8, 8), (8,)]
    )
    # compile-by-width compiles each width cold (seconds each): one width here; its whole quick
    # run is test_profiling's test of the cold-compile benchmark.
    from trainfast.profiling import overhead

    by_width = overhead.compile_speedup_by_width
    monkeypatch.setattr(
        overhead, "compile_speedup_by_width", lambda widths, *a, **k: by_width(widths[:1], *a, **k)
    )
    assert main(["--out", str(tmp_path), "--only", name, "--quick", "--device", "cpu"]) == 0
    (record,) = load_records(tmp_path, name)
    assert record.command.startswith(f"python -m trainfast.measure --out {tmp_path}")
    assert record.environment["device"] == "cpu" and record.rows


def test_nvidia_smi_query_reads_fields_and_is_none_without_nvidia_smi(tmp_path, monkeypatch):
    from trainfast.device import nvidia_smi_query

    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_smi_query(["driver_version"]) is None  # no nvidia-smi on PATH
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '570.86.15, 1980'\n")
    fake.chmod(0o755)
    assert nvidia_smi_query(["driver_version", "clocks.sm"]) == {
        "driver_version": "570.86.15",
        "clocks.sm": "1980",
    }
    assert nvidia_smi_query(["driver_version"]) is None  # answer does not match the question


def test_provenance_names_the_driver_when_recorded():
    record = _record()
    assert "driver" not in provenance(record)
    record.environment["driver_version"] = "570.86.15"
    assert "driver 570.86.15" in provenance(record)


def test_exercise_report_prints_one_line_per_failure_and_raises_on_the_first(capsys):
    from trainfast.checks import report

    report([("a", None), ("b", None)])
    assert capsys.readouterr().out.splitlines() == ["All 2 cases passed."]
    with pytest.raises(AssertionError, match="2 of 3 cases failed; first: b: too big"):
        report([("a", None), ("b", "too big"), ("c", "too small")])
    assert capsys.readouterr().out.splitlines() == ["FAILED: b (too big)", "FAILED: c (too small)"]
    with pytest.raises(AssertionError, match="no cases"):
        report([])


# --- the chapters: GPU cells render a measurement, a prediction or a citation, never a placeholder

CHAPTERS = (
    "optimizers",
    "hyperparameters",
    "mixed_precision",
    "memory_hierarchy",
    "profiling",
    "parallelism",
)
PLACEHOLDER = re.compile(
    r"not recorded yet|no (?:gpu|cuda) (?:measurement|record)|(?:gpu|cuda)[^.\n]*been recorded yet",
    re.IGNORECASE,
)


def test_the_placeholder_pattern_catches_the_old_lines():
    old = [
        "No GPU measurement of 'roofline' has been recorded yet. To add one, run on a GPU:",
        "No CUDA autocast policy has been recorded yet. To record it, run on a GPU:",
        "| HBM3 | 80 GB | 3.35 TB/s | not recorded yet |",
        "No GPU record of the DDP overlap exists yet.",
    ]
    assert all(PLACEHOLDER.search(line) for line in old)
    unmeasured = GPUFigure("x", "ms", (), published=_PUBLISHED, benchmark="roofline")
    assert not PLACEHOLDER.search(gpu_figures_table([unmeasured]))


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_sources_hold_no_gpu_placeholder(name):
    import chapters

    text = "\n".join(chapters.chapter_path(page).read_text() for page in chapters.pages_of(name))
    found = [m.group(0) for m in PLACEHOLDER.finditer(text)]
    assert found == [], f"{name}: placeholder text {found}"


@pytest.mark.chapter
@pytest.mark.parametrize("name", CHAPTERS)
def test_executed_chapters_print_no_gpu_placeholder(name):
    import book_site
    import chapters

    notebooks = [
        chapters.executed_notebook(page)
        for page in chapters.pages_of(name)
        if book_site.is_notebook(page)
    ]
    outputs = [
        output
        for notebook in notebooks
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    ]
    texts = [
        str(output.get("text", "")) + "".join(str(v) for v in output.get("data", {}).values())
        for output in outputs
    ]
    found = [m.group(0) for text in texts for m in PLACEHOLDER.finditer(text)]
    assert found == [], f"{name}: placeholder output {found}"


def test_to_markdown_uses_one_number_format_per_column_and_the_given_labels():
    from trainfast.records import Record, to_markdown

    rows = [{"way": "a", "ms": 19585.2, "ratio": 1.0}, {"way": "b", "ms": 8830.0, "ratio": 0.45}]
    env = dict.fromkeys(["torch_version", "device_name", "device", "python_version"], "x")
    record = Record("t", "d.", ["way", "ms", "ratio"], rows, env, "2026-01-01", "x", {"ms": "ms"})
    table = to_markdown(record, labels={"ratio": "ours / torch"})
    assert table.splitlines()[0] == "| way | ms | ours / torch |"
    assert "| a | 19,585 | 1.00 |" in table and "| b | 8,830 | 0.45 |" in table
    with pytest.raises(ValueError, match="nope"):
        to_markdown(record, labels={"nope": "x"})


def _times(seconds: list, unit: str = "s") -> Record:
    rows = [{"way": str(i), "t": value} for i, value in enumerate(seconds)]
    return make_record("times", "d.", rows, units={"t": unit}, device="cpu")


def _column(table: str, index: int = 1) -> list[str]:
    """The header and cells of column ``index`` of ``to_markdown``'s table."""
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    return [row.split(" | ")[index].strip(" |") for row in rows]


def test_to_markdown_shows_times_under_a_second_in_ms_or_us():
    assert _column(to_markdown(_times([4.19e-4, 2.1e-3]))) == ["t (ms)", "0.419", "2.100"]
    assert _column(to_markdown(_times([4e-6, 9e-5]))) == ["t (µs)", "4", "90"]
    assert _column(to_markdown(_times([4e-9, 9e-8])))[0] == "t (ns)"
    # a label that ends in (s) gets the new unit; the values are the same times
    labelled = to_markdown(_times([0.353, 0.449]), labels={"t": "synchronous (s)"})
    assert _column(labelled) == ["synchronous (ms)", "353", "449"]


def test_to_markdown_shows_times_from_microseconds_to_seconds_each_in_its_unit():
    """One unit would need 7.52e-04 beside 6.30 (seconds) or 6,301 beside 0.752 (ms)."""
    table = to_markdown(_times([7.5157e-4, 6.3014, float("nan")]), labels={"t": "first (s)"})
    assert _column(table) == ["first", "752 µs", "6.3 s", "nan"]


def test_to_markdown_leaves_other_time_columns_as_they_were():
    assert _column(to_markdown(_times([1.5, 20.25]))) == ["t (s)", "1.50", "20.25"]
    assert _column(to_markdown(_times([4.19e-4, 2.1e-3], unit="ms")))[0] == "t (ms)"
    # a label without (s) says nothing of the unit: the seconds stay
    kept = to_markdown(_times([4.19e-4, 2.1e-3]), labels={"t": "time"})
    assert _column(kept) == ["time", "4.19e-04", "2.10e-03"]
    assert _column(to_markdown(_times([0.0, 0.0]))) == ["t (s)", "0", "0"]


def test_gpu_figures_table_keeps_measured_predicted_and_published_apart():
    record = _record()
    figures = [
        GPUFigure(
            "with a record",
            "ms",
            [record],
            measured=lambda r: 3.0,
            prediction=_PREDICTION,
            benchmark="demo",
        ),
        GPUFigure("without one", "ms", (), published=_PUBLISHED, benchmark="other"),
        GPUFigure("predicted only", "ms", prediction=_PREDICTION, benchmark="other"),
    ]
    text = gpu_figures_table(figures)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert (
        rows[1] == "| with a record | 3 ms [1] | 2 ms (two bytes over the bandwidth) | – | 1.50 |"
    )
    assert rows[2] == ("| without one | – | – | 1.5 ms (a datasheet {cite}`nvidia2022h100`) | – |")
    assert "[1] " + provenance(record) in text
    # no note to the maintainer about the benchmarks that would fill the other rows
    assert "trainfast.measure" not in text and "Rows without" not in text


def test_gpu_figures_table_says_why_a_measurement_is_off_its_prediction():
    """Past OFF_BY either way the table prints the figure's reason, computed from its record,
    or says that none is given; within it, nothing."""
    record = _record()

    def figure(value, explain=None):
        return GPUFigure(f"measured {value}", "ms", [record], lambda r: value, _PREDICTION,
                         explain=explain)  # fmt: skip

    reason = lambda r: f"the record {r.name} shows why"  # noqa: E731
    off_high, off_low = 2 * OFF_BY * 1.01, 2 / OFF_BY * 0.99  # the prediction is 2 ms
    text = gpu_figures_table(
        [figure(3.0, reason), figure(off_high, reason), figure(off_low), figure(2.0, reason)]
    )
    notes = [line for line in text.splitlines() if line.startswith("**Off by")]
    assert len(notes) == 2, text
    assert notes[0].startswith(f"**Off by more than {OFF_BY:g}×:** measured {off_high}")
    assert notes[0].endswith(f"(two bytes over the bandwidth). the record {record.name} shows why")
    assert notes[1].startswith(f"**Off by more than {OFF_BY:g}×:** measured {off_low}")
    assert "does not yet say which assumption" in notes[1]
    tiny = gpu_figures_table([figure(2 * 0.0052)])  # two significant digits, not 0.01
    assert "| 0.0052 |" in tiny and "predicted 0.0052 (" in tiny


def test_gpu_figures_table_leaves_out_a_row_that_would_be_only_dashes():
    many = "a machine with a GPU per rank (NCCL)"
    empty = GPUFigure("ranks", "ms", benchmark="ranks", machine=many)
    assert gpu_figures_table([empty]) == ""
    text = gpu_figures_table([GPUFigure("one GPU", "ms", prediction=_PREDICTION), empty])
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 2 and rows[1].startswith("| one GPU |"), rows


def test_gpu_figures_table_refuses_mismatched_units_and_missing_extractors():
    with pytest.raises(ValueError, match="'s'"):
        GPUFigure("x", "s", prediction=_PREDICTION)
    with pytest.raises(ValueError, match="measured"):
        GPUFigure("x", "ms", [_record()])
    with pytest.raises(ValueError, match="at least one"):
        gpu_figures_table([])


def test_provenance_shows_an_absolute_out_folder_as_dir():
    record = _record()
    record.command = "python -m trainfast.measure --out /tmp/run7 --only demo"
    assert "by `python -m trainfast.measure --out DIR --only demo`." in provenance(record)
    record.command = "python -m trainfast.measure --out book/records"
    assert "--out book/records" in provenance(record)
    record.command = "python -m a --out /tmp/x & python -m b --entry 'c d' --out /tmp/y"
    assert "by `python -m a --out DIR & python -m b --entry 'c d' --out DIR`." in provenance(record)


def test_a_record_stores_the_commit_named_by_trainfast_commit(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFAST_COMMIT", "0123abc")
    record = _record()
    assert record.source_commit == "0123abc"
    write_record(record, tmp_path)
    (loaded,) = load_records(tmp_path)
    assert loaded.source_commit == "0123abc"


def _git(repo: Path, *arguments: str) -> str:
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
    command = ["git", *identity, "-C", str(repo), *arguments]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


def test_source_commit_is_the_checkouts_head_marked_dirty_for_changes_under_code(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("TRAINFAST_COMMIT", raising=False)
    assert source_commit(tmp_path) == ""  # no git repository: unknown, not an error
    repo = tmp_path / "repo"
    (repo / "code").mkdir(parents=True)
    _git(repo, "init", "-q")
    assert source_commit(repo) == ""  # no commit yet
    (repo / "code" / "m.py").write_text("x = 1\n")
    (repo / "README.md").write_text("hello\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    head = _git(repo, "rev-parse", "HEAD")
    assert source_commit(repo) == head
    (repo / "README.md").write_text(
        "changed\n"
    )  # outside code/: the measuring code is as committed
    (repo / "code" / "new.py").write_text("")  # untracked: imported by nothing committed
    assert source_commit(repo) == head
    (repo / "code" / "m.py").write_text("x = 2\n")
    assert source_commit(repo) == f"{head}+dirty"
    (repo / "code" / "inner").mkdir()  # a folder inside someone else's repository is not one
    assert source_commit(repo / "code" / "inner") == ""
    monkeypatch.setenv("TRAINFAST_COMMIT", "given")
    assert source_commit(repo) == "given"  # the variable wins (a copy without .git)


def test_records_without_a_source_commit_still_load(tmp_path):
    data = {k: v for k, v in asdict(_record()).items() if k != "source_commit"}
    (tmp_path / "old.json").write_text(json.dumps(data))
    (old,) = load_records(tmp_path)
    assert old.source_commit == ""
    books = load_records(Path(__file__).resolve().parents[1] / "book" / "records")
    assert books and all(isinstance(r.source_commit, str) for r in books)
    with pytest.raises(ValueError, match=r"bad.json: invalid 'source_commit'"):
        Record.from_dict({**data, "source_commit": 5}, source="bad.json")


# --- what a record says about its machine (the GPU's own properties, the CPU's flags) ----------

ZEN4_CPUINFO = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 17
model name	: AMD EPYC
flags		: fpu sse2 avx2 fma avx512f avx512dq avx512_bf16 avx512vnni

processor	: 1
vendor_id	: AuthenticAMD
model name	: AMD EPYC (another block, not read)
"""
ARM_CPUINFO = """processor	: 0
BogoMIPS	: 2000.00
Features	: fp asimd sve sve2 bf16 i8mm
CPU implementer	: 0x41
"""


def test_cpu_properties_name_the_processor_and_its_bf16_flags():
    zen4 = cpu_properties(ZEN4_CPUINFO)
    assert zen4["model_name"] == "AMD EPYC" and zen4["vendor_id"] == "AuthenticAMD"
    assert (zen4["cpu_family"], zen4["model"]) == (25, 17)
    assert zen4["flags"] == ["avx2", "fma", "avx512f", "avx512_bf16"]  # CPU_FLAGS' order
    arm = cpu_properties(ARM_CPUINFO)
    assert arm["flags"] == ["bf16", "sve", "sve2"] and arm["cpu_family"] is None
    assert arm["vendor_id"] == "0x41" and arm["model_name"]  # platform's name where none
    assert set(CPU_FLAGS) >= {"avx512_bf16", "amx_bf16", "avx512f", "bf16"}
    assert cpu_properties("")["flags"] == []


def test_every_record_names_its_cpu_and_a_cpu_record_says_so_in_its_provenance():
    record = make_record("x", "d", [{"a": 1}], device="cpu")
    cpu = record.environment["cpu"]
    assert cpu == cpu_properties() and record.environment["gpu"] is None
    assert cpu["model_name"] and all(flag in CPU_FLAGS for flag in cpu["flags"])
    record.environment["cpu"] = cpu_properties(ZEN4_CPUINFO)
    assert "(cpu, family 25 model 17, with avx2, fma, avx512f, avx512_bf16)" in provenance(record)


def test_gpu_properties_are_what_the_device_reports(monkeypatch):
    from types import SimpleNamespace

    import trainfast.device as device_module

    fake = SimpleNamespace(
        name="NVIDIA H200",
        multi_processor_count=132,
        L2_cache_size=60 * 2**20,
        total_memory=150_754_820_096,
        major=9,
        minor=0,
        shared_memory_per_block_optin=232_448,
        regs_per_multiprocessor=65_536,
        max_threads_per_multi_processor=2_048,
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: fake)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    clocks = {"clocks.max.sm": "1980", "clocks.max.mem": "3201"}
    monkeypatch.setattr(device_module, "nvidia_smi_query", lambda fields, device: clocks)
    properties = gpu_properties("cuda")
    assert properties == {
        "name": "NVIDIA H200",
        "sm_count": 132,
        "l2_bytes": 62_914_560,
        "memory_bytes": 150_754_820_096,
        "compute_capability": [9, 0],
        "shared_memory_per_block_optin_bytes": 232_448,
        "registers_per_sm": 65_536,
        "max_threads_per_sm": 2_048,
        "max_sm_clock_mhz": 1980,
        "max_memory_clock_mhz": 3201,
    }
    monkeypatch.setattr(device_module, "nvidia_smi_query", lambda fields, device: None)
    assert gpu_properties(0)["max_sm_clock_mhz"] is None  # no nvidia-smi: the rest is known
    with pytest.raises(ValueError, match="cpu"):
        gpu_properties("cpu")


def test_records_made_before_the_machine_was_described_still_load_and_render():
    """The committed H100 records have no ``gpu`` or ``cpu`` in their environment."""
    from trainfast.gpus import GPUS, spec_for_record

    (old,) = records_for("roofline", "cuda", gpu="NVIDIA H100 80GB HBM3")
    assert "gpu" not in old.environment and "cpu" not in old.environment
    assert "Measured on NVIDIA H100 80GB HBM3 (cuda) with torch 2.11.0+cu130" in to_markdown(old)
    assert spec_for_record(old) == GPUS["H100 SXM 80GB"]
    (cpu,) = records_for("ddp-overlap", "cpu")
    assert "(cpu) with torch" in provenance(cpu)


# --- records from two GPUs: one GPU per section ---------------------------------------------


def _gpu_record(name: str, gpu: str, created: str) -> Record:
    record = _record(name, device="cuda")
    record.environment["device_name"], record.created = gpu, created
    return record


def test_records_for_a_gpu_and_records_grouped_by_gpu(tmp_path):
    for name, gpu, created in [
        ("a", "NVIDIA H100 80GB HBM3", "2026-11-26T15:00:00+00:00"),
        ("a", "NVIDIA H200", "2026-12-02T10:00:00+00:00"),
        ("b", "NVIDIA H100 80GB HBM3", "2026-11-26T15:01:00+00:00"),
    ]:
        write_record(_gpu_record(name, gpu, created), tmp_path)
    assert [r.device_name for r in records_for("a", "cuda", tmp_path)] == [
        "NVIDIA H200",
        "NVIDIA H100 80GB HBM3",
    ]  # newest first: the newest alone would mix GPUs across a section's figures
    assert [
        r.device_name for r in records_for("a", "cuda", tmp_path, gpu="NVIDIA H100 80GB HBM3")
    ] == ["NVIDIA H100 80GB HBM3"]
    assert records_for("b", "cuda", tmp_path, gpu="NVIDIA H200") == []
    groups = records_by_gpu("a", tmp_path)
    assert list(groups) == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    assert all(r.device_name == gpu for gpu, rs in groups.items() for r in rs)
    with pytest.raises(ValueError, match="Invalid gpu: ''"):
        records_for("a", "cuda", tmp_path, gpu="")


def test_a_section_shows_one_gpu_the_one_that_measured_most_of_its_benchmarks(tmp_path):
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    for name in "abc":
        write_record(_gpu_record(name, h100, "2026-11-26T15:00:00+00:00"), tmp_path)
    write_record(_gpu_record("a", h200, "2026-12-02T10:00:00+00:00"), tmp_path)  # a partial pass
    section = section_records(["a", "b", "c"], tmp_path)
    assert section.gpu == h100 and section.other_gpus == [h200]
    assert all(r.device_name == h100 for name in "abc" for r in section[name])
    assert section.sentence() == (
        f"This section's GPU records come from the {h100} (3 of its 3 benchmarks). Of the same "
        f"benchmarks, the {h200} measured 1."
    )
    for name in "bc":  # the new GPU catches up: the newest GPU wins the tie
        write_record(_gpu_record(name, h200, "2026-12-02T10:05:00+00:00"), tmp_path)
    assert section_records(["a", "b", "c"], tmp_path).gpu == h200
    chosen = section_records(["a", "b"], tmp_path, gpu=h100)
    assert chosen.gpu == h100 and chosen["a"][0].device_name == h100
    empty = section_records(["nothing"], tmp_path)
    assert empty.gpu is None and empty["nothing"] == []
    assert empty.sentence() == "No GPU has measured this section's benchmarks yet."
    with pytest.raises(ValueError, match="not one of this section's"):
        empty["a"]
    with pytest.raises(ValueError, match=r"Invalid names: \[\]"):
        section_records([], tmp_path)
