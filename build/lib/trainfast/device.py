"""Pick the device a chapter runs on, and describe the environment in one line.

Chapters never assume CUDA: they call :func:`pick_device` and print :func:`environment_line`
first, so every executed page says where its numbers came from.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = [
    "CPU_FLAGS",
    "Environment",
    "cpu_properties",
    "describe_environment",
    "device_name",
    "environment_line",
    "gpu_properties",
    "nvidia_smi_id",
    "page_environment_line",
    "nvidia_smi_query",
    "parse_device",
    "pick_device",
]


_KINDS = ("cpu", "cuda", "mps")


def parse_device(
    name: str | torch.device, *, field: str = "device", note: str = ""
) -> torch.device:
    """``name`` ("cuda", "cuda:1", "cpu", a ``torch.device``) as a device of a kind the book
    knows, whether or not this machine has one; anything else raises ``ValueError`` naming it
    (as ``field``, the argument it came in: ``device`` unless the caller says otherwise).

    The one check of a device argument in the package: every public function that takes a
    device passes it through here (or :func:`pick_device`, which also checks that the machine
    has one), so ``'tpu'`` is named, not answered by torch's list of twenty backends. A kind
    torch knows but the book does not run on (``'meta'``, ``'xla'``) is refused too, saying so.
    A config may name a device it will run on elsewhere: :func:`pick_device` checks that too.
    ``note`` is appended to the message (what the torch function the caller wraps would do).
    """
    expected = "'cpu', 'cuda' or 'mps', with an index if need be, such as 'cuda:1'"
    note = f"; {note}" if note else ""
    if not isinstance(name, (str, torch.device)):
        raise ValueError(f"Invalid {field}: {name!r} (expected {expected}, as a string){note}")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"Invalid {field}: {name!r} (expected {expected}){note}") from None
    if device.type not in _KINDS:
        raise ValueError(
            f"Invalid {field}: {name!r} (expected {expected}; torch.device accepts "
            f"{device.type!r}, but the book runs on none of its kind){note}"
        )
    return device


def pick_device(prefer: str | torch.device | None = None) -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU.

    ``prefer`` forces a kind ("cuda", "mps" or "cpu") or one device ("cuda:1", a
    ``torch.device``); asking for one that is unknown or not available raises ``ValueError``
    naming it, rather than silently falling back or failing at the first tensor.
    """
    if prefer is not None:
        device = parse_device(prefer)
        available = {"cuda": torch.cuda.is_available, "mps": _mps_available, "cpu": lambda: True}
        if not available[device.type]():
            raise ValueError(f"Device kind {device.type!r} is not available on this machine")
        if device.type == "cuda" and device.index is not None:
            if device.index >= torch.cuda.device_count():
                raise ValueError(
                    f"Invalid device: {prefer!r} (this machine has "
                    f"{torch.cuda.device_count()} CUDA devices)"
                )
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


@dataclass(frozen=True)
class Environment:
    """What a measurement ran on: enough to tell two records apart.

    ``gpu`` is the CUDA device's own properties (:func:`gpu_properties`: SM count, L2, memory,
    compute capability, maximum clocks), so a record says what its GPU was even where
    :data:`trainfast.gpus.GPUS` has no row for it or the datasheet is silent; ``cpu`` is the
    host processor (:func:`cpu_properties`: ``/proc/cpuinfo``'s model name, family and model,
    and the flags that decide how fast bf16 runs). Both are None in records made before they
    were recorded (2026-12-01), which still load.
    """

    device: str  # "cuda", "mps" or "cpu"
    device_name: str  # the card's name on CUDA, the processor otherwise
    torch_version: str
    cuda_version: str | None  # None on a CPU-only or MPS build
    python_version: str
    platform: str
    driver_version: str | None = None  # the NVIDIA driver on CUDA (from nvidia-smi), else None
    gpu: dict[str, Any] | None = None  # gpu_properties(device) on CUDA, else None
    cpu: dict[str, Any] | None = None  # cpu_properties() of the host

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_environment(device: torch.device | None = None) -> Environment:
    """The :class:`Environment` of ``device`` (default: :func:`pick_device`)."""
    device = device or pick_device()
    driver = None
    if device.type == "cuda":
        driver = (nvidia_smi_query(["driver_version"], device) or {}).get("driver_version")
    return Environment(
        device=device.type,
        device_name=device_name(device),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda if device.type == "cuda" else None,
        python_version=sys.version.split()[0],
        platform=platform.platform(terse=True),
        driver_version=driver,
        gpu=gpu_properties(device) if device.type == "cuda" else None,
        cpu=cpu_properties(),
    )


def gpu_properties(device: torch.device | str | int | None = None) -> dict[str, Any]:
    """What CUDA ``device`` reports about itself (``torch.cuda.get_device_properties``), for a
    record's environment: its name, SM count, L2 and memory in bytes, compute capability,
    opt-in shared memory per block, registers and threads per SM, and (from nvidia-smi, where it
    answers) its maximum SM and memory clocks in MHz.

    These are what :func:`trainfast.gpus.with_device_properties` takes where a datasheet is
    silent (an H200's L2 is on none). Clocks are the maximum, not the current ones: a record's
    environment must not change between two processes on the same machine.
    """
    if device is None or isinstance(device, int):
        index = torch.cuda.current_device() if device is None else device
    else:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"Invalid device: {device} (gpu_properties needs a CUDA device)")
        index = device.index if device.index is not None else torch.cuda.current_device()
    p = torch.cuda.get_device_properties(index)
    properties: dict[str, Any] = {
        "name": p.name,
        "sm_count": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None),  # torch >= 2.5 reports it (pytorch#132819)
        "memory_bytes": p.total_memory,
        "compute_capability": [p.major, p.minor],
        "shared_memory_per_block_optin_bytes": getattr(p, "shared_memory_per_block_optin", None),
        "registers_per_sm": getattr(p, "regs_per_multiprocessor", None),
        "max_threads_per_sm": getattr(p, "max_threads_per_multi_processor", None),
    }
    clocks = nvidia_smi_query(["clocks.max.sm", "clocks.max.mem"], torch.device("cuda", index))
    for field, key in (
        ("clocks.max.sm", "max_sm_clock_mhz"),
        ("clocks.max.mem", "max_memory_clock_mhz"),
    ):
        value = (clocks or {}).get(field)
        properties[key] = int(value) if value and value.isdigit() else None
    return properties


#: ``/proc/cpuinfo`` flags that decide how a CPU runs float32 and bf16 matrix work: 256-bit FMA
#: (``avx2``, ``fma``), 512-bit (``avx512f``), bf16 dot products (``avx512_bf16``), fp16
#: arithmetic (``avx512_fp16``), Intel's AMX tiles (``amx_tile``, ``amx_bf16``) and, on 64-bit
#: Arm, ``bf16`` and the scalable vectors (``sve``, ``sve2``), which Linux lists under ``Features``.
#: A CPU named only "AMD EPYC" says none of this; its flags do.
CPU_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "bf16",
    "sve",
    "sve2",
)


def cpu_properties(cpuinfo: str | None = None) -> dict[str, Any]:
    """The host processor, for a record's environment: ``/proc/cpuinfo``'s ``model name``,
    ``vendor_id``, ``cpu family`` and ``model`` (which name the microarchitecture where the model
    name does not, e.g. family 25, model 17 is AMD Zen 4), the logical CPUs this process may
    use, and which of :data:`CPU_FLAGS` the processor has (``flags`` on x86, ``Features`` on Arm).

    ``cpuinfo`` is the file's text (default: read it; empty where there is none, as on macOS, and
    then only ``platform``'s processor name and the CPU count are known).
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as file:
                cpuinfo = file.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block describes them all
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set((fields.get("flags") or fields.get("Features") or "").split())

    def number(key: str) -> int | None:
        return int(fields[key]) if fields.get(key, "").isdigit() else None

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count()
    return {
        "model_name": fields.get("model name") or platform.processor() or platform.machine(),
        "vendor_id": fields.get("vendor_id") or fields.get("CPU implementer"),
        "cpu_family": number("cpu family"),
        "model": number("model"),
        "cpus": cpus,
        "flags": [flag for flag in CPU_FLAGS if flag in flags],
    }


def nvidia_smi_query(
    fields: list[str], device: torch.device | None = None
) -> dict[str, str] | None:
    """Ask ``nvidia-smi --query-gpu`` for ``fields`` of one GPU; None where it cannot answer.

    ``fields`` are nvidia-smi's names (``driver_version``, ``clocks.sm``, ``clocks.max.sm``,
    ``clocks.mem``, ``power.draw``, ``temperature.gpu``; ``nvidia-smi --help-query-gpu`` lists
    them). The GPU is ``device`` (default: the current CUDA device), named to nvidia-smi by
    its UUID (:func:`nvidia_smi_id`; nvidia-smi's first GPU where torch sees none). Values come
    back as nvidia-smi prints them, units stripped. Returns None when there is no
    ``nvidia-smi``, it fails, or takes over 10 s: describing the machine must never stop a
    measurement.
    """
    executable = shutil.which("nvidia-smi")
    if executable is None or not fields:
        return None
    try:
        gpu = nvidia_smi_id(device or torch.device("cuda"))
    except (RuntimeError, AssertionError):  # torch sees no GPU: nvidia-smi's first, if any
        gpu = "0"
    try:
        result = subprocess.run(
            [
                executable,
                f"--id={gpu}",
                f"--query-gpu={','.join(fields)}",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    values = [value.strip() for value in result.stdout.strip().split(",")]
    if len(values) != len(fields):
        return None
    return dict(zip(fields, values, strict=True))


def nvidia_smi_id(device: torch.device) -> str:
    """The name nvidia-smi knows CUDA ``device`` by: ``GPU-`` and the GPU's UUID.

    A CUDA index is not an nvidia-smi index: CUDA numbers only the GPUs that
    ``CUDA_VISIBLE_DEVICES`` lets the process see, in that variable's order, and by default
    fastest first (``CUDA_DEVICE_ORDER=FASTEST_FIRST``), while nvidia-smi numbers every GPU in
    the machine by PCI bus. The UUID is the same to both (``nvidia-smi --id`` accepts it, and
    ``nvidia-smi -L`` lists it); CUDA reports it as ``cudaDeviceProp.uuid``, 16 bytes.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"Invalid device: {device} (nvidia-smi knows only CUDA devices)")
    index = device.index if device.index is not None else torch.cuda.current_device()
    raw = torch.cuda.get_device_properties(index).uuid
    return f"GPU-{uuid.UUID(bytes=bytes(raw.bytes))}"


def device_name(device: torch.device) -> str:
    """The card's name on CUDA (``NVIDIA H100 80GB HBM3``), the processor's model otherwise."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _processor_name()


def _processor_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown processor"


def environment_line(device: torch.device | None = None) -> str:
    """One line for the top of a chapter, e.g. ``device: cpu (x86_64) | torch 2.14.1 | ...``."""
    env = describe_environment(device)
    parts = [f"device: {env.device} ({env.device_name})", f"torch {env.torch_version}"]
    if env.cuda_version:
        parts.append(f"CUDA {env.cuda_version}")
    if env.driver_version:
        parts.append(f"driver {env.driver_version}")
    parts += [f"Python {env.python_version}", env.platform]
    return " | ".join(parts)


def page_environment_line(device: torch.device | None = None, page: str | None = None) -> str:
    """The short line a page of the book opens with: where its cells ran and, for ``page`` (its
    name under ``book/``, e.g. ``optimizers/adam``), where it last ran on a GPU, e.g.
    ``device: cpu (AMD EPYC 9R14) | torch 2.14.1 | commit 26fa116 | last on a GPU: NVIDIA H200,
    2026-12-02, at 1a2b3c4, every cell passed``.

    It starts as :func:`environment_line` does (``device: <kind>``), which the GPU pass reads to
    tell where a page executed; Python, the platform and the driver stay in the records'
    provenance, where a reader who needs them finds them. The commit is
    :func:`trainfast.versions.source_commit`, shortened (``+dirty`` kept), left out where unknown.
    The GPU run comes from the GPU pass's record
    (:func:`trainfast.gpu_pass.last_gpu_execution`); a page no pass executed says so.
    """
    from trainfast.versions import source_commit

    env = describe_environment(device)
    parts = [f"device: {env.device} ({env.device_name})", f"torch {env.torch_version}"]
    commit = source_commit()
    if commit:
        head, _, dirty = commit.partition("+")
        parts.append(f"commit {head[:7]}{'+' + dirty if dirty else ''}")
    if page is not None:
        from trainfast.gpu_pass import last_gpu_execution

        run = last_gpu_execution(page)
        if run is None:
            parts.append("never executed on a GPU")
        else:
            at = f", at {run.source_commit[:7]}" if run.source_commit else ""
            verdict = "every cell passed" if run.passed else run.status
            parts.append(f"last on a GPU: {run.gpu}, {run.finished[:10]}{at}, {verdict}")
    return " | ".join(parts)
