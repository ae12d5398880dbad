"""Flash attention in Triton: the launchers, the autograd function and the registered operator.

The algorithm of :mod:`trainfast.kernels.attention` as kernels, each a loop over tiles that
lives in on-chip memory (registers and shared memory), never writing an ``n_queries × n_keys``
matrix to main memory: the forward kernel in :mod:`trainfast.kernels.attention_triton_forward`,
the backward kernels in :mod:`trainfast.kernels.attention_triton_backward`. This module launches
them (:func:`flash_attention_triton_forward`, :func:`flash_attention_triton_backward`), wraps
them as :class:`FlashAttentionTriton`, and registers them as one operator with ``torch.library``.

Head dimensions that are not powers of two (24, 80, 96, ...) are padded to the next power of two
inside the kernel (masked loads read zeros), so any head dimension from 16 to 128 works. Pointer
arithmetic only (no block pointers), for Triton 3.0 to 3.8. The causal mask is
``scaled_dot_product_attention``'s, aligned at the top-left (see
:mod:`trainfast.kernels.attention`).

Tiles depend on the GPU, the dtype and the head dimension, through one function per kernel
(:func:`attention_forward_tiles`, :func:`attention_dkdv_tiles`, :func:`attention_dq_tiles`): the
launchers call them with the live device's row of :data:`trainfast.gpus.GPUS`, the compile
report (:mod:`trainfast.kernels.compile_report`) with any row, so that a T4 (64 KiB of shared
memory per block, no asynchronous copies) gets tiles that fit it.
"""

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from trainfast.gpus import GPUSpec
from trainfast.kernels.attention_inputs import validate_attention_inputs
from trainfast.kernels.attention_triton_backward import (
    attention_dkdv_tiles,
    attention_dq_tiles,
    dkdv_query_tiles,
    dq_key_tiles,
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_backward_preprocess_kernel,
)
from trainfast.kernels.attention_triton_forward import (
    LOG2_E,
    MAX_GRID_X,
    AttentionTiles,
    attend_key_tiles,
    attention_forward_tiles,
    attention_grid,
    flash_forward_kernel,
)
from trainfast.kernels.targets import launch_target
from trainfast.kernels.triton_runtime import check_launch, is_interpreted
from trainfast.validation import check_flag

__all__ = [
    "MAX_GRID_X",
    "AttentionTiles",
    "FlashAttentionTriton",
    "attend_key_tiles",
    "attention_backward_delta",
    "attention_dkdv_launch",
    "attention_dkdv_tiles",
    "attention_dq_launch",
    "attention_dq_tiles",
    "attention_forward_launch",
    "attention_forward_tiles",
    "attention_grid",
    "dkdv_query_tiles",
    "dq_key_tiles",
    "flash_attention_op_backward",
    "flash_attention_op_setup_context",
    "flash_attention_triton_backward",
    "flash_attention_triton_forward",
    "flash_backward_dkdv_kernel",
    "flash_backward_dq_kernel",
    "flash_backward_preprocess_kernel",
    "flash_forward_kernel",
    "register_flash_attention_op",
    "validate_op_backward_inputs",
    "validate_op_inputs",
]

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 exactly, as the references do


def _check(
    q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool = False, *, launch: bool = True
) -> None:
    validate_attention_inputs(q, k, v, enable_gqa)
    head_dim = q.shape[-1]
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"Unsupported head dimension {head_dim} for the Triton kernels "
            f"(need {MIN_HEAD_DIM} to {MAX_HEAD_DIM}); use implementation='tiled'"
        )
    if launch:
        check_launch(flash_forward_kernel, q, k, v)


def validate_op_inputs(q: Tensor, k: Tensor, v: Tensor, is_causal: object) -> None:
    """Raise ``ValueError`` naming the value unless the registered operator
    ``trainfast_kernels::flash_attention_forward`` can attend ``q``, ``k``, ``v``.

    An operator anyone can call through ``torch.ops`` gets no help from a Python wrapper, so it
    checks what :class:`FlashAttentionTriton` checks (:func:`validate_attention_inputs`: shapes,
    one dtype and device, head counts, with grouped-query attention allowed when the KV heads
    divide the query heads; a head dimension of 16 to 128; a dtype and device the kernels run
    on) and, as flash-attn's ``mha_fwd`` does, a last dimension of stride 1, the layout whose
    loads coalesce. Without these checks 4 query heads on 3 KV heads launched with
    ``group = 4 // 3 = 1`` and read past the end of K and V, and head dimension 256 compiled a
    kernel whose tiles the launchers never size for. Meta tensors (a trace without data) skip
    the launch check only.
    """
    check_flag("is_causal", is_causal)
    if q.ndim == k.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        n_heads, n_kv_heads = q.shape[-3], k.shape[-3]
        if n_kv_heads == 0 or n_heads % n_kv_heads:
            raise ValueError(
                f"q has {n_heads} heads and k {n_kv_heads}: the KV heads must divide the query "
                "heads (grouped-query attention)"
            )
    _check(q, k, v, enable_gqa=True, launch=q.device.type != "meta")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"{name} has stride {t.stride(-1)} in its last dimension; the operator needs 1 "
                f"(call .contiguous() first)"
            )


def validate_op_backward_inputs(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_lse: Tensor | None,
) -> None:
    """Raise ``ValueError`` naming the value unless ``trainfast_kernels::flash_attention_backward``
    can run: the forward's checks on ``q``, ``k``, ``v`` (:func:`validate_op_inputs`), ``out`` and
    ``grad_out`` of q's shape and dtype, ``lse`` (and ``grad_lse``, if given) of shape
    ``q.shape[:-1]``, all on q's device."""
    validate_op_inputs(q, k, v, False)
    for name, t in (("out", out), ("grad_out", grad_out)):
        if t.shape != q.shape or t.dtype != q.dtype:
            raise ValueError(
                f"{name} must have q's shape {tuple(q.shape)} and dtype {q.dtype}, got "
                f"{tuple(t.shape)} and {t.dtype}"
            )
    for name, t in (("lse", lse), ("grad_lse", grad_lse)):
        if t is not None and t.shape != q.shape[:-1]:
            raise ValueError(
                f"{name} must have shape {tuple(q.shape[:-1])} (q's without head_dim), got "
                f"{tuple(t.shape)}"
            )
    for name, t in (("out", out), ("grad_out", grad_out), ("lse", lse), ("grad_lse", grad_lse)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")


def flash_attention_triton_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    is_causal: bool = False,
    tiles: AttentionTiles | None = None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor]:
    """Run :func:`flash_forward_kernel`: the output (q's shape and dtype) and L (..., n_queries).

    L is float32.

    ``tiles`` defaults to :func:`attention_forward_tiles` for the tensors' device; with
    ``enable_gqa``, k and v may have fewer heads than q (grouped-query attention, SDPA's rule).
    """
    _check(q, k, v, enable_gqa)
    *batch_shape, n_queries, head_dim = q.shape
    if tiles is None:
        tiles = attention_forward_tiles(launch_target(q.device), q.dtype, head_dim)
    q3, k3, v3 = (t.reshape(-1, t.shape[-2], head_dim) for t in (q, k, v))  # (batch·heads, n, d)
    out = torch.empty_like(q3)
    # (batch·heads, n_queries)
    lse = torch.empty(q3.shape[:2], dtype=torch.float32, device=q.device)
    grid, args, kwargs = attention_forward_launch(q3, k3, v3, out, lse, is_causal, tiles)
    flash_forward_kernel[grid](*args, **kwargs)
    return out.reshape(q.shape), lse.reshape(*batch_shape, n_queries)


def _target(kernel: object, t: Tensor) -> GPUSpec | None:
    return None if is_interpreted(kernel) else launch_target(t.device)


def attention_forward_launch(
    q3: Any, k3: Any, v3: Any, out: Any, lse: Any, is_causal: bool, tiles: AttentionTiles
) -> tuple[tuple[int], tuple, dict[str, Any]]:
    """Grid, arguments and keywords of :func:`flash_forward_kernel` on (batch·heads, n, d) tensors.

    Shared by :func:`flash_attention_triton_forward` and the compile report, which passes
    stand-ins with the tensors' dtype, shape and strides.
    """
    batch_heads, n_queries, head_dim = q3.shape
    n_keys = k3.shape[1]
    strides = (*q3.stride(), *k3.stride(), *v3.stride(), *out.stride())
    group = batch_heads // k3.shape[0]  # query heads per KV head (1 without GQA)
    args = (q3, k3, v3, out, lse, *strides, n_queries, n_keys, head_dim**-0.5 * LOG2_E, group)
    constants = _constants(q3.shape[-1], is_causal, q3.dtype, tiles)
    return attention_grid(n_queries, tiles.block_q, batch_heads), args, constants


def _constants(
    head_dim: int, is_causal: bool, dtype: torch.dtype, tiles: AttentionTiles
) -> dict[str, Any]:
    blocks = dict(BLOCK_Q=tiles.block_q, BLOCK_K=tiles.block_k, BLOCK_D=_padded(head_dim))
    launch = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    precision = _dot_precision(dtype)
    return dict(**blocks, HEAD_DIM=head_dim, IS_CAUSAL=is_causal, DOT_PRECISION=precision, **launch)


def _padded(head_dim: int) -> int:
    return max(16, 1 << math.ceil(math.log2(head_dim)))


def _as_is(kernel: Any) -> Any:
    return kernel


def attention_backward_delta(
    out: Tensor,
    grad_out: Tensor,
    block_rows: int = 32,
    *,
    wrap_kernel: Callable[[Any], Any] = _as_is,
) -> Tensor:
    """D = rowsum(dO ∘ O) by :func:`flash_backward_preprocess_kernel`: float32, ``out.shape[:-1]``.

    The term every backward kernel subtracts from dP (``dS = P ∘ (dP - D)``): since
    ``O_i = Σ_j P_ij V_j``, ``D_i = Σ_j P_ij dP_ij = dO_i · O_i``, one dot product of length
    head_dim per query instead of a sum over all keys. Computed once, before the two backward
    kernels, as FlashAttention-2 does; ``block_rows`` rows per program. ``wrap_kernel`` is
    applied to the kernel before its launch (``torch.library.wrap_triton`` inside a
    ``triton_op``, so that ``torch.compile`` can trace the launch).
    """
    if out.shape != grad_out.shape:
        raise ValueError(
            f"out and grad_out must have one shape, got {tuple(out.shape)} and "
            f"{tuple(grad_out.shape)}"
        )
    if block_rows < 1 or block_rows & (block_rows - 1):
        raise ValueError(f"Invalid block_rows: {block_rows} (need a power of two)")
    head_dim = out.shape[-1]
    o2, do2 = (t.reshape(-1, head_dim).contiguous() for t in (out, grad_out))  # (rows, d)
    delta = torch.empty(o2.shape[0], dtype=torch.float32, device=out.device)
    grid = (-(-o2.shape[0] // block_rows),)
    wrap_kernel(flash_backward_preprocess_kernel)[grid](
        o2,
        do2,
        delta,
        o2.shape[0],
        BLOCK_ROWS=block_rows,
        BLOCK_D=_padded(head_dim),
        HEAD_DIM=head_dim,
    )
    return delta.reshape(out.shape[:-1])


def flash_attention_triton_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    is_causal: bool = False,
    tiles: AttentionTiles | None = None,
    grad_lse: Tensor | None = None,
    *,
    wrap_kernel: Callable[[Any], Any] = _as_is,
) -> tuple[Tensor, Tensor, Tensor]:
    """Run the two backward kernels: ``(dq, dk, dv)`` in the inputs' dtype.

    ``tiles`` (both kernels) defaults to :func:`attention_dkdv_tiles` and
    :func:`attention_dq_tiles` for the tensors' device. ``grad_lse`` (L's shape), the gradient
    of a loss that also reads L: since ``dL_i/dS_ij = P_ij``, it enters as ``D - grad_lse`` in
    ``dS = P ∘ (dP - D)``, so the kernels are unchanged. ``wrap_kernel`` as in
    :func:`attention_backward_delta`, for all three kernels.
    """
    *_, n_queries, head_dim = q.shape
    n_keys = k.shape[-2]
    target = _target(flash_backward_dq_kernel, q)
    dkdv_tiles = tiles or attention_dkdv_tiles(target, q.dtype, head_dim)
    dq_tiles = tiles or attention_dq_tiles(target, q.dtype, head_dim)
    # One layout for all: contiguous (batch·heads, n, d), so q and k share their strides.
    q3, do3 = (t.reshape(-1, n_queries, head_dim).contiguous() for t in (q, grad_out.to(q.dtype)))
    # D = rowsum(dO ∘ O)
    delta = attention_backward_delta(out, grad_out.to(q.dtype), wrap_kernel=wrap_kernel)
    if grad_lse is not None:
        if grad_lse.shape != lse.shape:
            raise ValueError(
                f"grad_lse must have L's shape {tuple(lse.shape)}, got {tuple(grad_lse.shape)}"
            )
        delta = delta - grad_lse.float()
    k3, v3 = (t.reshape(-1, n_keys, head_dim).contiguous() for t in (k, v))
    lse2, delta2 = lse.reshape(-1, n_queries).contiguous(), delta.reshape(-1, n_queries)
    dq = torch.empty_like(q3)
    # one dK, dV per query head (batch·heads, n_keys, d), summed over each group below
    dk, dv = (
        torch.empty(q3.shape[0], n_keys, head_dim, dtype=q.dtype, device=q.device) for _ in "kv"
    )
    grid, args, kwargs = attention_dkdv_launch(
        q3, k3, v3, do3, lse2, delta2, dk, dv, is_causal, dkdv_tiles
    )
    wrap_kernel(flash_backward_dkdv_kernel)[grid](*args, **kwargs)
    grid, args, kwargs = attention_dq_launch(q3, k3, v3, do3, lse2, delta2, dq, is_causal, dq_tiles)
    wrap_kernel(flash_backward_dq_kernel)[grid](*args, **kwargs)
    if k3.shape[0] != q3.shape[0]:  # grouped-query attention: (kv heads, group, n_keys, d)
        dk, dv = (t.float().unflatten(0, (k3.shape[0], -1)).sum(1).to(q.dtype) for t in (dk, dv))
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


def _backward_sizes(q3: Any, k3: Any) -> tuple[int, int, int, tuple]:
    """Batch·heads, queries, keys and the size arguments both backward kernels take."""
    batch_heads, n_queries, head_dim = q3.shape
    n_keys = k3.shape[1]
    scale = head_dim**-0.5
    group = batch_heads // k3.shape[0]  # query heads per KV head (1 without GQA)
    sizes = (q3.stride(0), k3.stride(0), head_dim, n_queries, n_keys, scale, scale * LOG2_E, group)
    return batch_heads, n_queries, n_keys, sizes


def attention_dkdv_launch(
    q3: Any,
    k3: Any,
    v3: Any,
    do3: Any,
    lse: Any,
    delta: Any,
    dk: Any,
    dv: Any,
    is_causal: bool,
    tiles: AttentionTiles,
) -> tuple[tuple[int], tuple, dict[str, Any]]:
    """Grid, arguments and keywords of :func:`flash_backward_dkdv_kernel` (contiguous tensors)."""
    batch_heads, n_queries, n_keys, sizes = _backward_sizes(q3, k3)
    args = (q3, k3, v3, do3, lse, delta, dk, dv, *sizes)
    constants = _constants(q3.shape[-1], is_causal, q3.dtype, tiles)
    return attention_grid(n_keys, tiles.block_k, batch_heads), args, constants


def attention_dq_launch(
    q3: Any,
    k3: Any,
    v3: Any,
    do3: Any,
    lse: Any,
    delta: Any,
    dq: Any,
    is_causal: bool,
    tiles: AttentionTiles,
) -> tuple[tuple[int], tuple, dict[str, Any]]:
    """Grid, arguments and keywords of :func:`flash_backward_dq_kernel` (contiguous tensors)."""
    batch_heads, n_queries, n_keys, sizes = _backward_sizes(q3, k3)
    args = (q3, k3, v3, do3, lse, delta, dq, *sizes)
    constants = _constants(q3.shape[-1], is_causal, q3.dtype, tiles)
    return attention_grid(n_queries, tiles.block_q, batch_heads), args, constants


_OPS: dict[str, Any] = {}


def flash_attention_op_setup_context(
    ctx: Any, inputs: tuple[Tensor, Tensor, Tensor, bool], output: tuple[Tensor, Tensor]
) -> None:
    """Save what :func:`flash_attention_op_backward` needs: q, k, v, O, L and the mask flag."""
    q, k, v, is_causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal = is_causal


def flash_attention_op_backward(
    ctx: Any, grad_out: Tensor | None, grad_lse: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, None]:
    """The forward operator's backward: ``(dq, dk, dv, None)`` for ``(q, k, v, is_causal)``.

    ``torch.library.register_autograd`` needs a backward that ``torch.compile`` can trace, and
    its docstring puts anything else into a custom operator of its own: the backward kernels
    run inside ``trainfast_kernels::flash_attention_backward``, whose body launches them
    through ``wrap_triton``. The forward returns L as well as O, so
    a loss may read both; ``grad_lse`` is folded into D (:func:`flash_attention_triton_backward`).
    A ``None`` for either gradient means zeros (eager autograd already passes zeros for an
    output the loss does not read)."""
    q, k, v, out, lse = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.trainfast_kernels.flash_attention_backward(
        grad_out, q, k, v, out, lse, grad_lse, ctx.is_causal
    )
    return dq, dk, dv, None


def _wrap_triton_accepts(kernel: object) -> bool:
    try:
        torch.library.wrap_triton(kernel)
    except RuntimeError:  # "wrap_triton only works on functions annotated with triton.jit ..."
        return False
    return True


def register_flash_attention_op() -> Any:
    """Register the Triton kernels as ``torch.ops.trainfast_kernels.flash_attention_forward``.

    ``torch.library.triton_op`` (PyTorch 2.6 and later) makes a custom operator whose body
    launches Triton kernels through ``torch.library.wrap_triton``; ``torch.compile`` then traces
    *into* the kernel launch (its output shapes come from tracing the body, no fake
    implementation needed) instead of breaking the graph, and inductor can schedule it with the
    kernels it generates. The forward operator is ``(q, k, v, is_causal) -> (out, lse)``. Its
    backward (``torch.library.register_autograd``: :func:`flash_attention_op_setup_context`
    saves what :func:`flash_attention_op_backward` reads) calls a second operator,
    ``flash_attention_backward``: a registered backward must be traceable, and
    ``register_autograd``'s docstring puts one that is not into a custom operator of its own.

    Returns the forward operator, once per process; ``None`` on a PyTorch without
    ``triton_op``, or one whose ``wrap_triton`` refuses our kernels. Under Triton's CPU
    interpreter (``TRITON_INTERPRET=1``) ``@triton.jit`` returns an ``InterpretedFunction``,
    which PyTorch 2.14's ``wrap_triton`` returns unchanged: the operators run, and autograd
    differentiates them, eagerly on CPU tensors, but ``torch.compile`` cannot trace the
    interpreted launches.
    """
    if "forward" in _OPS:
        return _OPS["forward"]
    triton_op = getattr(torch.library, "triton_op", None)
    if triton_op is None or not _wrap_triton_accepts(flash_forward_kernel):
        return None
    wrap_triton = torch.library.wrap_triton

    @triton_op("trainfast_kernels::flash_attention_forward", mutates_args=())
    def flash_attention_forward(
        q: Tensor, k: Tensor, v: Tensor, is_causal: bool
    ) -> tuple[Tensor, Tensor]:
        validate_op_inputs(q, k, v, is_causal)
        *batch_shape, n_queries, head_dim = q.shape
        tiles = attention_forward_tiles(launch_target(q.device), q.dtype, head_dim)
        q3, k3, v3 = (t.reshape(-1, t.shape[-2], head_dim) for t in (q, k, v))
        out = torch.empty_like(q3)
        lse = torch.empty(q3.shape[:2], dtype=torch.float32, device=q.device)
        grid, args, kwargs = attention_forward_launch(q3, k3, v3, out, lse, is_causal, tiles)
        wrap_triton(flash_forward_kernel)[grid](*args, **kwargs)
        return out.reshape(q.shape), lse.reshape(*batch_shape, n_queries)

    @triton_op("trainfast_kernels::flash_attention_backward", mutates_args=())
    def flash_attention_backward(
        grad_out: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        grad_lse: Tensor | None,
        is_causal: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        validate_op_backward_inputs(grad_out, q, k, v, out, lse, grad_lse)
        return flash_attention_triton_backward(
            grad_out, q, k, v, out, lse, is_causal, grad_lse=grad_lse, wrap_kernel=wrap_triton
        )

    torch.library.register_autograd(
        "trainfast_kernels::flash_attention_forward",
        flash_attention_op_backward,
        setup_context=flash_attention_op_setup_context,
    )
    _OPS["forward"] = flash_attention_forward
    return flash_attention_forward


class FlashAttentionTriton(torch.autograd.Function):
    """Flash attention with Triton forward and backward.

    Call it as ``FlashAttentionTriton.apply(q, k, v, is_causal)``.

    Same interface (``enable_gqa`` included), saved tensors (q, k, v, O, L) and causal
    convention as :class:`~trainfast.kernels.attention.FlashAttention`. Runs on CUDA tensors
    (float16, bfloat16, float32) and, under Triton's interpreter, on CPU tensors (float16,
    float32).
    """

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, enable_gqa: bool = False
    ) -> Tensor:
        out, lse = flash_attention_triton_forward(q, k, v, is_causal, enable_gqa=enable_gqa)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_triton_backward(grad_out, q, k, v, out, lse, ctx.is_causal)
        return dq, dk, dv, None, None
