"""Loading Triton for trainfast's kernels: compiled on a GPU, interpreted on a CPU.

Triton compiles a kernel for a GPU. With the environment variable ``TRITON_INTERPRET=1`` it
runs the kernel's Python body instead, on NumPy arrays on the host, one program instance at a
time: hundreds of times slower, but exact enough to test a kernel on a laptop. Triton reads the
variable when a function is *decorated*: ``@triton.jit`` returns an ``InterpretedFunction`` or a
``JITFunction`` right there (in every version from 3.0 to 3.8). That concerns our kernels, and
also Triton's own standard library (``tl.max``, ``tl.sum``, ``tl.cdiv``, ... are ``@triton.jit``
functions too), decorated when ``triton.language`` is first imported. So on a CPU the variable
must be set before *anything* imports Triton, and torch imports it behind your back
(``torch.utils.flop_counter`` and ``torch.compile`` do).

Every Triton module of :mod:`trainfast.kernels` imports this module first, which decides once
per process:

* ``TRITON_INTERPRET`` set by the user: respected as it is;
* unset, and no CUDA device: set to ``"1"``, so our kernels (and a kernel you write in a
  notebook cell afterwards) run on CPU tensors;
* unset, and a CUDA device: left unset, kernels are compiled.

If interpreting and Triton was already imported without the interpreter, its standard library
cannot run in the interpreter ("Cannot call @triton.jit'd outside of the scope of a kernel").
This module then imports Triton's Python modules afresh (keeping its compiled extension), so
that ``tl.max`` and friends are interpreted too; whoever imported the old copy (torch) keeps it,
and on a machine without a GPU never runs a Triton kernel with it. :func:`interpreter_repaired`
says whether that happened. If even that fails, the import raises an ``ImportError`` that says
to set ``TRITON_INTERPRET=1`` first thing.

The failure that remains possible is a kernel decorated in one mode and called in the other:
CPU tensors handed to a compiled kernel (``TRITON_INTERPRET=0`` on a CPU-only machine, or our
kernels imported on a GPU machine and called with CPU tensors). Triton's own error is obscure
("Pointer argument cannot be accessed from Triton"), so :func:`check_launch` raises a
``ValueError`` that says what happened and what to do. It also refuses bfloat16 under the
interpreter, which computes it wrongly (NumPy has no bfloat16; a 32×32 dot product comes back
off by 1e10).

``import trainfast.kernels`` does not import this module: only the Triton kernels need it.
Without the ``triton`` package it raises an ``ImportError`` saying how to get it.
"""

import importlib
import os
import sys

import torch

__all__ = [
    "INTERPRETER_VARIABLE",
    "check_launch",
    "interpreter_repaired",
    "interpreting",
    "is_interpreted",
    "tl",
    "triton",
    "triton_version",
]

INTERPRETER_VARIABLE = "TRITON_INTERPRET"


def _decide_mode() -> None:
    """Set ``TRITON_INTERPRET=1`` on a machine without CUDA, unless the user chose already."""
    if INTERPRETER_VARIABLE not in os.environ and not torch.cuda.is_available():
        os.environ[INTERPRETER_VARIABLE] = "1"


def interpreting() -> bool:
    """True if kernels decorated now run in Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get(INTERPRETER_VARIABLE, "0").strip().lower() in ("1", "true", "on", "yes")


def is_interpreted(kernel: object) -> bool:
    """True if ``kernel`` (a ``@triton.jit`` function) was decorated in interpreter mode."""
    return type(kernel).__name__ == "InterpretedFunction"


def _standard_library_compiled() -> bool:
    """True if ``triton.language`` was imported with its ``@triton.jit`` functions compiled."""
    standard = sys.modules.get("triton.language.standard")
    return standard is not None and not is_interpreted(getattr(standard, "cdiv", None))


def _reimport_triton() -> None:
    """Import Triton's Python modules afresh (the compiled extension ``triton._C`` stays)."""
    for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
        if not name.startswith("triton._C"):
            del sys.modules[name]
    importlib.import_module("triton.language")


_decide_mode()
_REPAIRED = False
if interpreting() and _standard_library_compiled():
    try:
        _reimport_triton()
        _REPAIRED = True
    except Exception as error:  # pragma: no cover - depends on Triton's internals
        raise ImportError(
            f"Triton was imported before {INTERPRETER_VARIABLE}=1 was set (torch imports it for "
            "FlopCounterMode and torch.compile), so its standard library cannot run in the "
            f"interpreter, and importing it afresh failed ({error!r}). Set "
            f"{INTERPRETER_VARIABLE}=1 in the environment before starting Python."
        ) from error

try:
    import triton
    import triton.language as tl
except ImportError as error:  # pragma: no cover - triton ships with torch's Linux CUDA wheels
    raise ImportError(
        "trainfast.kernels' Triton kernels need the `triton` package; it comes with torch's "
        "CUDA wheels on Linux, or `pip install triton`. The PyTorch versions "
        "(FlashAttention, online_softmax, ...) work without it."
    ) from error


if interpreting():  # a combination known to fail gets an error naming it, not 28 odd ones
    import numpy

    from trainfast.versions import interpreter_problem

    _problem = interpreter_problem(triton.__version__, numpy.__version__)
    if _problem:
        raise ImportError(_problem)


def interpreter_repaired() -> bool:
    """True if this process imported Triton afresh for the interpreter (see the module's notes)."""
    return _REPAIRED


def triton_version() -> tuple[int, int]:
    """Triton's (major, minor) version, e.g. ``(3, 8)``."""
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


_GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INTERPRETER_DTYPES = (torch.float32, torch.float16)


def check_launch(kernel: object, *tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` if ``kernel`` cannot run on ``tensors`` in this process.

    Checks that the tensors share one device and one floating dtype that the kernel's mode
    supports: float32, float16 and bfloat16 compiled; float32 and float16 interpreted (the
    interpreter computes bfloat16 wrongly, so a bfloat16 request fails here instead). CPU tensors
    need an interpreted kernel.
    """
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"All tensors must be on one device, got {sorted(map(str, devices))}")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"All tensors must have one dtype, got {sorted(map(str, dtypes))}")
    (device,), (dtype,) = devices, dtypes
    interpreted = is_interpreted(kernel)
    if interpreted and dtype not in _INTERPRETER_DTYPES:
        reason = " (the interpreter computes bfloat16 wrongly)" if dtype == torch.bfloat16 else ""
        raise ValueError(
            f"Unsupported dtype {dtype} in Triton's interpreter{reason}; "
            f"use one of {[str(d) for d in _INTERPRETER_DTYPES]}, or a GPU"
        )
    if not interpreted and dtype not in _GPU_DTYPES:
        raise ValueError(
            f"Unsupported dtype {dtype}; the Triton kernels take {[str(d) for d in _GPU_DTYPES]}"
        )
    if device.type != "cuda" and not interpreted:
        raise ValueError(
            f"Tensors on {device} need Triton's interpreter, but this kernel was compiled for "
            f"the GPU: {INTERPRETER_VARIABLE} was not '1' when trainfast's Triton modules were "
            f"imported. Set {INTERPRETER_VARIABLE}=1 before importing them (a new process), or "
            "move the tensors to the GPU."
        )
