"""The chapter's measurements, as ``python -m trainfast.measure`` benchmarks.

Each function takes ``(device, quick)`` and returns a :class:`~trainfast.records.Record`. On a GPU
the Triton kernels run compiled and are compared, in the same run, with what PyTorch ships:

=====================  ==================================================  ===========
benchmark              measures                                            target
=====================  ==================================================  ===========
``copy-bandwidth``     Triton copy vs ``torch`` copy, by size               ≥ 0.90
``matmul-tiles``       tiled Triton matmul vs ``torch.matmul`` at 4096³,    ≥ 0.75
                       fp16 and bf16, over a sweep of tile sizes
``attention-forward``  Triton flash-attention forward vs                    ≥ 0.60
                       ``scaled_dot_product_attention``, bf16, seq 4096
``attention-fwd-bwd``  forward + backward over sequence lengths and head     (none)
                       dimensions: Triton (GPU) or tiled (CPU) flash
                       attention, SDPA, FlexAttention under compile (CPU)
``roofline``           elementwise ops, a reduction, matmuls: FLOP/s and    (none)
                       intensity, with the measured ridge
``strided-access``     one gather of a buffer in stride order, by stride     (none)
``host-transfers``     ``.item()``, pageable and pinned copies              (none)
``fused-linear-gelu``  ``gelu(a @ b + bias)``: the Triton epilogue vs      (none)
                       eager, ``torch.compile`` and cuBLASLt's epilogue
=====================  ==================================================  ===========

:func:`target_ratios` reads the three ratios back from records and prints them beside their
targets (each benchmark prints its own when it finishes). On a CPU the Triton kernels run in
the interpreter, whose timings measure the interpreter, not the hardware: those benchmarks then
time the PyTorch side only (the cache hierarchy, the roofline, the tiled PyTorch attention),
and run the Triton kernels once at a tiny size to prove they work.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from trainfast.accounting import saved_tensor_bytes
from trainfast.gpus import GPUSpec
from trainfast.kernels.attention import FlashAttention, attention_reference
from trainfast.kernels.bandwidth import copy_bandwidth, host_transfer_costs, strided_bandwidth
from trainfast.kernels.roofline import Roofline, matmul_cost, measure_roofline, roofline_from_rows
from trainfast.kernels.tiled_matmul import MatmulTiles, epilogue_traffic_bytes, tile_traffic_bytes
from trainfast.records import Prediction, Record, make_record
from trainfast.timing import benchmark

__all__ = [
    "ELEMENT_BYTES",
    "FUSED_LINEAR_GELU_SHAPE",
    "TARGETS",
    "attention_forward_prediction",
    "attention_record",
    "attention_sweep_prediction",
    "attention_sweep_record",
    "copy_prediction",
    "copy_record",
    "fused_linear_gelu_prediction",
    "fused_linear_gelu_record",
    "host_transfer_prediction",
    "host_transfer_record",
    "matmul_prediction",
    "matmul_record",
    "roofline_record",
    "strided_record",
    "target_ratios",
]

#: Bytes per element of each format the predictions take (a key of ``GPUSpec.peak_flops``).
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

#: benchmark name -> (what is compared, the ratio's target on an H100)
TARGETS = {
    "copy-bandwidth": ("Triton copy / torch copy, bandwidth at the largest size", 0.90),
    "matmul-tiles": ("tiled Triton matmul / torch.matmul, FLOP/s at 4096³ (best tiles)", 0.75),
    "attention-forward": ("Triton flash forward / SDPA, FLOP/s at seq 4096 (worst case)", 0.60),
}


def _record(
    name: str,
    description: str,
    rows: list[dict[str, Any]],
    device: torch.device,
    units: dict[str, str],
) -> Record:
    record = make_record(name, description, rows, units=units, device=device)
    for line in target_ratios([record]):
        print(line)
    return record


# --- copy --------------------------------------------------------------------------------------

_COPY_CONFIGS = [(1024, 4), (2048, 8), (4096, 8), (8192, 16)]  # (block_size, num_warps)


def copy_record(device: torch.device, quick: bool) -> Record:
    """Copy bandwidth by size; on CUDA, ``torch`` beside the Triton kernel in four configurations.

    Sizes span the caches and main memory: 16 KiB to 256 MiB on a CPU (to 8 MiB quick),
    1 MiB to 2 GiB on a GPU (to 64 MiB quick).
    """
    if device.type == "cuda":
        sizes = [1 << p for p in range(20, 27 if quick else 32, 2)]
    else:
        sizes = [1 << p for p in range(14, 24 if quick else 29)]
    rows = [dict(row, config="") for row in copy_bandwidth(device, sizes)]
    if device.type == "cuda":
        from trainfast.kernels.elementwise import copy_tensor

        torch_speed = {row["bytes"]: row["gb_per_s"] for row in rows}
        for nbytes in sizes:
            x = torch.randn(nbytes // 4, device=device)
            for block_size, num_warps in _COPY_CONFIGS:

                def run(x=x, b=block_size, w=num_warps):
                    return copy_tensor(x, block_size=b, num_warps=w)

                timing = benchmark(run, warmup=3, repeats=10, device=device)
                row = {
                    "implementation": "triton copy_kernel",
                    "bytes": nbytes,
                    "seconds": timing.median,
                    "gb_per_s": 2 * nbytes / timing.median / 1e9,
                    "config": f"BLOCK_SIZE={block_size}, num_warps={num_warps}",
                }
                rows.append(row)
        for row in rows:
            row["ratio_to_torch"] = row["gb_per_s"] / torch_speed[row["bytes"]]
    else:
        _prove_triton_copy_runs()
        for row in rows:
            row["ratio_to_torch"] = 1.0
    return _record(
        "copy-bandwidth",
        "Copy bandwidth (bytes read + written per second) by tensor size, float32; median of "
        "repeats, warm caches (the working set is 2x the size).",
        rows,
        device,
        {"bytes": "bytes", "seconds": "s", "gb_per_s": "GB/s"},
    )


def _prove_triton_copy_runs() -> None:
    from trainfast.kernels.elementwise import copy_tensor

    x = torch.randn(1000)
    if not torch.equal(copy_tensor(x), x):  # pragma: no cover - the tests check this too
        raise AssertionError("the Triton copy kernel gave a wrong result")


# --- matmul ------------------------------------------------------------------------------------


def _tile_sweep() -> list[Any]:
    from trainfast.kernels.tiled_matmul import MatmulTiles

    return [
        MatmulTiles(32, 32, 32, group_m=8, num_warps=2, num_stages=3),
        MatmulTiles(64, 64, 32, group_m=8, num_warps=4, num_stages=4),
        MatmulTiles(128, 64, 32, group_m=8, num_warps=4, num_stages=4),
        MatmulTiles(128, 128, 32, group_m=8, num_warps=4, num_stages=4),
        MatmulTiles(128, 128, 64, group_m=8, num_warps=8, num_stages=3),
        MatmulTiles(64, 256, 32, group_m=8, num_warps=4, num_stages=4),
        MatmulTiles(128, 256, 64, group_m=8, num_warps=8, num_stages=3),
        MatmulTiles(256, 128, 64, group_m=8, num_warps=8, num_stages=3),
        # no grouping: L2 reuse lost
        MatmulTiles(128, 256, 64, group_m=1, num_warps=8, num_stages=3),
    ]


def _is_out_of_resources(error: Exception) -> bool:
    return type(error).__name__ == "OutOfResources"


def matmul_record(device: torch.device, quick: bool) -> Record:
    """``torch.matmul`` and the tiled Triton matmul over a sweep of tile sizes.

    On CUDA at 4096³ (2048³ quick) in float16 and bfloat16; tiles that need more shared memory
    than the GPU has are recorded with no time. On a CPU, the interpreter at 64³ in float32.
    """
    from trainfast.kernels.tiled_matmul import MatmulTiles, matmul, tile_traffic_bytes

    if device.type == "cuda":
        size = 2048 if quick else 4096
        dtypes, sweep, repeats = [torch.float16, torch.bfloat16], _tile_sweep(), 10
    else:
        size, dtypes, repeats = 64, [torch.float32], 3
        sweep = [
            MatmulTiles(16, 16, 16, num_stages=1),
            MatmulTiles(32, 32, 32, num_stages=1),
            MatmulTiles(64, 64, 32, num_stages=1),
        ]
    flops = 2 * size**3
    rows = []
    for dtype in dtypes:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        element = a.element_size()
        reference = benchmark(
            lambda a=a, b=b: torch.matmul(a, b), warmup=3, repeats=repeats, device=device
        )
        base = {"size": size, "dtype": str(dtype).removeprefix("torch.")}
        row = base | {
            "implementation": "torch.matmul",
            "tiles": "",
            "shared_memory_bytes": None,
            "traffic_bytes": None,
            "seconds": reference.median,
            "tflops": flops / reference.median / 1e12,
            "ratio_to_torch": 1.0,
        }
        rows.append(row)
        for tiles in sweep:
            shape = f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}"
            launch = f"{tiles.num_warps} warps, {tiles.num_stages} stages"
            row = base | {
                "implementation": "triton matmul_kernel",
                "tiles": f"{shape}, group {tiles.group_m}, {launch}",
                "shared_memory_bytes": tiles.shared_memory_bytes(element),
                "traffic_bytes": tile_traffic_bytes(size, size, size, tiles, element),
                "seconds": None,
                "tflops": None,
                "ratio_to_torch": None,
            }
            try:
                timing = benchmark(
                    lambda a=a, b=b, t=tiles: matmul(a, b, tiles=t),
                    warmup=3,
                    repeats=repeats,
                    device=device,
                )
            except Exception as error:  # noqa: BLE001 - only the one kind is expected, else re-raised
                if not _is_out_of_resources(error):
                    raise
            else:
                row["seconds"] = timing.median
                row["tflops"] = flops / timing.median / 1e12
                row["ratio_to_torch"] = reference.median / timing.median
            rows.append(row)
    if device.type == "cuda":
        where = "compiled"
    else:
        where = "interpreted on the CPU (the Triton timings measure Triton's interpreter)"
    units = {
        "seconds": "s",
        "tflops": "TFLOP/s",
        "shared_memory_bytes": "bytes",
        "traffic_bytes": "bytes",
    }
    return _record(
        "matmul-tiles",
        f"Square matmuls of size {size}: torch.matmul and the tiled Triton kernel ({where}) for "
        "each tile configuration; traffic_bytes is what the tiling reads and writes with no cache.",
        rows,
        device,
        units,
    )


# --- fused linear + GELU -------------------------------------------------------------------------

#: an MLP's first projection: tokens × model width @ model width × 4 · model width (GPT-2 medium)
FUSED_LINEAR_GELU_SHAPE = (8192, 4096, 1024)  # (m, n, k)


def _gelu_linear(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``gelu(a @ b + bias, approximate="tanh")`` in eager PyTorch: the reference path."""
    from trainfast.kernels.tiled_matmul import matmul_reference

    return matmul_reference(a, b, bias, "gelu_tanh")


def _inductor_kernel_count(compiled: Any, args: tuple[torch.Tensor, ...]) -> tuple[int, int]:
    """(kernels Inductor generated, library calls it kept) for one fresh compile of ``compiled``."""
    from torch._dynamo.utils import counters
    from torch._inductor import metrics

    torch._dynamo.reset()
    metrics.reset()
    counters.clear()
    compiled(*args)
    return metrics.generated_kernel_count, int(counters["inductor"]["extern_calls"])


def fused_linear_gelu_record(device: torch.device, quick: bool) -> Record:
    """``gelu(a @ b + bias, approximate="tanh")`` four ways, at an MLP's shape.

    Eager PyTorch (three kernels), ``torch.compile`` (Inductor), cuBLASLt's fused GELU epilogue
    (``torch._addmm_activation(bias, a, b, use_gelu=True)``, on CUDA only: on a CPU that op
    computes the exact GELU), and :func:`~trainfast.kernels.tiled_matmul.matmul` with its
    epilogue, at its default tiles and autotuned. On CUDA in bf16 at
    :data:`FUSED_LINEAR_GELU_SHAPE` (a quarter of the tokens quick); ``max_error`` is against
    the float64 result. On a CPU, float32 at a small size, and the Triton kernel once,
    interpreted (its time measures the interpreter).
    """
    from trainfast.kernels.tiled_matmul import matmul, matmul_tiles, tune_matmul_tiles

    cuda = device.type == "cuda"
    if cuda:
        (m, n, k), dtype, repeats = FUSED_LINEAR_GELU_SHAPE, torch.bfloat16, 20
        m = m // 4 if quick else m
    else:
        (m, n, k), dtype, repeats = (256, 512, 128), torch.float32, 5
    generator = torch.Generator().manual_seed(0)
    a = (torch.randn(m, k, generator=generator) / k**0.5).to(device, dtype)
    b = torch.randn(k, n, generator=generator).to(device, dtype)
    bias = torch.randn(n, generator=generator).to(device, dtype)
    expected = _gelu_linear(a.double(), b.double(), bias.double())
    compiled = torch.compile(_gelu_linear)
    kernels, library_calls = _inductor_kernel_count(compiled, (a, b, bias))
    contenders = {
        "eager": ("3 kernels", lambda: _gelu_linear(a, b, bias)),
        "torch.compile": (
            f"Inductor: {kernels} generated kernel(s), {library_calls} library call(s)",
            lambda: compiled(a, b, bias),
        ),
    }
    if cuda:
        contenders["cuBLASLt epilogue"] = (
            "torch._addmm_activation(use_gelu=True)",
            lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
        )
    default = matmul_tiles(None if not cuda else _target(device), dtype)
    contenders["triton epilogue"] = (
        _tiles_text(default),
        lambda: matmul(a, b, bias, "gelu_tanh", tiles=default),
    )
    if cuda:
        tuned = tune_matmul_tiles(a, b, bias, "gelu_tanh")
        contenders["triton epilogue, autotuned"] = (
            _tiles_text(tuned),
            lambda: matmul(a, b, bias, "gelu_tanh", tiles=tuned),
        )
    flops = 2 * m * n * k
    base = {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch.")}
    rows, eager_seconds = [], None
    for name, (config, run) in contenders.items():
        interpreted = name.startswith("triton") and not cuda
        timing = benchmark(
            run,
            warmup=0 if interpreted else 3,
            repeats=1 if interpreted else repeats,
            device=device,
        )
        eager_seconds = eager_seconds or timing.median
        rows.append(
            base
            | {
                "implementation": name,
                "config": config,
                "seconds": timing.median,
                "tflops": flops / timing.median / 1e12,
                "speedup_vs_eager": eager_seconds / timing.median,
                "max_error": (run().double() - expected).abs().max().item(),
            }
        )
    where = "compiled" if cuda else "interpreted on the CPU (its time measures the interpreter)"
    return _record(
        "fused-linear-gelu",
        f"gelu(a @ b + bias, tanh) for a ({m}, {k}) @ ({k}, {n}) product in {base['dtype']}: eager "
        f"PyTorch, torch.compile, cuBLASLt's fused epilogue (CUDA only) and the Triton matmul "
        f"with its fused epilogue ({where}); max_error against float64.",
        rows,
        device,
        {"seconds": "s", "tflops": "TFLOP/s"},
    )


def _target(device: torch.device) -> Any:
    from trainfast.kernels.targets import launch_target

    return launch_target(device)


def _tiles_text(tiles: MatmulTiles) -> str:
    return (
        f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}, {tiles.num_warps} warps, "
        f"{tiles.num_stages} stages"
    )


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


def _sdpa_flash_backend() -> Any:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def attention_record(device: torch.device, quick: bool) -> Record:
    """Attention forward: Triton flash attention vs ``scaled_dot_product_attention``.

    On CUDA: bfloat16, batch 4 (2 quick), sequence 4096 (2048 quick), model width 2048 as 32
    heads of 64 or 16 heads of 128, causal and not; SDPA with its default backend choice and
    with the FlashAttention backend forced. FLOPs are ``4·b·h·n²·d``, halved for causal. On a CPU
    (float32, 4 heads of 64, sequence 256, 64 quick): the tiled PyTorch FlashAttention, the
    textbook attention and SDPA, with the bytes each saves for the backward pass.
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
                    if not _is_out_of_resources(error):
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
    return _record(
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

    contenders: list[tuple[str, str, Any, Any]] = [("sdpa (default)", "", default, default)]
    if cuda:
        from trainfast.kernels.attention_triton import (
            FlashAttentionTriton,
            flash_attention_triton_forward,
        )

        def flash_backend() -> Any:
            with _sdpa_flash_backend():
                return sdpa(q, k, v, is_causal=is_causal)

        def triton_function() -> Any:
            return FlashAttentionTriton.apply(q, k, v, is_causal)

        contenders.append(("sdpa (flash backend)", "", flash_backend, flash_backend))
        for tiles in _attention_tile_sweep():
            launch = f"{tiles.num_warps} warps, {tiles.num_stages} stages"
            config = f"{tiles.block_q}x{tiles.block_k}, {launch}"

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
    return _record(
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


def attention_sweep_prediction(
    gpu: GPUSpec, seq: int, head_dim: int, dtype: str = "bf16", block: int = 64
) -> Prediction:
    """The forward + backward FLOP/s of causal flash attention on ``gpu``, from the roofline.

    Executed FLOPs per (batch, head), before halving for causal: the forward's two products
    (``4 · seq² · head_dim``) and the backward's seven (S and dP recomputed in both backward
    kernels, dV, dK, dQ: ``14 · seq² · head_dim``). Bytes, with tiles of ``block`` rows and no
    cache: each of the three kernels streams the other side's two n × d tensors once per tile,
    ``3 · (seq / block) · 2 · seq · head_dim`` elements, plus about ``9 · seq · head_dim`` read
    or written once (q, k, v, O, dO, dQ, dK, dV). The time is the larger of FLOPs / peak and
    bytes / bandwidth; the rate is reported in :func:`attention_sweep_record`'s convention
    (``3.5 · 4 · seq² · head_dim`` per time), so it is comparable with the record. L2 serves
    most repeated tile reads on a real GPU, so read it as a no-cache estimate.
    ``attention-fwd-bwd`` measures it.
    """
    if seq < 1 or head_dim < 1 or block < 1:
        raise ValueError(
            f"Invalid attention shape: seq={seq!r}, head_dim={head_dim!r}, block={block!r}"
        )
    if dtype not in gpu.peak_flops:
        raise ValueError(f"Unknown dtype for {gpu.name}: {dtype!r} (has {sorted(gpu.peak_flops)})")
    element = ELEMENT_BYTES[dtype]
    executed = (4 + 14) * seq * seq * head_dim
    moved = (3 * -(-seq // block) * 2 * seq * head_dim + 9 * seq * head_dim) * element
    seconds = max(executed / gpu.peak_flops[dtype], moved / gpu.hbm_bytes_per_s)
    return Prediction(
        3.5 * 4 * seq * seq * head_dim / seconds / 1e12,
        "TFLOP/s",
        f"roofline of the {gpu.name} datasheet, {dtype} forward + backward, seq {seq}, "
        f"head dim {head_dim}, {block}-row tiles, no cache",
    )


# --- the memory hierarchy ----------------------------------------------------------------------


def roofline_record(device: torch.device, quick: bool) -> Record:
    """Roofline points: copy, add, sum, matrix-vector and square matmuls, with the measured ridge.

    CUDA: bfloat16 (float32 for the elementwise ops would halve nothing of interest), vectors of
    2^28 elements (2^24 quick), matmuls 256 to 8192. CPU: float32, vectors of 2^25 elements
    (2^20 quick: in cache), matmuls 16 to 2048 (512 quick).
    """
    if device.type == "cuda":
        dtype, n = torch.bfloat16, 1 << (24 if quick else 28)
        matmul_sizes = (256, 512, 1024, 2048, 4096, 8192)[: 4 if quick else 6]
    else:
        dtype, n = torch.float32, 1 << (20 if quick else 25)
        matmul_sizes = (16, 64, 256, 512, 1024, 2048)[: 4 if quick else 6]
    rows = measure_roofline(device, dtype=dtype, n=n, matmul_sizes=matmul_sizes)
    roofline = roofline_from_rows(rows)
    for row in rows:
        row["bound"] = roofline.bound(row["intensity"])
        roof = roofline.attainable(row["intensity"])
        row["fraction_of_roof"] = row["flops_per_s"] / roof if row["flops"] else None
    return _record(
        "roofline",
        f"Achieved FLOP/s and arithmetic intensity (minimum traffic) of common operations; the "
        f"measured roofline is the fastest matmul ({roofline.peak_flops / 1e9:,.0f} GFLOP/s) and "
        f"the copy ({roofline.bytes_per_s / 1e9:,.1f} GB/s), ridge {roofline.ridge:.1f} "
        "FLOPs/byte.",
        rows,
        device,
        {
            "seconds": "s",
            "flops_per_s": "FLOP/s",
            "bytes_per_s": "bytes/s",
            "intensity": "FLOPs/byte",
            "bytes": "bytes",
        },
    )


def strided_record(device: torch.device, quick: bool) -> Record:
    """Useful bandwidth of one gather reading a whole buffer in stride order, strides 1 to 64
    (1 to 16 quick): the same code and the same buffer at every stride, larger than the last
    cache (1 GiB of float32 on a GPU, 64 MiB on a CPU), so only the order of the reads changes."""
    n = 1 << (16 if quick else (28 if device.type == "cuda" else 24))
    strides = [1, 2, 4, 8, 16] + ([] if quick else [32, 64])
    rows = strided_bandwidth(device, strides, n=n, repeats=3 if quick else 7)
    return _record(
        "strided-access",
        f"torch.index_select of all {n:,} float32 elements of one buffer in stride order (stride "
        "passes of every stride-th element) into a contiguous tensor; useful bandwidth counts "
        "each element gathered once.",
        rows,
        device,
        {
            "seconds": "s",
            "seconds_min": "s",
            "seconds_max": "s",
            "useful_gb_per_s": "GB/s",
            "buffer_bytes": "bytes",
            "pass_bytes": "bytes",
            "unit_bytes": "bytes",
        },
    )


def host_transfer_record(device: torch.device, quick: bool) -> Record:
    """``.item()`` after every kernel, and host-device copies from pageable and pinned memory."""
    rows = host_transfer_costs(device, nbytes=(32 << 20) if quick else (256 << 20))
    return _record(
        "host-transfers",
        "Seconds per small kernel with one sync at the end or a .item() after each (host clock), "
        "and copies between host and device (CUDA only).",
        rows,
        device,
        {"seconds": "s", "gb_per_s": "GB/s", "bytes": "bytes"},
    )


# --- the targets -------------------------------------------------------------------------------


def _target_ratio(record: Record) -> float | None:
    rows = record.rows
    if record.name == "copy-bandwidth":
        largest = max(r["bytes"] for r in rows)
        triton = [r for r in rows if r["implementation"] != "torch copy_"]
        ratios = [r["ratio_to_torch"] for r in triton if r["bytes"] == largest]
        return max(ratios) if ratios else None
    if record.name == "matmul-tiles":
        per_dtype = {}
        for r in rows:
            if r["implementation"] != "torch.matmul" and r["ratio_to_torch"] is not None:
                per_dtype[r["dtype"]] = max(per_dtype.get(r["dtype"], 0.0), r["ratio_to_torch"])
        return min(per_dtype.values()) if per_dtype else None
    if record.name == "attention-forward":
        best: dict[tuple, float] = {}
        for r in rows:
            if r["implementation"].startswith("triton"):
                key = (r["head_dim"], r["causal"])
                best[key] = max(best.get(key, 0.0), r["ratio_to_sdpa"])
        return min(best.values()) if best else None
    return None


def target_ratios(records: list[Record]) -> list[str]:
    """One line per target benchmark among ``records``: measured ratio beside the H100 target."""
    lines = []
    for record in records:
        if record.name not in TARGETS:
            continue
        what, target = TARGETS[record.name]
        ratio = _target_ratio(record)
        device = f"{record.environment['device_name']} ({record.environment['device']})"
        if record.environment["device"] != "cuda" or ratio is None:
            outcome = f"not measured on {device} (needs a CUDA GPU); target >= {target:.2f}"
        else:
            verdict = "met" if ratio >= target else "NOT met"
            outcome = f"{ratio:.2f} on {device}; target >= {target:.2f}: {verdict}"
        lines.append(f"{record.name}: {what}: {outcome}")
    return lines


# --- what the book's models predict for a GPU, beside the benchmarks that would measure it ------


def copy_prediction(gpu: GPUSpec) -> Prediction:
    """The bandwidth a large copy should reach on ``gpu``: its HBM bandwidth, read + written.

    The roofline's memory ceiling: a copy does no arithmetic, so its only limit is moving each
    byte in and out of HBM, and a sweep's largest size is far beyond L2. ``copy-bandwidth``
    measures it (``torch copy_`` at the largest size).
    """
    return Prediction(
        gpu.hbm_bytes_per_s / 1e9,
        "GB/s",
        f"roofline memory ceiling: {gpu.name} HBM bandwidth, bytes read + written",
    )


def matmul_prediction(
    gpu: GPUSpec, size: int, dtype: str = "bf16", tiles: MatmulTiles | None = None
) -> Prediction:
    """The FLOP/s a ``size``³ matrix product should reach on ``gpu``, from the roofline.

    The bytes moved are A, B and C once (:func:`~trainfast.kernels.roofline.matmul_cost`), or,
    given ``tiles``, the traffic of that tiling with no cache
    (:func:`~trainfast.kernels.tiled_matmul.tile_traffic_bytes`); the attainable rate is
    ``min(peak, intensity × bandwidth)`` with the datasheet's dense ``dtype`` peak. It ignores
    launch overhead and tile quantisation, so it is a ceiling, not a forecast of cuBLAS.
    ``roofline`` and ``matmul-tiles`` measure it.
    """
    if size < 1:
        raise ValueError(f"Invalid matrix size: {size!r} (expected >= 1)")
    if dtype not in gpu.peak_flops:
        raise ValueError(f"Unknown dtype for {gpu.name}: {dtype!r} (has {sorted(gpu.peak_flops)})")
    element = ELEMENT_BYTES[dtype]
    cost = matmul_cost(size, size, size, element_bytes=element)
    moved = cost.bytes if tiles is None else tile_traffic_bytes(size, size, size, tiles, element)
    roofline = Roofline(gpu.peak_flops[dtype], gpu.hbm_bytes_per_s)
    how = "A, B, C once" if tiles is None else f"{tiles.block_m}x{tiles.block_n} tiles, no cache"
    return Prediction(
        roofline.attainable(cost.flops / moved) / 1e12,
        "TFLOP/s",
        f"roofline of the {gpu.name} datasheet, {dtype} {size}³ with {how}",
    )


def fused_linear_gelu_prediction(
    gpu: GPUSpec, m: int, n: int, k: int, dtype: str = "bf16", *, fused: bool
) -> Prediction:
    """The time ``gelu(a @ b + bias)`` should take on ``gpu``, fused or as three kernels.

    Each kernel takes ``max(FLOPs / peak, bytes / bandwidth)`` (the roofline), with the bytes of
    :func:`~trainfast.kernels.tiled_matmul.epilogue_traffic_bytes`: fused, one matmul that also
    reads the bias; unfused, the matmul, then a bias add and a GELU that each read and write the
    (m, n) output (their few FLOPs per element never reach the compute ceiling). It ignores
    launch overhead and the L2 cache, which can hold part of an (m, n) intermediate between two
    kernels. ``fused-linear-gelu`` measures it.
    """
    if dtype not in gpu.peak_flops:
        raise ValueError(f"Unknown dtype for {gpu.name}: {dtype!r} (has {sorted(gpu.peak_flops)})")
    element = ELEMENT_BYTES[dtype]
    peak, bandwidth = gpu.peak_flops[dtype], gpu.hbm_bytes_per_s
    matmul_flops = 2 * m * n * k
    fused_bytes = epilogue_traffic_bytes(m, n, k, element, fused=True)
    if fused:
        seconds = max(matmul_flops / peak, fused_bytes / bandwidth)
    else:
        matmul_bytes = epilogue_traffic_bytes(m, n, k, element, has_bias=False, fused=True)
        epilogue_bytes = epilogue_traffic_bytes(m, n, k, element, fused=False) - matmul_bytes
        seconds = max(matmul_flops / peak, matmul_bytes / bandwidth) + epilogue_bytes / bandwidth
    how = "one fused kernel" if fused else "matmul, bias add and GELU as three kernels"
    return Prediction(
        seconds * 1e6,
        "µs",
        f"roofline of the {gpu.name} datasheet, {dtype} ({m}, {k}) @ ({k}, {n}), {how}",
    )


def host_transfer_prediction(gpu: GPUSpec) -> Prediction:
    """A pinned host-to-device copy's bandwidth: PCIe's, one direction (half the datasheet's).

    NVIDIA states PCIe bandwidth for both directions together; one copy uses one. Pageable
    copies go through a staging buffer and should land below this. ``host-transfers`` measures it.
    """
    return Prediction(
        gpu.pcie_bytes_per_s / 2 / 1e9,
        "GB/s",
        f"{gpu.name} datasheet PCIe bandwidth, one direction",
    )


def attention_forward_prediction(
    gpu: GPUSpec, seq: int, head_dim: int, dtype: str = "bf16", block: int = 128
) -> Prediction:
    """The FLOP/s a flash-attention forward should reach on ``gpu``, from the roofline.

    Per (batch, head): ``4 · seq² · head_dim`` FLOPs (two products; causal masking halves both
    FLOPs and traffic, so the rate is the same), and with query tiles of ``block`` rows each
    program reads all of K and V once: ``(seq / block) · 2 · seq · head_dim`` elements, plus Q
    and O once. The intensity is then about ``2 · block`` FLOPs per element, whatever the head
    dimension: 128 FLOPs per byte for bf16 tiles of 128 rows, below an H100's ridge (about 295),
    so this no-cache count calls the forward memory-bound. On the device the programs of one
    head read the same K and V at about the same time and L2 serves most of those reads, so the
    real ceiling is higher, up to the tensor-core peak: read the prediction as what the kernel
    reaches if L2 did not help. ``attention-forward`` measures it.
    """
    if seq < 1 or head_dim < 1 or block < 1:
        raise ValueError(
            f"Invalid attention shape: seq={seq!r}, head_dim={head_dim!r}, block={block!r}"
        )
    if dtype not in gpu.peak_flops:
        raise ValueError(f"Unknown dtype for {gpu.name}: {dtype!r} (has {sorted(gpu.peak_flops)})")
    element = ELEMENT_BYTES[dtype]
    flops = 4 * seq * seq * head_dim
    moved = (-(-seq // block) * 2 * seq * head_dim + 2 * seq * head_dim) * element
    roofline = Roofline(gpu.peak_flops[dtype], gpu.hbm_bytes_per_s)
    return Prediction(
        roofline.attainable(flops / moved) / 1e12,
        "TFLOP/s",
        f"roofline of the {gpu.name} datasheet, {dtype} forward, seq {seq}, head dim {head_dim}",
    )
