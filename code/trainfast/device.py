"""Pick the device a chapter runs on, and describe the environment in one line.

Chapters never assume CUDA: they call :func:`pick_device` and print :func:`environment_line`
first, so every executed page says where its numbers came from.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass

import torch

__all__ = [
    "Environment",
    "describe_environment",
    "device_name",
    "environment_line",
    "nvidia_smi_id",
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
    """What a measurement ran on: enough to tell two records apart."""

    device: str  # "cuda", "mps" or "cpu"
    device_name: str  # the card's name on CUDA, the processor otherwise
    torch_version: str
    cuda_version: str | None  # None on a CPU-only or MPS build
    python_version: str
    platform: str
    driver_version: str | None = None  # the NVIDIA driver on CUDA (from nvidia-smi), else None

    def as_dict(self) -> dict[str, str | None]:
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
    )


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
