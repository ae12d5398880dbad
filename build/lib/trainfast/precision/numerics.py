"""What goes wrong in low precision, as the chapter's functions: sums, softmax, matmuls, autocast.

* :func:`running_sum` adds one value over and over in a given dtype: once the sum's spacing
  exceeds twice the value, every addition rounds back to the same sum ("swamping"). This is
  why matrix products should accumulate in float32 even when their inputs are 16-bit (how many
  bits a GPU's accumulator really keeps: :mod:`~trainfast.precision.accumulation`).
* :func:`softmax_naive` exponentiates raw logits and overflows; :func:`softmax_stable`
  subtracts the maximum first (the log-sum-exp trick) and cannot.
* :func:`matmul_error` measures a matrix product's relative error against float64 for each
  precision mode, emulating TF32 on a CPU with :func:`~trainfast.precision.formats.round_to_tf32`.
* :func:`autocast_policy` runs a list of ops under ``torch.autocast`` and reports which dtype
  each produced, on whatever device it is given: the CPU and CUDA policies differ.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from trainfast.device import parse_device
from trainfast.precision.formats import round_to_tf32
from trainfast.precision.fp8 import fp8_matmul, has_fp8_tensor_cores
from trainfast.precision.tf32 import tf32_matmuls
from trainfast.validation import check_choice, check_int, check_number

__all__ = [
    "AUTOCAST_OPS",
    "MATMUL_MODES",
    "autocast_policy",
    "matmul_error",
    "running_sum",
    "softmax_naive",
    "softmax_stable",
]


def running_sum(value: float, count: int, dtype: torch.dtype) -> Tensor:
    """The partial sums of adding ``value`` to 0 ``count`` times, each rounded to ``dtype``.

    Returns a float64 tensor of the ``count`` partial sums (for plotting). The additions are
    sequential, one rounding each, as a naive accumulator in that dtype would do them.
    """

    check_number("value", value)
    check_int("count", count, minimum=1)
    step = torch.tensor(value, dtype=dtype)
    total = torch.zeros((), dtype=dtype)
    sums = torch.empty(count, dtype=torch.float64)
    for i in range(count):
        total = total + step
        sums[i] = total.double()
    return sums


def softmax_naive(logits: Tensor, dim: int = -1) -> Tensor:
    """``exp(x) / sum(exp(x))`` as written: overflows once a logit exceeds log(dtype max)."""
    exps = logits.exp()
    return exps / exps.sum(dim=dim, keepdim=True)


def softmax_stable(logits: Tensor, dim: int = -1) -> Tensor:
    """Softmax with the maximum subtracted first: no exponent is positive.

    ``softmax(x) = softmax(x - c)`` for any constant ``c``; with ``c = max(x)``
    the largest term is ``exp(0) = 1`` and the denominator is at least 1.
    """
    shifted = logits - logits.amax(dim=dim, keepdim=True)
    exps = shifted.exp()
    return exps / exps.sum(dim=dim, keepdim=True)


#: Precision modes of a float32 matrix product, as :func:`matmul_error` names them.
MATMUL_MODES = ("fp32", "tf32", "bf16", "fp16", "fp8")


def matmul_error(
    m: int, k: int, n: int, mode: str, *, device: torch.device | str = "cpu", seed: int = 0
) -> dict[str, object]:
    """Relative Frobenius error ``||C - C_64|| / ||C_64||`` of an ``(m, k) @ (k, n)`` product.

    Inputs are standard normal float32 matrices (the same for every mode, given ``seed``);
    ``C_64`` is their product in float64 on the CPU. Modes:

    * ``fp32``: float32 inputs and arithmetic (TF32 off);
    * ``tf32``: on CUDA, a real float32 matmul with TF32 on
      (:func:`~trainfast.precision.tf32.tf32_matmuls`; the tensor cores round the inputs to 10
      mantissa bits); elsewhere emulated by rounding the inputs with :func:`round_to_tf32` and
      multiplying in float32;
    * ``bf16`` / ``fp16``: inputs cast to that dtype and multiplied by the device's own kernel
      (float32 accumulation in oneDNN; on GPUs cuBLAS may reduce partly in reduced precision
      unless ``torch.backends.cuda.matmul.allow_{fp16,bf16}_reduced_precision_reduction`` is off;
      the result is rounded to 16 bits);
    * ``fp8``: :func:`~trainfast.precision.fp8.fp8_matmul`, both inputs in e4m3 with per-tensor
      scales, a float32 result (real FP8 tensor cores where the GPU has them, else emulated).

    Returns ``{"mode", "m", "k", "n", "device", "emulated", "relative_error"}``.
    """
    check_choice("mode", mode, MATMUL_MODES)
    for name, size in (("m", m), ("k", k), ("n", n)):
        check_int(name, size, minimum=1)
    check_int("seed", seed)
    device = parse_device(device)
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)
    reference = a.double() @ b.double()
    emulated = (mode == "tf32" and device.type != "cuda") or (
        mode == "fp8" and not has_fp8_tensor_cores(device)
    )
    a_dev, b_dev = a.to(device), b.to(device)
    if mode in ("fp32", "tf32") and device.type == "cuda":
        with tf32_matmuls(mode == "tf32"):
            product = a_dev @ b_dev
    elif mode == "tf32":
        product = round_to_tf32(a_dev) @ round_to_tf32(b_dev)
    elif mode == "fp32":
        product = a_dev @ b_dev
    elif mode == "fp8":
        product = fp8_matmul(a_dev, b_dev, out_dtype=torch.float32)
    else:
        dtype = torch.bfloat16 if mode == "bf16" else torch.float16
        product = a_dev.to(dtype) @ b_dev.to(dtype)
    error = torch.linalg.norm(product.double().cpu() - reference) / torch.linalg.norm(reference)
    return {
        "mode": mode,
        "m": m,
        "k": k,
        "n": n,
        "device": device.type,
        "emulated": emulated,
        "relative_error": float(error),
    }


def _long(x: Tensor) -> Tensor:
    return torch.zeros(x.shape[0], dtype=torch.long, device=x.device)


#: op name -> function of two (8, 8) tensors, run by :func:`autocast_policy`.
AUTOCAST_OPS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "matmul": lambda a, b: a @ b,
    "linear": lambda a, b: F.linear(a, b),
    "addmm": lambda a, b: torch.addmm(a, a, b),
    "bmm": lambda a, b: torch.bmm(a[None], b[None]),
    "conv1d": lambda a, b: F.conv1d(a[None], b[:, :, None]),
    "scaled_dot_product_attention": lambda a, b: F.scaled_dot_product_attention(
        a[None], b[None], b[None]
    ),
    "softmax": lambda a, b: torch.softmax(a, -1),
    "log_softmax": lambda a, b: torch.log_softmax(a, -1),
    "layer_norm": lambda a, b: F.layer_norm(a, (a.shape[-1],)),
    "group_norm": lambda a, b: F.group_norm(a[None], 2),
    "batch_norm": lambda a, b: F.batch_norm(a, None, None, training=True),
    "gelu": lambda a, b: F.gelu(a),
    "exp": lambda a, b: a.exp(),
    "log": lambda a, b: a.abs().log(),
    "pow": lambda a, b: a.pow(2),
    "sum": lambda a, b: a.sum(),
    "cumsum": lambda a, b: a.cumsum(0),
    "vector_norm": lambda a, b: torch.linalg.vector_norm(a),
    "prod": lambda a, b: a.prod(),
    "add": lambda a, b: a + b,
    "mse_loss": lambda a, b: F.mse_loss(a, b),
    "cross_entropy": lambda a, b: F.cross_entropy(a, _long(a)),
    "binary_cross_entropy_with_logits": lambda a, b: F.binary_cross_entropy_with_logits(
        a, b.sigmoid()
    ),
}


def autocast_policy(
    device: torch.device | str, dtype: torch.dtype = torch.bfloat16
) -> list[dict[str, str]]:
    """What ``torch.autocast(device, dtype)`` does to each op of :data:`AUTOCAST_OPS`.

    Each op runs twice under autocast: on float32 inputs and on ``dtype`` inputs. If float32
    inputs give a ``dtype`` output, autocast casts the op *down* ("lower precision"); if
    ``dtype`` inputs give float32, it casts *up* ("float32"); otherwise the op runs in whatever
    dtype it receives ("input dtype"). Rows: ``op``, ``from float32 inputs``, ``from <dtype>
    inputs``, ``policy``.
    """
    device = parse_device(device)
    low = str(dtype).removeprefix("torch.")
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(8, 8, generator=generator).to(device)
    b = torch.randn(8, 8, generator=generator).to(device)
    rows = []
    for name, op in AUTOCAST_OPS.items():
        with torch.autocast(device.type, dtype=dtype):
            from_fp32 = op(a, b).dtype
            from_low = op(a.to(dtype), b.to(dtype)).dtype
        if from_fp32 == dtype:
            policy = "lower precision"
        elif from_low == torch.float32:
            policy = "float32"
        else:
            policy = "input dtype"
        row = {
            "op": name,
            "from float32 inputs": str(from_fp32).removeprefix("torch."),
            f"from {low} inputs": str(from_low).removeprefix("torch."),
            "policy": policy,
        }
        rows.append(row)
    return rows
