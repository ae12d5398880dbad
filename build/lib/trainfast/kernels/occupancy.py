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

The rules are those of CUDA's occupancy calculator (``cuda_occupancy.h``,
``cudaOccMaxActiveBlocksPerMultiprocessor``) with the default shared-memory carveout: registers
are allocated per warp in units of 256, and each of an SM's four sub-partitions holds its own
quarter of the register file, so the warps that fit by registers are ``4 · floor(65,536 / 4 /
registers per warp)``; shared memory is allocated per block in units of 256 bytes on compute
capability 7.x and 128 bytes from 8.0 on, where the runtime also reserves 1 KiB per block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainfast.gpus import GPUSpec
from trainfast.validation import check_instance, check_int, check_number

__all__ = [
    "HOPPER_LATENCY_CYCLES",
    "REGISTERS_PER_BLOCK",
    "REGISTER_ALLOCATION_UNIT",
    "REGISTER_SUB_PARTITIONS",
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
REGISTER_SUB_PARTITIONS = 4  # each SM's register file is split among 4 sub-partitions (cc 7.0-9.0)
REGISTERS_PER_BLOCK = 64 * 1024  # the most registers one block may hold (cc 7.0-9.0)
RESERVED_SHARED_MEMORY_PER_BLOCK = 1024  # the runtime keeps 1 KiB per block (cc 8.0 and later)
#: shared memory is allocated per block in units of these bytes, by compute capability major
SHARED_ALLOCATION_UNIT = {7: 256, 8: 128, 9: 128}
UNLIMITED = 2**31 - 1  # the blocks a resource the kernel does not use allows (INT_MAX, as CUDA's)
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
    and ``limit`` names every resource that allows no more (``"registers and shared memory"``
    where two bind at once).
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
    registers (the warps each of the :data:`REGISTER_SUB_PARTITIONS` quarters of the register
    file holds, registers allocated per warp in units of :data:`REGISTER_ALLOCATION_UNIT`, times
    four, over the block's warps), ``max_blocks_per_sm``, and shared memory (per-SM capacity over
    the block's use plus :data:`RESERVED_SHARED_MEMORY_PER_BLOCK` from compute capability 8.0 on,
    rounded up to :data:`SHARED_ALLOCATION_UNIT`); the smallest wins. These are the rules of
    CUDA's ``cuda_occupancy.h`` with the default carveout.
    A block that asks for more shared memory than ``shared_memory_per_block_bytes`` cannot launch
    at all: 0 blocks, limited by shared memory.
    """
    check_instance("spec", spec, GPUSpec, hint="trainfast.gpus.GPUS holds one per GPU")
    check_int("threads_per_block", threads_per_block, minimum=1, maximum=1024)
    check_int("registers_per_thread", registers_per_thread, minimum=1, maximum=255)
    check_int("shared_memory_per_block", shared_memory_per_block, minimum=0)
    warps = -(-threads_per_block // WARP_SIZE)
    registers_per_warp = REGISTER_ALLOCATION_UNIT * -(
        -(registers_per_thread * WARP_SIZE) // REGISTER_ALLOCATION_UNIT
    )
    # each sub-partition holds whole warps in its quarter of the register file
    per_partition = spec.registers_per_sm // REGISTER_SUB_PARTITIONS // registers_per_warp
    by_registers = per_partition * REGISTER_SUB_PARTITIONS // warps
    # the hardware checks a block as if its warps were spread over all four sub-partitions
    if registers_per_warp * -(-warps // REGISTER_SUB_PARTITIONS) * REGISTER_SUB_PARTITIONS > (
        REGISTERS_PER_BLOCK
    ):
        by_registers = 0
    major = spec.compute_capability[0]
    reserved = RESERVED_SHARED_MEMORY_PER_BLOCK if major >= 8 else 0
    unit = SHARED_ALLOCATION_UNIT.get(major, 128)
    shared = unit * -(-(shared_memory_per_block + reserved) // unit)
    if shared_memory_per_block > spec.shared_memory_per_block_bytes:
        by_shared = 0
    elif shared == 0:
        by_shared = UNLIMITED
    else:
        by_shared = spec.shared_memory_per_sm_bytes // shared
    limits = {
        "threads": spec.max_threads_per_sm // (warps * WARP_SIZE),
        "registers": by_registers,
        "blocks": spec.max_blocks_per_sm,
        "shared memory": by_shared,
    }
    blocks = min(limits.values())
    limit = " and ".join(name for name, value in limits.items() if value == blocks)
    return Occupancy(blocks, blocks * warps, spec.max_threads_per_sm // WARP_SIZE, limit, limits)


def bytes_in_flight(bytes_per_s: float, latency_s: float) -> float:
    """Little's law: the bytes that must be requested and not yet delivered, at every moment,
    to move ``bytes_per_s`` through a memory that answers after ``latency_s`` seconds."""
    check_number("bytes_per_s", bytes_per_s, above=0.0)
    check_number("latency_s", latency_s, above=0.0)
    return bytes_per_s * latency_s


def sm_clock_hz(spec: GPUSpec, fp32_lanes_per_sm: int) -> float:
    """The clock that the datasheet's float32 peak implies: ``peak / (SMs · lanes · 2)``, a
    fused multiply-add per lane per clock. ``fp32_lanes_per_sm`` is the whitepaper's count of
    FP32 cores per SM (128 on Hopper's GH100, 64 on the A100's GA100)."""
    check_instance("spec", spec, GPUSpec, hint="trainfast.gpus.GPUS holds one per GPU")
    check_int("fp32_lanes_per_sm", fp32_lanes_per_sm, minimum=1)
    return spec.peak_flops["fp32"] / (spec.sm_count * fp32_lanes_per_sm * 2)
