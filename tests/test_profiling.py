"""The profiling chapter: the package's one timer, against torch's and Triton's."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from trainfast.profiling import Timing, benchmark

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


def test_benchmark_measures_seconds_per_call():
    timing = benchmark(lambda: time.sleep(0.004), warmup=1, repeats=5, number=2, device="cpu")
    assert 0.004 <= timing.median < 0.004 * 3, timing  # a sleep never returns early


def test_benchmark_agrees_with_torch_utils_benchmark():
    from torch.utils.benchmark import Timer

    def work() -> None:
        time.sleep(0.003)

    ours = benchmark(work, warmup=1, repeats=9, device="cpu").median
    theirs = Timer(stmt="work()", globals={"work": work}).blocked_autorange(min_run_time=0.05).median
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
