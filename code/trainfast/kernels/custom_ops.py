"""A custom operator in C++ and CUDA: fused bias + GELU, registered with ``torch.library``.

``gelu(x + bias)`` in PyTorch is two kernels: the addition writes ``x + bias`` to memory and
GELU reads it back. The fused operator reads ``x`` and ``bias`` once and writes the result once,
a third of the memory traffic saved for this memory-bound pair. It is the smallest example of
the recipe in PyTorch's "Custom C++ and CUDA Operators" tutorial:

1. the kernels in C++ (:data:`CPP_SOURCE`, with ``at::parallel_for``) and CUDA
   (:data:`CUDA_SOURCE`, one thread per element), compiled just in time by
   ``torch.utils.cpp_extension.load_inline`` with the machine's g++ and nvcc;
2. the operator's schema and its CPU and CUDA implementations registered with the dispatcher
   in C++ (``TORCH_LIBRARY``/``TORCH_LIBRARY_IMPL``), so it is ``torch.ops.trainfast_kernels.bias_gelu``;
3. in Python, a *fake* implementation (``torch.library.register_fake``: the output's shape and
   dtype without computing it, which ``torch.compile`` traces with) and the backward formula
   (``torch.library.register_autograd``).

**Build cache.** ``load_inline`` writes the sources and a ninja file to
``$TORCH_EXTENSIONS_DIR/<name>`` (by default ``~/.cache/torch_extensions/py<ver>_<cuda tag>/<name>``,
see :func:`build_directory`) and compiles there. A later process finds the same sources and an
up-to-date library, so ninja has nothing to do and the library loads in well under a second;
changing the source rebuilds it.

The GELU is the exact one, ``z·Φ(z)`` with the error function (``torch.nn.functional.gelu``'s
default). CPU kernels take float32 and float64; CUDA kernels also float16 and bfloat16,
computing in float32.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from trainfast.profiling.timing import timestamp

__all__ = [
    "CPP_SOURCE",
    "CUDA_SOURCE",
    "BuildInfo",
    "bias_gelu",
    "bias_gelu_backward",
    "bias_gelu_reference",
    "build_directory",
    "build_in_subprocess",
    "load_bias_gelu",
    "register_fake_and_autograd",
]

NAMESPACE = "trainfast_kernels"
CPU_EXTENSION = "trainfast_bias_gelu_cpu"
CUDA_EXTENSION = "trainfast_bias_gelu_cuda"

#: The C++ operator: schema, CPU kernels and their registration with the dispatcher.
CPP_SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>
#include <cmath>

namespace trainfast_kernels {

at::Tensor bias_gelu_cpu(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(x.is_contiguous() && bias.is_contiguous(), "bias_gelu: inputs must be contiguous");
  TORCH_CHECK(bias.dim() == 1 && x.size(-1) == bias.size(0), "bias_gelu: bias must match x's last dim");
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.numel(), width = bias.numel();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "bias_gelu_cpu", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* bp = bias.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t z = xp[i] + bp[i % width];           // x + bias, never stored
        op[i] = z * scalar_t(0.5) * (scalar_t(1) + std::erf(z * scalar_t(M_SQRT1_2)));
      }
    });
  });
  return out;
}

// d gelu(z) / dz = Phi(z) + z * phi(z), times the incoming gradient.
at::Tensor bias_gelu_backward_cpu(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(grad.is_contiguous() && x.is_contiguous() && bias.is_contiguous(),
              "bias_gelu_backward: inputs must be contiguous");
  at::Tensor grad_z = at::empty_like(x);
  const int64_t n = x.numel(), width = bias.numel();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "bias_gelu_backward_cpu", [&] {
    const scalar_t* gp = grad.data_ptr<scalar_t>();
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* bp = bias.data_ptr<scalar_t>();
    scalar_t* op = grad_z.data_ptr<scalar_t>();
    const scalar_t inv_sqrt_2pi = scalar_t(0.3989422804014327);
    at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t z = xp[i] + bp[i % width];
        const scalar_t cdf = scalar_t(0.5) * (scalar_t(1) + std::erf(z * scalar_t(M_SQRT1_2)));
        op[i] = gp[i] * (cdf + z * inv_sqrt_2pi * std::exp(scalar_t(-0.5) * z * z));
      }
    });
  });
  return grad_z;
}

TORCH_LIBRARY(trainfast_kernels, m) {
  m.def("bias_gelu(Tensor x, Tensor bias) -> Tensor");
  m.def("bias_gelu_backward(Tensor grad, Tensor x, Tensor bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(trainfast_kernels, CPU, m) {
  m.impl("bias_gelu", &bias_gelu_cpu);
  m.impl("bias_gelu_backward", &bias_gelu_backward_cpu);
}

}  // namespace trainfast_kernels
"""

#: The CUDA twin: the same two operators for CUDA tensors, one thread per element.
CUDA_SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace trainfast_kernels {

template <typename scalar_t>
__global__ void bias_gelu_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias,
                                 scalar_t* __restrict__ out, int64_t n, int64_t width) {
  using acc_t = at::opmath_type<scalar_t>;  // float for half and bfloat16
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const acc_t z = static_cast<acc_t>(x[i]) + static_cast<acc_t>(bias[i % width]);
    out[i] = static_cast<scalar_t>(z * acc_t(0.5) * (acc_t(1) + erf(z * acc_t(M_SQRT1_2))));
  }
}

template <typename scalar_t>
__global__ void bias_gelu_backward_kernel(const scalar_t* __restrict__ grad, const scalar_t* __restrict__ x,
                                          const scalar_t* __restrict__ bias, scalar_t* __restrict__ out,
                                          int64_t n, int64_t width) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
    const acc_t z = static_cast<acc_t>(x[i]) + static_cast<acc_t>(bias[i % width]);
    const acc_t cdf = acc_t(0.5) * (acc_t(1) + erf(z * acc_t(M_SQRT1_2)));
    const acc_t pdf = acc_t(0.3989422804014327) * exp(acc_t(-0.5) * z * z);
    out[i] = static_cast<scalar_t>(static_cast<acc_t>(grad[i]) * (cdf + z * pdf));
  }
}

static int blocks_for(int64_t n, int threads) {
  return static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535));
}

at::Tensor bias_gelu_cuda(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(x.is_contiguous() && bias.is_contiguous(), "bias_gelu: inputs must be contiguous");
  TORCH_CHECK(bias.dim() == 1 && x.size(-1) == bias.size(0), "bias_gelu: bias must match x's last dim");
  const at::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) return out;
  const int threads = 256;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_cuda", [&] {
    bias_gelu_kernel<scalar_t><<<blocks_for(n, threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n, bias.numel());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor bias_gelu_backward_cuda(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(grad.is_contiguous() && x.is_contiguous() && bias.is_contiguous(),
              "bias_gelu_backward: inputs must be contiguous");
  const at::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor grad_z = at::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) return grad_z;
  const int threads = 256;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_backward_cuda", [&] {
    bias_gelu_backward_kernel<scalar_t><<<blocks_for(n, threads), threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(),
        grad_z.data_ptr<scalar_t>(), n, bias.numel());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad_z;
}

TORCH_LIBRARY_IMPL(trainfast_kernels, CUDA, m) {
  m.impl("bias_gelu", &bias_gelu_cuda);
  m.impl("bias_gelu_backward", &bias_gelu_backward_cuda);
}

}  // namespace trainfast_kernels
"""


@dataclass(frozen=True)
class BuildInfo:
    """What :func:`load_bias_gelu` did: the extension, where it lives, how long it took, and
    whether it compiled (the library file is new) or found an up-to-date one in the cache."""

    name: str
    directory: str
    seconds: float  # compiling and loading (cold), or checking the cache and loading (warm)
    compiled: bool


def build_directory(name: str = CPU_EXTENSION) -> str:
    """Where ``load_inline`` builds and caches extension ``name`` (honours ``TORCH_EXTENSIONS_DIR``)."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(name, verbose=False)


def _library_mtime(name: str) -> float | None:
    path = os.path.join(build_directory(name), f"{name}.so")
    return os.path.getmtime(path) if os.path.exists(path) else None


def _build(name: str, cuda: bool) -> BuildInfo:
    from torch.utils.cpp_extension import load_inline

    options: dict[str, Any] = {}
    if "no_implicit_headers" in inspect.signature(load_inline).parameters:
        # Without it load_inline prepends <torch/extension.h> (all of torch's C++ API and
        # pybind11): our sources include only what they use, which compiled in 7-9 s instead
        # of 25-34 s on a 2-core CPU (torch 2.14).
        options["no_implicit_headers"] = True
    before = _library_mtime(name)
    start = timestamp()  # a one-off build: one timestamp before, one after
    load_inline(
        name=name,
        cpp_sources="" if cuda else CPP_SOURCE,
        cuda_sources=CUDA_SOURCE if cuda else None,
        is_python_module=False,  # a library of operators, loaded with torch.ops.load_library
        extra_cflags=["-O2"],
        verbose=False,
        **options,
    )
    seconds = timestamp() - start
    return BuildInfo(name, build_directory(name), seconds, compiled=_library_mtime(name) != before)


#: device type -> BuildInfo of the libraries loaded into this process
_LOADED: dict[str, BuildInfo] = {}


def register_fake_and_autograd() -> None:
    """Register, in Python, what the C++ library does not define: the fake implementations
    (output shape and dtype, for ``torch.compile``'s tracing) and the backward formula.
    :func:`load_bias_gelu` calls it once, after loading the library."""
    torch.library.register_fake(f"{NAMESPACE}::bias_gelu")(_bias_gelu_fake)
    torch.library.register_fake(f"{NAMESPACE}::bias_gelu_backward")(_bias_gelu_backward_fake)
    torch.library.register_autograd(
        f"{NAMESPACE}::bias_gelu", bias_gelu_backward, setup_context=_bias_gelu_setup_context
    )


def build_in_subprocess(extensions_dir: str | None = None, *, timeout: float = 600) -> BuildInfo:
    """Run :func:`load_bias_gelu` (CPU) in a fresh Python process and return its :class:`BuildInfo`.

    With ``extensions_dir`` the child uses it as ``TORCH_EXTENSIONS_DIR``: an empty directory
    gives a cold build, the directory of an earlier build a warm one. A separate process is
    needed because one process can load the operator library only once.
    """
    environment = dict(os.environ)
    if extensions_dir is not None:
        environment["TORCH_EXTENSIONS_DIR"] = extensions_dir
    code = ("import json, dataclasses; from trainfast.kernels.custom_ops import load_bias_gelu; "
            "print(json.dumps(dataclasses.asdict(load_bias_gelu('cpu'))))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=environment, timeout=timeout)  # fmt: skip
    if result.returncode != 0:
        raise ValueError(f"Building bias_gelu in a subprocess failed:\n{result.stderr[-2000:]}")
    return BuildInfo(**json.loads(result.stdout.strip().splitlines()[-1]))


def load_bias_gelu(device_type: Literal["cpu", "cuda"] = "cpu") -> BuildInfo:
    """Compile (or load from the cache) the operator for ``device_type``; once per process.

    The CPU library defines the operator and must come first; ``"cuda"`` loads it, then the CUDA
    kernels (which need nvcc, the CUDA toolkit matching torch's CUDA version, and a GPU).
    Returns the :class:`BuildInfo` of the requested library (the first call's, later calls are
    free). Set ``MAX_JOBS`` to limit ninja's parallel compile jobs.
    """
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"Unknown device_type: {device_type!r} (expected 'cpu' or 'cuda')")
    if "cpu" not in _LOADED:
        _LOADED["cpu"] = _build(CPU_EXTENSION, cuda=False)
        register_fake_and_autograd()
    if device_type == "cuda" and "cuda" not in _LOADED:
        if not torch.cuda.is_available():
            raise ValueError("The CUDA build of bias_gelu needs a CUDA device")
        _LOADED["cuda"] = _build(CUDA_EXTENSION, cuda=True)
    return _LOADED[device_type]


def _bias_gelu_fake(x: Tensor, bias: Tensor) -> Tensor:
    torch._check(x.shape[-1] == bias.shape[0])
    return torch.empty_like(x)


def _bias_gelu_backward_fake(grad: Tensor, x: Tensor, bias: Tensor) -> Tensor:
    return torch.empty_like(x)


def _bias_gelu_setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    x, bias = inputs
    ctx.save_for_backward(x, bias)


def bias_gelu_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
    """The backward formula registered for ``bias_gelu``: the gradients of ``x`` and ``bias``."""
    x, bias = ctx.saved_tensors
    grad_z = torch.ops.trainfast_kernels.bias_gelu_backward(grad.contiguous(), x, bias)
    return grad_z, grad_z.reshape(-1, bias.shape[0]).sum(dim=0)  # bias is broadcast over rows


_CPU_DTYPES = (torch.float32, torch.float64)
_CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def bias_gelu_reference(x: Tensor, bias: Tensor) -> Tensor:
    """``gelu(x + bias)`` in two PyTorch kernels: the reference for :func:`bias_gelu`."""
    return torch.nn.functional.gelu(x + bias)


def bias_gelu(x: Tensor, bias: Tensor, *, implementation: Literal["cpp", "torch"] = "cpp") -> Tensor:
    """``gelu(x + bias)`` for ``x`` (..., width) and ``bias`` (width,), fused in one C++/CUDA kernel.

    ``implementation="cpp"`` calls ``torch.ops.trainfast_kernels.bias_gelu`` (building it on
    first use, see :func:`load_bias_gelu`); ``"torch"`` is :func:`bias_gelu_reference`. Both are
    differentiable and traceable by ``torch.compile``. Raises ``ValueError`` for mismatched
    shapes, devices or dtypes, a dtype the device's kernel lacks, or non-contiguous inputs.
    """
    if implementation == "torch":
        return bias_gelu_reference(x, bias)
    if implementation != "cpp":
        raise ValueError(f"Unknown implementation: {implementation!r} (expected 'cpp' or 'torch')")
    if bias.ndim != 1 or x.ndim < 1 or x.shape[-1] != bias.shape[0]:
        raise ValueError(
            f"bias must be 1-D with x's last dimension, got x {tuple(x.shape)}, bias {tuple(bias.shape)}"
        )
    if x.device != bias.device or x.dtype != bias.dtype:
        raise ValueError(
            f"x and bias must share device and dtype, got {x.device}/{x.dtype} and "
            f"{bias.device}/{bias.dtype}"
        )
    supported = _CUDA_DTYPES if x.device.type == "cuda" else _CPU_DTYPES
    if x.device.type not in ("cpu", "cuda") or x.dtype not in supported:
        raise ValueError(
            f"Unsupported dtype {x.dtype} on {x.device.type} for bias_gelu's kernel "
            f"(supported: {[str(d) for d in supported]})"
        )
    if not (x.is_contiguous() and bias.is_contiguous()):
        raise ValueError(
            f"bias_gelu's kernel indexes flat memory: x (strides {x.stride()}) and bias must be "
            "contiguous; call .contiguous() first"
        )
    if x.device.type not in _LOADED:
        load_bias_gelu(x.device.type)
    return torch.ops.trainfast_kernels.bias_gelu(x, bias)
