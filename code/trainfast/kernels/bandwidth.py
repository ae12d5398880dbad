"""Memory bandwidth, measured: by working-set size, by access pattern, and across the host link.

* :func:`copy_bandwidth`: a copy at growing sizes. Bytes counted are read *plus* written. While
  source and destination fit in a cache (a CPU's L1/L2/L3, a GPU's L2), the copy runs at that
  cache's speed; past the last level it runs at main memory's. The curve *is* the hierarchy.
* :func:`strided_bandwidth`: the same number of useful elements read with a stride. Memory moves
  in fixed units (64-byte cache lines on a CPU, 32-byte sectors of 128-byte lines on an NVIDIA
  GPU); reading every ``stride``-th float wastes the rest of each unit. On a GPU this is
  *coalescing*: the 32 threads of a warp reading 32 neighbouring floats need 4 sectors, reading
  32 floats 32 apart need 32.
* :func:`host_transfer_costs`: what crossing to the host costs (CUDA only): ``.item()``, which
  waits for the GPU to finish everything queued, and copies over PCIe from pageable and from
  pinned (page-locked) memory.

All timing goes through :func:`trainfast.profiling.benchmark`; results are rows for a record.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trainfast.profiling import benchmark

__all__ = ["cache_sizes", "copy_bandwidth", "host_transfer_costs", "strided_bandwidth"]


def cache_sizes() -> dict[str, int]:
    """This CPU's data caches, e.g. ``{"L1d": 32768, "L2": 524288, "L3": 33554432}`` (per core or
    per socket, as Linux reports them for CPU 0); empty where ``/sys`` does not say."""
    sizes: dict[str, int] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = (index / "level").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        multiplier = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1], 1)
        sizes[f"L{level}{'d' if kind == 'Data' else ''}"] = int(size.rstrip("KMG")) * multiplier
    return sizes


def _repeats_for(nbytes: float) -> tuple[int, int]:
    """(calls per sample, samples): enough work per sample to dwarf the clock's resolution."""
    return max(1, int(4e6 // max(nbytes, 1))), 7


def copy_bandwidth(
    device: torch.device,
    sizes: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
) -> list[dict[str, Any]]:
    """``dst.copy_(src)`` for tensors of each byte size in ``sizes``: GB/s counting read + written."""
    rows = []
    element = torch.tensor([], dtype=dtype).element_size()
    for nbytes in sizes:
        n = max(1, nbytes // element)
        src = torch.randn(n, device=device).to(dtype)
        dst = torch.empty_like(src)
        number, repeats = _repeats_for(2 * n * element)
        timing = benchmark(lambda dst=dst, src=src: dst.copy_(src), warmup=2, repeats=repeats,
                           device=device, number=number)  # fmt: skip
        rows.append({
            "implementation": "torch copy_", "bytes": n * element, "seconds": timing.median,
            "gb_per_s": 2 * n * element / timing.median / 1e9,
        })  # fmt: skip
    return rows


def strided_bandwidth(
    device: torch.device,
    strides: Sequence[int],
    *,
    n: int = 1 << 22,
    dtype: torch.dtype = torch.float32,
) -> list[dict[str, Any]]:
    """Copy ``n`` elements read ``stride`` apart into a contiguous tensor, for each stride.

    ``useful_gb_per_s`` counts only the elements copied (read + written); ``touched_bytes`` is
    the span of memory the reads cover, which grows with the stride.
    """
    element = torch.tensor([], dtype=dtype).element_size()
    source = torch.randn(n * max(strides), device=device).to(dtype)
    rows = []
    for stride in strides:
        view = source.as_strided((n,), (stride,))  # every stride-th element
        out = torch.empty(n, device=device, dtype=dtype)
        number, repeats = _repeats_for(2 * n * element)
        timing = benchmark(lambda view=view, out=out: out.copy_(view), warmup=2, repeats=repeats,
                           device=device, number=number)  # fmt: skip
        rows.append({
            "stride": stride, "elements": n, "touched_bytes": n * stride * element,
            "seconds": timing.median, "useful_gb_per_s": 2 * n * element / timing.median / 1e9,
        })  # fmt: skip
    return rows


def host_transfer_costs(device: torch.device, *, nbytes: int = 256 << 20) -> list[dict[str, Any]]:
    """The cost of crossing to the host, on a CUDA ``device``; on others only ``.item()``.

    Rows: launching 100 small kernels and waiting once at the end, against calling ``.item()``
    after each (seconds per kernel, host clock); copies of ``nbytes`` host to device and back,
    from pageable and from pinned memory (GB/s).
    """
    rows: list[dict[str, Any]] = []
    x = torch.randn(1024, device=device)

    def launches(item: bool) -> None:
        for _ in range(100):
            value = x.sum()
            if item:
                value.item()  # copies 4 bytes to the host: waits for the device to finish
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for item in (False, True):
        timing = benchmark(lambda item=item: launches(item), warmup=3, repeats=15, device="cpu")
        rows.append({"operation": "100 x sum()" + (" + .item()" if item else ", one sync"),
                     "bytes": 4 * 100 if item else 0, "seconds": timing.median / 100,
                     "gb_per_s": None})  # fmt: skip
    if device.type != "cuda":
        return rows
    n = nbytes // 4
    gpu = torch.empty(n, device=device)
    pageable = torch.randn(n)
    pinned = torch.randn(n).pin_memory()
    copies = {
        "host to device, pageable": lambda: gpu.copy_(pageable),
        "host to device, pinned": lambda: gpu.copy_(pinned, non_blocking=True),
        "device to host, pageable": lambda: pageable.copy_(gpu),
        "device to host, pinned": lambda: pinned.copy_(gpu, non_blocking=True),
    }
    for name, copy in copies.items():
        timing = benchmark(copy, warmup=2, repeats=7, device=device)
        rows.append({"operation": name, "bytes": n * 4, "seconds": timing.median,
                     "gb_per_s": n * 4 / timing.median / 1e9})  # fmt: skip
    return rows
