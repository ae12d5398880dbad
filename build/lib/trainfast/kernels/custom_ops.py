"""A custom operator in C++ and CUDA: fused bias + GELU, registered with ``torch.library``.

``gelu(x + bias)`` in PyTorch is two kernels: the addition writes ``x + bias`` to memory and
GELU reads it back: four passes over a tensor of ``x``'s size (read ``x``, write ``y = x + b``,
read ``y``, write ``gelu(y)``). The fused operator makes two (read ``x``, write the result; the
bias is one row), so it moves half the bytes of this memory-bound pair. It is the smallest
example of the recipe in PyTorch's "Custom C++ and CUDA Operators" tutorial:

1. the kernels in C++ (:data:`CPP_SOURCE`, with ``at::parallel_for``) and CUDA
   (:data:`CUDA_SOURCE`: 16-byte vector loads and stores, a row and column grid so that the bias
   index needs no per-element ``%``, and element-by-element loads where rows are not 16-byte
   aligned), compiled just in time by
   ``torch.utils.cpp_extension.load_inline`` with the machine's g++ and nvcc;
2. the operator's schema and its CPU and CUDA implementations registered with the dispatcher
   in C++ (``TORCH_LIBRARY``/``TORCH_LIBRARY_IMPL``), so it is
   ``torch.ops.trainfast_kernels.bias_gelu``;
3. in Python, a *fake* implementation (``torch.library.register_fake``: the output's shape and
   dtype without computing it, which ``torch.compile`` traces with) and the backward formula
   (``torch.library.register_autograd``).

**Build cache.** ``load_inline`` writes the sources and a ninja file to
``$TORCH_EXTENSIONS_DIR/<name>`` (by default
``~/.cache/torch_extensions/py<ver>_<cuda tag>/<name>``, see :func:`build_directory`) and
compiles there. A later process finds the same sources and an up-to-date library, so ninja has
nothing to do and the library loads in well under a second; changing the source rebuilds it.

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

from trainfast.timing import timestamp

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
#: (C++ in its own layout: the ``noqa`` at its end lets its lines pass 100 columns.)
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
"""  # noqa: E501

#: The CUDA twin: the same two operators for CUDA tensors, one thread per element.
CUDA_SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

namespace trainfast_kernels {

// 16 bytes of scalar_t: one 128-bit load or store (4 floats, 8 halves or bfloat16s, 2 doubles).
template <typename scalar_t>
struct alignas(16) Pack {
  static constexpr int size = 16 / sizeof(scalar_t);
  scalar_t v[size];
};

template <typename acc_t>
__device__ __forceinline__ acc_t gelu(acc_t z) {
  return z * acc_t(0.5) * (acc_t(1) + erf(z * acc_t(M_SQRT1_2)));
}

template <typename acc_t>
__device__ __forceinline__ acc_t gelu_grad(acc_t z) {
  const acc_t cdf = acc_t(0.5) * (acc_t(1) + erf(z * acc_t(M_SQRT1_2)));
  const acc_t pdf = acc_t(0.3989422804014327) * exp(acc_t(-0.5) * z * z);
  return cdf + z * pdf;
}

// x and out are (rows, width), bias is (width,). Grid: x over columns, y over rows (striding
// past 65,535 rows). The bias column is the loop index itself: no 64-bit `%` per element.
// With `packed` (can_pack: every row 16-byte aligned, so width % Pack::size == 0), every column
// moves in 16-byte packs; without it, the scalar loop does every column.
template <typename scalar_t>
__global__ void bias_gelu_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias,
                                 scalar_t* __restrict__ out, int64_t rows, int64_t width, bool packed) {
  using acc_t = at::opmath_type<scalar_t>;  // float for half and bfloat16
  using P = Pack<scalar_t>;
  const int64_t packs = packed ? width / P::size : 0;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const scalar_t* x_row = x + row * width;
    scalar_t* out_row = out + row * width;
    for (int64_t p = first; p < packs; p += step) {
      const P xs = reinterpret_cast<const P*>(x_row)[p];
      const P bs = reinterpret_cast<const P*>(bias)[p];
      P ys;
#pragma unroll
      for (int k = 0; k < P::size; ++k) {
        ys.v[k] = static_cast<scalar_t>(gelu(static_cast<acc_t>(xs.v[k]) + static_cast<acc_t>(bs.v[k])));
      }
      reinterpret_cast<P*>(out_row)[p] = ys;
    }
    for (int64_t col = packs * P::size + first; col < width; col += step) {  // scalar: all of it unless packed
      out_row[col] = static_cast<scalar_t>(gelu(static_cast<acc_t>(x_row[col]) + static_cast<acc_t>(bias[col])));
    }
  }
}

template <typename scalar_t>
__global__ void bias_gelu_backward_kernel(const scalar_t* __restrict__ grad, const scalar_t* __restrict__ x,
                                          const scalar_t* __restrict__ bias, scalar_t* __restrict__ out,
                                          int64_t rows, int64_t width, bool packed) {
  using acc_t = at::opmath_type<scalar_t>;
  using P = Pack<scalar_t>;
  const int64_t packs = packed ? width / P::size : 0;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int64_t offset = row * width;
    for (int64_t p = first; p < packs; p += step) {
      const P gs = reinterpret_cast<const P*>(grad + offset)[p];
      const P xs = reinterpret_cast<const P*>(x + offset)[p];
      const P bs = reinterpret_cast<const P*>(bias)[p];
      P ys;
#pragma unroll
      for (int k = 0; k < P::size; ++k) {
        const acc_t z = static_cast<acc_t>(xs.v[k]) + static_cast<acc_t>(bs.v[k]);
        ys.v[k] = static_cast<scalar_t>(static_cast<acc_t>(gs.v[k]) * gelu_grad(z));
      }
      reinterpret_cast<P*>(out + offset)[p] = ys;
    }
    for (int64_t col = packs * P::size + first; col < width; col += step) {  // scalar: all of it unless packed
      const acc_t z = static_cast<acc_t>(x[offset + col]) + static_cast<acc_t>(bias[col]);
      out[offset + col] = static_cast<scalar_t>(static_cast<acc_t>(grad[offset + col]) * gelu_grad(z));
    }
  }
}

// True if every pointer is 16-byte aligned and each row starts on a 16-byte boundary.
static bool can_pack(std::initializer_list<const at::Tensor*> tensors, int64_t width) {
  const int64_t per_pack = 16 / static_cast<int64_t>(tensors.begin()[0]->element_size());
  if (width % per_pack != 0) return false;
  for (const at::Tensor* t : tensors) {
    if (reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  }
  return true;
}

// Columns: enough 256-thread blocks for one pack (or element) per thread; rows: up to 65,535.
static dim3 grid_for(int64_t rows, int64_t width, int64_t per_thread, int threads) {
  const int64_t columns = (width + per_thread - 1) / per_thread;
  const int64_t x = std::max<int64_t>(1, std::min<int64_t>((columns + threads - 1) / threads, 1024));
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
}

at::Tensor bias_gelu_cuda(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(x.is_contiguous() && bias.is_contiguous(), "bias_gelu: inputs must be contiguous");
  TORCH_CHECK(bias.dim() == 1 && x.size(-1) == bias.size(0), "bias_gelu: bias must match x's last dim");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  const int64_t width = bias.numel(), rows = x.numel() / width;
  const bool packed = can_pack({&x, &bias, &out}, width);
  const int threads = 256;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_cuda", [&] {
    const dim3 grid = grid_for(rows, width, packed ? Pack<scalar_t>::size : 1, threads);
    bias_gelu_kernel<scalar_t><<<grid, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, width, packed);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor bias_gelu_backward_cuda(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(grad.is_contiguous() && x.is_contiguous() && bias.is_contiguous(),
              "bias_gelu_backward: inputs must be contiguous");
  const c10::cuda::OptionalCUDAGuard guard(x.device());
  at::Tensor grad_z = at::empty_like(x);
  if (x.numel() == 0) return grad_z;
  const int64_t width = bias.numel(), rows = x.numel() / width;
  const bool packed = can_pack({&grad, &x, &bias, &grad_z}, width);
  const int threads = 256;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "bias_gelu_backward_cuda", [&] {
    const dim3 grid = grid_for(rows, width, packed ? Pack<scalar_t>::size : 1, threads);
    bias_gelu_backward_kernel<scalar_t><<<grid, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), bias.data_ptr<scalar_t>(),
        grad_z.data_ptr<scalar_t>(), rows, width, packed);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grad_z;
}

TORCH_LIBRARY_IMPL(trainfast_kernels, CUDA, m) {
  m.impl("bias_gelu", &bias_gelu_cuda);
  m.impl("bias_gelu_backward", &bias_gelu_backward_cuda);
}

}  // namespace trainfast_kernels
"""  # noqa: E501


@dataclass(frozen=True)
class BuildInfo:
    """What :func:`load_bias_gelu` did: the extension, where it lives, how long it took, and
    whether it compiled (the library file is new) or found an up-to-date one in the cache."""

    name: str
    directory: str
    seconds: float  # compiling and loading (cold), or checking the cache and loading (warm)
    compiled: bool


def build_directory(name: str = CPU_EXTENSION) -> str:
    """Where ``load_inline`` builds and caches extension ``name``.

    Honours ``TORCH_EXTENSIONS_DIR``.
    """
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
    code = (
        "import json, dataclasses; from trainfast.kernels.custom_ops import load_bias_gelu; "
        "print(json.dumps(dataclasses.asdict(load_bias_gelu('cpu'))))"
    )
    command = [sys.executable, "-c", code]
    result = subprocess.run(
        command, capture_output=True, text=True, env=environment, timeout=timeout
    )
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


def bias_gelu(
    x: Tensor, bias: Tensor, *, implementation: Literal["cpp", "torch"] = "cpp"
) -> Tensor:
    """``gelu(x + bias)`` for ``x`` (..., width) and ``bias`` (width,), fused in one kernel.

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
            f"bias must be 1-D with x's last dimension, got x {tuple(x.shape)}, "
            f"bias {tuple(bias.shape)}"
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
