"""The benchmark registry of ``python -m trainfast.measure``: names map to real functions."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainfast.measure import BENCHMARKS, benchmark_function, main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_benchmark_is_a_function_of_its_module(name):
    function = BENCHMARKS[name]
    assert inspect.isfunction(function), f"{name}: {function!r} is not a function"
    module = importlib.import_module(function.__module__)
    assert getattr(module, function.__name__) is function, f"{name}: not {module.__name__}'s own"
    assert function.__module__.startswith("trainfast."), function.__module__
    assert list(inspect.signature(function).parameters)[:2] == ["device", "quick"], name
    assert inspect.getdoc(function), f"{name}: {function.__qualname__} has no docstring"
    assert benchmark_function(name) is function


def test_each_function_is_registered_once():
    functions = [f"{f.__module__}.{f.__qualname__}" for f in BENCHMARKS.values()]
    assert len(set(functions)) == len(functions)
    assert all(name == name.lower() and " " not in name for name in BENCHMARKS)


def test_list_prints_every_name_without_an_out_folder(capsys):
    assert main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(BENCHMARKS)


def test_unknown_names_fail_before_anything_runs_and_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"\['nope', 'nor-this'\]"):
        main(["--out", str(tmp_path), "--only", "copy-bandwidth", "nope", "nor-this"])
    assert not list(tmp_path.iterdir())  # copy-bandwidth did not run
    with pytest.raises(ValueError, match="Unknown benchmark: 'nope'"):
        benchmark_function("nope")


def test_running_needs_an_out_folder(capsys):
    with pytest.raises(SystemExit):
        main(["--only", "copy-bandwidth"])
    assert "--out is required" in capsys.readouterr().err


def test_list_as_a_command():
    run = subprocess.run(
        [sys.executable, "-m", "trainfast.measure", "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT / "code"), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == list(BENCHMARKS)


def test_cuda_only_benchmarks_are_refused_by_name_off_cuda(tmp_path):
    from trainfast import measure

    assert measure.CUDA_ONLY <= set(measure.BENCHMARKS)
    with pytest.raises(ValueError, match="need a CUDA device, got cpu"):
        measure.main(["--out", str(tmp_path), "--device", "cpu", "--only", "copy-compute-overlap"])
    assert not list(tmp_path.iterdir())  # refused before anything ran


def test_a_one_gpu_machine_skips_the_benchmarks_whose_ranks_need_a_gpu_each(monkeypatch, tmp_path):
    """On the first GPU pass (one H100) all-reduce-time fell back to gloo processes and wrote a
    record under the GPU's name; a GPU pass now reports such benchmarks "not available"."""
    import argparse

    from trainfast.gpu_pass.step_commands import run_benchmark as pass_step
    from trainfast.gpu_pass.steps import NOT_AVAILABLE_EXIT
    from trainfast.measure import PROCESS_GROUPS, not_on_this_gpu

    cuda = torch.device("cuda")
    for count, expected in ((1, True), (2, False)):
        monkeypatch.setattr(torch.cuda, "device_count", lambda count=count: count)
        for name in PROCESS_GROUPS:
            assert (not_on_this_gpu(name, cuda) is not None) is expected, (name, count)
        assert not_on_this_gpu("copy-bandwidth", cuda) is None
        assert not_on_this_gpu("all-reduce-time", torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = tmp_path / "result.json"
    args = argparse.Namespace(
        device="cuda", records=tmp_path, quick=True, copy_to=None, result=result
    )
    assert pass_step("ddp-overlap", args) == NOT_AVAILABLE_EXIT
    assert "not available" in result.read_text()
    assert not list(tmp_path.glob("ddp-overlap--*.json"))
