"""The tiled matmul's benchmarks and predictions: tile sweeps and the fused GELU epilogue.

Beside :mod:`trainfast.kernels.tiled_matmul`, whose kernels they time; each
``*_record(device, quick)`` is a ``python -m trainfast.measure`` benchmark (the index is
:mod:`trainfast.kernels.benchmarks`).
"""

from __future__ import annotations

from typing import Any

import torch

from trainfast.gpus import GPUSpec
from trainfast.kernels.benchmark_targets import (
    ELEMENT_BYTES,
    check_dtype,
    is_out_of_resources,
    kernel_record,
)
from trainfast.kernels.roofline import Roofline, matmul_cost
from trainfast.kernels.tiled_matmul import MatmulTiles, epilogue_traffic_bytes, tile_traffic_bytes
from trainfast.records import Prediction, Record
from trainfast.timing import benchmark
from trainfast.validation import check_int, plural

__all__ = [
    "FUSED_LINEAR_GELU_SHAPE",
    "fused_linear_gelu_prediction",
    "fused_linear_gelu_record",
    "LAUNCH_ORDER_SIZES",
    "QUANTISATION_SIZES",
    "launch_order_prediction",
    "matmul_prediction",
    "matmul_record",
    "quantisation_prediction",
]


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


#: square sizes at which the launch order is compared on a GPU (bf16, 128 × 256 × 64 tiles,
#: ``group_m`` 1 and 8): where :func:`launch_order_prediction` says grouping starts to matter on
#: an H100 (32768³, a 6 GiB problem) and the size below it
LAUNCH_ORDER_SIZES = (16384, 32768)

#: square sizes just past 4096 at which ``matmul-tiles`` times the default bf16 tiles (128 × 256
#: × 64) and ``torch.matmul``, for the sawtooth of :func:`quantisation_prediction`: 4160 has
#: partial tiles in M, N (and one more K step) and a fifth wave, 4224 partial tiles in N only
#: and a fifth wave, 4352 whole tiles and a fifth wave. All are multiples of 64, so that rows
#: stay 16-byte aligned (4097 would mix in misaligned loads).
QUANTISATION_SIZES = (4160, 4224, 4352)


def matmul_record(device: torch.device, quick: bool) -> Record:
    """``torch.matmul`` and the tiled Triton matmul over a sweep of tile sizes.

    On CUDA at 4096³ (2048³ quick) in float16 and bfloat16, with a row autotuned over
    :func:`~trainfast.kernels.tiled_matmul.matmul_tile_candidates` (``tiles="autotune"``);
    tiles that need more shared memory than the GPU has are recorded with no time. Then, not
    quick, the launch order at :data:`~trainfast.kernels.matmul_benchmarks.LAUNCH_ORDER_SIZES`
    in bfloat16: 128 × 256 × 64 tiles with ``group_m`` 1 and 8, beside ``torch.matmul``; and the
    default bf16 tiles beside ``torch.matmul`` at
    :data:`~trainfast.kernels.matmul_benchmarks.QUANTISATION_SIZES`. On a CPU, the interpreter at
    64³ in float32.
    """
    from trainfast.kernels.tiled_matmul import (
        MatmulTiles,
        matmul,
        tile_traffic_bytes,
        tune_matmul_tiles,
    )

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
            row = base | {
                "implementation": "triton matmul_kernel",
                "tiles": _sweep_text(tiles),
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
                if not is_out_of_resources(error):
                    raise
            else:
                row["seconds"] = timing.median
                row["tflops"] = flops / timing.median / 1e12
                row["ratio_to_torch"] = reference.median / timing.median
            rows.append(row)
        if device.type == "cuda":
            tuned = tune_matmul_tiles(a, b)
            timing = benchmark(
                lambda a=a, b=b, t=tuned: matmul(a, b, tiles=t),
                warmup=3,
                repeats=repeats,
                device=device,
            )
            rows.append(
                base
                | {
                    "implementation": "triton matmul_kernel, autotuned",
                    "tiles": _sweep_text(tuned),
                    "shared_memory_bytes": tuned.shared_memory_bytes(element),
                    "traffic_bytes": tile_traffic_bytes(size, size, size, tuned, element),
                    "seconds": timing.median,
                    "tflops": flops / timing.median / 1e12,
                    "ratio_to_torch": reference.median / timing.median,
                }
            )
    if device.type == "cuda" and not quick:
        rows += _launch_order_rows(device)
        rows += _quantisation_rows(device)
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
    return kernel_record(
        "matmul-tiles",
        f"Square matmuls of size {size}: torch.matmul and the tiled Triton kernel ({where}) for "
        "each tile configuration (larger sizes: the launch order, then sizes just past 4096: "
        "tile and wave quantisation); traffic_bytes is what the tiling reads and writes with no "
        "cache.",
        rows,
        device,
        units,
    )


def _sweep_text(tiles: MatmulTiles) -> str:
    """How ``matmul-tiles`` rows name tiles: ``"128x256x64, group 8, 8 warps, 3 stages"``."""
    shape = f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}"
    return f"{shape}, group {tiles.group_m}, {tiles.num_warps} warps, {tiles.num_stages} stages"


def _launch_order_rows(device: torch.device) -> list[dict[str, Any]]:
    """``torch.matmul`` and 128 × 256 × 64 tiles with ``group_m`` 1 and 8 at
    :data:`LAUNCH_ORDER_SIZES`, bfloat16, fewer repeats (a 32768³ product takes about 0.2 s)."""
    from trainfast.kernels.tiled_matmul import MatmulTiles, matmul, tile_traffic_bytes

    rows = []
    for size in LAUNCH_ORDER_SIZES:
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        flops = 2 * size**3
        base = {"size": size, "dtype": "bfloat16"}
        reference = benchmark(
            lambda a=a, b=b: torch.matmul(a, b), warmup=2, repeats=3, device=device
        )
        rows.append(
            base
            | {
                "implementation": "torch.matmul",
                "tiles": "",
                "shared_memory_bytes": None,
                "traffic_bytes": None,
                "seconds": reference.median,
                "tflops": flops / reference.median / 1e12,
                "ratio_to_torch": 1.0,
            }
        )
        for group in (1, 8):
            tiles = MatmulTiles(128, 256, 64, group_m=group, num_warps=8, num_stages=3)
            timing = benchmark(
                lambda a=a, b=b, t=tiles: matmul(a, b, tiles=t), warmup=2, repeats=3, device=device
            )
            rows.append(
                base
                | {
                    "implementation": "triton matmul_kernel",
                    "tiles": _sweep_text(tiles),
                    "shared_memory_bytes": tiles.shared_memory_bytes(2),
                    "traffic_bytes": tile_traffic_bytes(size, size, size, tiles, 2),
                    "seconds": timing.median,
                    "tflops": flops / timing.median / 1e12,
                    "ratio_to_torch": reference.median / timing.median,
                }
            )
        del a, b
        torch.cuda.empty_cache()
    return rows


def _quantisation_rows(device: torch.device) -> list[dict[str, Any]]:
    """``torch.matmul`` and :func:`~trainfast.kernels.tiled_matmul.matmul` at its default bf16
    tiles at :data:`QUANTISATION_SIZES` (the sweep has them at 4096³)."""
    from trainfast.kernels.tiled_matmul import matmul, matmul_tiles, tile_traffic_bytes

    rows = []
    tiles = matmul_tiles(_target(device), torch.bfloat16)
    for size in QUANTISATION_SIZES:
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        flops, base = 2 * size**3, {"size": size, "dtype": "bfloat16"}
        reference = benchmark(lambda a=a, b=b: torch.matmul(a, b), repeats=10, device=device)
        timing = benchmark(lambda a=a, b=b: matmul(a, b, tiles=tiles), repeats=10, device=device)
        for name, timed, text in (
            ("torch.matmul", reference, ""),
            ("triton matmul_kernel", timing, _sweep_text(tiles)),
        ):
            rows.append(
                base
                | {
                    "implementation": name,
                    "tiles": text,
                    "shared_memory_bytes": tiles.shared_memory_bytes(2) if text else None,
                    "traffic_bytes": tile_traffic_bytes(size, size, size, tiles, 2)
                    if text
                    else None,
                    "seconds": timed.median,
                    "tflops": flops / timed.median / 1e12,
                    "ratio_to_torch": reference.median / timed.median,
                }
            )
    return rows


def quantisation_prediction(
    gpu: GPUSpec,
    size: int,
    tiles: MatmulTiles,
    compute_flops_per_s: float | None = None,
    *,
    programs_in_flight: int | None = None,
    dtype: str = "bf16",
) -> Prediction:
    """The FLOP/s of a ``size``³ tiled product on ``gpu`` with tile and wave quantisation: the
    compute rate times :func:`~trainfast.kernels.tiled_matmul.dimension_quantisation`'s
    ``efficiency``.

    ``compute_flops_per_s`` defaults to the datasheet's dense ``dtype`` peak;
    ``programs_in_flight`` to one program per SM, as :func:`launch_order_prediction` assumes.
    Bytes are left out: by that model they do not bind below 32768³ on an H100. It predicts
    the sawtooth's shape, the ratio between two sizes, better than a size's rate.
    ``matmul-tiles`` measures it at
    :data:`~trainfast.kernels.matmul_benchmarks.QUANTISATION_SIZES` and 4096³.
    """
    from trainfast.kernels.tiled_matmul import dimension_quantisation

    check_dtype(gpu, dtype)
    rate = compute_flops_per_s or gpu.peak_flops[dtype]
    in_flight = programs_in_flight or gpu.sm_count
    quantised = dimension_quantisation(size, size, size, tiles, in_flight)
    return Prediction(
        rate * quantised.efficiency / 1e12,
        "TFLOP/s",
        f"tile and wave quantisation on the {gpu.name}, {dtype} {size}³, "
        f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k} tiles, {quantised.programs} programs "
        f"in {quantised.waves} waves of {in_flight}, compute at {rate / 1e12:,.0f} TFLOP/s",
    )


def launch_order_prediction(
    gpu: GPUSpec,
    size: int,
    tiles: MatmulTiles,
    compute_flops_per_s: float,
    *,
    programs_in_flight: int | None = None,
    dtype: str = "bf16",
) -> Prediction:
    """The FLOP/s of a ``size``³ tiled product on ``gpu`` in ``tiles``' launch order, from the
    wave model: ``max(FLOPs / compute_flops_per_s, bytes / bandwidth)`` with the bytes of
    :func:`~trainfast.kernels.tiled_matmul.wave_traffic_bytes`.

    ``compute_flops_per_s`` is the kernel's compute roof: the datasheet's peak, or the rate the
    kernel measured where bytes do not bind (its 4096³ row); ``programs_in_flight`` defaults to
    one program per SM (the compile report's one block a SM for 128 × 256 tiles). The order
    matters once the row-by-row order's bytes take longer than its FLOPs: on an H100 from about
    32768³ at its measured 4096³ rate, on an H200 (1.4 times the bandwidth) not at a square
    size. ``matmul-tiles`` measures it at
    :data:`~trainfast.kernels.matmul_benchmarks.LAUNCH_ORDER_SIZES`.
    """
    from trainfast.kernels.tiled_matmul import wave_traffic_bytes

    check_dtype(gpu, dtype)
    in_flight = programs_in_flight or gpu.sm_count
    moved = wave_traffic_bytes(size, size, size, tiles, in_flight, ELEMENT_BYTES[dtype])
    flops = 2 * size**3
    seconds = max(flops / compute_flops_per_s, moved / gpu.hbm_bytes_per_s)
    return Prediction(
        flops / seconds / 1e12,
        "TFLOP/s",
        f"wave model on the {gpu.name} datasheet's bandwidth, {dtype} {size}³, "
        f"{tiles.block_m}x{tiles.block_n} tiles, group {tiles.group_m}, {in_flight} programs "
        f"at a time, compute at {compute_flops_per_s / 1e12:,.0f} TFLOP/s",
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
            f"Inductor: {plural(kernels, 'generated kernel')}, "
            f"{plural(library_calls, 'library call')}",
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
    return kernel_record(
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
    check_int("size", size, minimum=1)
    check_dtype(gpu, dtype)
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
    check_dtype(gpu, dtype)
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
