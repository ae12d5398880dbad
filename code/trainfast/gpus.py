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
datasheet (SXM5); the NVIDIA H200 datasheet (2024); the NVIDIA A100 Tensor Core GPU Architecture
whitepaper (2020) and A100 datasheet (80GB SXM); the NVIDIA L4 datasheet (2023) and Ada
Lovelace architecture whitepaper; the NVIDIA Turing GPU Architecture whitepaper (2018, Tesla T4
appendix) and T4 datasheet. The per-compute-capability limits (shared memory per block and per
SM, registers, resident blocks and threads per SM) are the CUDA C++ Programming Guide's table
"Technical Specifications per Compute Capability".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from trainfast.device import parse_device

__all__ = ["GPUS", "GPUSpec", "gpu_for_device", "gpu_spec"]


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet numbers and its compute capability's limits.

    ``shared_memory_per_block_bytes`` is the opt-in maximum a kernel may ask for
    (``cudaFuncAttributeMaxDynamicSharedMemorySize``); without opting in a block gets 48 KiB.
    ``nvlink_bytes_per_s`` is ``None`` for a card without NVLink (L4, T4); NVLink and PCIe
    bandwidths are as NVIDIA states them, both directions together.
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
        l2_bytes=50 * _MIB,  # not on the datasheet: the H100 SXM5's GH100 configuration
        sm_count=132,  # as H100 SXM5
        nvlink_bytes_per_s=900e9,  # datasheet: NVLink 900 GB/s
        pcie_bytes_per_s=128e9,  # datasheet: PCIe Gen5 128 GB/s
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
    (re.compile(r"H200(?! NVL)", re.IGNORECASE), "H200 SXM 141GB"),
    (re.compile(r"A100[- ]SXM4?[- ]80GB", re.IGNORECASE), "A100 SXM 80GB"),
    (re.compile(r"\bL4\b", re.IGNORECASE), "L4 24GB"),
    (re.compile(r"\bT4\b", re.IGNORECASE), "T4 16GB"),
]


def gpu_spec(device_name: str, capability: tuple[int, int] | None = None) -> GPUSpec | None:
    """The :data:`GPUS` entry for a ``torch.cuda.get_device_name()`` string, or None.

    ``"NVIDIA H100 80GB HBM3"`` is the H100 SXM5; ``"NVIDIA H200"`` the H200 SXM;
    ``"NVIDIA A100-SXM4-80GB"`` the A100 SXM 80GB; ``"NVIDIA L4"`` and ``"Tesla T4"`` the L4 and
    T4. With ``capability`` (``torch.cuda.get_device_capability()``), a name whose entry has
    another compute capability gives None rather than a wrong row.
    """
    spec = next((GPUS[key] for pattern, key in _DEVICE_NAMES if pattern.search(device_name)), None)
    if spec is not None and capability is not None and tuple(capability) != spec.compute_capability:
        return None
    return spec


def gpu_for_device(device: torch.device | str | int | None = None) -> GPUSpec | None:
    """The :data:`GPUS` entry of a live CUDA device, matched by name and compute capability;
    None for a CPU or MPS device and for a GPU the table does not list."""
    if device is not None and not isinstance(device, int):
        device = parse_device(device)
        if device.type != "cuda":
            return None
    if not torch.cuda.is_available():
        return None
    return gpu_spec(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
