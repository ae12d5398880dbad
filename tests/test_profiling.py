"""The profiling chapter: the one timer (against torch's and Triton's, and the only one in the
package), traces, the case study's fixes, the benchmarks, the exercises and the chapter."""

from __future__ import annotations

import ast
import contextlib
import gzip
import json
import statistics
import time
from pathlib import Path

import pytest
import torch
import trainfast
from trainfast.profiling import profile_steps
from trainfast.profiling.case_study import (
    FIXES,
    LOSS_HORIZON,
    LOSS_TOLERANCE,
    CaseStudy,
    CaseStudyConfig,
    Fixes,
    case_study_dataset,
    compare_fixes,
    cumulative_fixes,
    loss_deviation,
    train_with_fixes,
)
from trainfast.profiling.compilation import use_compile_cache
from trainfast.profiling.text import TokenWindows, WordTokenizer
from trainfast.timing import Timing, benchmark, benchmark_side_by_side, timestamp

# --- the timing harness ----------------------------------------------------------------------


def test_benchmark_calls_warmup_then_repeats_times_number_and_keeps_every_sample():
    calls = []
    timing = benchmark(lambda: calls.append(1), warmup=2, repeats=5, number=3, device="cpu")
    assert len(calls) == 2 + 5 * 3
    assert isinstance(timing, Timing) and len(timing.samples) == 5
    assert timing.median == statistics.median(timing.samples)
    q1, _, q3 = statistics.quantiles(timing.samples, n=4, method="inclusive")
    assert timing.iqr == pytest.approx(q3 - q1)
    assert timing.device == "cpu" and timing.threads == torch.get_num_threads()
    assert timing.clocks is None  # no nvidia-smi readings for a CPU


def test_benchmark_measures_seconds_per_call(monkeypatch):
    """Seconds per call, not per sample of ``number`` calls: on a clock that only the timed
    function advances (4 ms a call) the median is 4 ms exactly, however busy the machine is; a
    real sleep never returns early, so a real timing is at least its length (its upper end is
    the machine's load, which a test must not depend on)."""
    import trainfast.timing as timing_module

    timing = benchmark(lambda: time.sleep(0.004), warmup=1, repeats=5, number=2, device="cpu")
    assert timing.median >= 0.004, timing
    now = [100.0]

    def call() -> None:
        now[0] += 0.004

    monkeypatch.setattr(timing_module.time, "perf_counter", lambda: now[0])
    fake = benchmark(call, warmup=1, repeats=5, number=3, device="cpu")
    assert fake.median == pytest.approx(0.004, abs=1e-12), fake


def test_benchmark_agrees_with_torch_utils_benchmark():
    from torch.utils.benchmark import Timer

    def work() -> None:
        time.sleep(0.003)

    ours = benchmark(work, warmup=1, repeats=9, device="cpu").median
    theirs = (
        Timer(stmt="work()", globals={"work": work}).blocked_autorange(min_run_time=0.05).median
    )
    assert 0.7 < ours / theirs < 1.4, (ours, theirs)


def test_benchmark_passes_errors_through_unchanged():
    error = KeyError("boom")

    def broken() -> None:
        raise error

    with pytest.raises(KeyError) as caught:
        benchmark(broken, device="cpu")
    assert caught.value is error


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"repeats": 0}, "repeats: 0"), ({"warmup": -1}, "warmup: -1"), ({"number": 0}, "number: 0")],
)
def test_benchmark_rejects_bad_counts_naming_the_value(settings, message):
    with pytest.raises(ValueError, match=message):
        benchmark(lambda: None, device="cpu", **settings)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_benchmark_on_cuda_agrees_with_triton_do_bench():
    from triton.testing import do_bench

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    ours = benchmark(lambda: a @ a, warmup=5, repeats=50, device="cuda")
    theirs = do_bench(lambda: a @ a, warmup=25, rep=100, return_mode="median") / 1e3  # ms -> s
    assert 0.8 < ours.median / theirs < 1.25, (ours, theirs)
    assert ours.clocks is None or "clocks.sm" in ours.clocks["before"]


def test_benchmark_side_by_side_takes_turns_and_times_each_function():
    order = []
    timings = benchmark_side_by_side(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")},
        warmup=1,
        repeats=3,
        number={"a": 1, "b": 2},
        device="cpu",
    )
    assert order == ["a", "b"] + ["a", "b", "b"] * 3  # one warm-up call each, then turns
    assert list(timings) == ["a", "b"] and timings["b"].number == 2
    assert all(len(t.samples) == 3 for t in timings.values())
    with pytest.raises(ValueError, match="nothing to time"):
        benchmark_side_by_side({}, device="cpu")
    with pytest.raises(ValueError, match="keys"):
        benchmark_side_by_side({"a": lambda: None}, number={"b": 1}, device="cpu")


def test_before_sample_runs_untimed_before_every_sample():
    events = []
    timing = benchmark(
        lambda: events.append("fn"),
        warmup=1,
        repeats=3,
        number=2,
        device="cpu",
        before_sample=lambda: (events.append("before"), time.sleep(0.01)),
    )
    assert events == ["fn"] + ["before", "fn", "fn"] * 3
    assert timing.median < 0.005  # the 10 ms sleep before each sample is not in the samples


def test_cuda_samples_start_and_end_on_an_idle_device(monkeypatch):
    """On a GPU every sample is bracketed by synchronisations, so that a host-bound function
    timed after a GPU-bound one is not hidden behind the other's queued kernels. Checked on a
    CPU with a fake CUDA clock that logs what the harness asks of it."""
    from trainfast import timing

    log: list[str] = []

    class FakeEvent:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.stamp = 0.0

        def record(self) -> None:
            log.append("record")
            self.stamp = float(len(log))

        def elapsed_time(self, end: FakeEvent) -> float:
            return end.stamp - self.stamp  # "milliseconds"

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    fns = {"gpu_bound": lambda: log.append("a"), "host_bound": lambda: log.append("b")}
    samples = timing.cuda_event_samples(
        fns, {"gpu_bound": 1, "host_bound": 2}, torch.device("cuda", 0), 2, None
    )
    one_round = "sync record a record sync sync record b b record sync".split()
    assert log == one_round * 2
    assert samples == {"gpu_bound": [2e-3, 2e-3], "host_bound": [1.5e-3, 1.5e-3]}
    # before_sample's device work (a cache flush) is queued ahead of the start event with no
    # wait in between, as do_bench does: the GPU is busy with it while the host launches fn
    log.clear()
    timing.cuda_event_samples(
        {"a": lambda: log.append("a")},
        {"a": 1},
        torch.device("cuda", 0),
        1,
        lambda: log.append("flush"),
    )
    assert log == "sync flush record a record sync".split()


def test_timestamp_is_the_host_clock_after_the_device_is_idle():
    first = timestamp()
    time.sleep(0.002)
    assert timestamp("cpu") - first >= 0.002
    if torch.cuda.is_available():
        assert timestamp("cuda") >= first


def test_nvidia_smi_is_asked_about_the_gpu_by_uuid_not_by_cuda_index(tmp_path, monkeypatch):
    """CUDA's index 0 may be nvidia-smi's GPU 3 (CUDA_VISIBLE_DEVICES=3): ask by UUID."""
    import types
    import uuid

    from trainfast.device import nvidia_smi_id, nvidia_smi_query

    raw = uuid.UUID("58d39a4f-e1b2-4c6d-8e9f-0a1b2c3d4e5f")
    asked = []

    def properties(index: int) -> types.SimpleNamespace:
        asked.append(index)
        return types.SimpleNamespace(uuid=types.SimpleNamespace(bytes=raw.bytes))

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    assert nvidia_smi_id(torch.device("cuda", 1)) == "GPU-58d39a4f-e1b2-4c6d-8e9f-0a1b2c3d4e5f"
    assert asked == [1]
    with pytest.raises(ValueError, match="cpu"):
        nvidia_smi_id(torch.device("cpu"))
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\necho "${1#--id=}"\n')  # answers with the --id it was given
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    answer = nvidia_smi_query(["uuid"], torch.device("cuda", 1))
    assert answer == {"uuid": "GPU-58d39a4f-e1b2-4c6d-8e9f-0a1b2c3d4e5f"}


# --- one timer in the package ----------------------------------------------------------------

PACKAGE = Path(trainfast.__file__).parent

#: Names that read a clock (as the end of a dotted name, or imported from the module on the left).
_CLOCKS = (
    "perf_counter",
    "perf_counter_ns",
    "monotonic",
    "monotonic_ns",
    "process_time",
    "process_time_ns",
    "time_ns",
    "time.time",
    "cuda.Event",
    "datetime.now",
    "datetime.utcnow",
    "benchmark.Timer",
    "timeit",
)

#: Clock reads that are not measurements, each with its reason; every other one is an error.
ALLOWED_CLOCKS = {
    ("timing.py", "perf_counter"): "the harness itself: its one host clock",
    ("timing.py", "cuda.Event"): "the harness itself: its one device clock",
    (
        "distributed/launch.py",
        "monotonic",
    ): "deadlines of the launcher's timeouts, not a measurement",
    ("distributed/launch.py", "time.time"): "a rank's failure date, to tell which failed first",
    ("distributed/measurements/launchers.py", "time.time"): "a failure's date, across processes",
    ("records.py", "datetime.now"): "the date a record was created, not a duration",
    ("gpu_pass/steps.py", "perf_counter"): "how long a step's subprocess ran, for the summary",
    ("gpu_pass/run.py", "perf_counter"): "how much of the pass's --budget is left",
    ("gpu_pass/run.py", "datetime.now"): "the date the pass's summary was written",
    ("gpu_pass/step_commands.py", "perf_counter"): "how long a chapter took, for the summary",
    ("gpu_pass/step_commands.py", "time.time"): "file dates, to find the records a step wrote",
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def clock_reads(source: str) -> set[tuple[int, str]]:
    """Every (line, clock) in ``source`` that names one of ``_CLOCKS`` (attribute or import)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Attribute):
            names = [_dotted(node)]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            for clock in _CLOCKS:
                if name == clock or name.endswith("." + clock):
                    found.add((node.lineno, clock))
    return found


def test_clock_reads_finds_every_way_of_reading_a_clock():
    source = (
        "import time\nfrom time import perf_counter as pc\nimport timeit\n"
        "a = time.perf_counter()\nb = time.time()\nc = torch.cuda.Event(enable_timing=True)\n"
        "d = datetime.datetime.now()\ne = time.monotonic_ns()\nf = time.sleep(1)\n"
    )
    assert clock_reads(source) == {
        (2, "perf_counter"),
        (3, "timeit"),
        (4, "perf_counter"),
        (5, "time.time"),
        (6, "cuda.Event"),
        (7, "datetime.now"),
        (8, "monotonic_ns"),
    }


def test_the_package_has_one_timer():
    """Every clock read in trainfast is the harness's, or allowed above for a stated reason."""
    seen = set()
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        for line, clock in sorted(clock_reads(path.read_text())):
            seen.add((relative, clock))
            if (relative, clock) not in ALLOWED_CLOCKS:
                unexplained.append(f"{relative}:{line}: {clock}")
    assert not unexplained, (
        "time through trainfast.timing.benchmark (or timestamp), not a clock of your own: "
        + ", ".join(unexplained)
    )
    assert seen == set(ALLOWED_CLOCKS), f"stale allow-list entries: {set(ALLOWED_CLOCKS) - seen}"


# --- traces ----------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _tiny_study(**fixes: bool) -> CaseStudy:
    return CaseStudy(Fixes(**fixes), device="cpu")


def test_profile_steps_writes_a_small_gzipped_trace_with_the_named_ranges(tmp_path):
    study = _tiny_study()
    profile = profile_steps(
        lambda: study.run(1), wait=1, warmup=1, active=2, out_dir=tmp_path, record_shapes=True
    )
    assert profile.trace == tmp_path / "trace.json.gz"
    assert profile.trace.stat().st_size < 1_000_000  # small enough to put on a web page
    with gzip.open(profile.trace, "rt") as file:
        trace = json.load(file)  # valid JSON: Perfetto and chrome://tracing read it
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"data", "forward", "backward", "optimizer"} <= names
    assert sum(name.startswith("ProfilerStep#") for name in names if name) == 2  # active only
    assert "aten::mm" in names or "aten::addmm" in names
    assert len(study.losses()) == 4  # wait + warmup + active steps all ran
    # the table is the profiler's, and its rows say the same as the trace
    assert "Self CPU" in profile.table and "aten::" in profile.table
    forward = profile.operator("forward")
    assert forward.calls == 2 and forward.total_cpu_s >= forward.self_cpu_s > 0
    assert profile.operators == sorted(profile.operators, key=lambda r: r.self_cpu_s, reverse=True)
    with pytest.raises(KeyError, match="aten::nothing"):
        profile.operator("aten::nothing")


def test_profile_steps_asks_for_the_gpu_kernels_on_cuda(monkeypatch, tmp_path):
    from torch.profiler import ProfilerActivity
    from trainfast.profiling import traces

    assert traces.profiler_activities("cpu") == [ProfilerActivity.CPU]
    assert traces.profiler_activities(None) == [ProfilerActivity.CPU]
    assert traces.profiler_activities("cuda:0") == [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    asked = {}

    class Stop(Exception):
        pass

    def fake_profile(**settings):
        asked.update(settings)
        raise Stop

    monkeypatch.setattr(traces, "profile", fake_profile)
    with pytest.raises(Stop):
        profile_steps(lambda: None, out_dir=tmp_path, device="cuda")
    assert ProfilerActivity.CUDA in asked["activities"]


def test_the_chapter_profiles_on_its_device():
    """Without ``device=`` the profiler records no kernel on a GPU: every call must pass it."""
    page = (ROOT / "book" / "profiling.md").read_text()
    calls = page.split("profile_steps(")[1:]
    assert calls
    for call in calls:
        arguments = call[: call.index(")\n")]
        assert "device=device" in arguments, arguments


def test_operator_table_is_markdown_per_step_with_shares_of_self_time(tmp_path):
    from trainfast.profiling.traces import OperatorTime, StepProfile, operator_table

    def row(name: str, self_cpu: float, device: float = 0.0) -> OperatorTime:
        return OperatorTime(name, 4, self_cpu, 2 * self_cpu, device, device, 0)

    cpu = StepProfile("", [row("aten::mm", 0.006), row("a|b", 0.002)], tmp_path / "t", 2)
    lines = operator_table(cpu).splitlines()
    assert lines[0].startswith("| operator or range | calls per step | self CPU (ms)")
    assert "device" not in lines[0] and len(lines) == 4
    assert lines[2] == "| `aten::mm` | 2 | 3 | 6 | 75.0% |"
    assert "a\\|b" in lines[3]  # a | in a name cannot split the row
    gpu = StepProfile("", [row("aten::mm", 0.001, 0.003), row("x", 0.004, 0.001)], tmp_path, 1)
    assert "self device (ms)" in operator_table(gpu) and "75.0%" in operator_table(gpu, rows=1)
    with pytest.raises(ValueError, match="rows: 0"):
        operator_table(cpu, rows=0)


def test_trace_times_measures_busy_idle_and_overlap_in_a_synthetic_trace(tmp_path):
    from trainfast.profiling import trace_times

    def event(name: str, cat: str, ts: float, dur: float) -> dict:
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}

    events = [
        event("ProfilerStep#1", "user_annotation", 100, 100),  # the span: 100 to 300 µs
        event("ProfilerStep#2", "user_annotation", 200, 100),
        event("aten::mm", "cpu_op", 90, 30),  # clipped to 100-120
        event("aten::empty", "cpu_op", 110, 5),  # nested: counts once
        event("aten::add", "cpu_op", 200, 50),
        event("gemm", "kernel", 115, 40),  # 115-155
        event("Memcpy HtoD", "gpu_memcpy", 240, 100),  # clipped to 240-300
        event("cudaLaunchKernel", "cuda_runtime", 100, 200),  # not device work
        {"ph": "i", "name": "marker", "ts": 150},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    times = trace_times(path)
    assert times.span_s == pytest.approx(200e-6)
    assert times.host_busy_s == pytest.approx(70e-6)  # 100-120 and 200-250
    assert times.device_busy_s == pytest.approx(100e-6)  # 115-155 and 240-300
    assert times.overlap_s == pytest.approx(15e-6)  # 115-120 and 240-250
    assert times.device_idle_s == pytest.approx(100e-6)
    assert times.host_busy_fraction == pytest.approx(0.35)
    path.write_text(json.dumps({"traceEvents": events[2:]}))
    with pytest.raises(ValueError, match="no ProfilerStep"):
        trace_times(path)


def test_allocated_bytes_timeline_follows_allocs_and_completed_frees():
    from trainfast.profiling.traces import allocated_bytes_timeline

    events = [
        {"action": "segment_alloc", "size": 2**21},
        {"action": "alloc", "size": 512},
        {"action": "alloc", "size": 1024},
        {"action": "free_requested", "size": 512},  # still held until the stream is done
        {"action": "free_completed", "size": 512},
        {"action": "free_completed", "size": 4096},  # allocated before recording began
    ]
    snapshot = {"segments": [], "device_traces": [events]}
    assert allocated_bytes_timeline(snapshot) == [0, 512, 1536, 1536, 1024, -3072]
    with pytest.raises(ValueError, match="device_index: 1"):
        allocated_bytes_timeline(snapshot, device_index=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_allocated_bytes_timeline_of_a_real_snapshot():
    from trainfast.profiling.traces import allocated_bytes_timeline

    torch.cuda.memory._record_memory_history(max_entries=1000)
    try:
        x = torch.empty(2**20, device="cuda")  # 4 MiB
        del x
        torch.cuda.synchronize()
        timeline = allocated_bytes_timeline(torch.cuda.memory._snapshot())
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert max(timeline) >= 4 * 2**20 and timeline[-1] <= max(timeline) - 4 * 2**20


def test_trace_times_of_a_cpu_profile_sees_operators_and_no_gpu(tmp_path):
    from trainfast.profiling import trace_times

    study = _tiny_study()
    profile = profile_steps(lambda: study.run(1), wait=0, warmup=1, active=2, out_dir=tmp_path)
    times = trace_times(profile)
    assert 0 < times.host_busy_s < times.span_s
    assert times.device_busy_s == times.overlap_s == 0.0
    steps = sum(r.total_cpu_s for r in profile.operators if r.name.startswith("ProfilerStep"))
    assert times.span_s == pytest.approx(steps, rel=0.05)  # the steps follow each other


def test_profile_steps_records_memory_and_rejects_bad_schedules(tmp_path):
    profile = profile_steps(
        lambda: torch.ones(1024, 1024).sum(),
        wait=0,
        warmup=0,
        active=1,
        out_dir=tmp_path,
        profile_memory=True,
    )
    assert profile.operator("aten::empty").self_cpu_memory_bytes >= 4 * 1024 * 1024
    for settings, message in [({"active": 0}, "active: 0"), ({"wait": -1}, "wait: -1")]:
        with pytest.raises(ValueError, match=message):
            profile_steps(lambda: None, out_dir=tmp_path, **settings)


# --- the case study's data -------------------------------------------------------------------


def test_token_windows_tokenize_on_the_fly_and_cover_the_text_once():

    text = "the cat sat on the mat . the dog sat on the log ."
    tokenizer = WordTokenizer(text, vocab_size=5)
    assert tokenizer.encode("the sat on zebra") == [0, 1, 2, 4]  # 4 is <unk>
    windows = TokenWindows(text, tokenizer, seq_len=4)
    assert len(windows) == (14 - 1) // 4
    tokens, targets = windows[1]
    every = tokenizer.encode(text)
    assert tokens.tolist() == every[4:8] and targets.tolist() == every[5:9]
    with pytest.raises(ValueError, match="vocab_size: 1"):
        WordTokenizer(text, vocab_size=1)
    with pytest.raises(ValueError, match="Text too short"):
        TokenWindows("a b", tokenizer, seq_len=4)


# --- the case study's fixes keep the loss curve ----------------------------------------------

STEPS = LOSS_HORIZON  # the horizon the tolerances are stated for


@pytest.fixture(scope="module")
def baseline_losses():

    torch.set_num_threads(1)
    return train_with_fixes(Fixes(), STEPS)


@pytest.mark.parametrize(
    "fix", ["data_workers", "no_item", "bf16", "fused_optimizer", "sdpa", "foreach_optimizer"]
)
def test_each_fix_alone_keeps_the_loss_curve(fix, baseline_losses):

    losses = train_with_fixes(Fixes(**{fix: True}), STEPS)
    assert loss_deviation(losses, baseline_losses) <= LOSS_TOLERANCE[fix]
    assert losses[-1] < losses[0] - 0.5  # and it trains


def test_every_fix_this_cpu_runs_keeps_the_loss_curve_compile_included(baseline_losses):
    """The chapter's chain (compile included, same graph as the chapter: its cache is reused)."""
    use_compile_cache(ROOT / "_build" / "torchinductor")
    chain = cumulative_fixes(torch.device("cpu"), skip=["bf16"])
    assert list(chain) == [
        "baseline",
        "+ data_workers",
        "+ no_item",
        "+ fused_optimizer",
        "+ sdpa",
        "+ compile",
    ]
    for name, fixes in list(chain.items())[1:]:
        tolerance = max(LOSS_TOLERANCE[fix] for fix in fixes.enabled)
        deviation = loss_deviation(train_with_fixes(fixes, STEPS), baseline_losses)
        assert deviation <= tolerance, (name, deviation, tolerance)


def test_loader_workers_yield_the_baselines_batches_across_epochs_with_the_gpu_config():
    """On an H100, '+ data_workers' strayed 16 % from the baseline's loss within the horizon.
    The GPU's config has 13 batches an epoch, and the second epoch's order came from a generator
    that the baseline's loader (a fresh iterator each epoch, which draws a worker seed from it)
    had advanced once more than the persistent workers' loader had. The config is the GPU's;
    the batches are made on this CPU, as on the GPU (in the loader, before the copy)."""
    config = CaseStudyConfig.for_device("cuda")  # only a config: builds nothing on a GPU
    epoch = len(case_study_dataset(config.shape.vocab_size, config.shape.seq_len))
    epoch //= config.shape.batch_size
    assert epoch < LOSS_HORIZON  # the chapter's curves cross an epoch boundary
    steps = 2 * epoch + 1

    def batches(fixes: Fixes) -> list[tuple[torch.Tensor, torch.Tensor]]:
        study = CaseStudy(fixes, config, device="cpu")
        try:
            return [next(study.batches) for _ in range(steps)]
        finally:
            study.close()

    baseline, workers = batches(Fixes()), batches(Fixes(data_workers=True))
    for step, ((tokens, targets), (w_tokens, w_targets)) in enumerate(
        zip(baseline, workers, strict=True)
    ):
        assert torch.equal(tokens, w_tokens) and torch.equal(targets, w_targets), f"step {step}"


def test_the_float32_tolerance_catches_a_one_percent_change_of_the_learning_rate(baseline_losses):

    nudged = train_with_fixes(Fixes(), STEPS, CaseStudyConfig(lr=1.01 * CaseStudyConfig().lr))
    assert loss_deviation(nudged, baseline_losses) > 2 * LOSS_TOLERANCE["compile"]


def test_cuda_only_fixes_are_refused_on_a_cpu_with_a_reason():

    for fixes in (Fixes(pinned_memory=True), Fixes(compile=True, cuda_graphs=True)):
        with pytest.raises(ValueError, match="needs a CUDA device"):
            CaseStudy(fixes, device="cpu")
    with pytest.raises(ValueError, match="cuda_graphs=True needs compile=True"):
        Fixes(cuda_graphs=True)


def test_cumulative_fixes_add_one_fix_at_a_time():

    chain = cumulative_fixes(torch.device("cuda"))  # only names the device, builds nothing
    assert list(chain)[1:] == [f"+ {name}" for name in FIXES]
    enabled = [fixes.enabled for fixes in chain.values()]
    assert all(later[:-1] == earlier for earlier, later in zip(enabled, enabled[1:], strict=False))
    with pytest.raises(ValueError, match="Unknown fixes: \\['fast'\\]"):
        cumulative_fixes(torch.device("cpu"), skip=["fast"])


def test_compare_fixes_builds_each_run_after_the_last_one_has_stopped_its_workers(monkeypatch):
    """A run's loader workers would tokenize its next batches while another run is timed."""
    import multiprocessing

    from trainfast.profiling import case_study

    built, alive_at_build = [], []

    class Watched(case_study.CaseStudy):
        def __init__(self, *args, **kwargs) -> None:
            # every earlier run has trained and been closed, and no worker process is left
            assert all(run.logged and run.loader is None for run in built)
            alive_at_build.append(len(multiprocessing.active_children()))
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(case_study, "CaseStudy", Watched)
    workers = Fixes(data_workers=True)
    rows, curves = compare_fixes(
        {"a": workers, "b": workers, "c": Fixes()}, steps_per_sample=1, rounds=4, passes=2
    )
    assert alive_at_build == [0] * 6 and len(built) == 6  # two passes of three runs
    assert [row["samples"] for row in rows] == [4, 4, 4]
    assert all(len(curve) == 1 + 1 + 2 for curve in curves.values())  # the first pass's
    assert rows[0]["loss_deviation"] == 0.0
    with pytest.raises(ValueError, match="passes: 3"):
        compare_fixes({"c": Fixes()}, rounds=4, passes=3)


def test_compare_fixes_times_each_run_and_compares_curves():
    rows, curves = compare_fixes(
        {"baseline": Fixes(), "fused": Fixes(fused_optimizer=True)},
        steps_per_sample=2,
        rounds=2,
        warmup_samples=0,
    )
    assert [row["variant"] for row in rows] == ["baseline", "fused"]
    assert rows[0]["speedup"] == 1.0 and rows[1]["fixes"] == "fused_optimizer"
    assert all(len(curve) == 1 + 2 * 2 for curve in curves.values())
    assert rows[1]["loss_deviation"] <= rows[1]["tolerance"] == 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_fix_keeps_the_loss_curve_on_cuda():
    """Pinned memory and CUDA graphs only run here; the chain includes bf16 on a GPU."""

    chain = cumulative_fixes(torch.device("cuda"))
    baseline = train_with_fixes(chain.pop("baseline"), STEPS, device="cuda")
    for name, fixes in chain.items():
        tolerance = max(LOSS_TOLERANCE[fix] for fix in fixes.enabled)
        deviation = loss_deviation(train_with_fixes(fixes, STEPS, device="cuda"), baseline)
        assert deviation <= tolerance, (name, deviation, tolerance)


# --- pitfalls, overhead, loading, compilation helpers ----------------------------------------


def test_timing_without_synchronize_is_flagged_and_the_pitfall_rows_are_complete():
    from trainfast.profiling.pitfalls import cold_and_warm, wrong_and_right, zeros_and_random

    cpu = torch.device("cpu")
    assert not benchmark(lambda: None, device="cpu", synchronize=False).synchronized
    rows = wrong_and_right(cpu, 32, torch.float32, 3) + zeros_and_random(
        cpu, 32, torch.float32, 3, 1
    )
    rows += cold_and_warm(cpu, 2**20, 3)
    assert len(rows) == 7 and all(set(row) == set(rows[0]) for row in rows)
    assert rows[2]["ratio"] == 1.0 and rows[3]["ratio"] == 1.0 and rows[6]["ratio"] == 1.0
    assert "GB/s" in rows[5]["note"]


def test_cold_and_warm_hide_the_launch_of_their_one_call_a_sample(monkeypatch):
    """Both ways time one call a sample behind queued device work (a flush, or a busy-wait
    kernel on a GPU), so neither times a launch the other hides; on a GPU the rows say so."""
    from trainfast.profiling import pitfalls

    asked = []

    def fake_benchmark(fn, **kwargs):
        asked.append(kwargs)
        return benchmark(fn, **{**kwargs, "device": "cpu"})

    monkeypatch.setattr(pitfalls, "benchmark", fake_benchmark)
    slept = []
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append)
    monkeypatch.setattr(pitfalls, "flush_cache", lambda device: lambda: slept.append("flush"))
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None: real_randn(*shape))
    rows = pitfalls.cold_and_warm(torch.device("cuda"), 2**16, 2)
    assert [kw.get("number", 1) for kw in asked] == [1, 1]
    assert all(kw["before_sample"] is not None for kw in asked)
    assert slept == [2_000_000] * 2 + ["flush"] * 2
    assert all(pitfalls.QUEUED in row["way"] for row in rows)
    assert pitfalls.QUEUED not in pitfalls.cold_and_warm(torch.device("cpu"), 2**16, 2)[0]["way"]


def test_flush_cache_writes_the_buffer_it_allocated():
    from trainfast.profiling.pitfalls import flush_cache

    flush = flush_cache("cpu", n_bytes=4096)
    assert flush().numel() == 1024 and not flush().any()


def test_overhead_helpers_measure_rates_and_refuse_cuda_graphs_on_a_cpu():
    from trainfast.profiling.overhead import (
        cuda_graph,
        dispatch_rate,
        launch_overhead,
        small_kernels,
        time_per_op,
    )

    x = torch.randn(8)
    expected = x
    for _ in range(3):
        expected = torch.tanh(expected * 1.01 + 0.01)
    torch.testing.assert_close(small_kernels(x, 3), expected)
    assert 1e3 < dispatch_rate(number=100, repeats=3) < 1e8  # between 1 µs and 1 ms per op
    rows = time_per_op([1, 2**22], repeats=3)
    assert rows[1]["seconds"] > rows[0]["seconds"]  # 4 M elements cost more than one
    (eager,) = launch_overhead(torch.device("cpu"), repeats=2, number=2, compiled=False)
    assert eager["mode"] == "eager" and eager["speedup"] == 1.0
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA tensor"):
        cuda_graph(small_kernels, x)


def test_autocast_matmul_ratio_times_both_precisions_side_by_side(monkeypatch):
    from trainfast.profiling import overhead

    seen_dtypes = []
    linear = torch.nn.functional.linear

    def watched(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = linear(x, weight)
        seen_dtypes.append(out.dtype)
        return out

    monkeypatch.setattr(torch.nn.functional, "linear", watched)
    rows = overhead.autocast_matmul_ratio([8, 64], tokens=16, repeats=2)
    assert [row["width"] for row in rows] == [8, 64]
    for row in rows:
        assert row["ratio"] == pytest.approx(row["bf16_us"] / row["fp32_us"])
    assert {torch.float32, torch.bfloat16} == set(seen_dtypes)  # autocast really ran in bf16
    with pytest.raises(ValueError, match="width: 0"):
        overhead.autocast_matmul_ratio([0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replays_the_captured_function_on_new_inputs():
    from trainfast.profiling.overhead import cuda_graph, small_kernels

    x = torch.randn(1024, device="cuda")
    replay = cuda_graph(small_kernels, x)
    y = torch.randn(1024, device="cuda")
    torch.testing.assert_close(replay(y), small_kernels(y))


def test_loader_seconds_times_whole_passes_and_consumes_every_batch():
    from trainfast.profiling.loading import loader_seconds

    seen = []
    data = torch.utils.data.TensorDataset(torch.arange(10))
    timing = loader_seconds(data, batch_size=4, epochs=2, repeats=2, consume=seen.append)
    assert len(timing.samples) == 2 and len(seen) == 2 * 2 * 3  # repeats x epochs x batches
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin_memory"):
            loader_seconds(data, batch_size=4, pin_memory=True)


def test_counting_backend_counts_graph_breaks_and_recompiles():
    from trainfast.profiling.compilation import CountingBackend, cache_counters
    from trainfast.profiling.exercises import clip_by_norm_with_break

    torch._dynamo.reset()
    counter = CountingBackend()
    torch.compile(clip_by_norm_with_break, backend=counter)(torch.randn(10) * 10, 1.0)
    assert counter.compiles == 2  # a graph before the .item() break, one after it
    assert "norm" in counter.operators()
    torch._dynamo.reset()
    counter = CountingBackend()
    compiled = torch.compile(torch.tanh, backend=counter, dynamic=False)
    for n in (3, 4, 5):
        compiled(torch.randn(n))
    assert counter.compiles == 3
    assert set(cache_counters()) == {
        "fx_graph_hits",
        "fx_graph_misses",
        "aot_autograd_hits",
        "aot_autograd_misses",
    }


def test_cudagraph_skip_reasons_reports_what_torch_compile_skips_silently():
    from torch._dynamo.utils import counters
    from trainfast.profiling.compilation import cudagraph_skip_reasons

    def scale_in_place(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)  # a mutated input: one of the rules CUDA graphs need
        return torch.tanh(x).sum()

    torch._dynamo.reset()
    before = counters["inductor"]["cudagraph_skips"]
    x = torch.randn(8)
    reasons = cudagraph_skip_reasons(lambda: torch.compile(scale_in_place, backend="cudagraphs")(x))
    assert len(reasons) == 1 and reasons[0].reason.startswith("cpu device"), reasons
    # the reason without torch's dangling "Found from :", and the line it points at, no path
    assert "Found from" not in str(reasons[0]) and reasons[0].code == "x.mul_(2.0)", reasons
    assert "/" not in str(reasons[0]), reasons
    assert counters["inductor"]["cudagraph_skips"] == before + 1
    torch._dynamo.reset()
    assert cudagraph_skip_reasons(lambda: torch.compile(scale_in_place, backend="eager")(x)) == []
    torch._dynamo.reset()


def test_skip_message_parsing_keeps_the_reason_and_the_code_line():
    from trainfast.profiling.compilation import CudagraphSkip, _skip_from_message

    message = (
        "skipping cudagraphs due to skipping cudagraphs due to mutated inputs (1 instances). "
        'Found from : \n   File "/__w/pytorch/pytorch/x.py", line 4, in f\n    x.mul_(2.0)\n'
    )
    assert _skip_from_message(message) == CudagraphSkip(
        "mutated inputs (1 instances)", "x.mul_(2.0)"
    )
    assert str(_skip_from_message("cpu device (arg0_1)")) == "cpu device (arg0_1)"
    rerecord = "skipping cudagraph due to function 0 exceeding max re-recording limit (=50)"
    assert _skip_from_message(rerecord).reason.startswith("function 0 exceeding")


def test_cudagraph_skip_reasons_ignores_the_logs_records_that_are_not_skips():
    """Past eight shapes torch warns in the same log; that warning, and the info records that
    TORCH_LOGS="cudagraphs" lets through, are not skips."""
    import logging

    from torch._inductor import cudagraph_utils
    from trainfast.profiling.compilation import cudagraph_skip_reasons

    log = getattr(cudagraph_utils, "cudagraphs_log", None) or cudagraph_utils.perf_hint_log
    level = log.level
    log.setLevel(logging.DEBUG)  # as TORCH_LOGS="cudagraphs" would
    try:

        def not_skips() -> None:
            shapes_seen = {(n,): None for n in range(8)}  # eight graphs already recorded
            if hasattr(cudagraph_utils, "maybe_warning_due_to_dynamic_shape"):  # not in torch 2.4
                assert cudagraph_utils.maybe_warning_due_to_dynamic_shape(shapes_seen, (8,))
            log.info("Created 2 graph partitions: 1 cudagraphable, 1 non-cudagraphable")

        assert cudagraph_skip_reasons(not_skips) == []
        skip = cudagraph_skip_reasons(
            lambda: cudagraph_utils.log_cudagraph_skip_and_bump_counter(
                "skipping cudagraphs due to mutated inputs (1 instances)"
            )
        )
        assert [s.reason for s in skip] == ["mutated inputs (1 instances)"], skip
    finally:
        log.setLevel(level)


def test_reduce_overhead_splits_cpu_work_off_instead_of_skipping_the_graph():
    """The chapter says that under reduce-overhead a CPU tensor no longer makes torch skip the
    whole graph: graph partitions (on by default in torch 2.14) run it outside the graphs. The
    cudagraphs backend, which does not partition, still skips (its CPU demonstration)."""
    import types

    from torch._inductor import config
    from torch._inductor.cudagraph_utils import check_multiple_devices_or_any_cpu_nodes

    if not hasattr(config, "graph_partition"):
        pytest.skip(f"torch {torch.__version__}'s Inductor has no graph partitions (the chapter's)")
    assert config.graph_partition is True

    def devices() -> dict:
        node = types.SimpleNamespace(name="arg0_1", users={})
        return {torch.device("cpu"): node, torch.device("cuda", 0): node}

    assert "cpu device (arg0_1)" in check_multiple_devices_or_any_cpu_nodes(devices())
    with config.patch(torch._inductor.list_mode_options("reduce-overhead")):
        assert check_multiple_devices_or_any_cpu_nodes(devices()) is None
        with config.patch(graph_partition=False):
            assert "cpu device" in check_multiple_devices_or_any_cpu_nodes(devices())


def test_a_new_shape_is_not_a_default_reason_to_skip_cuda_graphs():
    """The chapter says reduce-overhead records one graph per shape and skips dynamic-shape
    graphs only when asked (torch/_inductor/config.py, triton.cudagraph_skip_dynamic_graphs)."""
    from torch._inductor import config

    if not hasattr(config.triton, "cudagraph_dynamic_shape_warn_limit"):
        pytest.skip(f"torch {torch.__version__}'s Inductor has no shape warn limit (the chapter's)")
    assert config.triton.cudagraph_skip_dynamic_graphs is False
    assert config.triton.cudagraph_dynamic_shape_warn_limit == 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_reduce_overhead_records_a_graph_per_shape_without_skipping():
    from trainfast.profiling.compilation import cudagraph_skip_reasons

    def pooled(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x).sum()

    torch._dynamo.reset()
    compiled = torch.compile(pooled, mode="reduce-overhead", dynamic=True)

    def calls() -> None:
        for n in (64, 96, 128):
            for _ in range(3):  # warm-up, record, replay
                torch.testing.assert_close(
                    compiled(torch.ones(n, device="cuda")),
                    torch.tanh(torch.ones(n, device="cuda")).sum(),
                )

    assert cudagraph_skip_reasons(calls) == []
    torch._dynamo.reset()


def test_the_cold_compile_benchmark_leaves_the_process_able_to_compile(tmp_path):
    """compile-by-width compiles in a fresh, deleted-afterwards Inductor cache; a compile after it
    in the same process must still work (torch 2.4 kept a header path inside the deleted folder
    and failed: the version floor's fused-linear-gelu record, measured after it, did)."""
    import subprocess
    import sys

    script = tmp_path / "after.py"
    script.write_text(
        "import torch\n"
        "import trainfast.profiling.overhead as overhead\n"
        "from trainfast.profiling.benchmarks import compile_by_width_record\n"
        "def one_compile(widths, device, tokens, repeats):\n"
        "    torch.compile(lambda x: (x * 2).sin())(torch.randn(8))\n"
        "    return [dict(width=8, eager_us=1.0, compiled_us=1.0, eager_iqr_us=0.0,\n"
        "                 compiled_iqr_us=0.0, ratio=1.0, compile_s=1.0)]\n"
        "overhead.compile_speedup_by_width = one_compile\n"
        "compile_by_width_record(torch.device('cpu'), quick=True)\n"
        "print(torch.compile(lambda x: x.cos() + 1)(torch.randn(8)).shape)\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("torch.Size([8])")


def test_use_compile_cache_points_inductor_at_the_folder(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    path = use_compile_cache(tmp_path / "inductor")
    assert path.is_dir() and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # torch before 2.6 kept it beside the other runtime helpers
        from torch._inductor.runtime.runtime_utils import cache_dir

    assert cache_dir() == str(path)


def test_plot_waterfall_draws_one_bar_per_variant_plus_the_total():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from trainfast.profiling.plots import plot_waterfall

    rows = [
        {"variant": "baseline", "step_ms": 10.0, "iqr_ms": 1.0},
        {"variant": "+ a", "step_ms": 8.0, "iqr_ms": 1.0},
        {"variant": "+ b", "step_ms": 9.0, "iqr_ms": 0.5},
        {"variant": "foreach alone", "step_ms": 7.0, "iqr_ms": 0.5},
    ]
    ax = plot_waterfall(rows)
    assert len(ax.patches) == 4 and ax.get_ylabel().endswith("(ms)")  # "alone" is no link
    assert [t.get_text() for t in ax.get_xticklabels()] == ["baseline", "+ a", "+ b", "all fixes"]
    colors = [patch.get_facecolor()[:3] for patch in ax.patches]
    assert colors[1] != colors[2]  # faster and slower are told apart
    with pytest.raises(ValueError, match="needs a baseline"):
        plot_waterfall(rows[:1])


# --- exercises: each check passes the right answer and catches a wrong one --------------------


def test_check_bottleneck():
    from trainfast.profiling.exercises import check_bottleneck

    def busiest_aten_op(p):
        aten = [r for r in p.operators if r.name.startswith("aten::")]
        return max(aten, key=lambda r: r.self_cpu_s).name

    check_bottleneck(busiest_aten_op)
    with pytest.raises(AssertionError, match="answered"):  # total time picks a range, not an op
        check_bottleneck(lambda p: max(p.operators, key=lambda r: r.total_cpu_s).name)
    for no_aten_filter in (  # most self time, but a named range may hold it
        lambda p: p.operators[0].name,
        lambda p: max(p.operators, key=lambda r: r.self_cpu_s).name,
    ):
        with pytest.raises(AssertionError, match="named range: answered 'python loop'"):
            check_bottleneck(no_aten_filter)


def test_check_no_graph_break():
    from trainfast.profiling.exercises import check_no_graph_break, clip_by_norm_with_break

    check_no_graph_break(lambda x, m: x * torch.clamp(m / x.norm(), max=1.0))
    with pytest.raises(AssertionError, match="graph break"):
        check_no_graph_break(clip_by_norm_with_break)
    with pytest.raises(AssertionError, match="values differ"):
        check_no_graph_break(lambda x, m: x * (m / x.norm()))  # also scales short tensors up


def test_check_bucketing(capsys):
    from trainfast.profiling.exercises import check_bucketing

    def pad(tokens, buckets):
        size = min(b for b in buckets if b >= len(tokens))
        return torch.nn.functional.pad(tokens, (0, size - len(tokens)))

    check_bucketing(pad)
    with pytest.raises(AssertionError, match="2 of 2 cases failed"):
        check_bucketing(lambda tokens, buckets: tokens)  # no padding: one shape per length
    assert "compiles for 3 buckets" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="wrong padding"):
        check_bucketing(
            lambda tokens, buckets: torch.nn.functional.pad(tokens, (0, 64 - len(tokens)), value=1)
        )


def test_check_fewer_dispatches():
    from trainfast.profiling.exercises import check_fewer_dispatches

    check_fewer_dispatches(lambda tensors, factors: list(torch._foreach_mul(tensors, factors)))
    with pytest.raises(AssertionError, match="64 operations"):
        check_fewer_dispatches(
            lambda tensors, factors: [t * f for t, f in zip(tensors, factors, strict=True)]
        )
    with pytest.raises(AssertionError, match="differ"):
        check_fewer_dispatches(lambda tensors, factors: list(torch._foreach_mul(tensors, 1.0)))


# --- the chapter -----------------------------------------------------------------------------


def _find_sync(profile, sync_operators=("aten::_local_scalar_dense", "aten::nonzero")) -> str:
    """The chapter's solution: the named part whose time holds a sync operator."""
    from trainfast.profiling.exercises import SYNC_STEP_PARTS

    with gzip.open(profile.trace, "rt") as file:
        events = [e for e in json.load(file)["traceEvents"] if e.get("ph") == "X"]
    parts = [
        e for e in events if e.get("cat") == "user_annotation" and e["name"] in SYNC_STEP_PARTS
    ]
    sync = next((e for e in events if e["name"] in sync_operators), None)
    if sync is None:
        return "no sync found"
    return next(p["name"] for p in parts if p["ts"] <= sync["ts"] <= p["ts"] + p["dur"])


def test_check_find_sync(capsys):
    from trainfast.profiling.exercises import check_find_sync, planted_sync_step

    check_find_sync(_find_sync)
    assert "All 4 cases passed." in capsys.readouterr().out
    with pytest.raises(AssertionError, match="boolean-mask indexing planted in 'prepare'"):
        check_find_sync(lambda profile: _find_sync(profile, ("aten::_local_scalar_dense",)))
    # always the same part: the first case planted elsewhere fails (an answer read from the
    # parts' CPU times, as this test once used, depends on the machine's load)
    with pytest.raises(AssertionError, match="planted in 'log': answered 'compute'"):
        check_find_sync(lambda profile: "compute")
    with pytest.raises(ValueError, match="how: 'print'"):
        planted_sync_step("log", "print")
    with pytest.raises(ValueError, match="part: 'data'"):
        planted_sync_step("data", ".item()")


def test_listings_come_from_the_package():
    import chapters

    assert chapters.listing_problems("profiling") == []


def _shown_lines(block) -> list[str]:
    """The lines a literalinclude shows: its :pyobject:, then :start-at: and :end-at: (Sphinx
    applies them in that order, each to what the one before it left)."""
    import ast

    import chapters

    path = (chapters.chapter_path("profiling").parent / block.argument).resolve()
    lines = path.read_text().splitlines()
    node: ast.AST = ast.parse(path.read_text())
    for name in block.options["pyobject"].split("."):
        node = next(n for n in ast.iter_child_nodes(node) if getattr(n, "name", None) == name)
    shown = lines[node.lineno - 1 : node.end_lineno]
    if "start-at" in block.options:
        shown = shown[next(i for i, x in enumerate(shown) if block.options["start-at"] in x) :]
    if "end-at" in block.options:
        shown = shown[: next(i for i, x in enumerate(shown) if block.options["end-at"] in x) + 1]
    return shown


def test_listings_show_no_restructuredtext_markup():
    """A listing shows its docstring as plain text: :func: roles and double backticks would
    appear verbatim on the page."""
    import re

    import chapters

    markup = re.compile(r":(func|meth|class|data|mod|attr|math|obj):`|``")
    found = []
    for block in chapters.blocks(chapters.chapter_path("profiling").read_text()):
        if block.directive == "literalinclude":
            found += [
                f"{block.options['pyobject']}: {line.strip()}"
                for line in _shown_lines(block)
                if markup.search(line)
            ]
    assert found == [], found


#: Constants the profiling chapter may type: the numbers of its numbered lists (1 to 8), which
#: also cover "inference with batch 1"; the 256 MB buffer that Triton's ``do_bench`` writes to
#: flush the L2 cache (triton.testing); and exercise 4's problem size, 64 tensors (the default
#: of ``check_fewer_dispatches``, a statement of the exercise, not a measurement).
#: Also "3.14", the Python version that changed the multiprocessing default the chapter names.


def test_rank_sum_test_agrees_with_scipy_mann_whitney_exact():
    import random

    from trainfast.timing import rank_sum_test

    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for m, n, shift in [(15, 15, 0.3), (5, 7, 1.0), (10, 12, 0.0), (3, 3, 5.0)]:
        before = [rng.gauss(0.0, 1.0) for _ in range(m)]
        after = [rng.gauss(-shift, 1.0) for _ in range(n)]
        theirs = stats.mannwhitneyu(before, after, method="exact", alternative="two-sided")
        share, p_value = rank_sum_test(before, after)
        assert share == pytest.approx(theirs.statistic / (m * n), rel=1e-12)
        assert p_value == pytest.approx(theirs.pvalue, rel=1e-9)
    assert rank_sum_test([2.0, 3.0, 4.0], [1.0, 1.5, 1.2]) == (1.0, pytest.approx(2 / 20))
    with pytest.raises(ValueError, match="Invalid samples: 0 and 1"):
        rank_sum_test([], [1.0])


def test_paired_sign_test_counts_rounds_and_gives_the_binomial_tail():
    from trainfast.timing import paired_sign_test

    before = [10.0] * 15
    assert paired_sign_test(before, [9.0] * 12 + [11.0] * 3) == (12, pytest.approx(2 * 576 / 2**15))
    assert paired_sign_test(before, [11.0] * 12 + [9.0] * 3) == (3, pytest.approx(2 * 576 / 2**15))
    assert paired_sign_test(before, [9.0] * 8 + [11.0] * 7)[1] == 1.0  # an even split
    assert paired_sign_test([1.0] * 5, [1.0] * 5)[1] == 1.0  # ties are no evidence
    with pytest.raises(ValueError, match="Invalid samples: 2 and 1"):
        paired_sign_test([1.0, 2.0], [1.0])


def test_the_waterfall_colours_follow_the_rank_sum_verdict():
    from trainfast.profiling.plots import fix_verdict

    slow = {"step_ms": 10.0, "samples_ms": [10.0 + 0.1 * i for i in range(8)]}
    fast = {"step_ms": 5.0, "samples_ms": [5.0 + 0.1 * i for i in range(8)]}
    mixed = {"step_ms": 10.0, "samples_ms": [10.05 + 0.1 * i for i in range(8)]}
    assert fix_verdict(slow, fast) == "faster" and fix_verdict(fast, slow) == "slower"
    assert fix_verdict(slow, mixed) == "noise"  # interleaved samples: no evidence either way
    assert fix_verdict({"step_ms": 2.0}, {"step_ms": 1.0}) == "faster"  # no samples: medians


def test_mlp_block_matches_torch_modules():
    from trainfast.profiling.overhead import mlp_block

    torch.manual_seed(0)
    width = 16
    x = torch.randn(5, width)
    norm = torch.nn.LayerNorm(width, elementwise_affine=False)
    up, down = (
        torch.nn.Linear(width, 4 * width, bias=False),
        torch.nn.Linear(4 * width, width, bias=False),
    )
    expected = x + down(torch.nn.GELU()(up(norm(x))))
    actual = mlp_block(x, up.weight, down.weight)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-5)


def test_inductor_fuses_only_the_residual_add_of_the_mlp_block():
    """mlp_block's docstring and the chapter: compiled, the norm and GELU stay kernels of their
    own and only the residual add folds into the second matmul (addmm): four kernels to five."""
    import re

    from torch._inductor.utils import fresh_inductor_cache, run_and_get_code
    from trainfast.profiling.overhead import mlp_block

    torch._dynamo.reset()
    x, w_in, w_out = torch.randn(8, 16), torch.randn(64, 16), torch.randn(16, 64)
    with fresh_inductor_cache():
        _, (code, *_) = run_and_get_code(torch.compile(mlp_block), x, w_in, w_out)
    calls = re.findall(r"^\s+(cpp_fused_\w+|extern_kernels\.\w+)\(", code, flags=re.MULTILINE)
    kinds = [re.sub(r"_\d+$", "", call) for call in calls]
    assert kinds == [
        "cpp_fused_native_layer_norm",
        "extern_kernels.mm",
        "cpp_fused_gelu",
        "extern_kernels.addmm",
    ], calls


def test_compile_speedup_by_width_rows_and_bad_width():
    from trainfast.profiling.overhead import compile_speedup_by_width

    torch.set_num_threads(1)
    rows = compile_speedup_by_width([8, 16], tokens=4, repeats=3, backend="eager")
    assert [row["width"] for row in rows] == [8, 16]
    for row in rows:
        assert row["eager_us"] > 0 and row["compiled_us"] > 0 and row["compile_s"] > 0
        assert row["ratio"] == pytest.approx(row["compiled_us"] / row["eager_us"])
        assert row["eager_iqr_us"] >= 0 and row["compiled_iqr_us"] >= 0
    with pytest.raises(ValueError, match="Invalid width: 0"):
        compile_speedup_by_width([0], backend="eager")


def test_host_to_device_seconds_is_one_direction_of_pcie():
    from trainfast.gpus import GPUS
    from trainfast.profiling.streams import host_to_device_seconds

    h100 = GPUS["H100 SXM 80GB"]
    assert host_to_device_seconds(64 * 2**20, h100) == pytest.approx(
        64 * 2**20 / (h100.pcie_bytes_per_s / 2)
    )
    assert host_to_device_seconds(0, h100) == 0.0
    with pytest.raises(ValueError, match="Invalid nbytes: -1"):
        host_to_device_seconds(-1, h100)


def test_prefetching_can_hide_every_copy_but_each_samples_first():
    """copy_compute_overlap builds a new CudaPrefetcher in every sample, on an idle GPU: of its
    ``steps`` copies the first has no compute to hide behind."""
    import inspect

    from trainfast.gpus import GPUS
    from trainfast.profiling.streams import (
        copy_compute_overlap,
        host_to_device_seconds,
        prefetch_saving_seconds,
    )

    h100 = GPUS["H100 SXM 80GB"]
    copy = host_to_device_seconds(32 * 2**20, h100)
    assert prefetch_saving_seconds(32 * 2**20, h100, 8) == pytest.approx(7 / 8 * copy)
    assert prefetch_saving_seconds(32 * 2**20, h100, 1) == 0.0  # one step: nothing to overlap
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"Invalid steps: {bad!r}"):
            prefetch_saving_seconds(1, h100, bad)
    # the chapter predicts for the benchmark's default batch and steps
    defaults = inspect.signature(copy_compute_overlap).parameters
    assert defaults["steps"].default == 8 and defaults["batch_shape"].default == (8192, 1024)
    assert "CudaPrefetcher(pinned, device)" in inspect.getsource(copy_compute_overlap)


def test_stream_overlap_needs_cuda():
    from trainfast.profiling.streams import CudaPrefetcher, copy_compute_overlap

    with pytest.raises(ValueError, match="needs a CUDA device, got cpu"):
        CudaPrefetcher([torch.zeros(2)], torch.device("cpu"))
    with pytest.raises(ValueError, match="needs a CUDA device, got cpu"):
        copy_compute_overlap(torch.device("cpu"))
    from trainfast.measure import run_benchmark

    with pytest.raises(ValueError, match="needs a CUDA device, got cpu"):
        run_benchmark("copy-compute-overlap", torch.device("cpu"), quick=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prefetcher_delivers_every_batch_unchanged_and_overlap_is_timed():
    from trainfast.profiling.streams import CudaPrefetcher, copy_compute_overlap

    device = torch.device("cuda")
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(256, 64, generator=generator).pin_memory() for _ in range(5)]
    received = [batch * 1.0 for batch in CudaPrefetcher(batches, device)]  # computed on them
    assert len(received) == len(batches)
    for host, on_device in zip(batches, received, strict=True):
        torch.testing.assert_close(on_device.cpu(), host, atol=0, rtol=0)
    with pytest.raises(ValueError, match="pinned"):
        list(CudaPrefetcher([torch.zeros(2)], device))
    rows = copy_compute_overlap(device, batch_shape=(512, 256), layers=2, steps=3, repeats=3)
    assert [row.mode for row in rows] == [
        "pageable, in line",
        "pinned, in line",
        "pinned, prefetched",
    ]
    assert all(row.step_ms > 0 for row in rows) and rows[0].speedup == 1.0


def test_host_memory_profile_names_the_line_and_misses_tensor_storage():
    from trainfast.profiling.host_memory import host_memory_profile, resident_bytes

    torch.set_num_threads(1)
    # 256 MiB of float32: above glibc's largest mmap threshold (32 MiB), and larger than any
    # free heap region an earlier test on this worker left (a 64 MiB tensor once fitted into
    # one under xdist and the RSS did not grow), so the storage is fresh pages
    numel = 64 * 2**20

    def allocate():
        blobs = [bytes(1000) for _ in range(1000)]  # about 1 MB of Python objects
        tensor = torch.ones(numel)  # storage from PyTorch's allocator
        return blobs, tensor

    profile = host_memory_profile(allocate, top=3)
    top = profile.sites[0]
    assert top.file == __file__ and top.count >= 1000 and top.size_bytes >= 1000 * 1000
    assert profile.traced_bytes >= 1000 * 1000
    assert profile.traced_peak_bytes >= profile.traced_bytes
    assert profile.traced_bytes < 4 * numel  # the tensor's storage is not traced ...
    if resident_bytes()["rss"]:  # ... but it is resident (Linux)
        assert profile.rss_growth_bytes >= 0.9 * 4 * numel
        assert profile.untraced_bytes >= 0.8 * 4 * numel
    with pytest.raises(ValueError, match="Invalid top: 0"):
        host_memory_profile(lambda: None, top=0)
