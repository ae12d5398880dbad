"""Which GPU a kernel launch is tiled for: the live device's row of :data:`trainfast.gpus.GPUS`.

Every Triton launcher of :mod:`trainfast.kernels` picks its tiles (block sizes, warps, pipeline
stages) with one public function per kernel that takes a *target*, a
:class:`~trainfast.gpus.GPUSpec`, or ``None`` for Triton's CPU interpreter. The launchers get the
target of their tensors' device from :func:`launch_target`; the ahead-of-time compile report
(:mod:`trainfast.kernels.compile_report`) passes a row of the table. Both then compile the same
kernel with the same tiles.

The tile functions read two fields of the target: ``compute_capability`` (tensor-core
instructions, and whether loads can be pipelined with ``cp.async``, which needs sm_80) and
``shared_memory_per_block_bytes`` (the opt-in limit that a tile must fit).
"""

from __future__ import annotations

import torch

from trainfast.gpus import GPUS, GPUSpec, gpu_for_device

__all__ = ["launch_target", "pipelines_loads"]


def launch_target(device: torch.device | str) -> GPUSpec | None:
    """The :data:`~trainfast.gpus.GPUS` row to tile for on ``device``; ``None`` on a CPU.

    A listed GPU gets its own row (:func:`~trainfast.gpus.gpu_for_device`). A GPU the table does
    not list gets the most capable listed row that it can stand in for: a compute capability
    and a per-block shared memory no larger than the device's, so the tiles fit (the T4's row
    at worst).
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    spec = gpu_for_device(device)
    if spec is not None:
        return spec
    properties = torch.cuda.get_device_properties(device)
    capability = (properties.major, properties.minor)
    shared = getattr(properties, "shared_memory_per_block_optin", 48 * 1024)
    fitting = [
        s
        for s in GPUS.values()
        if s.compute_capability <= capability and s.shared_memory_per_block_bytes <= shared
    ]
    if not fitting:
        raise ValueError(
            f"No listed GPU fits {properties.name} (compute capability {capability}, "
            f"{shared} bytes of shared memory per block); the Triton kernels need sm_75 or newer"
        )
    return max(fitting, key=lambda s: (s.compute_capability, s.shared_memory_per_block_bytes))


def pipelines_loads(target: GPUSpec) -> bool:
    """True if Triton can pipeline global loads into shared memory on ``target``.

    Triton's software pipelining (``num_stages > 1``) issues asynchronous copies, ``cp.async``
    (sm_80 and later) or TMA (sm_90). On sm_75 there is no asynchronous copy, so extra stages
    buy nothing there and only cost shared memory.
    """
    return target.compute_capability >= (8, 0)
