"""The roofline model: is an operation limited by arithmetic or by memory traffic?

An operation that does ``F`` floating-point operations and moves ``B`` bytes between main memory
and the chip has *arithmetic intensity* ``I = F / B`` (FLOPs per byte). On a device that
computes at most ``P`` FLOP/s and moves at most ``W`` bytes/s, it can run no faster than
``min(P, I · W)`` FLOP/s (Williams, Waterman and Patterson, 2009). The two limits meet at the
*ridge* ``I* = P / W``: below it an operation is memory-bound (more FLOP/s needs less traffic,
i.e. fusion), above it compute-bound (more FLOP/s needs faster arithmetic, e.g. lower precision).

:class:`Roofline` holds the two limits (take them from measurements, :func:`measure_roofline`
does, or from a datasheet, :class:`trainfast.gpus.GPUSpec`); :class:`OpCost` holds what an
operation does, with the *minimum* traffic (every operand read once, every result written
once: what a perfect cache would achieve). :func:`measure_roofline` times elementwise ops,
reductions and matrix products on a device and returns them as points for :func:`plot_roofline`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainfast.accounting import matmul_flops
from trainfast.gpus import GPUSpec
from trainfast.timing import benchmark
from trainfast.validation import check_counts, check_number

__all__ = [
    "MICROARCHITECTURES",
    "CpuPeak",
    "OpCost",
    "Roofline",
    "cpu_peak_flops",
    "datasheet_roofline",
    "elementwise_cost",
    "matmul_cost",
    "measure_roofline",
    "plot_roofline",
    "predicted_speedups",
    "reduction_cost",
    "roofline_from_rows",
]


@dataclass(frozen=True)
class Roofline:
    """A device's two ceilings: ``peak_flops`` (FLOP/s) and ``bytes_per_s`` (memory bandwidth)."""

    peak_flops: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        check_number("peak_flops", self.peak_flops, above=0.0)
        check_number("bytes_per_s", self.bytes_per_s, above=0.0)

    @property
    def ridge(self) -> float:
        """The intensity (FLOPs per byte) where the memory ceiling meets the compute ceiling."""
        return self.peak_flops / self.bytes_per_s

    def attainable(self, intensity: float) -> float:
        """The most FLOP/s an operation of this ``intensity`` can reach: ``min(P, I · W)``."""
        return min(self.peak_flops, intensity * self.bytes_per_s)

    def bound(self, intensity: float) -> str:
        """``"memory"`` below the ridge, ``"compute"`` at or above it."""
        return "memory" if intensity < self.ridge else "compute"


@dataclass(frozen=True)
class OpCost:
    """What an operation does: ``flops`` and the minimum ``bytes`` it moves to and from memory."""

    name: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


@dataclass(frozen=True)
class CpuPeak:
    """A CPU's theoretical float32 peak from its clock and vector datapath (:func:`cpu_peak_flops`).

    ``peak_flops = threads · clock_hz · flops_per_cycle``, with ``flops_per_cycle = fma_units ·
    lanes · 2`` (a fused multiply-add is two FLOPs). ``isa`` names the widest vector extension
    found; ``lanes`` is the float32 values one FMA unit processes per cycle, which is the
    *datapath's* width, not the register's: Zen 4 runs 512-bit instructions on 256-bit pipes.
    ``microarchitecture`` names the core the width was read for.
    """

    threads: int
    clock_hz: float
    isa: str
    lanes: int
    fma_units: int
    microarchitecture: str = "unknown"

    @property
    def flops_per_cycle(self) -> int:
        return self.fma_units * self.lanes * 2

    @property
    def peak_flops(self) -> float:
        return self.threads * self.clock_hz * self.flops_per_cycle

    def implied_clock_hz(self, flops_per_s: float) -> float:
        """The clock at which ``flops_per_s`` would be this peak: above ``clock_hz`` (turbo)
        where a measurement beats the nominal-clock peak."""
        return flops_per_s / (self.threads * self.flops_per_cycle)


#: (vendor, family, first model, last model) -> (microarchitecture, FMA datapath bits, FMA units),
#: widths from AMD's and Intel's optimisation manuals (see :func:`cpu_peak_flops`); model ranges
#: as Linux assigns them (``arch/x86/kernel/cpu/amd.c``, ``arch/x86/include/asm/intel-family.h``).
#: Zen 5's datapath width differs by part, so only its server and desktop models are listed;
#: other family-26 models (mobile parts among them) are left unknown.
MICROARCHITECTURES = {
    ("AuthenticAMD", 23, 0x00, 0x2F): ("Zen / Zen+", 128, 2),
    ("AuthenticAMD", 23, 0x50, 0x5F): ("Zen / Zen+", 128, 2),
    ("AuthenticAMD", 23, 0x30, 0x4F): ("Zen 2", 256, 2),
    ("AuthenticAMD", 23, 0x60, 0x7F): ("Zen 2", 256, 2),
    ("AuthenticAMD", 23, 0x90, 0x91): ("Zen 2", 256, 2),
    ("AuthenticAMD", 23, 0xA0, 0xAF): ("Zen 2", 256, 2),
    ("AuthenticAMD", 25, 0x00, 0x0F): ("Zen 3", 256, 2),
    ("AuthenticAMD", 25, 0x20, 0x5F): ("Zen 3", 256, 2),
    ("AuthenticAMD", 25, 0x10, 0x1F): ("Zen 4", 256, 2),
    ("AuthenticAMD", 25, 0x60, 0xAF): ("Zen 4", 256, 2),
    ("AuthenticAMD", 26, 0x00, 0x0F): ("Zen 5", 512, 2),
    ("AuthenticAMD", 26, 0x40, 0x4F): ("Zen 5", 512, 2),
    ("GenuineIntel", 6, 0x8F, 0x8F): ("Sapphire Rapids", 512, 2),
    ("GenuineIntel", 6, 0xCF, 0xCF): ("Emerald Rapids", 512, 2),
}


def cpu_peak_flops(threads: int, *, fma_units: int = 2, cpuinfo: str | None = None) -> CpuPeak:
    """The theoretical float32 peak of ``threads`` cores of this CPU: MFU's denominator.

    PaLM's MFU (Chowdhery et al. 2022, Appendix B) divides by the hardware's *theoretical* peak,
    not by a measured one. A GPU's comes from its datasheet (:data:`trainfast.gpus.GPUS`); a
    CPU's is ``clock · fma_units · lanes · 2`` per core. The clock (``cpu MHz``) and the vector
    extensions (``avx512f``, ``avx2`` with ``fma``, or ``sse2``: 512, 256 or 128 bits) are read
    from ``/proc/cpuinfo``; the width of the FMA datapath and the number of FMA units come from
    the core's microarchitecture (``vendor_id``, ``cpu family``, ``model``, looked up in
    :data:`MICROARCHITECTURES`). The lanes are the narrower of the instruction and the datapath:
    Zen 4 executes a 512-bit FMA on its two 256-bit pipes, so it does 32 float32 FLOPs per cycle
    like Zen 3, not the 64 of Sapphire Rapids' two 512-bit units. An unknown core is assumed to
    have ``fma_units`` units as wide as its widest instructions. The clock is the one the
    operating system reports, usually nominal: a core running at a turbo clock can beat this
    peak (:meth:`CpuPeak.implied_clock_hz` says at what clock a measurement would be the peak).
    """
    check_counts(threads=threads, fma_units=fma_units)
    if cpuinfo is None:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    clock = re.search(r"^cpu MHz\s*:\s*([\d.]+)", cpuinfo, re.MULTILINE)
    flags = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    if clock is None or flags is None:
        raise ValueError("Invalid cpuinfo: no 'cpu MHz' or 'flags' line to read the peak from")
    names = set(flags.group(1).split())
    if "avx512f" in names:
        isa, bits = "AVX-512", 512
    elif {"avx2", "fma"} <= names:
        isa, bits = "AVX2 + FMA", 256
    else:
        return CpuPeak(
            threads,
            float(clock.group(1)) * 1e6,
            "SSE2 (no FMA: one add and one multiply per cycle)",
            4,
            1,
            _microarchitecture(cpuinfo)[0],
        )
    name, datapath, units = _microarchitecture(cpuinfo)
    if datapath is None:
        datapath, units = bits, fma_units
    lanes = min(bits, datapath) // 32
    return CpuPeak(threads, float(clock.group(1)) * 1e6, isa, lanes, units, name)


def _microarchitecture(cpuinfo: str) -> tuple[str, int | None, int | None]:
    """(name, FMA datapath bits, FMA units) of the first core in ``cpuinfo``; bits ``None``
    when the core is not in :data:`MICROARCHITECTURES`."""
    fields = {}
    for key in ("vendor_id", "cpu family", "model"):
        found = re.search(rf"^{key}\s*:\s*(\S+)", cpuinfo, re.MULTILINE)
        fields[key] = found.group(1) if found else None
    try:
        family, model = int(fields["cpu family"]), int(fields["model"])
    except (TypeError, ValueError):
        return "unknown", None, None
    for (vendor, fam, first, last), row in MICROARCHITECTURES.items():
        if fields["vendor_id"] == vendor and family == fam and first <= model <= last:
            return row
    return f"unknown ({fields['vendor_id']} family {family} model {model})", None, None


def elementwise_cost(
    name: str,
    n: int,
    *,
    inputs: int,
    outputs: int = 1,
    flops_per_element: float = 1,
    element_bytes: int = 4,
) -> OpCost:
    """An elementwise op on ``n`` elements: ``inputs`` tensors read, ``outputs`` written."""
    check_counts(minimum=0, n=n, inputs=inputs, outputs=outputs)
    check_counts(element_bytes=element_bytes)
    check_number("flops_per_element", flops_per_element, minimum=0.0)
    return OpCost(name, flops_per_element * n, (inputs + outputs) * n * element_bytes)


def reduction_cost(name: str, n: int, *, element_bytes: int = 4) -> OpCost:
    """A sum of ``n`` elements: ``n - 1`` additions, ``n`` elements read, one written."""
    check_counts(n=n, element_bytes=element_bytes)
    return OpCost(name, n - 1, (n + 1) * element_bytes)


def matmul_cost(m: int, k: int, n: int, *, element_bytes: int = 4) -> OpCost:
    """``(m, k) @ (k, n)``: ``2mkn`` FLOPs, and each of A, B, C moved once."""
    check_counts(m=m, k=k, n=n, element_bytes=element_bytes)
    return OpCost(
        f"matmul {m}x{k}x{n}", matmul_flops(m, k, n), (m * k + k * n + m * n) * element_bytes
    )


def _operations(
    device: torch.device, dtype: torch.dtype, n: int, matmul_sizes: Sequence[int]
) -> list[tuple[OpCost, Callable[[], Any]]]:
    """The measured operations, each with its cost and a closure that runs it once."""
    size = torch.tensor([], dtype=dtype).element_size()
    x, y = torch.randn(n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)
    out = torch.empty_like(x)
    copy = elementwise_cost("copy", n, inputs=1, flops_per_element=0, element_bytes=size)
    add = elementwise_cost("x + y", n, inputs=2, element_bytes=size)
    ops: list[tuple[OpCost, Callable[[], Any]]] = [
        (copy, lambda: out.copy_(x)),
        (add, lambda: torch.add(x, y, out=out)),
        (reduction_cost("sum(x)", n, element_bytes=size), lambda: x.sum()),
    ]
    side = int(n**0.5)
    matrix, vector = x[: side * side].view(side, side), y[:side].view(side, 1)
    counted = matmul_cost(side, side, 1, element_bytes=size)
    gemv = OpCost(f"matrix-vector {side}x{side}", counted.flops, counted.bytes)
    ops.append((gemv, lambda: matrix @ vector))
    for m in matmul_sizes:
        a = torch.randn(m, m, device=device, dtype=dtype)
        b = torch.randn(m, m, device=device, dtype=dtype)
        c = torch.empty(m, m, device=device, dtype=dtype)
        cost = matmul_cost(m, m, m, element_bytes=size)
        ops.append((cost, lambda a=a, b=b, c=c: torch.mm(a, b, out=c)))
    return ops


def measure_roofline(
    device: torch.device,
    *,
    dtype: torch.dtype = torch.float32,
    n: int = 1 << 24,
    matmul_sizes: Sequence[int] = (16, 64, 256, 1024),
    repeats: int = 7,
) -> list[dict[str, Any]]:
    """Time elementwise ops, a reduction, a matrix-vector product and square matmuls on ``device``.

    Returns one row per operation: its FLOPs, minimum bytes, intensity, median seconds (the
    package's one timer, :func:`trainfast.timing.benchmark`) and achieved FLOP/s and bytes/s.
    The vectors have ``n`` elements (make them much larger than the last-level cache to measure
    main memory). :func:`roofline_from_rows` turns the rows into the measured :class:`Roofline`.
    """
    rows = []
    for cost, run in _operations(device, dtype, n, matmul_sizes):
        number = max(1, int(2e6 // max(cost.bytes, 1)))  # calls per sample: about 2 MB moved
        timing = benchmark(run, warmup=2, repeats=repeats, device=device, number=number)
        seconds = timing.median
        row = {
            "operation": cost.name,
            "dtype": str(dtype).removeprefix("torch."),
            "flops": cost.flops,
            "bytes": cost.bytes,
            "intensity": cost.intensity,
            "seconds": seconds,
            "flops_per_s": cost.flops / seconds,
            "bytes_per_s": cost.bytes / seconds,
        }
        rows.append(row)
    return rows


def roofline_from_rows(rows: Sequence[dict[str, Any]]) -> Roofline:
    """The measured roofline: the fastest matmul's FLOP/s and the copy's bytes/s."""
    peak = max(r["flops_per_s"] for r in rows if r["operation"].startswith("matmul"))
    copies = [r["bytes_per_s"] for r in rows if r["operation"] == "copy"]
    if not copies:
        raise ValueError("No 'copy' row to take the bandwidth from")
    return Roofline(peak_flops=peak, bytes_per_s=max(copies))


def datasheet_roofline(spec: GPUSpec, dtype: str = "bf16") -> Roofline:
    """``spec``'s datasheet roofline in ``dtype``: its dense peak and its HBM bandwidth. Draw it
    beside a record with the record's own GPU (:func:`trainfast.gpus.spec_for_record`), never
    another card's: an H200's copy would plot above an H100's memory roof."""
    if dtype not in spec.peak_flops:
        raise ValueError(
            f"Unknown dtype for {spec.name}: {dtype!r} (has {sorted(spec.peak_flops)})"
        )
    return Roofline(spec.peak_flops[dtype], spec.hbm_bytes_per_s)


def predicted_speedups(
    rows: Sequence[dict[str, Any]], measured_on: GPUSpec, other: GPUSpec, dtype: str = "bf16"
) -> list[dict[str, Any]]:
    """What the roofline predicts ``other`` does to each operation of a ``roofline`` record
    measured on ``measured_on``: per row with an ``intensity``, the attainable FLOP/s of its
    intensity on each datasheet roofline and their ratio (``other / measured_on``).

    An H200 has an H100's arithmetic and about 1.4 times its bandwidth, so below the H200's ridge
    the ratio is about 1.4 (the copy, elementwise ops, small matrix products), above the H100's
    it is 1 (large matrix products), and between the two ridges it falls from 1.4 to 1 as the
    intensity grows: a prediction that a record on ``other`` tests. Rows without FLOPs (a copy
    counts none) use their bytes: the ratio of bandwidths.
    """
    old, new = datasheet_roofline(measured_on, dtype), datasheet_roofline(other, dtype)
    predictions = []
    for row in rows:
        intensity = row.get("intensity")
        if not row.get("flops") or not intensity:
            ratio, bound = new.bytes_per_s / old.bytes_per_s, "memory"
        else:
            ratio = new.attainable(intensity) / old.attainable(intensity)
            bound = new.bound(intensity)
        predictions.append(
            {
                "operation": row["operation"],
                "intensity": intensity,
                "bound_on_other": bound,
                "predicted_ratio": ratio,
            }
        )
    return predictions


def plot_roofline(
    rooflines: dict[str, Roofline],
    points: Sequence[tuple[str, float, float]] = (),
    *,
    ax: Any = None,
    title: str = "Roofline",
) -> Any:
    """Draw each roofline (log-log) and the measured ``(label, intensity, flops_per_s)`` points.

    Returns the matplotlib axes. The first roofline's ridge is marked; the legend sits below the
    axes (make the figure about 1.4 times as tall as wide, and call ``tight_layout``).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 8))
    intensities = [p[1] for p in points] + [r.ridge for r in rooflines.values()]
    low = min(intensities + [0.05]) / 4
    high = max(intensities + [100.0]) * 4
    grid = np.logspace(np.log10(low), np.log10(high), 200)
    for i, (label, roofline) in enumerate(rooflines.items()):
        style = "-" if i == 0 else "--"
        color = "k" if i == 0 else "0.5"
        peak = f"{roofline.peak_flops / 1e9:,.0f} GFLOP/s"
        bandwidth = f"{roofline.bytes_per_s / 1e9:,.1f} GB/s"
        attainable = [roofline.attainable(x) for x in grid]
        # two lines, so the legend's two columns fit a figure 6.5 inches wide
        ax.plot(grid, attainable, style, color=color, label=f"{label}:\n{peak}, {bandwidth}")
    first = next(iter(rooflines.values()), None)
    if first is not None:
        ax.axvline(
            first.ridge, color="0.7", linestyle=":", label=f"ridge: {first.ridge:.1f} FLOPs/byte"
        )
    markers = "osD^v<>ph*"
    for i, (label, intensity, flops) in enumerate(points):
        ax.plot(intensity, flops, markers[i % len(markers)], markersize=7, label=label)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOPs per byte of memory traffic)",
        ylabel="achieved FLOP/s",
        title=title,
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    return ax
