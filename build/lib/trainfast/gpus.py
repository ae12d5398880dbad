"""The GPUs the book reasons about: one table of datasheet numbers, each with its source.

The accounting (:mod:`trainfast.accounting`), the roofline (:mod:`trainfast.kernels.roofline`),
the layout and step-time models and the kernels' tile choices all read their hardware numbers
from here, so a figure the book predicts for an H100 and the tile a launcher picks for a T4 come
from the same row.

Units: bytes, FLOP/s and bytes/s; ``GB`` is 10^9 bytes, on-chip sizes (L2, shared memory,
registers) are binary, as NVIDIA and CUDA report them. ``peak_flops`` is dense (no 2:4
sparsity) FLOP/s per format: ``"fp32"`` on CUDA cores, ``"tf32"``, ``"bf16"``, ``"fp16"`` and
``"fp8"`` on tensor cores; a format the GPU has no tensor cores for is absent.

Sources, per row: the NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022) and H100
datasheet (SXM5); the NVIDIA H200 datasheet (2024: the specifications table of NVIDIA's H200
page, with an H200 SXM and an H200 NVL column); the NVIDIA A100 Tensor Core GPU Architecture
whitepaper (2020) and A100 datasheet (80GB SXM); the NVIDIA L4 datasheet (2023) and Ada
Lovelace architecture whitepaper; the NVIDIA Turing GPU Architecture whitepaper (2018, Tesla T4
appendix) and T4 datasheet. The per-compute-capability limits (shared memory per block and per
SM, registers, resident blocks and threads per SM) are the CUDA C++ Programming Guide's table
"Technical Specifications per Compute Capability".

Where a datasheet is silent (an H200's L2 and SM count, an L4's SM count), the row's figure is a
stand-in named in ``from_device``, and the device's own report replaces it: a live
GPU's (:func:`gpu_for_device`) or the one a record stored (:func:`spec_for_record`, from
:func:`trainfast.device.gpu_properties`). A GPU with no row gets no prediction, with an
:class:`UnlistedGPUWarning` naming it, never another card's row.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from trainfast.device import parse_device

if TYPE_CHECKING:
    from trainfast.records import Published, Record

__all__ = [
    "GPUS",
    "GPUSpec",
    "UnlistedGPUWarning",
    "datasheet_peak",
    "gpu_for_device",
    "gpu_spec",
    "spec_for_record",
    "spec_for_records",
    "with_device_properties",
]


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet numbers and its compute capability's limits.

    ``shared_memory_per_block_bytes`` is the opt-in maximum a kernel may ask for
    (``cudaFuncAttributeMaxDynamicSharedMemorySize``); without opting in a block gets 48 KiB.
    ``nvlink_bytes_per_s`` is ``None`` for a card without NVLink (L4, T4); NVLink and PCIe
    bandwidths are as NVIDIA states them, both directions together. ``citation`` is the key in
    ``book/references.bib`` of the datasheet the peaks and bandwidth come from (empty where the
    book has none). ``from_device`` names the fields no datasheet gives: the row's value is a
    stand-in that :func:`with_device_properties` replaces with what the device reports.
    """

    name: str
    compute_capability: tuple[int, int]
    memory_bytes: float
    peak_flops: Mapping[str, float] = field(hash=False)  # a dict: the spec stays hashable
    hbm_bytes_per_s: float
    l2_bytes: int
    sm_count: int
    shared_memory_per_sm_bytes: int
    shared_memory_per_block_bytes: int
    registers_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    pcie_bytes_per_s: float
    nvlink_bytes_per_s: float | None = None
    citation: str = ""
    from_device: tuple[str, ...] = ()

    def ridge_intensity(self, dtype: str = "bf16") -> float:
        """FLOPs per HBM byte above which a kernel can be compute-bound (the roofline's ridge)."""
        if dtype not in self.peak_flops:
            raise ValueError(
                f"Unknown dtype for {self.name}: {dtype!r} (has {sorted(self.peak_flops)})"
            )
        return self.peak_flops[dtype] / self.hbm_bytes_per_s

    @property
    def sm_target(self) -> str:
        """The compiler's name for the architecture, e.g. ``"sm_90"``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


_TERA, _KIB, _MIB = 1e12, 1024, 1024**2

#: Hopper (compute capability 9.0): 228 KiB shared memory per SM, 227 KiB per block (opt-in),
#: 64 K 32-bit registers, 2,048 threads and 32 blocks per SM (CUDA C++ Programming Guide).
_HOPPER = dict(
    compute_capability=(9, 0),
    shared_memory_per_sm_bytes=228 * _KIB,
    shared_memory_per_block_bytes=227 * _KIB,
    registers_per_sm=64 * 1024,
    max_threads_per_sm=2048,
    max_blocks_per_sm=32,
)

GPUS: dict[str, GPUSpec] = {
    "H100 SXM 80GB": GPUSpec(
        name="H100 SXM 80GB",
        memory_bytes=80e9,  # datasheet: 80 GB HBM3
        # whitepaper, dense: FP32 66.9, TF32 494.7, BF16/FP16 989.4, FP8 1978.9 TFLOPS
        peak_flops={
            "fp32": 66.9 * _TERA,
            "tf32": 494.7 * _TERA,
            "bf16": 989.4 * _TERA,
            "fp16": 989.4 * _TERA,
            "fp8": 1978.9 * _TERA,
        },
        hbm_bytes_per_s=3.35e12,  # datasheet: 3.35 TB/s (whitepaper: 3,352 GB/s)
        l2_bytes=50 * _MIB,  # whitepaper: 50 MB L2
        sm_count=132,  # whitepaper: 132 SMs
        nvlink_bytes_per_s=900e9,  # datasheet: NVLink 900 GB/s
        pcie_bytes_per_s=128e9,  # datasheet: PCIe Gen5 128 GB/s
        citation="nvidia2022h100",
        **_HOPPER,
    ),
    "H200 SXM 141GB": GPUSpec(
        name="H200 SXM 141GB",
        memory_bytes=141e9,  # datasheet: 141 GB HBM3e
        # datasheet: 67 / 989* / 1,979* / 1,979* / 3,958* TFLOPS (* with sparsity): the H100 SXM5's
        # GH100 compute, whose unrounded dense numbers are the H100 whitepaper's
        peak_flops={
            "fp32": 66.9 * _TERA,
            "tf32": 494.7 * _TERA,
            "bf16": 989.4 * _TERA,
            "fp16": 989.4 * _TERA,
            "fp8": 1978.9 * _TERA,
        },
        hbm_bytes_per_s=4.8e12,  # datasheet: 4.8 TB/s
        # not on the datasheet, so taken from the device (from_device): the H200 SXM lent to
        # this project reports 60 MiB (PyTorch printed L2_cache_size=60MB, which is CUDA's
        # l2CacheSize // 2**20: torch/csrc/cuda/Module.cpp), the whole GH100's L2 (the H100
        # whitepaper: 60 MB on the full GH100, of which the H100 SXM5 enables 50)
        l2_bytes=60 * _MIB,
        sm_count=132,  # not on the datasheet: the device reported 132, as the H100 SXM5 has
        nvlink_bytes_per_s=900e9,  # datasheet: NVLink 900 GB/s
        pcie_bytes_per_s=128e9,  # datasheet: PCIe Gen5 128 GB/s
        citation="nvidia2024h200",
        from_device=("l2_bytes", "sm_count"),
        **_HOPPER,
    ),
    "H200 NVL 141GB": GPUSpec(
        name="H200 NVL 141GB",
        memory_bytes=141e9,  # datasheet: 141 GB HBM3e
        # datasheet (H200 NVL column): FP32 60; TF32 835*, BF16/FP16 1,671*, FP8 3,341* TFLOPS
        # (* with sparsity): dense is half of the starred numbers. Lower than the SXM's; the
        # datasheet gives a 600 W TDP but no clocks or SM count
        peak_flops={
            "fp32": 60 * _TERA,
            "tf32": 417.5 * _TERA,
            "bf16": 835.5 * _TERA,
            "fp16": 835.5 * _TERA,
            "fp8": 1670.5 * _TERA,
        },
        hbm_bytes_per_s=4.8e12,  # datasheet: 4.8 TB/s
        l2_bytes=60 * _MIB,  # not on the datasheet: the H200 SXM's, until the device says
        sm_count=132,  # not on the datasheet: the H200 SXM's, until the device says
        nvlink_bytes_per_s=900e9,  # datasheet: 2- or 4-way NVLink bridge, 900 GB/s per GPU
        pcie_bytes_per_s=128e9,  # datasheet: PCIe Gen5 128 GB/s
        citation="nvidia2024h200",
        from_device=("l2_bytes", "sm_count"),
        **_HOPPER,
    ),
    "A100 SXM 80GB": GPUSpec(
        name="A100 SXM 80GB",
        compute_capability=(8, 0),
        memory_bytes=80e9,  # datasheet: 80 GB HBM2e
        # datasheet, dense: FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS; no FP8 tensor cores
        peak_flops={
            "fp32": 19.5 * _TERA,
            "tf32": 156 * _TERA,
            "bf16": 312 * _TERA,
            "fp16": 312 * _TERA,
        },
        hbm_bytes_per_s=2.039e12,  # datasheet: 2,039 GB/s
        l2_bytes=40 * _MIB,  # whitepaper: 40 MB L2
        sm_count=108,  # whitepaper: 108 SMs
        shared_memory_per_sm_bytes=164 * _KIB,  # whitepaper and CUDA guide (8.0): 164 KB per SM
        shared_memory_per_block_bytes=163 * _KIB,  # CUDA guide (8.0): 163 KB per block, opt-in
        registers_per_sm=64 * 1024,
        max_threads_per_sm=2048,
        max_blocks_per_sm=32,
        nvlink_bytes_per_s=600e9,  # datasheet: NVLink 600 GB/s
        pcie_bytes_per_s=64e9,  # datasheet: PCIe Gen4 64 GB/s
    ),
    "L4 24GB": GPUSpec(
        name="L4 24GB",
        compute_capability=(8, 9),
        memory_bytes=24e9,  # datasheet: 24 GB GDDR6
        # datasheet: FP32 30.3; TF32 120*, BF16/FP16 242*, FP8 485* TFLOPS (* with sparsity):
        # dense is half of the starred numbers
        peak_flops={
            "fp32": 30.3 * _TERA,
            "tf32": 60 * _TERA,
            "bf16": 121 * _TERA,
            "fp16": 121 * _TERA,
            "fp8": 242.5 * _TERA,
        },
        hbm_bytes_per_s=300e9,  # datasheet: 300 GB/s (GDDR6, not HBM)
        l2_bytes=48 * _MIB,  # Ada whitepaper: AD104's 48 MB L2
        sm_count=58,  # the L4's AD104 configuration as CUDA reports it; not on the datasheet
        from_device=("sm_count",),
        shared_memory_per_sm_bytes=100 * _KIB,  # CUDA guide (8.9): 100 KB per SM
        shared_memory_per_block_bytes=99 * _KIB,  # CUDA guide (8.9): 99 KB per block, opt-in
        registers_per_sm=64 * 1024,
        max_threads_per_sm=1536,  # CUDA guide (8.9)
        max_blocks_per_sm=24,  # CUDA guide (8.9)
        pcie_bytes_per_s=64e9,  # datasheet: PCIe Gen4 x16 64 GB/s; no NVLink
    ),
    "T4 16GB": GPUSpec(
        name="T4 16GB",
        compute_capability=(7, 5),
        memory_bytes=16e9,  # datasheet: 16 GB GDDR6
        # Turing whitepaper (Tesla T4): FP32 8.1, FP16 tensor cores 65 TFLOPS (FP32 accumulate);
        # no tf32, bf16 or fp8 tensor cores
        peak_flops={"fp32": 8.1 * _TERA, "fp16": 65 * _TERA},
        hbm_bytes_per_s=320e9,  # datasheet: 320+ GB/s (GDDR6, not HBM)
        l2_bytes=4 * _MIB,  # Turing whitepaper: 4 MB L2 (TU104)
        sm_count=40,  # Turing whitepaper: 40 SMs
        shared_memory_per_sm_bytes=64 * _KIB,  # CUDA guide (7.5): 64 KB per SM
        shared_memory_per_block_bytes=64 * _KIB,  # CUDA guide (7.5): 64 KB per block, opt-in
        registers_per_sm=64 * 1024,
        max_threads_per_sm=1024,  # CUDA guide (7.5)
        max_blocks_per_sm=16,  # CUDA guide (7.5)
        pcie_bytes_per_s=32e9,  # datasheet: PCIe Gen3 x16 32 GB/s; no NVLink
    ),
}

#: ``torch.cuda.get_device_name()`` patterns of each entry (other variants, e.g. PCIe or 40GB
#: cards, have other clocks or memory and get no match rather than a wrong one)
_DEVICE_NAMES = [
    (re.compile(r"H100 80GB HBM3|H100 SXM", re.IGNORECASE), "H100 SXM 80GB"),
    (re.compile(r"H200 NVL", re.IGNORECASE), "H200 NVL 141GB"),
    (re.compile(r"H200(?! NVL)", re.IGNORECASE), "H200 SXM 141GB"),
    (re.compile(r"A100[- ]SXM4?[- ]80GB", re.IGNORECASE), "A100 SXM 80GB"),
    (re.compile(r"\bL4\b", re.IGNORECASE), "L4 24GB"),
    (re.compile(r"\bT4\b", re.IGNORECASE), "T4 16GB"),
]


class UnlistedGPUWarning(UserWarning):
    """A CUDA device (or a record's) that :data:`GPUS` has no row for: it gets no prediction."""


def gpu_spec(device_name: str, capability: tuple[int, int] | None = None) -> GPUSpec | None:
    """The :data:`GPUS` entry for a ``torch.cuda.get_device_name()`` string, or None.

    ``"NVIDIA H100 80GB HBM3"`` is the H100 SXM5; ``"NVIDIA H200"`` the H200 SXM and ``"NVIDIA
    H200 NVL"`` the H200 NVL; ``"NVIDIA A100-SXM4-80GB"`` the A100 SXM 80GB; ``"NVIDIA L4"`` and
    ``"Tesla T4"`` the L4 and T4. With ``capability`` (``torch.cuda.get_device_capability()``),
    a name whose entry has another compute capability gives None rather than a wrong row.

    A pure lookup: the datasheet row, without the device's own figures and without a warning
    (:func:`gpu_for_device` and :func:`spec_for_record` add both).
    """
    spec = next((GPUS[key] for pattern, key in _DEVICE_NAMES if pattern.search(device_name)), None)
    if spec is not None and capability is not None and tuple(capability) != spec.compute_capability:
        return None
    return spec


def with_device_properties(spec: GPUSpec, properties: Mapping[str, Any]) -> GPUSpec:
    """``spec`` with each of its ``from_device`` fields replaced by the device's own
    figure in ``properties`` (:func:`trainfast.device.gpu_properties`' keys: ``l2_bytes``,
    ``sm_count``), where the device reported one. Datasheet fields are kept: the device reports
    no peak rate or bandwidth, and a prediction is the datasheet's."""
    found = {name: properties[name] for name in spec.from_device if properties.get(name)}
    return replace(spec, **found) if found else spec


def _unlisted(name: str, capability: Sequence[int] | None) -> None:
    cc = f" (compute capability {'.'.join(map(str, capability))})" if capability else ""
    warnings.warn(
        f"{name}{cc} has no row in trainfast.gpus.GPUS: no datasheet prediction for it (add a "
        "row with its datasheet figures; another card's would be wrong)",
        UnlistedGPUWarning,
        stacklevel=3,
    )


def gpu_for_device(device: torch.device | str | int | None = None) -> GPUSpec | None:
    """The :data:`GPUS` entry of a live CUDA device, matched by name and compute capability, with
    the device's own figures where the datasheet is silent (:func:`with_device_properties`).

    None for a CPU or MPS device; None with an :class:`UnlistedGPUWarning` naming the GPU for one
    the table does not list.
    """
    if device is not None and not isinstance(device, int):
        device = parse_device(device)
        if device.type != "cuda":
            return None
    if not torch.cuda.is_available():
        return None
    from trainfast.device import gpu_properties

    name, capability = torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
    spec = gpu_spec(name, capability)
    if spec is None:
        _unlisted(name, capability)
        return None
    return with_device_properties(spec, gpu_properties(device))


def spec_for_record(record: Record) -> GPUSpec | None:
    """The :data:`GPUS` entry of the GPU ``record`` was measured on, with the figures its device
    reported where the datasheet is silent (records made since 2026-12-01 store them in
    ``environment["gpu"]``; older ones get the row as it is). Every prediction set beside a
    record comes from this, so an H200 record is predicted as an H200.

    None for a CPU or MPS record; None with an :class:`UnlistedGPUWarning` naming the GPU for a
    CUDA record whose GPU has no row (or whose stored compute capability is not the row's).
    """
    env = record.environment
    if env.get("device") != "cuda":
        return None
    properties = env.get("gpu") or {}
    capability = properties.get("compute_capability")
    spec = gpu_spec(str(env["device_name"]), tuple(capability) if capability else None)
    if spec is None:
        _unlisted(str(env["device_name"]), capability)
        return None
    return with_device_properties(spec, properties)


def spec_for_records(records: Sequence[Record]) -> GPUSpec | None:
    """:func:`spec_for_record` of the first of ``records`` (``records_for``'s newest, or the one
    a section shows); None for no records. Take the records of one GPU first
    (:func:`trainfast.records.records_by_gpu`), so the prediction is that GPU's."""
    return spec_for_record(records[0]) if records else None


def datasheet_peak(spec: GPUSpec, dtype: str = "bf16") -> Published:
    """``spec``'s dense ``dtype`` peak as a :class:`~trainfast.records.Published` figure in
    TFLOP/s, named for its GPU and cited to its own datasheet (``citation``), for a
    table's "published" column beside that GPU's record."""
    from trainfast.records import Published

    if dtype not in spec.peak_flops:
        raise ValueError(
            f"Unknown dtype for {spec.name}: {dtype!r} (has {sorted(spec.peak_flops)})"
        )
    source = f"NVIDIA, {spec.name}, dense {dtype} peak"
    return Published(spec.peak_flops[dtype] / 1e12, "TFLOP/s", source, spec.citation)
