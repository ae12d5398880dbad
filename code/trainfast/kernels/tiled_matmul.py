"""A tiled matrix multiplication in Triton, beside its reference ``torch.matmul``.

``C = A @ B`` with ``A`` of shape (M, K) and ``B`` of shape (K, N). Each program computes one
``BLOCK_M × BLOCK_N`` tile of ``C``: it walks along K in steps of ``BLOCK_K``, loads a tile of
``A`` and a tile of ``B`` into on-chip memory, multiplies them on the tensor cores
(``tl.dot``) and accumulates in float32 registers. Every element of ``A`` is then read from
main memory N / BLOCK_N times instead of N times, every element of ``B`` M / BLOCK_M times:
bigger tiles mean less traffic, until they no longer fit in shared memory and registers
(:func:`tile_traffic_bytes` does the arithmetic; the chapter measures it).

Programs are launched in *grouped* order (``GROUP_M`` row-tiles at a time, the trick of
Triton's matmul tutorial): programs that run at the same time share tiles of ``A`` and ``B``,
which then come from the L2 cache instead of main memory.

The kernel uses plain pointer arithmetic, not ``tl.make_block_ptr`` (deprecated in Triton 3.8
and removed after it), and works on Triton 3.0 to 3.8. Offsets are int64 (the program id and the
index ranges are cast before they meet a stride), so matrices with more than 2**31 elements are
addressed correctly; in int32 ``row × stride`` wraps once M·K reaches 2**31. Out-of-range rows
and columns are handled by wrapping the load offsets (``% M``) and masking the store,
out-of-range K by masked loads that read zeros.

Tiles depend on the GPU: :func:`matmul_tiles` picks the largest of a few tile shapes whose
pipelined A and B tiles fit the target's shared memory per block (an H100's 227 KiB, a T4's
64 KiB), and a single stage on sm_75, which cannot pipeline loads.
"""

from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import Tensor

from trainfast.gpus import GPUSpec
from trainfast.kernels.targets import launch_target, pipelines_loads
from trainfast.kernels.triton_runtime import check_launch, is_interpreted, tl, triton
from trainfast.validation import (
    check_choice,
    check_counts,
    check_flag,
    check_instance,
    check_int,
    check_positive,
)

__all__ = [
    "ACTIVATIONS",
    "DimensionQuantisation",
    "MatmulTiles",
    "dimension_quantisation",
    "epilogue_traffic_bytes",
    "matmul",
    "matmul_kernel",
    "matmul_launch",
    "matmul_reference",
    "matmul_tile_candidates",
    "matmul_tiles",
    "program_tile",
    "tile_traffic_bytes",
    "tune_matmul_tiles",
    "wave_traffic_bytes",
]


@dataclass(frozen=True)
class MatmulTiles:
    """Tile sizes and launch settings of :func:`matmul_kernel`.

    ``block_m``, ``block_n``, ``block_k`` are powers of two, at least 16 (``tl.dot``'s minimum);
    ``group_m`` row-tiles are scheduled together for L2 reuse; ``num_warps`` warps of 32
    threads share a tile; ``num_stages`` tiles of A and B are in flight in shared memory at once
    (software pipelining), which costs ``num_stages × (block_m + block_n) × block_k`` elements of
    shared memory.
    """

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = check_int(name, getattr(self, name), minimum=16)
            if value & (value - 1):
                raise ValueError(f"Invalid {name}: {value} (need a power of two, at least 16)")
        for name in ("group_m", "num_warps", "num_stages"):
            check_int(name, getattr(self, name), minimum=1)

    def shared_memory_bytes(self, element_bytes: int) -> int:
        """Bytes of shared memory the pipelined A and B tiles need."""
        return self.num_stages * (self.block_m + self.block_n) * self.block_k * element_bytes


#: tile shapes for 16-bit and for 32-bit inputs, largest first: Triton's matmul-tutorial shapes
#: and the stages and warps around them that the compile report accepts on sm_90 and sm_80 (every
#: one fits the per-block shared memory and, without an epilogue, spills no register: a test
#: compiles them all for every listed GPU); 128 × 256 × 64 with 4 warps spills 1.7 KiB on sm_90
#: and 256 × 256 × 64 would need 256 accumulator registers a thread, so neither is here
_CANDIDATES = {
    2: [
        MatmulTiles(128, 256, 64, 8, 8, 3),
        MatmulTiles(256, 128, 64, 8, 8, 3),
        MatmulTiles(128, 256, 64, 8, 8, 4),
        MatmulTiles(256, 128, 64, 8, 8, 4),
        MatmulTiles(128, 256, 32, 8, 8, 5),
        MatmulTiles(128, 128, 64, 8, 8, 4),
        MatmulTiles(128, 128, 64, 8, 8, 3),
        MatmulTiles(64, 256, 32, 8, 4, 4),
        MatmulTiles(128, 128, 32, 8, 4, 4),
        MatmulTiles(64, 64, 64, 8, 4, 3),  # 64 × 64 × 32 with 4 stages spills 4 bytes on sm_80
    ],
    4: [
        MatmulTiles(128, 128, 32, 8, 8, 3),
        MatmulTiles(64, 64, 32, 8, 4, 3),
        MatmulTiles(64, 64, 32, 8, 4, 2),
    ],
}


def matmul_tile_candidates(target: GPUSpec | None, dtype: torch.dtype) -> list[MatmulTiles]:
    """Every tile shape :func:`matmul` may use for ``dtype`` on ``target``, largest first.

    The candidates :func:`tune_matmul_tiles` times, and the rule :func:`matmul_tiles` applies:
    those of :data:`_CANDIDATES` whose pipelined A and B tiles
    (:meth:`MatmulTiles.shared_memory_bytes`) fit the target's shared memory per block (on
    sm_90 the compiled kernel asks for exactly that; on sm_80 for one stage less), the smallest
    if none fits. A test compiles every candidate for every listed GPU
    and checks that it fits and, without an epilogue, spills nothing. On sm_75, which has no
    asynchronous copies, one stage; and since Triton emits no tensor-core instructions for
    sm_75, 16-bit dots run on CUDA cores there and need registers, not shared memory: 64 × 64 ×
    32 only. Interpreted (``target`` ``None``): one small tile (fewer, smaller programs run
    faster on the host), and nothing to tune.
    """
    if target is None:
        return [MatmulTiles(32, 32, 32, group_m=4, num_warps=4, num_stages=1)]
    element_bytes = torch.empty((), dtype=dtype).element_size()
    candidates = _CANDIDATES[4 if element_bytes == 4 else 2]
    if not pipelines_loads(target):
        if element_bytes == 2:
            return [MatmulTiles(64, 64, 32, group_m=8, num_warps=4, num_stages=1)]
        candidates = list(dict.fromkeys(replace(t, num_stages=1) for t in candidates))
    budget = target.shared_memory_per_block_bytes
    fitting = [t for t in candidates if t.shared_memory_bytes(element_bytes) <= budget]
    return fitting or candidates[-1:]


def matmul_tiles(target: GPUSpec | None, dtype: torch.dtype) -> MatmulTiles:
    """The tiles :func:`matmul` uses for ``dtype`` on ``target`` (``None``: the CPU interpreter)
    unless asked to tune: the largest of :func:`matmul_tile_candidates`."""
    return matmul_tile_candidates(target, dtype)[0]


_TUNED: dict[tuple, MatmulTiles] = {}


def tune_matmul_tiles(
    a: Tensor, b: Tensor, bias: Tensor | None = None, activation: str | None = None
) -> MatmulTiles:
    """The fastest of :func:`matmul_tile_candidates` for this product, timed once and cached.

    The book's own small autotuner, in the spirit of ``triton.autotune``: each candidate runs
    the real launch (epilogue included) under :func:`trainfast.timing.benchmark`, and the
    winner is remembered per device, dtype, shape and epilogue. Unlike a ``triton.autotune``
    decorator, whose config list is fixed when the module is imported, the candidates come
    from the launch's own target, so none is over its shared memory; and the kernel stays a
    plain ``@triton.jit`` function that the compile report can compile. Interpreted, nothing
    is timed (the interpreter's speed says nothing about a GPU): the fixed tiles.
    """
    if is_interpreted(matmul_kernel) or a.device.type != "cuda":
        return matmul_tiles(None, a.dtype)
    from trainfast.timing import benchmark

    (M, K), (_, N) = a.shape, b.shape
    key = (str(a.device), a.dtype, M, N, K, bias is not None, activation)
    if key not in _TUNED:
        candidates = matmul_tile_candidates(launch_target(a.device), a.dtype)
        seconds = {
            tiles: benchmark(
                lambda t=tiles: matmul(a, b, bias, activation, tiles=t), repeats=5, device=a.device
            ).median
            for tiles in candidates
        }
        _TUNED[key] = min(seconds, key=seconds.__getitem__)
    return _TUNED[key]


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """One BLOCK_M × BLOCK_N tile of C = act(A @ B + bias) per program, accumulated in float32.

    The epilogue (``HAS_BIAS``; ``ACTIVATION`` "none" or "gelu_tanh") works on the float32
    accumulator in registers, before the one store: constexpr flags, so each variant compiles
    to its own kernel and the plain matmul pays nothing for them.
    """
    # Which tile of C: programs go down GROUP_M rows of tiles before moving right (L2 reuse).
    pid = tl.program_id(axis=0).to(tl.int64)  # int64 from here on: offsets × strides can pass 2**31
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Pointers to the first K-tile of A (BLOCK_M, BLOCK_K) and of B (BLOCK_K, BLOCK_N).
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M  # wrap: rows past M are never stored
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    a_rows = a_ptr + offs_m[:, None] * stride_am  # (BLOCK_M, 1)
    b_cols = b_ptr + offs_n[None, :] * stride_bn  # (1, BLOCK_N)

    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        offs_k = k * BLOCK_K + tl.arange(0, BLOCK_K).to(tl.int64)  # (BLOCK_K,)
        in_k = offs_k < K  # the last K-tile may be partial: read zeros past K
        a = tl.load(a_rows + offs_k[None, :] * stride_ak, mask=in_k[None, :], other=0.0)
        b = tl.load(b_cols + offs_k[:, None] * stride_bk, mask=in_k[:, None], other=0.0)
        accumulator = tl.dot(a, b, accumulator, input_precision=DOT_PRECISION)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Epilogue, on the accumulator in registers: the bias and GELU cost no extra trip to memory.
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n).to(tl.float32)  # (BLOCK_N,), offs_n wraps like B's
        accumulator += bias[None, :]
    if ACTIVATION == "gelu_tanh":
        accumulator = _gelu_tanh(accumulator)
    c = accumulator.to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _gelu_tanh(x):
    """GELU's tanh approximation, ``x/2 · (1 + tanh(u))`` with ``u = √(2/π)(x + 0.044715 x³)``,
    written as ``x · sigmoid(2u)`` (the same function: ``(1 + tanh u)/2 = sigmoid(2u)``), since
    ``tl.sigmoid`` is in Triton's core language and ``tanh`` is not. ``u`` is clamped to ±15,
    where sigmoid(2u) is already 1 or 0 to float32's precision, so that ``exp`` cannot overflow
    (the interpreter's NumPy warns when it does; the GPU would return the same value)."""
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    u = tl.minimum(tl.maximum(u, -15.0), 15.0)
    return x * tl.sigmoid(2.0 * u)


def _dot_precision(dtype: torch.dtype) -> str:
    """ "ieee" for float32 unless torch allows TF32 for matmuls (as torch.matmul decides)."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"  # Triton's default; ignored for 16-bit inputs


#: the epilogues :func:`matmul` fuses after the product (``None``: no activation)
ACTIVATIONS = ("gelu_tanh",)


def matmul_reference(
    a: Tensor, b: Tensor, bias: Tensor | None = None, activation: str | None = None
) -> Tensor:
    """``activation(a @ b + bias)`` in eager PyTorch: one kernel per step, each a trip to memory.

    ``"gelu_tanh"`` is ``torch.nn.functional.gelu(..., approximate="tanh")``, the GELU that
    cuBLASLt's epilogue and GPT-2 use.
    """

    if activation is not None:
        check_choice("activation", activation, ACTIVATIONS)
    c = torch.matmul(a, b)
    if bias is not None:
        c = c + bias
    if activation == "gelu_tanh":
        c = torch.nn.functional.gelu(c, approximate="tanh")
    return c


def matmul(
    a: Tensor,
    b: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    *,
    implementation: Literal["triton", "torch"] = "triton",
    tiles: MatmulTiles | Literal["autotune"] | None = None,
) -> Tensor:
    """``activation(a @ b + bias)`` for 2-D ``a`` (M, K), ``b`` (K, N) and ``bias`` (N,).

    ``implementation="triton"`` runs :func:`matmul_kernel`, with the bias and the activation
    (``None`` or one of :data:`ACTIVATIONS`) fused into its epilogue; ``"torch"`` runs
    :func:`matmul_reference`. Any strides work (the kernel takes them as arguments), so ``b.T``
    needs no copy. ``tiles`` defaults to :func:`matmul_tiles` for the dtype and the tensors'
    device; ``"autotune"`` times the candidates once per shape (:func:`tune_matmul_tiles`).
    The output has the inputs' dtype; products, bias and activation are computed in float32.
    """
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(
            f"Unknown activation: {activation!r} (expected None or one of {ACTIVATIONS})"
        )
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != b.shape[-1]):
        raise ValueError(
            f"bias must have shape ({b.shape[-1]},) to match b {tuple(b.shape)}, "
            f"got {tuple(bias.shape)}"
        )
    if implementation == "torch":
        return matmul_reference(a, b, bias, activation)
    if implementation != "triton":
        raise ValueError(
            f"Unknown implementation: {implementation!r} (expected 'triton' or 'torch')"
        )
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(
            f"matmul takes 2-D matrices, got shapes {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"Inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} "
            f"({a.shape[1]} != {b.shape[0]})"
        )
    check_launch(matmul_kernel, a, b, *([] if bias is None else [bias]))
    if tiles is None:
        target = None if is_interpreted(matmul_kernel) else launch_target(a.device)
        tiles = matmul_tiles(target, a.dtype)
    elif tiles == "autotune":
        tiles = tune_matmul_tiles(a, b, bias, activation)
    (M, K), (_, N) = a.shape, b.shape
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:  # the product is zero; the epilogue still applies
        return matmul_reference(a, b, bias, activation)
    grid, args, kwargs = matmul_launch(a, b, c, tiles, bias, activation)
    matmul_kernel[grid](*args, **kwargs)
    return c


def matmul_launch(
    a: Any,
    b: Any,
    c: Any,
    tiles: MatmulTiles,
    bias: Any = None,
    activation: str | None = None,
) -> tuple[tuple[int], tuple, dict[str, Any]]:
    """Grid, arguments and keywords of :func:`matmul_kernel` for ``c = activation(a @ b + bias)``.

    Shared by :func:`matmul` and the compile report (:mod:`trainfast.kernels.compile_report`),
    which passes stand-ins with the tensors' dtype, shape and strides. Without a bias the kernel
    still takes a pointer (``c``'s, never read: ``HAS_BIAS`` is False), so the argument list is
    the same for every variant.
    """
    (M, K), (_, N) = a.shape, b.shape
    grid = (triton.cdiv(M, tiles.block_m) * triton.cdiv(N, tiles.block_n),)
    args = (a, b, c, c if bias is None else bias, M, N, K, *a.stride(), *b.stride(), *c.stride())
    blocks = dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k)
    epilogue = dict(HAS_BIAS=bias is not None, ACTIVATION=activation or "none")
    launch = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    kwargs = dict(
        **blocks,
        GROUP_M=tiles.group_m,
        DOT_PRECISION=_dot_precision(a.dtype),
        **epilogue,
        **launch,
    )
    return grid, args, kwargs


def tile_traffic_bytes(m: int, n: int, k: int, tiles: MatmulTiles, element_bytes: int) -> int:
    """Bytes a tiled ``(m, k) @ (k, n)`` reads from and writes to main memory, with no cache.

    Each of the ``ceil(m / block_m) × ceil(n / block_n)`` programs reads a ``block_m × k`` strip
    of A and a ``k × block_n`` strip of B and writes its tile of C once. An L2 cache (and the
    grouped launch order) cuts the reads further; this is the upper bound that tiling controls.
    """
    check_counts(m=m, n=n, k=k, element_bytes=element_bytes)
    check_instance("tiles", tiles, MatmulTiles)
    tiles_m, tiles_n = -(-m // tiles.block_m), -(-n // tiles.block_n)
    reads = tiles_m * tiles_n * (tiles.block_m + tiles.block_n) * k
    return (reads + m * n) * element_bytes


def program_tile(pid: int, m: int, n: int, tiles: MatmulTiles) -> tuple[int, int]:
    """The tile ``(pid_m, pid_n)`` of C that program ``pid`` of :func:`matmul_kernel` computes:
    the kernel's grouped launch order (``GROUP_M`` rows of tiles, column by column, then the
    next group), in Python, for the traffic model of :func:`wave_traffic_bytes`."""
    num_pid_m, num_pid_n = -(-m // tiles.block_m), -(-n // tiles.block_n)
    if not 0 <= pid < num_pid_m * num_pid_n:
        raise ValueError(f"Invalid pid: {pid} (the grid has {num_pid_m * num_pid_n} programs)")
    num_pid_in_group = tiles.group_m * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * tiles.group_m
    group_size_m = min(num_pid_m - first_pid_m, tiles.group_m)
    return first_pid_m + (pid % num_pid_in_group) % group_size_m, (
        pid % num_pid_in_group
    ) // group_size_m


@dataclass(frozen=True)
class DimensionQuantisation:
    """How much of a tiled product's issued work is useful (:func:`dimension_quantisation`).

    ``programs``: tiles of C in the grid; ``waves``: rounds of ``programs_in_flight`` programs
    that run them; ``tile_efficiency``: useful multiply-adds over those the programs issue;
    ``wave_efficiency``: program slots used over the slots of all the waves.
    """

    programs: int
    waves: int
    tile_efficiency: float
    wave_efficiency: float

    @property
    def efficiency(self) -> float:
        """Both together: the share of the slots' work that is the product's."""
        return self.tile_efficiency * self.wave_efficiency


def dimension_quantisation(
    m: int, n: int, k: int, tiles: MatmulTiles, programs_in_flight: int
) -> DimensionQuantisation:
    """Tile and wave quantisation of a tiled ``(m, k) @ (k, n)``, as NVIDIA's Matrix
    Multiplication Background User's Guide names them.

    *Tile quantisation*: where a dimension is not a multiple of its tile, the last row or column
    of tiles is partial and costs a whole tile. :func:`matmul_kernel` computes every
    ``block_m × block_n`` tile in full (it wraps its load offsets and masks only the store) and
    takes ``ceil(k / block_k)`` steps along K, the last on masked loads that read zeros: useful
    over issued work is ``m·n·k / (ceil(m/bm)·bm · ceil(n/bn)·bn · ceil(k/bk)·bk)``.
    *Wave quantisation*: the grid runs ``programs_in_flight`` programs at a time (one per SM for
    128 × 256 tiles), so ``programs`` take ``ceil(programs / programs_in_flight)`` waves and the
    last one leaves slots idle.

    If every program takes the same time and nothing else binds (bytes, launch overhead), the
    kernel reaches ``efficiency`` of its compute rate: the sawtooth of speed against size. Not
    a model of cuBLAS at large: it picks tiles, split-K and persistent schedules per shape.
    """
    check_counts(m=m, n=n, k=k)
    check_instance("tiles", tiles, MatmulTiles)
    check_positive("programs_in_flight", programs_in_flight)
    tiles_m, tiles_n, steps_k = (
        -(-m // tiles.block_m),
        -(-n // tiles.block_n),
        -(-k // tiles.block_k),
    )
    programs = tiles_m * tiles_n
    issued = programs * tiles.block_m * tiles.block_n * steps_k * tiles.block_k  # multiply-adds
    waves = -(-programs // programs_in_flight)
    return DimensionQuantisation(
        programs=programs,
        waves=waves,
        tile_efficiency=m * n * k / issued,
        wave_efficiency=programs / (waves * programs_in_flight),
    )


def wave_traffic_bytes(
    m: int, n: int, k: int, tiles: MatmulTiles, programs_in_flight: int, element_bytes: int
) -> int:
    """Bytes a tiled ``(m, k) @ (k, n)`` moves through main memory if the L2 cache holds what
    one *wave* of programs shares and nothing else: the grid runs ``programs_in_flight``
    programs at a time in launch order (:func:`program_tile`), each wave reads every row strip
    of A and column strip of B that its programs touch once, and the next wave reads its own
    again; C is written once.

    Between :func:`tile_traffic_bytes` (no cache: every program reads its strips) and A and B
    read once (a cache that holds everything). Its assumptions: the programs of a wave move
    along K together, so a strip's K-slice is read by all its programs while it sits in L2
    (each step's slices of a wave take about a megabyte, far under an H100's 50 MiB), and a wave
    leaves nothing that the next one reuses. The launch order decides how many strips a wave
    touches: with ``group_m`` 1 (row by row) a wave narrower than a row of tiles reads a new
    strip of B for each program, with ``group_m`` 8 it reads 8 strips of A and a few of B.
    """
    check_positive("programs_in_flight", programs_in_flight)
    grid = -(-m // tiles.block_m) * -(-n // tiles.block_n)
    strips = 0
    for start in range(0, grid, programs_in_flight):
        wave = [
            program_tile(pid, m, n, tiles)
            for pid in range(start, min(grid, start + programs_in_flight))
        ]
        strips += (
            len({r for r, _ in wave}) * tiles.block_m + len({c for _, c in wave}) * tiles.block_n
        )
    return (strips * k + m * n) * element_bytes


def epilogue_traffic_bytes(
    m: int, n: int, k: int, element_bytes: int, *, has_bias: bool = True, fused: bool
) -> int:
    """Bytes ``gelu(a @ b + bias)`` moves through main memory, each operand read once.

    Unfused, as eager PyTorch runs it: the matmul reads A (m × k) and B (k × n) and writes C
    (m × n); the bias add reads C and the bias (n) and writes C + bias; GELU reads that and writes
    the output: four extra passes over an m × n tensor. Fused (:func:`matmul`'s epilogue, or
    cuBLASLt's): A, B and the bias are read and the output written once. Ideal reuse of A and B
    is assumed in both cases (what :func:`tile_traffic_bytes` approaches with a good L2), so
    the difference is exactly the traffic that fusion removes: ``4·m·n`` elements with a bias,
    ``2·m·n`` without one.
    """
    check_counts(m=m, n=n, k=k, element_bytes=element_bytes)
    check_flag("has_bias", has_bias)
    check_flag("fused", fused)
    bias = n if has_bias else 0
    matmul = m * k + k * n + m * n
    if fused:
        return (matmul + bias) * element_bytes
    bias_add = (2 * m * n + bias) if has_bias else 0
    gelu = 2 * m * n
    return (matmul + bias_add + gelu) * element_bytes
