"""The targets the kernel benchmarks are held to, and what their records share.

:data:`TARGETS` names the four ratios a GPU run must reach; :func:`target_ratios` reads them
back from records. :func:`kernel_record` builds a record and prints its ratio;
:data:`ELEMENT_BYTES` and :func:`check_dtype` serve every prediction.
"""

from __future__ import annotations

from typing import Any

import torch

from trainfast.gpus import GPUSpec
from trainfast.records import Record, make_record

__all__ = [
    "ELEMENT_BYTES",
    "MATMUL_TARGET_SIZE",
    "TARGETS",
    "check_dtype",
    "is_out_of_resources",
    "kernel_record",
    "target_ratios",
]

#: Bytes per element of each format the predictions take (a key of ``GPUSpec.peak_flops``).
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

#: benchmark name -> (what is compared, the ratio's target on an H100 and an H200)
TARGETS = {
    "copy-bandwidth": ("Triton copy / torch copy, bandwidth at the largest size", 0.90),
    "matmul-tiles": ("tiled Triton matmul / torch.matmul, FLOP/s at 4096³ (best tiles)", 0.85),
    "attention-forward": (
        "Triton flash forward / SDPA's FlashAttention-2 backend, FLOP/s at seq 4096 (worst case)",
        0.90,
    ),
    "attention-fwd-bwd": (
        "Triton forward + backward / SDPA's default, FLOP/s, causal, head dim 128, longest "
        "sequence",
        0.60,
    ),
}
#: the size ``matmul-tiles`` compares its tiles at (its larger sizes compare launch orders)
MATMUL_TARGET_SIZE = 4096


def kernel_record(
    name: str,
    description: str,
    rows: list[dict[str, Any]],
    device: torch.device,
    units: dict[str, str],
) -> Record:
    """A record of ``rows``, printing its target ratio (if it has one) as it is made."""
    record = make_record(name, description, rows, units=units, device=device)
    for line in target_ratios([record]):
        print(line)
    return record


def is_out_of_resources(error: Exception) -> bool:
    """Whether ``error`` is Triton's ``OutOfResources`` (a tile too large for the GPU)."""
    return type(error).__name__ == "OutOfResources"


def check_dtype(gpu: GPUSpec, dtype: str) -> None:
    """Raise ``ValueError`` naming ``dtype`` unless ``gpu``'s datasheet has a peak for it."""
    if dtype not in gpu.peak_flops:
        raise ValueError(f"Unknown dtype for {gpu.name}: {dtype!r} (has {sorted(gpu.peak_flops)})")


def _target_ratio(record: Record) -> float | None:
    rows = record.rows
    if record.name == "copy-bandwidth":
        largest = max(r["bytes"] for r in rows)
        triton = [r for r in rows if r["implementation"] != "torch copy_"]
        ratios = [r["ratio_to_torch"] for r in triton if r["bytes"] == largest]
        return max(ratios) if ratios else None
    if record.name == "matmul-tiles":
        size = min(MATMUL_TARGET_SIZE, min(r["size"] for r in rows))  # 2048 in a quick run
        per_dtype = {}
        for r in rows:
            if r["size"] != size or r["implementation"] == "torch.matmul":
                continue
            if r["ratio_to_torch"] is not None:
                per_dtype[r["dtype"]] = max(per_dtype.get(r["dtype"], 0.0), r["ratio_to_torch"])
        return min(per_dtype.values()) if per_dtype else None
    if record.name == "attention-forward":
        best: dict[tuple, float] = {}
        flash = {
            (r["head_dim"], r["causal"]): r["tflops"]
            for r in rows
            if r["implementation"] == "sdpa (flash backend)"
        }
        for r in rows:
            key = (r["head_dim"], r["causal"])
            if r["implementation"].startswith("triton") and key in flash:
                best[key] = max(best.get(key, 0.0), r["tflops"] / flash[key])
        return min(best.values()) if best else None
    if record.name == "attention-fwd-bwd":
        cases = [r for r in rows if r["head_dim"] == 128 and r["pass"] == "forward + backward"]
        if not cases:
            return None
        longest = max(r["seq"] for r in cases)
        rate = {r["implementation"]: r["tflops"] for r in cases if r["seq"] == longest}
        triton = [v for k, v in rate.items() if k.startswith("triton")]
        return triton[0] / rate["sdpa (default)"] if triton and "sdpa (default)" in rate else None
    return None


def target_ratios(records: list[Record]) -> list[str]:
    """One line per target benchmark among ``records``: measured ratio beside the H100 target."""
    lines = []
    for record in records:
        if record.name not in TARGETS:
            continue
        what, target = TARGETS[record.name]
        ratio = _target_ratio(record)
        device = f"{record.environment['device_name']} ({record.environment['device']})"
        if record.environment["device"] != "cuda" or ratio is None:
            outcome = f"not measured on {device} (needs a CUDA GPU); target >= {target:.2f}"
        else:
            verdict = "met" if ratio >= target else "NOT met"
            outcome = f"{ratio:.2f} on {device}; target >= {target:.2f}: {verdict}"
        lines.append(f"{record.name}: {what}: {outcome}")
    return lines
