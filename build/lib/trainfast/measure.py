"""``python -m trainfast.measure``: run the book's benchmarks and write measurement records.

Run it on the machine whose numbers a chapter should show (the self-hosted GPU runner does, in
the book workflow); it writes one JSON record per benchmark into ``--out`` (the book keeps them
in ``book/records``), stamped by :mod:`trainfast.records` with the device, versions, date and
this command line.

Each benchmark is a function ``(device, quick) -> Record`` that lives beside the code it
measures; :data:`BENCHMARKS` names each one and holds the function itself, so a reader (or an
editor's "go to definition") follows a name straight to its producer. Importing the benchmark
modules costs almost nothing once torch is imported (they import their heavy helpers lazily),
so ``--list`` stays cheap.
"""

from __future__ import annotations

import argparse
import inspect
import shlex
import sys
import tempfile
from collections.abc import Callable

import torch

from trainfast.device import environment_line, pick_device
from trainfast.distributed.measurements.all_reduce import all_reduce_record
from trainfast.distributed.measurements.ddp_overlap import ddp_overlap_record
from trainfast.distributed.measurements.launchers import launcher_record, restart_record
from trainfast.kernels.allocator import allocator_rounding_record, allocator_snapshot_record
from trainfast.kernels.benchmarks import (
    attention_record,
    attention_sweep_record,
    copy_record,
    fused_linear_gelu_record,
    host_transfer_record,
    matmul_record,
    roofline_record,
    strided_record,
)
from trainfast.kernels.checkpointing import checkpointing_record
from trainfast.optim import benchmarks as optim_benchmarks
from trainfast.optim.comparison import muon_vs_adamw_record
from trainfast.precision import benchmarks as precision_benchmarks
from trainfast.profiling.benchmarks import (
    case_study_record,
    compile_by_width_record,
    compile_time_record,
    copy_compute_overlap_record,
    gpu_bound_case_study_record,
    launch_overhead_record,
    timing_pitfalls_record,
)
from trainfast.records import Record, write_record
from trainfast.speedrun.study import speedrun_record
from trainfast.training.benchmarks import scaling_study_record
from trainfast.validation import output_folder

__all__ = [
    "BENCHMARKS",
    "CUDA_ONLY",
    "PROCESS_GROUPS",
    "Benchmark",
    "benchmark_function",
    "main",
    "not_on_this_gpu",
    "output_folder_problem",
    "run_benchmark",
]

#: What a benchmark is: it takes the device and ``quick`` (small sizes, for a smoke test).
Benchmark = Callable[[torch.device, bool], Record]

#: benchmark name -> the function that measures it and returns its record.
BENCHMARKS: dict[str, Benchmark] = {
    "optimizer-step-time": optim_benchmarks.step_time_record,
    "muon-vs-adamw": muon_vs_adamw_record,
    "all-reduce-time": all_reduce_record,
    "ddp-overlap": ddp_overlap_record,
    "launcher-failure": launcher_record,
    "launcher-restart": restart_record,
    "matmul-throughput": precision_benchmarks.matmul_throughput_record,
    "precision-step-time": precision_benchmarks.step_time_record,
    "autocast-policy": precision_benchmarks.autocast_policy_record,
    "matmul-error": precision_benchmarks.matmul_error_record,
    "copy-bandwidth": copy_record,
    "matmul-tiles": matmul_record,
    "attention-forward": attention_record,
    "attention-fwd-bwd": attention_sweep_record,
    "roofline": roofline_record,
    "strided-access": strided_record,
    "host-transfers": host_transfer_record,
    "fused-linear-gelu": fused_linear_gelu_record,
    "activation-checkpointing": checkpointing_record,
    "caching-allocator": allocator_rounding_record,
    "allocator-snapshot": allocator_snapshot_record,
    "profiling-case-study": case_study_record,
    "timing-pitfalls": timing_pitfalls_record,
    "launch-overhead": launch_overhead_record,
    "compile-time": compile_time_record,
    "compile-by-width": compile_by_width_record,
    "copy-compute-overlap": copy_compute_overlap_record,
    "gpu-bound-case-study": gpu_bound_case_study_record,
    "scaling-study": scaling_study_record,
    "speedrun": speedrun_record,
}


def benchmark_function(name: str) -> Benchmark:
    """The function registered as benchmark ``name``; ``ValueError`` naming it if unknown."""
    if name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark: {name!r} (known: {sorted(BENCHMARKS)})")
    return BENCHMARKS[name]


def run_benchmark(name: str, device: torch.device | None = None, quick: bool = False) -> Record:
    """Run one benchmark by name and return its record (without writing it)."""
    return benchmark_function(name)(device or pick_device(), quick)


#: Benchmarks whose ranks are processes: with a GPU per rank they run on GPUs (NCCL), with fewer
#: they are CPU processes (gloo) whatever GPU the machine has, and their records say CPU.
PROCESS_GROUPS = frozenset(
    {"all-reduce-time", "ddp-overlap", "launcher-failure", "launcher-restart"}
)


def not_on_this_gpu(name: str, device: torch.device) -> str | None:
    """Why benchmark ``name`` measures nothing of ``device``'s GPUs here, or None.

    On a CUDA machine with fewer than two GPUs a :data:`PROCESS_GROUPS` benchmark would time the
    host's CPU (``make measure`` on the build machine records that): a GPU pass skips it.
    """
    if device.type == "cuda" and name in PROCESS_GROUPS and torch.cuda.device_count() < 2:
        return (
            f"{name} not available on this machine: it has {torch.cuda.device_count()} GPU, and "
            "its ranks need one each (with fewer they are CPU processes)"
        )
    return None


#: Benchmarks that measure something only a CUDA device has (a side stream's overlap); a run of
#: the whole table on another device skips them, and naming one there is an error.
CUDA_ONLY = frozenset({"copy-compute-overlap", "gpu-bound-case-study"})


def output_folder_problem(out: str) -> str | None:
    """Why records cannot be written into folder ``out`` (created if missing), or None.

    Checked before any benchmark runs, since a result that cannot be written is lost.
    """
    try:
        folder = output_folder("--out", out)  # the package's one check of an output folder
        with tempfile.TemporaryFile(dir=folder):
            pass
    except ValueError as error:
        return f"{error}; e.g. --out book/records"
    except OSError as error:
        return f"--out {out!r}: cannot write there ({error.strerror or error})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainfast.measure", description=__doc__)
    parser.add_argument("--out", help="folder for the JSON records (required to run)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)

    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    if args.out is None:
        parser.error("--out is required (except with --list)")
    problem = output_folder_problem(args.out)
    if problem:  # before running anything: a run that cannot be written is device time lost
        parser.error(problem)
    names = args.only or list(BENCHMARKS)
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:  # fail before running anything
        raise ValueError(f"Unknown benchmarks: {unknown} (known: {sorted(BENCHMARKS)})")
    try:
        device = pick_device(args.device)
    except ValueError as error:
        parser.error(f"--device: {error}")
    cuda_only = [name for name in names if name in CUDA_ONLY]
    if device.type != "cuda" and cuda_only:
        if args.only:  # asked for by name: say why it cannot run here
            raise ValueError(f"Benchmarks {cuda_only} need a CUDA device, got {device.type}")
        names = [name for name in names if name not in CUDA_ONLY]
        print(f"skipped on {device.type}, they need CUDA: {', '.join(cuda_only)}", flush=True)
    command = shlex.join(["python", "-m", "trainfast.measure", *(argv or sys.argv[1:])])
    print(environment_line(device), flush=True)
    for name in names:
        function = BENCHMARKS[name]
        # a benchmark that takes ``out`` writes its record as it goes (a long study)
        writes_as_it_goes = "out" in inspect.signature(function).parameters
        record = function(device, args.quick, **({"out": args.out} if writes_as_it_goes else {}))
        record.command = command
        path = write_record(record, args.out)
        print(f"{name}: wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
