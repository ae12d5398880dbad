"""The memory hierarchy's benchmarks and predictions: copies, strides, host transfers, roofline.

Beside :mod:`trainfast.kernels.bandwidth` and :mod:`trainfast.kernels.elementwise`, whose
functions they time; each ``*_record(device, quick)`` is a ``python -m trainfast.measure``
benchmark (the index is :mod:`trainfast.kernels.benchmarks`).
"""

from __future__ import annotations

import torch

from trainfast.gpus import GPUSpec
from trainfast.kernels.bandwidth import copy_bandwidth, host_transfer_costs, strided_bandwidth
from trainfast.kernels.benchmark_targets import kernel_record
from trainfast.kernels.roofline import measure_roofline, roofline_from_rows
from trainfast.records import Prediction, Record
from trainfast.timing import benchmark

__all__ = [
    "copy_prediction",
    "copy_record",
    "host_transfer_prediction",
    "host_transfer_record",
    "roofline_record",
    "strided_record",
]


# --- copy --------------------------------------------------------------------------------------

_COPY_CONFIGS = [(1024, 4), (2048, 8), (4096, 8), (8192, 16)]  # (block_size, num_warps)


def copy_record(device: torch.device, quick: bool) -> Record:
    """Copy bandwidth by size; on CUDA, ``torch`` beside the Triton kernel in four configurations.

    Sizes span the caches and main memory: 16 KiB to 256 MiB on a CPU (to 8 MiB quick),
    1 MiB to 2 GiB on a GPU (to 64 MiB quick).
    """
    if device.type == "cuda":
        sizes = [1 << p for p in range(20, 27 if quick else 32, 2)]
    else:
        sizes = [1 << p for p in range(14, 24 if quick else 29)]
    rows = [dict(row, config="") for row in copy_bandwidth(device, sizes)]
    if device.type == "cuda":
        from trainfast.kernels.elementwise import copy_tensor

        torch_speed = {row["bytes"]: row["gb_per_s"] for row in rows}
        for nbytes in sizes:
            x = torch.randn(nbytes // 4, device=device)
            for block_size, num_warps in _COPY_CONFIGS:

                def run(x=x, b=block_size, w=num_warps):
                    return copy_tensor(x, block_size=b, num_warps=w)

                timing = benchmark(run, warmup=3, repeats=10, device=device)
                row = {
                    "implementation": "triton copy_kernel",
                    "bytes": nbytes,
                    "seconds": timing.median,
                    "gb_per_s": 2 * nbytes / timing.median / 1e9,
                    "config": f"BLOCK_SIZE={block_size}, num_warps={num_warps}",
                }
                rows.append(row)
        for row in rows:
            row["ratio_to_torch"] = row["gb_per_s"] / torch_speed[row["bytes"]]
    else:
        _prove_triton_copy_runs()
        for row in rows:
            row["ratio_to_torch"] = 1.0
    return kernel_record(
        "copy-bandwidth",
        "Copy bandwidth (bytes read + written per second) by tensor size, float32; median of "
        "repeats, warm caches (the working set is 2x the size).",
        rows,
        device,
        {"bytes": "bytes", "seconds": "s", "gb_per_s": "GB/s"},
    )


def _prove_triton_copy_runs() -> None:
    from trainfast.kernels.elementwise import copy_tensor

    x = torch.randn(1000)
    if not torch.equal(copy_tensor(x), x):  # pragma: no cover - the tests check this too
        raise AssertionError("the Triton copy kernel gave a wrong result")


# --- the memory hierarchy ----------------------------------------------------------------------


def roofline_record(device: torch.device, quick: bool) -> Record:
    """Roofline points: copy, add, sum, matrix-vector and square matmuls, with the measured ridge.

    CUDA: bfloat16 (float32 for the elementwise ops would halve nothing of interest), vectors of
    2^28 elements (2^24 quick), matmuls 256 to 8192. CPU: float32, vectors of 2^25 elements
    (2^20 quick: in cache), matmuls 16 to 2048 (512 quick).
    """
    if device.type == "cuda":
        dtype, n = torch.bfloat16, 1 << (24 if quick else 28)
        matmul_sizes = (256, 512, 1024, 2048, 4096, 8192)[: 4 if quick else 6]
    else:
        dtype, n = torch.float32, 1 << (20 if quick else 25)
        matmul_sizes = (16, 64, 256, 512, 1024, 2048)[: 4 if quick else 6]
    rows = measure_roofline(device, dtype=dtype, n=n, matmul_sizes=matmul_sizes)
    roofline = roofline_from_rows(rows)
    for row in rows:
        row["bound"] = roofline.bound(row["intensity"])
        roof = roofline.attainable(row["intensity"])
        row["fraction_of_roof"] = row["flops_per_s"] / roof if row["flops"] else None
    return kernel_record(
        "roofline",
        f"Achieved FLOP/s and arithmetic intensity (minimum traffic) of common operations; the "
        f"measured roofline is the fastest matmul ({roofline.peak_flops / 1e9:,.0f} GFLOP/s) and "
        f"the copy ({roofline.bytes_per_s / 1e9:,.1f} GB/s), ridge {roofline.ridge:.1f} "
        "FLOPs/byte.",
        rows,
        device,
        {
            "seconds": "s",
            "flops_per_s": "FLOP/s",
            "bytes_per_s": "bytes/s",
            "intensity": "FLOPs/byte",
            "bytes": "bytes",
        },
    )


def strided_record(device: torch.device, quick: bool) -> Record:
    """Useful bandwidth of one gather reading a whole buffer in stride order, strides 1 to 64
    (1 to 16 quick): the same code and the same buffer at every stride, a buffer sized by
    :func:`~trainfast.kernels.bandwidth.strided_buffer_elements` so that even the largest
    stride's pass exceeds twice the last cache; then the shuffled control at stride 1 and at one
    read per memory unit, which keeps the waste and defeats the prefetchers."""
    from trainfast.gpus import gpu_for_device
    from trainfast.kernels.bandwidth import cache_line_bytes, cache_sizes, strided_buffer_elements

    strides = [1, 2, 4, 8, 16] + ([] if quick else [32, 64])
    gpu = gpu_for_device(device)
    unit = 32 if device.type == "cuda" else (cache_line_bytes() or 64)
    last_cache = gpu.l2_bytes if gpu else max(cache_sizes().values(), default=32 << 20)
    n = 1 << 16 if quick else strided_buffer_elements(strides[-1], last_cache, unit_bytes=unit)
    repeats = 3 if quick else 7
    rows = strided_bandwidth(device, strides, n=n, repeats=repeats)
    rows += strided_bandwidth(device, [1, max(1, unit // 4)], n=n, repeats=repeats, shuffled=True)
    return kernel_record(
        "strided-access",
        f"torch.index_select of all {n:,} float32 elements of one buffer in stride order (stride "
        "passes of every stride-th element) into a contiguous tensor; useful bandwidth counts "
        "each element gathered once.",
        rows,
        device,
        {
            "seconds": "s",
            "seconds_min": "s",
            "seconds_max": "s",
            "useful_gb_per_s": "GB/s",
            "buffer_bytes": "bytes",
            "pass_bytes": "bytes",
            "unit_bytes": "bytes",
            "traffic_bytes": "bytes",
            "predicted_gb_per_s": "GB/s",
        },
    )


def host_transfer_record(device: torch.device, quick: bool) -> Record:
    """``.item()`` after every kernel, and host-device copies from pageable and pinned memory."""
    rows = host_transfer_costs(device, nbytes=(32 << 20) if quick else (256 << 20))
    return kernel_record(
        "host-transfers",
        "Seconds per small kernel with one sync at the end or a .item() after each (host clock), "
        "and copies between host and device (CUDA only).",
        rows,
        device,
        {"seconds": "s", "gb_per_s": "GB/s", "bytes": "bytes"},
    )


def copy_prediction(gpu: GPUSpec) -> Prediction:
    """The bandwidth a large copy should reach on ``gpu``: its HBM bandwidth, read + written.

    The roofline's memory ceiling: a copy does no arithmetic, so its only limit is moving each
    byte in and out of HBM, and a sweep's largest size is far beyond L2. ``copy-bandwidth``
    measures it (``torch copy_`` at the largest size).
    """
    return Prediction(
        gpu.hbm_bytes_per_s / 1e9,
        "GB/s",
        f"roofline memory ceiling: {gpu.name} HBM bandwidth, bytes read + written",
    )


def host_transfer_prediction(gpu: GPUSpec) -> Prediction:
    """A pinned host-to-device copy's bandwidth: PCIe's, one direction (half the datasheet's).

    NVIDIA states PCIe bandwidth for both directions together; one copy uses one. Pageable
    copies go through a staging buffer and should land below this. ``host-transfers`` measures it.
    """
    return Prediction(
        gpu.pcie_bytes_per_s / 2 / 1e9,
        "GB/s",
        f"{gpu.name} datasheet PCIe bandwidth, one direction",
    )
