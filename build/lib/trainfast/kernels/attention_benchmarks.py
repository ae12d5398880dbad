"""Flash attention's benchmarks and predictions: the forward against SDPA, the forward + backward
sweep over sequence lengths and head dimensions.

Beside :mod:`trainfast.kernels.attention` and :mod:`trainfast.kernels.attention_triton`, whose
functions they time; each ``*_record(device, quick)`` is a ``python -m trainfast.measure``
benchmark (the index is :mod:`trainfast.kernels.benchmarks`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from trainfast.accounting import saved_tensor_bytes
from trainfast.gpus import GPUSpec
from trainfast.kernels.attention import FlashAttention, attention_reference
from trainfast.kernels.benchmark_targets import (
    ELEMENT_BYTES,
    check_dtype,
    is_out_of_resources,
    kernel_record,
)
from trainfast.kernels.roofline import Roofline
from trainfast.records import Prediction, Record
from trainfast.timing import benchmark

__all__ = [
    "SDPA_BACKENDS",
    "attention_forward_prediction",
    "attention_record",
    "attention_sweep_prediction",
    "attention_sweep_record",
    "launcher_forward_row",
    "sdpa_default_backend",
    "streamed_elements",
    "tile_config",
]


# --- attention ---------------------------------------------------------------------------------


def _attention_tile_sweep() -> list[Any]:
    from trainfast.kernels.attention_triton import AttentionTiles

    return [
        AttentionTiles(64, 64, 4, 3),
        AttentionTiles(128, 64, 4, 3),
        AttentionTiles(128, 64, 8, 3),
        AttentionTiles(128, 128, 8, 2),
        AttentionTiles(128, 32, 4, 4),
    ]


def tile_config(tiles: Any) -> str:
    """How ``attention-forward`` records name a tile choice in their ``config`` column:
    ``"128x64, 8 warps, 3 stages"`` for ``AttentionTiles(128, 64, 8, 3)``."""
    return f"{tiles.block_q}x{tiles.block_k}, {tiles.num_warps} warps, {tiles.num_stages} stages"


def launcher_forward_row(
    record: Record,
    gpu: GPUSpec,
    seq: int,
    head_dim: int,
    *,
    causal: bool,
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, Any]:
    """The Triton ``dtype`` row of an ``attention-forward`` ``record`` that ran the tiles the
    launcher picks.

    The benchmark sweeps several tile choices; a prediction made with the launcher's tiles
    (:func:`attention_forward_prediction` uses
    :func:`~trainfast.kernels.attention_triton_forward.attention_forward_tiles` on ``gpu``)
    compares with this row, not with the fastest of the sweep. Raises ``ValueError`` naming
    the configuration when the record has no such row.
    """
    from trainfast.kernels.attention_triton_forward import attention_forward_tiles

    for row in record.rows:
        if not (
            row["seq"] == seq
            and row["head_dim"] == head_dim
            and row["causal"] == causal
            and row["dtype"] == str(dtype).removeprefix("torch.")
            and row["implementation"].startswith("triton")
        ):
            continue
        tiles = attention_forward_tiles(gpu, dtype, head_dim)
        if row["config"] == tile_config(tiles):
            return row
    raise ValueError(
        f"The attention-forward record has no Triton row with the launcher's tiles on {gpu.name} "
        f"at seq={seq}, head_dim={head_dim}, causal={causal}, dtype={dtype}"
    )


#: SDPA's fused CUDA backends, each timed forced (``sdpa_kernel``) beside the default's choice:
#: row name -> ``torch.nn.attention.SDPBackend`` member
SDPA_BACKENDS = {
    "sdpa (flash backend)": "FLASH_ATTENTION",
    "sdpa (efficient backend)": "EFFICIENT_ATTENTION",
    "sdpa (cudnn backend)": "CUDNN_ATTENTION",
}


def sdpa_default_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> str:
    """The backend ``scaled_dot_product_attention`` picks for these inputs without being told
    (``torch._fused_sdp_choice``, the dispatcher's own choice: on CUDA ``select_sdp_backend`` in
    ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, whose priority order puts cuDNN's
    first on sm_90 and sm_100 with a recent cuDNN), e.g. ``"CUDNN_ATTENTION"``; ``"unknown"``
    where this PyTorch has no such function."""
    from torch.nn.attention import SDPBackend

    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is None:
        return "unknown"
    names = {int(getattr(SDPBackend, n)): n for n in dir(SDPBackend) if n.isupper()}
    return names.get(int(choice(q, k, v, is_causal=is_causal)), "unknown")


def _no_kernel(error: Exception) -> bool:
    """Whether ``error`` is SDPA refusing a forced backend for these inputs or this build."""
    return isinstance(error, RuntimeError) and "No available kernel" in str(error)


def attention_record(device: torch.device, quick: bool) -> Record:
    """Attention forward: Triton flash attention vs ``scaled_dot_product_attention``.

    On CUDA: bfloat16, batch 4 (2 quick), sequence 4096 (2048 quick), model width 2048 as 32
    heads of 64 or 16 heads of 128, causal and not; SDPA with its default backend choice (its
    ``config`` names the backend it picks,
    :func:`~trainfast.kernels.attention_benchmarks.sdpa_default_backend`) and with each fused
    backend of :data:`~trainfast.kernels.attention_benchmarks.SDPA_BACKENDS` forced (a backend
    that refuses the inputs has no row).
    FLOPs are ``4·b·h·n²·d``, halved for causal. On a CPU (float32, 4 heads of 64, sequence
    256, 64 quick): the tiled PyTorch FlashAttention, the textbook attention and SDPA, with the
    bytes each saves for the backward pass.
    """
    rows = []
    cuda = device.type == "cuda"
    batch, seq = ((2, 2048) if quick else (4, 4096)) if cuda else (1, 64 if quick else 256)
    dtype = torch.bfloat16 if cuda else torch.float32
    for head_dim in (64, 128) if cuda else (64,):
        heads = 2048 // head_dim if cuda else 4
        for is_causal in (False, True):
            shape = (batch, heads, seq, head_dim)
            q, k, v = (torch.randn(shape, device=device).to(dtype) for _ in range(3))
            flops = 4 * batch * heads * seq * seq * head_dim / (2 if is_causal else 1)
            base = {
                "seq": seq,
                "heads": heads,
                "head_dim": head_dim,
                "causal": is_causal,
                "dtype": str(dtype).removeprefix("torch."),
            }
            contenders = _attention_contenders(q, k, v, is_causal, cuda)
            for name, config, run, differentiable in contenders:
                try:
                    timing = benchmark(run, warmup=3, repeats=10 if cuda else 5, device=device)
                except Exception as error:  # noqa: BLE001
                    if not (is_out_of_resources(error) or _no_kernel(error)):
                        raise
                    continue
                saved = saved_tensor_bytes(
                    lambda f=differentiable, args=(q, k, v): _with_grad(f, args)
                )
                row = base | {
                    "implementation": name,
                    "config": config,
                    "seconds": timing.median,
                    "tflops": flops / timing.median / 1e12,
                    "saved_bytes": saved,
                }
                rows.append(row)
            sdpa = next(r["seconds"] for r in rows[::-1] if r["implementation"] == "sdpa (default)")
            for row in rows:
                if row["head_dim"] == head_dim and row["causal"] == is_causal:
                    row["ratio_to_sdpa"] = sdpa / row["seconds"]
    return kernel_record(
        "attention-forward",
        f"Attention forward, batch {batch}, {dtype}: median seconds and TFLOP/s "
        "(4·b·h·n²·d, halved when causal); saved_bytes is what the forward keeps for backward.",
        rows,
        device,
        {"seconds": "s", "tflops": "TFLOP/s", "saved_bytes": "bytes"},
    )


def _with_grad(run: Any, args: tuple[torch.Tensor, ...]) -> None:
    for t in args:
        t.requires_grad_(True)
    try:
        run()
    finally:
        for t in args:
            t.requires_grad_(False)


def _attention_contenders(q, k, v, is_causal: bool, cuda: bool) -> list[tuple[str, str, Any, Any]]:
    """(name, config, the timed forward, the differentiable call whose saved bytes are counted)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def default() -> Any:
        return sdpa(q, k, v, is_causal=is_causal)

    picks = f"picks {sdpa_default_backend(q, k, v, is_causal)}"
    contenders: list[tuple[str, str, Any, Any]] = [("sdpa (default)", picks, default, default)]
    if cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from trainfast.kernels.attention_triton import (
            FlashAttentionTriton,
            flash_attention_triton_forward,
        )

        def forced(backend: str) -> Any:
            def run() -> Any:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    return sdpa(q, k, v, is_causal=is_causal)

            return run

        def triton_function() -> Any:
            return FlashAttentionTriton.apply(q, k, v, is_causal)

        for name, backend in SDPA_BACKENDS.items():
            if hasattr(SDPBackend, backend):
                contenders.append((name, "", forced(backend), forced(backend)))
        for tiles in _attention_tile_sweep():
            config = tile_config(tiles)

            def triton_forward(t=tiles) -> Any:
                return flash_attention_triton_forward(q, k, v, is_causal, t)

            contender = ("triton flash_forward_kernel", config, triton_forward, triton_function)
            contenders.append(contender)
    else:

        def tiled() -> Any:
            return FlashAttention.apply(q, k, v, is_causal)

        def textbook() -> Any:
            return attention_reference(q, k, v, is_causal)

        tiles = f"{FlashAttention.tile_queries}x{FlashAttention.tile_keys}"
        contenders += [
            ("tiled FlashAttention (PyTorch)", tiles, tiled, tiled),
            ("textbook attention", "", textbook, textbook),
        ]
    return contenders


def attention_sweep_record(device: torch.device, quick: bool) -> Record:
    """Attention forward + backward, causal, over sequence lengths and head dimensions.

    On CUDA: bfloat16, 16 heads, tokens per batch fixed at 16,384 (batch = 16,384 / seq),
    sequences 512 to 8,192 (1,024 and 4,096 quick), head dimensions 64 and 128;
    :class:`~trainfast.kernels.attention_triton.FlashAttentionTriton` against SDPA's default
    backend. On a CPU (float32, batch 1, 4 heads, sequences 128 and 256 (128 quick), head
    dimensions 32 and 64 (32 quick)): the tiled PyTorch FlashAttention, SDPA and
    ``flex_attention`` compiled by ``torch.compile`` with a causal block mask (not when
    ``quick``). FLOPs follow the
    FlashAttention-2 paper's convention, forward ``4·b·h·n²·d`` and backward 2.5 times that,
    halved when causal (forward only where ``pass`` says so); ``min_seconds`` is the fastest
    of the ten calls, steadier than the median on a shared CPU; ``max_abs_diff`` is each
    output's largest difference from SDPA's. The
    prediction beside it is :func:`attention_sweep_prediction`. On a CPU it times with one thread
    (restored after): on a shared machine, several threads' calls swing by whole scheduler periods.
    """
    cuda = device.type == "cuda"
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    try:
        rows = _attention_sweep_rows(device, quick)
    finally:
        torch.set_num_threads(threads)
    dtype = rows[0]["dtype"]
    return kernel_record(
        "attention-fwd-bwd",
        f"Causal attention forward + backward, {dtype}: median seconds and TFLOP/s (forward "
        "4·b·h·n²·d, backward 2.5 times that, halved for causal); max_abs_diff from SDPA's output.",
        rows,
        device,
        {"seconds": "s", "min_seconds": "s", "tflops": "TFLOP/s"},
    )


def _attention_sweep_rows(device: torch.device, quick: bool) -> list[dict[str, Any]]:
    """The rows of :func:`attention_sweep_record`, timed with the threads the caller set."""
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    heads = 16 if cuda else 4
    if cuda:
        seqs, head_dims = ((1024, 4096) if quick else (512, 1024, 2048, 4096, 8192)), (64, 128)
    else:
        seqs, head_dims = ((128,) if quick else (128, 256)), ((32,) if quick else (32, 64))
    rows = []
    for head_dim in head_dims:
        for seq in seqs:
            batch = max(1, 16_384 // seq) if cuda else 1
            shape = (batch, heads, seq, head_dim)
            q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
            grad_out = torch.randn_like(q)
            forward_flops = 4 * batch * heads * seq * seq * head_dim / 2
            base = {
                "seq": seq,
                "head_dim": head_dim,
                "batch": batch,
                "heads": heads,
                "dtype": str(dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(),
            }
            expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            for name, attend, backward in _sweep_contenders(seq, cuda, quick):
                args = [t.detach().clone().requires_grad_(backward) for t in (q, k, v)]
                out = attend(*args)
                difference = (out.float() - expected.float()).abs().max().item()

                step = partial(_attention_step, attend, args, grad_out if backward else None)
                timing = benchmark(step, warmup=2, repeats=10, device=device)
                flops = forward_flops * (3.5 if backward else 1.0)
                rows.append(
                    base
                    | {
                        "implementation": name,
                        "pass": "forward + backward" if backward else "forward",
                        "seconds": timing.median,
                        "min_seconds": timing.min,
                        "tflops": flops / timing.median / 1e12,
                        "max_abs_diff": difference,
                    }
                )
    return rows


def _attention_step(attend: Any, args: list[torch.Tensor], grad_out: torch.Tensor | None) -> None:
    """One timed step: the forward, and the backward unless ``grad_out`` is None."""
    out = attend(*args)
    if grad_out is not None:
        torch.autograd.grad(out, args, grad_out)


def _sweep_contenders(seq: int, cuda: bool, quick: bool) -> list[tuple[str, Any, bool]]:
    """(name, attend(q, k, v) -> causal output, whether the backward is timed too) for
    :func:`attention_sweep_record`.

    ``quick`` on a CPU leaves FlexAttention out: its compilation takes minutes there. FlexAttention
    has no backward on a CPU (torch 2.14 raises ``NotImplementedError``), so there it is timed
    forward only, beside SDPA's forward.
    """
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return sdpa(q, k, v, is_causal=True)

    contenders: list[tuple[str, Any, bool]] = [("sdpa (default)", causal_sdpa, True)]
    if cuda:
        from trainfast.kernels.attention_triton import FlashAttentionTriton

        contenders.append(
            (
                "triton FlashAttentionTriton",
                lambda q, k, v: FlashAttentionTriton.apply(q, k, v, True),
                True,
            )
        )
        return contenders
    tiled = (
        "tiled FlashAttention (PyTorch)",
        lambda q, k, v: FlashAttention.apply(q, k, v, True),
        True,
    )
    if quick:
        return [*contenders, tiled]
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal(
        batch: torch.Tensor, head: torch.Tensor, q_index: torch.Tensor, kv_index: torch.Tensor
    ) -> torch.Tensor:
        return q_index >= kv_index

    block_mask = create_block_mask(causal, None, None, seq, seq, device="cpu")
    compiled = torch.compile(flex_attention)
    contenders += [
        tiled,
        ("sdpa (default)", causal_sdpa, False),
        (
            "flex_attention (torch.compile)",
            lambda q, k, v: compiled(q, k, v, block_mask=block_mask),
            False,
        ),
    ]
    return contenders


#: the torch dtype of each datasheet dtype name, for the launchers' tile functions
_TORCH_DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
#: how the predictions treat repeated reads of K and V (forward, dQ) or Q and dO (dK, dV)
CACHE_MODELS = ("none", "l2")


def _checked_element_bytes(gpu: GPUSpec, seq: int, head_dim: int, dtype: str, cache: str) -> int:
    """Bytes per element of ``dtype``, after checking the shape, the cache model and that
    ``gpu`` has a peak for ``dtype``."""
    if seq < 1 or head_dim < 1:
        raise ValueError(f"Invalid attention shape: seq={seq!r}, head_dim={head_dim!r}")
    if cache not in CACHE_MODELS:
        raise ValueError(f"Unknown cache model: {cache!r} (expected one of {CACHE_MODELS})")
    check_dtype(gpu, dtype)
    if dtype not in _TORCH_DTYPES:
        raise ValueError(f"No attention kernel for dtype {dtype!r} (has {sorted(_TORCH_DTYPES)})")
    return ELEMENT_BYTES[dtype]


def streamed_elements(
    gpu: GPUSpec, seq: int, head_dim: int, block: int, element: int, cache: str
) -> int:
    """Elements one attention kernel reads from HBM of the other side's two ``seq × head_dim``
    tensors, per (batch, head), when each program owns ``block`` rows.

    ``cache="none"``: every program reads them whole, ``ceil(seq / block)`` times: the most
    traffic, a pessimistic estimate that a measurement can exceed when L2 serves the rereads.
    ``cache="l2"``: the programs in flight (about one per SM, as the compile report shows
    for these kernels) cover ``ceil(SMs / tiles per head) + 1`` heads, which run next to each
    other in the grid order; if those heads' two tensors fit in L2, each is read from HBM once
    and L2 serves the rest, otherwise the no-cache count stands.
    """
    tiles = -(-seq // block)
    if cache == "l2":
        heads_in_flight = -(-gpu.sm_count // tiles) + 1
        if heads_in_flight * 2 * seq * head_dim * element <= gpu.l2_bytes:
            return 2 * seq * head_dim
    return tiles * 2 * seq * head_dim


def _cache_text(cache: str) -> str:
    if cache == "none":
        return "no cache (the most traffic; the products at the peak)"
    return "L2 reuse (each head's tensors read from HBM once)"


def attention_sweep_prediction(
    gpu: GPUSpec,
    seq: int,
    head_dim: int,
    dtype: str = "bf16",
    *,
    cache: str = "none",
    dkdv_tiles: Any = None,
    dq_tiles: Any = None,
) -> Prediction:
    """The forward + backward FLOP/s of causal flash attention on ``gpu``, from the roofline.

    Executed FLOPs per (batch, head), before halving for causal: the forward's two products
    (``4 · seq² · head_dim``) and the backward's seven (S and dP recomputed in both backward
    kernels, dV, dK, dQ: ``14 · seq² · head_dim``). Bytes: each of the three main kernels streams
    the other side's two n × d tensors
    (:func:`~trainfast.kernels.attention_benchmarks.streamed_elements`) with the tiles its
    launcher picks on ``gpu``
    (:func:`~trainfast.kernels.attention_triton_forward.attention_forward_tiles`,
    ``attention_dkdv_tiles``, ``attention_dq_tiles``), plus ``11 · seq · head_dim`` read or
    written once (forward Q, O; preprocessing O, dO; dK/dV kernel K, V, dK, dV; dQ kernel Q, dO,
    dQ). The time is the larger of FLOPs / peak and bytes
    / bandwidth; the rate is reported in :func:`attention_sweep_record`'s convention
    (``3.5 · 4 · seq² · head_dim`` per time), so it is comparable with the record.
    ``attention-fwd-bwd`` measures it. ``dkdv_tiles`` and ``dq_tiles`` replace the backward
    launchers' tiles, to predict what other tiles would do.
    """
    from trainfast.kernels.attention_triton_backward import attention_dkdv_tiles, attention_dq_tiles
    from trainfast.kernels.attention_triton_forward import attention_forward_tiles

    element = _checked_element_bytes(gpu, seq, head_dim, dtype, cache)
    torch_dtype = _TORCH_DTYPES[dtype]
    forward = attention_forward_tiles(gpu, torch_dtype, head_dim)
    dkdv = dkdv_tiles or attention_dkdv_tiles(gpu, torch_dtype, head_dim)
    dq = dq_tiles or attention_dq_tiles(gpu, torch_dtype, head_dim)
    executed = (4 + 14) * seq * seq * head_dim
    streamed = sum(
        streamed_elements(gpu, seq, head_dim, block, element, cache)
        for block in (forward.block_q, dkdv.block_k, dq.block_q)
    )
    moved = (streamed + 11 * seq * head_dim) * element
    seconds = max(executed / gpu.peak_flops[dtype], moved / gpu.hbm_bytes_per_s)
    return Prediction(
        3.5 * 4 * seq * seq * head_dim / seconds / 1e12,
        "TFLOP/s",
        f"roofline of the {gpu.name} datasheet, {dtype} forward + backward, seq {seq}, "
        f"head dim {head_dim}, tiles of {forward.block_q} queries a forward program, "
        f"{dkdv.block_k} keys a dK/dV program, {dq.block_q} queries a dQ program, "
        f"{_cache_text(cache)}",
    )


def attention_forward_prediction(
    gpu: GPUSpec, seq: int, head_dim: int, dtype: str = "bf16", *, cache: str = "none"
) -> Prediction:
    """The FLOP/s a flash-attention forward should reach on ``gpu``, from the roofline.

    Per (batch, head): ``4 · seq² · head_dim`` FLOPs (two products; causal masking halves both
    FLOPs and traffic, so the rate is the same). Bytes: Q and O once, and K and V as
    :func:`~trainfast.kernels.attention_benchmarks.streamed_elements` counts them for the
    launcher's query tiles
    (:func:`~trainfast.kernels.attention_triton_forward.attention_forward_tiles` on ``gpu``:
    128 × 64 in 16-bit on an H100). With no cache the intensity is about ``2 · block_q`` FLOPs
    per element, 128 per byte in bf16, below an H100's ridge (about 295): a pessimistic
    estimate (a measurement can exceed it) that calls the forward memory-bound. With L2 reuse K and
    V come from HBM once per head, the
    intensity is about ``seq / 2`` per byte, and the ceiling is the tensor-core peak.
    ``attention-forward`` measures it.
    """
    from trainfast.kernels.attention_triton_forward import attention_forward_tiles

    element = _checked_element_bytes(gpu, seq, head_dim, dtype, cache)
    tiles = attention_forward_tiles(gpu, _TORCH_DTYPES[dtype], head_dim)
    flops = 4 * seq * seq * head_dim
    streamed = streamed_elements(gpu, seq, head_dim, tiles.block_q, element, cache)
    moved = (streamed + 2 * seq * head_dim) * element
    roofline = Roofline(gpu.peak_flops[dtype], gpu.hbm_bytes_per_s)
    return Prediction(
        roofline.attainable(flops / moved) / 1e12,
        "TFLOP/s",
        f"roofline of the {gpu.name} datasheet, {dtype} forward, seq {seq}, head dim {head_dim}, "
        f"the launcher's {tiles.block_q}×{tiles.block_k} tiles, {_cache_text(cache)}",
    )
