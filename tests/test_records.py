"""The foundation every chapter uses: device choice, measurement records, the measure script."""

from __future__ import annotations

import json

import pytest
import torch
from trainfast.device import describe_environment, environment_line, pick_device
from trainfast.measure import BENCHMARKS, main
from trainfast.records import (
    Record,
    load_records,
    make_record,
    provenance,
    to_markdown,
    write_record,
)


def test_pick_device_prefers_cuda_then_mps_then_cpu():
    device = pick_device()
    if torch.cuda.is_available():
        assert device.type == "cuda"
    elif torch.backends.mps.is_available():
        assert device.type == "mps"
    else:
        assert device.type == "cpu"
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
        name, "A demo.", [{"size": 1, "ms": 0.5}, {"size": 2, "ms": 1.25}], units={"ms": "ms"}
    )
    record.environment["device"] = device
    return record


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


def test_load_records_filters_by_name_and_puts_gpu_records_first(tmp_path):
    write_record(_record("a"), tmp_path)
    gpu = _record("a", device="cuda")
    gpu.environment["device_name"] = "Some GPU"
    write_record(gpu, tmp_path)
    write_record(_record("b"), tmp_path)
    records = load_records(tmp_path, "a")
    assert [r.environment["device"] for r in records] == ["cuda", "cpu"]
    assert load_records(tmp_path / "missing") == []


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


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_measure_writes_a_record_per_benchmark(tmp_path, monkeypatch, name):
    # The CLI and the record are under test here, not the sizes: keep the optimizer benchmark tiny.
    monkeypatch.setattr("trainfast.optim.benchmark.transformer_shapes", lambda w, d: [(8, 8), (8,)])
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
