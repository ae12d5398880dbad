"""The foundation every chapter uses: device choice, measurement records, the measure script."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from trainfast.device import describe_environment, environment_line, pick_device
from trainfast.measure import BENCHMARKS, CUDA_ONLY, main
from trainfast.records import (
    OFF_BY,
    GPUFigure,
    Prediction,
    Published,
    Record,
    gpu_figures_table,
    load_records,
    make_record,
    provenance,
    records_for,
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
    assert "| size | ms (ms) |" in text and "| 2 | 1.25 |" in text
    assert provenance(loaded) in text and torch.__version__ in text


def test_to_markdown_can_pick_columns():
    text = to_markdown(_record(), columns=["ms"])
    assert text.startswith("| ms (ms) |\n|---|\n| 0.50 |")
    with pytest.raises(ValueError, match="no columns \\['speed'\\]"):
        to_markdown(_record(), columns=["speed"])


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

    text = chapters.chapter_path(name).read_text()
    found = [m.group(0) for m in PLACEHOLDER.finditer(text)]
    assert found == [], f"{name}: placeholder text {found}"


@pytest.mark.chapter
@pytest.mark.parametrize("name", CHAPTERS)
def test_executed_chapters_print_no_gpu_placeholder(name):
    import chapters

    notebook = chapters.executed_notebook(name)
    outputs = [
        output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
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
    assert table.splitlines()[0] == "| way | ms (ms) | ours / torch |"
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
    # each missing benchmark is named once, in one copyable command
    assert "`python -m trainfast.measure --only other` on a CUDA machine" in text
    assert text.count("other") == 1


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


def test_gpu_figures_table_names_the_machine_each_missing_benchmark_needs():
    many = "a machine with a GPU per rank (NCCL)"
    text = gpu_figures_table(
        [
            GPUFigure("one GPU", "ms", benchmark="single"),
            GPUFigure("ranks", "ms", benchmark="ranks", machine=many),
        ]
    )
    assert "`python -m trainfast.measure --only single` on a CUDA machine" in text
    assert f"`python -m trainfast.measure --only ranks` on {many}" in text


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
