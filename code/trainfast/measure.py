"""``python -m trainfast.measure``: run the book's benchmarks and write measurement records.

Run it on the machine whose numbers a chapter should show (the self-hosted GPU runner does, in
the book workflow); it writes one JSON record per benchmark into ``--out`` (the book keeps them
in ``book/records``), stamped by :mod:`trainfast.records` with the device, versions, date and
this command line.

Each benchmark is a function ``(device, quick) -> Record`` named below by its import path, so
listing them imports nothing heavy.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from trainfast.device import environment_line, pick_device
from trainfast.records import Record, write_record

__all__ = ["BENCHMARKS", "main", "run_benchmark"]

#: benchmark name -> "module:function"; the function takes (device, quick) and returns a Record.
BENCHMARKS: dict[str, str] = {
    "optimizer-step-time": "trainfast.optim.benchmark:step_time_record",
    "muon-vs-adamw": "trainfast.optim.comparison:muon_vs_adamw_record",
    "all-reduce-time": "trainfast.distributed.measurements.all_reduce:all_reduce_record",
    "ddp-overlap": "trainfast.distributed.measurements.ddp_overlap:ddp_overlap_record",
    "launcher-failure": "trainfast.distributed.measurements.launchers:launcher_record",
    "launcher-restart": "trainfast.distributed.measurements.launchers:restart_record",
    "matmul-throughput": "trainfast.precision.benchmark:matmul_throughput_record",
    "precision-step-time": "trainfast.precision.benchmark:step_time_record",
    "autocast-policy": "trainfast.precision.benchmark:autocast_policy_record",
    "matmul-error": "trainfast.precision.benchmark:matmul_error_record",
    "copy-bandwidth": "trainfast.kernels.benchmarks:copy_record",
    "matmul-tiles": "trainfast.kernels.benchmarks:matmul_record",
    "attention-forward": "trainfast.kernels.benchmarks:attention_record",
    "roofline": "trainfast.kernels.benchmarks:roofline_record",
    "strided-access": "trainfast.kernels.benchmarks:strided_record",
    "host-transfers": "trainfast.kernels.benchmarks:host_transfer_record",
    "activation-checkpointing": "trainfast.kernels.checkpointing:checkpointing_record",
    "caching-allocator": "trainfast.kernels.allocator:allocator_rounding_record",
    "allocator-snapshot": "trainfast.kernels.allocator:allocator_snapshot_record",
    "profiling-case-study": "trainfast.profiling.benchmarks:case_study_record",
    "timing-pitfalls": "trainfast.profiling.benchmarks:timing_pitfalls_record",
    "launch-overhead": "trainfast.profiling.benchmarks:launch_overhead_record",
    "compile-time": "trainfast.profiling.benchmarks:compile_time_record",
    "scaling-study": "trainfast.training.benchmarks:scaling_study_record",
}


def _resolve(name: str) -> Callable[[torch.device, bool], Record]:
    if name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark: {name!r} (known: {sorted(BENCHMARKS)})")
    module, function = BENCHMARKS[name].split(":")
    return getattr(importlib.import_module(module), function)


def run_benchmark(name: str, device: torch.device | None = None, quick: bool = False) -> Record:
    """Run one benchmark by name and return its record (without writing it)."""
    return _resolve(name)(device or pick_device(), quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainfast.measure", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON records")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)

    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    names = args.only or list(BENCHMARKS)
    for name in names:
        _resolve(name)  # fail on an unknown name before running anything
    device = pick_device(args.device)
    command = shlex.join(["python", "-m", "trainfast.measure", *(argv or sys.argv[1:])])
    print(environment_line(device))
    for name in names:
        record = _resolve(name)(device, args.quick)
        record.command = command
        path = write_record(record, args.out)
        print(f"{name}: wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
