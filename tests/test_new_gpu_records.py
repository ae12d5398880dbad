"""Nothing breaks on a new GPU's records: every benchmark, measured on an H200, read as the book
reads it.

An H200 record of every benchmark registered in :data:`trainfast.measure.BENCHMARKS` is planted
beside the book's own records (a copy of the newest record of it, restamped with an H200's
environment and today's date; a benchmark no machine recorded yet is run quick on this CPU and
restamped). Then the package functions the chapters call on records run on each: the renderers
(:func:`~trainfast.records.to_markdown`, :func:`~trainfast.records.gpu_figures_table`), the
``*_prediction`` functions with the record's own GPU (:func:`~trainfast.gpus.spec_for_record`),
and the readers (:func:`~trainfast.kernels.checkpointing.with_saved_prediction`,
:func:`~trainfast.profiling.loss_strays.loss_strays`, ...). Nothing may raise except a real
contradiction, which the reader names instead. A benchmark added to the registry without a
reader here fails :func:`test_every_benchmark_has_a_reader`.
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from trainfast.gpus import GPUS, UnlistedGPUWarning, datasheet_peak, spec_for_record
from trainfast.measure import BENCHMARKS, run_benchmark
from trainfast.records import (
    GPUFigure,
    Prediction,
    Record,
    gpu_figures_table,
    load_records,
    provenance,
    records_for,
    section_records,
    to_markdown,
    write_record,
)

ROOT = Path(__file__).resolve().parents[1]
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
#: what an H200 SXM reports (the device machine's notes, 2026-10-28: 132 SMs, 60 MB of L2)
H200_PROPERTIES = {
    "name": H200,
    "sm_count": 132,
    "l2_bytes": 60 * 2**20,
    "memory_bytes": 150_754_820_096,
    "compute_capability": [9, 0],
    "shared_memory_per_block_optin_bytes": 232_448,
    "registers_per_sm": 65_536,
    "max_threads_per_sm": 2_048,
    "max_sm_clock_mhz": 1980,
    "max_memory_clock_mhz": 3201,
}
NOW = datetime.now(timezone.utc).isoformat(timespec="seconds")


def as_h200(record: Record) -> Record:
    """``record`` as if an H200 had measured it today, at a known commit."""
    environment = {
        **record.environment,
        "device": "cuda",
        "device_name": H200,
        "cuda_version": record.environment.get("cuda_version") or "13.0",
        "driver_version": "580.159.04",
        "gpu": dict(H200_PROPERTIES),
    }
    rows = record.rows
    if record.name == "speedrun":  # what the GPU preset writes
        rows = [{**row, "preset": "gpu"} for row in rows]
    return replace(record, environment=environment, rows=rows, created=NOW, source_commit="f" * 40)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    """The book's records and an H200 record of every benchmark, in one folder."""
    folder = tmp_path_factory.mktemp("records")
    for path in (ROOT / "book" / "records").glob("*.json"):
        shutil.copy(path, folder / path.name)
    for name in BENCHMARKS:
        recorded = records_for(name, "cuda", folder) or records_for(name, "cpu", folder)
        base = recorded[0] if recorded else run_benchmark(name, torch.device("cpu"), quick=True)
        write_record(as_h200(base), folder)
    return folder


def _h200(records: Path, name: str) -> Record:
    (record,) = records_for(name, "cuda", records, gpu=H200)
    return record


def _spec(record: Record):
    spec = spec_for_record(record)
    assert spec is GPUS["H200 SXM 141GB"] or spec.name == "H200 SXM 141GB"
    assert spec.l2_bytes == H200_PROPERTIES["l2_bytes"]  # the device's, not a stand-in
    return spec


def _figure(record: Record, what: str, unit: str, measured, prediction=None, published=None):
    """A chapter's GPU table of one figure, rendered: it reads the record and its prediction."""
    return gpu_figures_table(
        [GPUFigure(what, unit, [record], measured, prediction, published, benchmark=record.name)]
    )


# --- one reader per benchmark: what the chapters call on its records -----------------------------


def read_optimizer_step_time(record: Record) -> None:
    from trainfast.optim.benchmarks import adamw_step_prediction

    spec, n_params = _spec(record), record.column("parameters")[0]
    for path in ("foreach", "fused"):
        _figure(
            record,
            f"AdamW {path}",
            "ms",
            lambda r, path=path: next(
                row[f"torch_{path}_ms"] for row in r.rows if row["optimizer"] == "AdamW"
            ),
            adamw_step_prediction(spec, n_params, path),
        )


def read_muon_vs_adamw(record: Record) -> None:
    to_markdown(record)
    assert {row["optimizer"] for row in record.rows} >= {"AdamW"}


def read_all_reduce_time(record: Record) -> None:
    from trainfast.distributed.measurements.all_reduce import all_reduce_prediction

    ring = [row for row in record.rows if row["algorithm"] == "ring"]
    largest = max(ring, key=lambda row: (row["world_size"], row["bytes"]))
    prediction = all_reduce_prediction(largest["bytes"], largest["world_size"])
    _figure(record, "ring all-reduce", "ms", lambda r: largest["seconds"] * 1e3, prediction)


def read_ddp_overlap(record: Record) -> None:
    _figure(record, "DDP overlap", "", lambda r: min(r.column("overlap_over_sync")))


def read_rendered(record: Record) -> None:
    to_markdown(record)


def read_matmul_throughput(record: Record) -> None:
    from trainfast.kernels.benchmarks import matmul_prediction

    spec = _spec(record)
    largest = max(r["m"] for r in record.rows if r["shape"].startswith("square "))
    text = _figure(
        record,
        f"bf16 {largest}³ torch.matmul",
        "TFLOP/s",
        lambda r: next(
            row["tflops"]
            for row in r.rows
            if row["dtype"] == "bf16"
            and row["timing"] == "harness"
            and row["shape"] == f"square {largest}"
        ),
        matmul_prediction(spec, largest, "bf16"),
        datasheet_peak(spec),
    )
    assert "H200 SXM 141GB datasheet" in text and "nvidia2024h200" in text


def read_precision_step_time(record: Record) -> None:
    from trainfast.precision.benchmarks import stale_recipes, step_memory_prediction

    assert stale_recipes(record) == set()  # a record made today ran today's tf32 recipe
    for row in record.rows:
        step_memory_prediction(row["recipe"], "n_layers=2," in record.description)
    bf16 = next(row for row in record.rows if row["recipe"] == "bf16 autocast")
    _figure(record, "peak memory", "GB", lambda r: bf16["peak_memory_gb"])


def test_the_stale_tf32_row_is_told_by_the_records_date_not_its_commit():
    """Records made before the tf32 step's backward ran in TF32 (ab66a8a) measured another
    recipe; one made after it without a known commit (no .whl/COMMIT) did not."""
    from trainfast.precision.benchmarks import stale_recipes

    (h100,) = records_for("precision-step-time", "cuda", gpu=H100)
    assert stale_recipes(h100) == {"tf32"}
    assert stale_recipes(replace(as_h200(h100), source_commit="")) == set()


def read_autocast_policy(record: Record) -> None:
    from trainfast.precision.benchmarks import published_cuda_autocast_policy

    ops = {row["op"] for row in record.rows}
    published_cuda_autocast_policy(ops)
    to_markdown(record)


def read_copy_bandwidth(record: Record) -> None:
    from trainfast.kernels.benchmarks import copy_prediction, target_ratios

    spec = _spec(record)
    rows = [r for r in record.rows if r["implementation"] == "torch copy_"]
    _figure(
        record,
        "copy",
        "GB/s",
        lambda r: max(rows, key=lambda x: x["bytes"])["gb_per_s"],
        copy_prediction(spec),
    )
    assert spec.l2_bytes / 2 == 30 * 2**20  # the half-L2 line of the H200's own L2
    target_ratios([record])


def read_matmul_tiles(record: Record) -> None:
    from trainfast.kernels.benchmarks import target_ratios

    to_markdown(record, columns=["dtype", "implementation", "tiles", "tflops", "ratio_to_torch"])
    target_ratios([record])


def read_attention_forward(record: Record) -> None:
    from trainfast.kernels.attention_benchmarks import launcher_forward_row
    from trainfast.kernels.benchmarks import attention_forward_prediction, target_ratios

    spec = _spec(record)
    row = launcher_forward_row(record, spec, 4096, 128, causal=False)
    prediction = attention_forward_prediction(spec, 4096, 128)
    _figure(record, "flash forward", "TFLOP/s", lambda r: row["tflops"], prediction)
    target_ratios([record])


def read_attention_fwd_bwd(record: Record) -> None:
    from trainfast.kernels.benchmarks import attention_sweep_prediction

    spec = _spec(record)
    for cache in ("none", "l2"):
        prediction = attention_sweep_prediction(spec, 4096, 128, cache=cache)
        _figure(
            record,
            f"fwd+bwd, {cache}",
            "TFLOP/s",
            lambda r: next(
                row["tflops"]
                for row in r.rows
                if row["seq"] == 4096
                and row["head_dim"] == 128
                and row["implementation"].startswith("triton")
            ),
            prediction,
        )


def read_roofline(record: Record) -> None:
    from trainfast.kernels.benchmarks import matmul_prediction
    from trainfast.kernels.roofline import (
        datasheet_roofline,
        predicted_speedups,
        roofline_from_rows,
    )

    spec = _spec(record)
    measured, roof = roofline_from_rows(record.rows), datasheet_roofline(spec)
    assert roof.bytes_per_s == 4.8e12  # the H200's roof, not the H100's 3.35 TB/s
    assert measured.bytes_per_s > 0
    h100 = GPUS["H100 SXM 80GB"]
    ratios = {
        p["operation"]: p["predicted_ratio"] for p in predicted_speedups(record.rows, h100, spec)
    }
    assert ratios["copy"] == pytest.approx(4.8 / 3.35) and ratios["matmul 8192x8192x8192"] == 1
    matmul_prediction(spec, 8192, "bf16")


def read_strided_access(record: Record) -> None:
    ordered = [r for r in record.rows if not r.get("shuffled")]
    assert [r["useful_gb_per_s"] for r in ordered]
    to_markdown(record)


def read_host_transfers(record: Record) -> None:
    from trainfast.kernels.benchmarks import host_transfer_prediction

    _figure(
        record,
        "pinned host to device",
        "GB/s",
        lambda r: next(
            row["gb_per_s"] for row in r.rows if row["operation"] == "host to device, pinned"
        ),
        host_transfer_prediction(_spec(record)),
    )


def read_fused_linear_gelu(record: Record) -> None:
    from trainfast.kernels.benchmarks import FUSED_LINEAR_GELU_SHAPE, fused_linear_gelu_prediction

    m, n, k = FUSED_LINEAR_GELU_SHAPE
    for fused in (False, True):
        fused_linear_gelu_prediction(_spec(record), m, n, k, "bf16", fused=fused)
    to_markdown(record)


def read_activation_checkpointing(record: Record) -> None:
    from trainfast.kernels.checkpointing import with_saved_prediction

    completed = with_saved_prediction(record)
    for row in completed.rows:
        assert row["saved_bytes"] == pytest.approx(row["predicted_saved_bytes"], rel=0.01)
    wrong = [{**row, "predicted_bytes": row["predicted_bytes"] + 1} for row in record.rows]
    with pytest.raises(ValueError, match=f"on {H200}, row 0: predicted_bytes .* not the formula"):
        with_saved_prediction(replace(record, rows=wrong))  # a new record is checked too


def read_caching_allocator(record: Record) -> None:
    from trainfast.kernels.allocator import block_bytes, segment_bytes

    for row in record.rows:
        assert row["allocated_bytes"] == block_bytes(row["requested_bytes"]), row
        assert row["reserved_bytes"] == segment_bytes(row["requested_bytes"]), row


def read_allocator_snapshot(record: Record) -> None:
    from trainfast.kernels.allocator import segment_summary

    to_markdown(
        record,
        columns=[
            "expandable_segments",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "unused_reserved_at_peak",
        ],
    )
    segment_summary(record.rows[0]["snapshot"])


def read_profiling_case_study(record: Record) -> None:
    from trainfast.profiling.loss_strays import loss_strays
    from trainfast.profiling.plots import plot_waterfall

    reading = loss_strays(record)  # the H100's strays, made after the loader's fix: unexplained
    assert reading.contradiction and "`+ data_workers` by 0.156" in reading.sentence()
    clean = [{**row, "loss_deviation": 0.0} for row in record.rows]
    assert not loss_strays(replace(record, rows=clean)).strays
    import matplotlib

    matplotlib.use("Agg")
    plot_waterfall([row for row in record.rows if row["variant"] != "bf16 alone"])


def read_timing_pitfalls(record: Record) -> None:
    from trainfast.profiling.pitfalls import QUEUED

    spec = _spec(record)
    cache_rows = [row for row in record.rows if row["case"].startswith("sum")]
    if cache_rows and not all(QUEUED in row["way"] for row in cache_rows):
        summed = float(cache_rows[-1]["case"].split()[2]) * 2**20
        assert summed / spec.hbm_bytes_per_s > 0
    to_markdown(record)


def read_launch_overhead(record: Record) -> None:
    to_markdown(record)
    assert {row["mode"] for row in record.rows}


def read_compile_by_width(record: Record) -> None:
    _figure(record, "compiled over eager", "", lambda r: r.rows[0]["ratio"])


def read_copy_compute_overlap(record: Record) -> None:
    from trainfast.profiling.streams import host_to_device_seconds, prefetch_saving_seconds

    spec = _spec(record)
    batch = 4 * 8192 * 1024
    saving = prefetch_saving_seconds(batch, spec, 8) * 1e3
    assert saving < host_to_device_seconds(batch, spec) * 1e3
    prediction = Prediction(saving, "ms", f"7/8 of a copy at the {spec.name} datasheet's PCIe")
    _figure(record, "prefetch saving", "ms", lambda r: 0.01, prediction)


def read_scaling_study(record: Record) -> None:
    from trainfast.training.scaling import ScalingRun, compute_frontier

    fields = ("width", "data_fraction", "dropout", "parameters", "examples", "flops")
    fields += ("eval_loss", "eval_loss_std", "test_loss", "lr")
    runs = [ScalingRun(**{f: row[f] for f in fields}) for row in record.rows]
    compute_frontier(runs)


def read_speedrun(record: Record) -> None:
    from trainfast.speedrun.gpu import gpu_preset, gpu_rows, predict

    spec = _spec(record)
    rows = gpu_rows(gpu_preset(spec))
    assert all(predict(entry.config, spec).step_seconds > 0 for entry in rows)
    assert record.rows[0]["preset"] == "gpu"
    to_markdown(record)


READERS = {
    "optimizer-step-time": read_optimizer_step_time,
    "muon-vs-adamw": read_muon_vs_adamw,
    "all-reduce-time": read_all_reduce_time,
    "ddp-overlap": read_ddp_overlap,
    "launcher-failure": read_rendered,  # CPU processes by design: never a GPU record
    "launcher-restart": read_rendered,
    "matmul-throughput": read_matmul_throughput,
    "precision-step-time": read_precision_step_time,
    "autocast-policy": read_autocast_policy,
    "matmul-error": read_rendered,
    "copy-bandwidth": read_copy_bandwidth,
    "matmul-tiles": read_matmul_tiles,
    "attention-forward": read_attention_forward,
    "attention-fwd-bwd": read_attention_fwd_bwd,
    "roofline": read_roofline,
    "strided-access": read_strided_access,
    "host-transfers": read_host_transfers,
    "fused-linear-gelu": read_fused_linear_gelu,
    "activation-checkpointing": read_activation_checkpointing,
    "caching-allocator": read_caching_allocator,
    "allocator-snapshot": read_allocator_snapshot,
    "profiling-case-study": read_profiling_case_study,
    "timing-pitfalls": read_timing_pitfalls,
    "launch-overhead": read_launch_overhead,
    "compile-time": read_rendered,
    "compile-by-width": read_compile_by_width,
    "copy-compute-overlap": read_copy_compute_overlap,
    "scaling-study": read_scaling_study,
    "speedrun": read_speedrun,
}


def test_every_benchmark_has_a_reader():
    assert list(READERS) == list(BENCHMARKS)


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_an_h200_record_of_every_benchmark_is_read_as_the_chapters_read_it(records, name):
    record = _h200(records, name)
    assert record.environment["gpu"] == H200_PROPERTIES
    assert f"Measured on {H200} (cuda)" in provenance(record)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnlistedGPUWarning)  # the H200 has a row
        READERS[name](record)


def test_the_records_of_two_gpus_load_side_by_side_and_a_section_takes_one(records):
    names = ["copy-bandwidth", "roofline", "host-transfers"]
    assert {r.device_name for r in load_records(records, "roofline")} >= {H100, H200}
    section = section_records(names, records)
    assert section.gpu == H200  # as many benchmarks as the H100, and newer
    assert all(r.device_name == H200 for name in names for r in section[name])
    assert section_records(names, records, gpu=H100)["roofline"][0].device_name == H100


def test_a_partial_pass_on_the_new_gpu_leaves_a_section_on_the_gpu_that_measured_it_all(
    tmp_path,
):
    names = ["copy-bandwidth", "roofline", "host-transfers"]
    for path in (ROOT / "book" / "records").glob("*--cuda--*.json"):
        shutil.copy(path, tmp_path / path.name)
    write_record(as_h200(records_for("roofline", "cuda", tmp_path)[0]), tmp_path)
    assert records_for("roofline", "cuda", tmp_path)[0].device_name == H200  # newest first
    section = section_records(names, tmp_path)
    assert section.gpu == H100 and section.coverage == {H100: 3, H200: 1}
    assert section["roofline"][0].device_name == H100


def test_the_case_study_strays_are_explained_only_in_records_made_before_the_fix():
    from trainfast.profiling.case_study import LOSS_TOLERANCE
    from trainfast.profiling.loss_strays import SHARED_GENERATOR, TOLERANCE_ASSUMPTIONS, loss_strays

    (h100,) = records_for("profiling-case-study", "cuda", gpu=H100)  # made before 757a110
    reading = loss_strays(h100)
    assert reading.explanation == SHARED_GENERATOR and not reading.contradiction
    assert len(reading.strays) == 8 and reading.worst == pytest.approx(0.156, abs=1e-3)
    assert "8 of its 10 runs strayed" in reading.sentence()
    one = [{**row, "loss_deviation": 0.0} for row in h100.rows]
    one[4] = {**one[4], "loss_deviation": 0.01}  # + bf16 alone: not the shared generator's pattern
    odd = loss_strays(replace(h100, rows=one))
    assert odd.contradiction and "`+ bf16` by 0.01 against 0.005, which assumes bf16" in (
        odd.sentence()
    )
    assert set(LOSS_TOLERANCE.values()) <= set(TOLERANCE_ASSUMPTIONS)
    (roofline,) = records_for("roofline", "cuda", gpu=H100)
    with pytest.raises(ValueError, match="Not a profiling-case-study record: 'roofline'"):
        loss_strays(roofline)
