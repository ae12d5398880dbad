"""Which CPU a speedrun record holds for: its model name and the flags that decide bf16.

Two CPUs the kernel both calls "AMD EPYC" can disagree on whether bf16 autocast pays: one with
``avx512_bf16`` (AVX-512 BF16 dot products, Zen 4 and Intel Cooper Lake on) or ``amx_bf16``
(Intel AMX tiles, Sapphire Rapids on) multiplies bf16 matrices in hardware, one without emulates
them and is slower in bf16 than in float32. A verdict on bf16 (or on Muon's Newton-Schulz
iteration in bf16) therefore names the CPU and these flags (Linux ``/proc/cpuinfo``), and
``torch.backends.cpu.get_cpu_capability()`` (the vector width PyTorch's kernels dispatch to).

This reader lives here until the records' environment carries the CPU's model and flags
(:mod:`trainfast.device`); it reads ``/proc/cpuinfo`` only, and on another system says it does
not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["BF16_FLAGS", "CpuDescription", "describe_cpu", "parse_cpuinfo"]

#: The instruction-set flags that give a CPU bf16 matrix arithmetic in hardware.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class CpuDescription:
    """A CPU as a record names it."""

    model: str  # "Intel(R) Xeon(R) Processor"; "unknown" where nothing says
    bf16_flags: tuple[str, ...]  # those of BF16_FLAGS it has
    capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", ...

    @property
    def has_bf16(self) -> bool:
        """Whether it multiplies bf16 in hardware (one of :data:`BF16_FLAGS`)."""
        return bool(self.bf16_flags)

    def text(self) -> str:
        """One line: ``Intel(R) Xeon(R) Processor (AVX512; avx512_bf16, amx_bf16)``."""
        flags = ", ".join(self.bf16_flags) or "no bf16 instructions"
        return f"{self.model} ({self.capability}; {flags})"


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """The first processor's ``model name`` and its flags among :data:`BF16_FLAGS` from the
    text of ``/proc/cpuinfo``."""
    model, flags = "unknown", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip() or "unknown"
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, tuple(flag for flag in BF16_FLAGS if flag in flags)


def describe_cpu(cpuinfo: str | Path = "/proc/cpuinfo") -> CpuDescription:
    """This machine's CPU (from ``cpuinfo``, a path or its text)."""
    text = ""
    if isinstance(cpuinfo, Path) or (isinstance(cpuinfo, str) and "\n" not in cpuinfo):
        try:
            text = Path(cpuinfo).read_text()
        except OSError:
            text = ""
    else:
        text = cpuinfo
    model, flags = parse_cpuinfo(text)
    return CpuDescription(model, flags, torch.backends.cpu.get_cpu_capability())
