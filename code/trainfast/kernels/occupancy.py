"""The GPU execution model in numbers: occupancy, and Little's law for memory latency.

An SM runs *warps*, groups of 32 threads that issue one instruction at a time (SIMT). It keeps
many warps resident at once, and while some wait for memory, others compute: that is how a GPU
hides latency, with parallelism instead of large caches. How many warps fit is *occupancy*,
limited by whichever per-SM resource a block of the kernel uses up first: threads, registers,
shared memory or block slots (:func:`occupancy`, with the limits of
:class:`trainfast.gpus.GPUSpec`, from the CUDA C++ Programming Guide's table "Technical
Specifications per Compute Capability").

How much latency must be hidden is Little's law (Little, 1961): to sustain a bandwidth ``W``
through a memory whose latency is ``L``, ``W · L`` bytes must be in flight at every moment
(:func:`bytes_in_flight`). Resident warps with outstanding loads, or a software pipeline that
loads the next tiles while it computes on this one (Triton's ``num_stages``), provide them.

Simplifications, so the arithmetic stays readable: registers are allocated per warp in units of
256 and shared memory per block in units of 128 bytes (the CUDA Occupancy Calculator's
granularities for compute capabilities 7.0 to 9.0), plus the 1 KiB the CUDA runtime reserves per
block from compute capability 8.0 on; the Occupancy Calculator and Nsight Compute are exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainfast.gpus import GPUSpec

__all__ = [
    "HOPPER_LATENCY_CYCLES",
    "REGISTER_ALLOCATION_UNIT",
    "RESERVED_SHARED_MEMORY_PER_BLOCK",
    "SHARED_ALLOCATION_UNIT",
    "SHARED_MEMORY_BYTES_PER_CLOCK",
    "WARP_SIZE",
    "Occupancy",
    "bytes_in_flight",
    "occupancy",
    "sm_clock_hz",
]

WARP_SIZE = 32  # threads per warp on every NVIDIA GPU so far (CUDA C++ Programming Guide)
REGISTER_ALLOCATION_UNIT = 256  # registers are allocated per warp in units of 256 (cc 7.0-9.0)
RESERVED_SHARED_MEMORY_PER_BLOCK = 1024  # the runtime keeps 1 KiB per block (cc 8.0 and later)
SHARED_ALLOCATION_UNIT = 128  # shared memory is allocated per block in units of 128 bytes
#: 32 banks of 4 bytes, each serving one 32-bit word per clock: 128 bytes per clock per SM when
#: no two threads of a warp hit different words of one bank (CUDA C++ Programming Guide)
SHARED_MEMORY_BYTES_PER_CLOCK = 32 * 4

#: Load latencies in clock cycles on a Hopper GPU (an H800 PCIe) measured by pointer-chasing
#: microbenchmarks: published by Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU
#: Architecture" (IPDPS 2024, arXiv:2402.13499), section IV-B. NVIDIA publishes no latencies.
HOPPER_LATENCY_CYCLES = {"shared memory": 29.0, "L1 cache": 40.7, "L2 cache": 263.0, "HBM": 478.8}


@dataclass(frozen=True)
class Occupancy:
    """Blocks and warps of one kernel resident on an SM, and the resource that limits them.

    ``limits`` maps each resource (``"threads"``, ``"registers"``, ``"blocks"``,
    ``"shared memory"``) to the blocks it alone would allow; ``blocks_per_sm`` is the smallest
    and ``limit`` names it (the first in that order on a tie).
    """

    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    limit: str
    limits: Mapping[str, int] = field(hash=False)

    @property
    def fraction(self) -> float:
        """Resident warps over the most the SM can hold (the CUDA calculator's occupancy)."""
        return self.warps_per_sm / self.max_warps_per_sm


def occupancy(
    spec: GPUSpec,
    *,
    threads_per_block: int,
    registers_per_thread: int,
    shared_memory_per_block: int = 0,
) -> Occupancy:
    """How many blocks of a kernel fit on one SM of ``spec``, and what stops more.

    Each limit gives a number of blocks: threads (``max_threads_per_sm`` over the block's warps),
    registers (the register file over the block's warps times their registers, allocated per
    warp in units of :data:`REGISTER_ALLOCATION_UNIT`), ``max_blocks_per_sm``, and shared memory
    (per-SM capacity over the block's use rounded up to :data:`SHARED_ALLOCATION_UNIT`, plus
    :data:`RESERVED_SHARED_MEMORY_PER_BLOCK` from compute capability 8.0 on); the smallest wins.
    A block that asks for more shared memory than ``shared_memory_per_block_bytes`` cannot launch
    at all: 0 blocks, limited by shared memory.
    """
    if not 1 <= threads_per_block <= 1024:
        raise ValueError(f"Invalid threads_per_block: {threads_per_block} (1 to 1024)")
    if not 1 <= registers_per_thread <= 255:
        raise ValueError(f"Invalid registers_per_thread: {registers_per_thread} (1 to 255)")
    if shared_memory_per_block < 0:
        raise ValueError(f"Invalid shared_memory_per_block: {shared_memory_per_block} (>= 0)")
    warps = -(-threads_per_block // WARP_SIZE)
    registers_per_warp = REGISTER_ALLOCATION_UNIT * -(
        -(registers_per_thread * WARP_SIZE) // REGISTER_ALLOCATION_UNIT
    )
    reserved = RESERVED_SHARED_MEMORY_PER_BLOCK if spec.compute_capability >= (8, 0) else 0
    shared = SHARED_ALLOCATION_UNIT * -(-shared_memory_per_block // SHARED_ALLOCATION_UNIT)
    if shared_memory_per_block > spec.shared_memory_per_block_bytes:
        by_shared = 0
    elif shared + reserved == 0:
        by_shared = spec.max_blocks_per_sm
    else:
        by_shared = spec.shared_memory_per_sm_bytes // (shared + reserved)
    limits = {
        "threads": spec.max_threads_per_sm // (warps * WARP_SIZE),
        "registers": spec.registers_per_sm // (warps * registers_per_warp),
        "blocks": spec.max_blocks_per_sm,
        "shared memory": by_shared,
    }
    limit = min(limits, key=lambda name: limits[name])
    blocks = limits[limit]
    return Occupancy(blocks, blocks * warps, spec.max_threads_per_sm // WARP_SIZE, limit, limits)


def bytes_in_flight(bytes_per_s: float, latency_s: float) -> float:
    """Little's law: the bytes that must be requested and not yet delivered, at every moment,
    to move ``bytes_per_s`` through a memory that answers after ``latency_s`` seconds."""
    if not (bytes_per_s > 0 and latency_s > 0):
        raise ValueError(f"Invalid bandwidth or latency: {bytes_per_s}, {latency_s} (need > 0)")
    return bytes_per_s * latency_s


def sm_clock_hz(spec: GPUSpec, fp32_lanes_per_sm: int) -> float:
    """The clock that the datasheet's float32 peak implies: ``peak / (SMs · lanes · 2)``, a
    fused multiply-add per lane per clock. ``fp32_lanes_per_sm`` is the whitepaper's count of
    FP32 cores per SM (128 on Hopper's GH100, 64 on the A100's GA100)."""
    if fp32_lanes_per_sm < 1:
        raise ValueError(f"Invalid fp32_lanes_per_sm: {fp32_lanes_per_sm} (need >= 1)")
    return spec.peak_flops["fp32"] / (spec.sm_count * fp32_lanes_per_sm * 2)
