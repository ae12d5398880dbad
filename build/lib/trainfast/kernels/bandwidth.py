"""Memory bandwidth, measured: by working-set size, by access pattern, and across the host link.

* :func:`copy_bandwidth`: a copy at growing sizes. Bytes counted are read *plus* written. While
  source and destination fit in a cache (a CPU's L1/L2/L3, a GPU's L2), the copy runs at that
  cache's speed; past the last level it runs at main memory's. The curve *is* the hierarchy.
* :func:`strided_bandwidth`: one gather (``torch.index_select``) that reads every element of one
  buffer exactly once, in stride order: ``stride`` passes, each reading every ``stride``-th
  element. Every stride runs the same code on the same buffer and touches the same elements;
  only the order changes. Memory moves in fixed units (a CPU's cache line,
  :func:`cache_line_bytes`; a 32-byte *sector* on an NVIDIA GPU), so once the buffer is larger
  than the last cache, each pass fetches every unit again and uses ``1/stride`` of it, until the
  stride reaches the unit. On a GPU this is *coalescing*: the 32 threads of a warp reading 32
  neighbouring floats need 4 sectors, reading 32 floats 32 apart need 32.
  :func:`strided_traffic_bytes` predicts the bytes moved, index and output included;
  :func:`strided_buffer_elements` sizes the buffer so that even the largest stride's pass
  exceeds the last cache; ``shuffled=True`` reads each pass's units in a random order within
  each page, a control that keeps the waste and the pages and defeats the prefetchers.
* :func:`host_transfer_costs`: what crossing to the host costs (CUDA only): ``.item()``, which
  waits for the GPU to finish everything queued, and copies over PCIe from pageable and from
  pinned (page-locked) memory.

All timing goes through :func:`trainfast.timing.benchmark`; results are rows for a record.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trainfast.device import parse_device
from trainfast.timing import benchmark
from trainfast.validation import check_counts, check_flag, check_int

__all__ = [
    "cache_line_bytes",
    "cache_sizes",
    "copy_bandwidth",
    "host_transfer_costs",
    "shuffled_order",
    "strided_bandwidth",
    "strided_buffer_elements",
    "strided_order",
    "strided_traffic_bytes",
]

PAGE_BYTES = 4096  # a base page on x86-64 Linux


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


def cache_line_bytes() -> int | None:
    """This CPU's cache-line size in bytes, as Linux reports it for CPU 0's L1 data cache
    (``coherency_line_size`` in ``/sys``, else ``sysconf(LEVEL1_DCACHE_LINESIZE)``, what
    ``getconf LEVEL1_DCACHE_LINESIZE`` prints); None where neither says."""
    path = Path("/sys/devices/system/cpu/cpu0/cache/index0/coherency_line_size")
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        pass
    try:
        size = os.sysconf("SC_LEVEL1_DCACHE_LINESIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return size if size > 0 else None


def _repeats_for(nbytes: float) -> tuple[int, int]:
    """(calls per sample, samples): enough work per sample to dwarf the clock's resolution."""
    return max(1, int(4e6 // max(nbytes, 1))), 7


def copy_bandwidth(
    device: torch.device,
    sizes: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
) -> list[dict[str, Any]]:
    """``dst.copy_(src)`` for tensors of each byte size in ``sizes``: GB/s, read + written."""
    rows = []
    element = torch.tensor([], dtype=dtype).element_size()
    for nbytes in sizes:
        n = max(1, nbytes // element)
        src = torch.randn(n, device=device).to(dtype)
        dst = torch.empty_like(src)
        number, repeats = _repeats_for(2 * n * element)
        timing = benchmark(
            lambda dst=dst, src=src: dst.copy_(src),
            warmup=2,
            repeats=repeats,
            device=device,
            number=number,
        )
        row = {
            "implementation": "torch copy_",
            "bytes": n * element,
            "seconds": timing.median,
            "gb_per_s": 2 * n * element / timing.median / 1e9,
        }
        rows.append(row)
    return rows


def strided_order(n: int, stride: int, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """The indices ``0, stride, 2·stride, …, 1, 1 + stride, …``: every one of ``range(n)`` once,
    in ``stride`` passes of every ``stride``-th element (int32, for ``torch.index_select``).

    ``n`` must be a multiple of ``stride``. ``strided_order(8, 2)`` is ``[0, 2, 4, 6, 1, 3, 5, 7]``.
    """
    check_counts(n=n, stride=stride)
    if n % stride:
        raise ValueError(f"Invalid n: {n} (expected a multiple of stride, {stride})")
    order = torch.arange(n, dtype=torch.int32, device=parse_device(device))
    return order.view(n // stride, stride).t().reshape(-1)  # (stride passes of n / stride)


def shuffled_order(
    n: int, stride: int, *, unit_elements: int, page_elements: int, seed: int = 0
) -> torch.Tensor:
    """:func:`strided_order` with each pass's reads shuffled within each page, in groups that
    share one memory unit (``unit_elements`` elements: a cache line or a sector).

    The same elements, units and pages are read in the same passes, with the same waste per
    unit; only the order inside a page changes (a new random permutation for every page, so no
    pattern repeats from page to page), which defeats the stream prefetchers; prefetchers that
    fetch the adjacent line do not depend on the order and may still help. At
    stride 1 a group is a whole unit read in order (no waste); from ``stride >= unit_elements``
    on, a group is one read.
    """
    check_counts(unit_elements=unit_elements, page_elements=page_elements)
    check_int("seed", seed)
    order = strided_order(n, stride).long()
    group = max(1, unit_elements // stride)  # consecutive reads of a pass that share a unit
    per_page = max(group, page_elements // stride)  # reads of one pass that fall in one page
    if per_page % group or (n // stride) % per_page:
        raise ValueError(f"Invalid stride: {stride} (a pass must hold whole units and pages)")
    # a pass's reads of one page are consecutive: permute the groups of each page's run, by a
    # new random permutation per page (no stride, and no pattern repeated page after page)
    segments = order.view(-1, per_page // group, group)  # (pages, groups per page, group)
    generator = torch.Generator().manual_seed(seed)
    keys = torch.rand(segments.shape[:2], generator=generator)  # (pages, groups per page)
    permutations = keys.argsort(dim=1)  # one permutation per page
    shuffled = torch.gather(segments, 1, permutations.unsqueeze(-1).expand_as(segments))
    return shuffled.reshape(-1).to(torch.int32)


def strided_traffic_bytes(
    n: int,
    stride: int,
    *,
    unit_bytes: int,
    element_bytes: int = 4,
    index_bytes: int = 4,
    write_allocate: bool = True,
) -> int:
    """The bytes one gather of :func:`strided_bandwidth` moves when no unit survives between
    passes: the source, ``n · element · min(stride, units / element)`` (each pass fetches every
    unit it touches again); the index, ``n · index_bytes``, read once; and the output, written
    once: ``2 · n · element`` on a CPU, whose write-allocate cache reads each line before writing
    it, ``n · element`` with ``write_allocate=False`` (a GPU's L2 writes whole sectors without
    reading them).
    The useful bandwidth at ``stride`` is then the stride-1 one times ``traffic(1) /
    traffic(stride)``: the line's waste, diluted by the index and output traffic that do not
    change with the stride."""
    check_counts(n=n, stride=stride, unit_bytes=unit_bytes, element_bytes=element_bytes)
    check_counts(minimum=0, index_bytes=index_bytes)
    check_flag("write_allocate", write_allocate)
    waste = min(stride, max(1, unit_bytes // element_bytes))
    output = (2 if write_allocate else 1) * n * element_bytes
    return n * element_bytes * waste + n * index_bytes + output


def strided_buffer_elements(
    largest_stride: int, last_cache_bytes: int, *, unit_bytes: int, element_bytes: int = 4
) -> int:
    """The smallest power-of-two element count whose buffer is at least twice
    ``last_cache_bytes`` and whose pass at ``largest_stride`` (the units it touches) is too
    (exactly twice for a power-of-two cache), so that no pass of
    :func:`strided_bandwidth` can be served from the previous one's cached units."""
    check_counts(largest_stride=largest_stride, last_cache_bytes=last_cache_bytes)
    check_counts(unit_bytes=unit_bytes, element_bytes=element_bytes)
    # a pass at stride s touches n / s units when s spans a unit, else every unit of the buffer
    need = max(
        2 * last_cache_bytes // element_bytes, 2 * last_cache_bytes * largest_stride // unit_bytes
    )
    return 1 << max(need - 1, 1).bit_length()


def strided_bandwidth(
    device: torch.device,
    strides: Sequence[int],
    *,
    n: int = 1 << 24,
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
    shuffled: bool = False,
) -> list[dict[str, Any]]:
    """Gather all ``n`` elements of one buffer in stride order (:func:`strided_order`), per stride.

    The same ``torch.index_select`` runs at every stride, on the same buffer, reading the same
    ``n`` elements into a contiguous output: code path and footprint are fixed, only the order
    of the reads changes. Make the buffer larger than the last cache (the default, 64 MiB of
    float32, is twice this machine's L3 and more than a GPU's L2), or lines fetched in one pass
    survive to the next. ``useful_gb_per_s`` counts the bytes gathered once (``n`` elements),
    ``pass_bytes`` the distinct memory units one pass touches (``unit_bytes``: the cache line on
    a CPU, the 32-byte sector on a GPU; what must stay cached for the next pass to hit), and
    ``seconds``, ``seconds_min`` and ``seconds_max`` the median and range of ``repeats`` samples.
    :func:`strided_buffer_elements` finds an ``n`` large enough for the largest stride.
    ``shuffled`` reads in :func:`shuffled_order` instead, the control that defeats prefetching.
    ``predicted_gb_per_s`` is the stride-1 bandwidth scaled by :func:`strided_traffic_bytes`
    (the first stride must be 1 for it; otherwise None).
    """
    element = torch.tensor([], dtype=dtype).element_size()
    source = torch.randn(n, device=device).to(dtype)
    out = torch.empty(n, device=device, dtype=dtype)
    unit = 32 if device.type == "cuda" else (cache_line_bytes() or 64)  # sector / cache line
    rows = []
    for stride in strides:
        if n % stride:
            raise ValueError(f"Invalid stride: {stride} (must divide n = {n})")
        if shuffled:
            units, page = max(1, unit // element), PAGE_BYTES // element
            index = shuffled_order(n, stride, unit_elements=units, page_elements=page)
            index = index.to(device)
        else:
            index = strided_order(n, stride, device=device)

        def gather(index: torch.Tensor = index) -> torch.Tensor:
            return torch.index_select(source, 0, index, out=out)

        timing = benchmark(gather, warmup=1, repeats=repeats, device=device)
        if not shuffled and not torch.equal(out[: n // stride], source[::stride]):
            raise RuntimeError(f"index_select gathered the wrong elements at stride {stride}")
        row = {
            "stride": stride,
            "elements": n,
            "buffer_bytes": n * element,
            "unit_bytes": unit,
            "pass_bytes": unit * n // max(stride, unit // element),
            "seconds": timing.median,
            "seconds_min": min(timing.samples),
            "seconds_max": max(timing.samples),
            "repeats": repeats,
            "useful_gb_per_s": n * element / timing.median / 1e9,
            "traffic_bytes": strided_traffic_bytes(
                n,
                stride,
                unit_bytes=unit,
                element_bytes=element,
                write_allocate=device.type != "cuda",
            ),
            "shuffled": shuffled,
        }
        rows.append(row)
        del index
    first = rows[0] if rows and rows[0]["stride"] == 1 else None
    for row in rows:
        row["predicted_gb_per_s"] = (
            first["useful_gb_per_s"] * first["traffic_bytes"] / row["traffic_bytes"]
            if first
            else None
        )
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
        row = {
            "operation": "100 x sum()" + (" + .item()" if item else ", one sync"),
            "bytes": 4 * 100 if item else 0,
            "seconds": timing.median / 100,
            "gb_per_s": None,
        }
        rows.append(row)
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
        row = {
            "operation": name,
            "bytes": n * 4,
            "seconds": timing.median,
            "gb_per_s": n * 4 / timing.median / 1e9,
        }
        rows.append(row)
    return rows
