"""What each Triton kernel costs a GPU, found by compiling it for that GPU on a CPU.

Triton compiles a kernel in stages (Triton IR, LLVM IR, PTX, and the ``cubin`` that ``ptxas``
makes from the PTX), and none of them needs a GPU: only loading and running the result does.
:func:`compile_report` compiles every Triton kernel of :mod:`trainfast.kernels` for a target
GPU, at the tiles its launcher would choose there (:func:`kernel_tiles`), with the argument
specialisation a launch would get (Triton's own binder, fed stand-ins that have the tensors'
dtype, shape and strides), and reads off what the GPU would have to provide:

* shared memory per block (Triton's metadata) against the target's limit;
* registers per thread and bytes spilled to local memory (``ptxas -v``, with Triton's flags);
* the tensor-core instruction class in the PTX: ``wgmma`` (Hopper's asynchronous warpgroup
  MMA), ``mma`` (``mma.sync``, Ampere and Ada) or ``none``;
* the occupancy those resources allow (:func:`trainfast.kernels.occupancy.occupancy`), and
  whether the kernel fits at all.

Triton's interpreter runs a kernel's Python body on the CPU, one program at a time, in NumPy:
no races between programs, no bfloat16, NumPy's rounding. It checks indexing, masks and float32
or float16 arithmetic, and none of this. This report is the other half
of testing a kernel without a GPU.

The compiling itself (in a child process on a CPU, cached on disk) is
:mod:`trainfast.kernels.compile_jobs`; only the first report on a machine pays for it: about two
minutes for H100, A100 and T4 in three dtypes on a 2-core CPU.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import torch

from trainfast.gpus import GPUSpec
from trainfast.kernels.compile_jobs import run_compile_jobs, tensor_core_class
from trainfast.kernels.occupancy import occupancy
from trainfast.validation import plural

__all__ = [
    "KERNELS",
    "KernelReport",
    "LoopPipeline",
    "VARIANTS",
    "attention_inner_loop_ptx",
    "attention_loop_pipeline",
    "compile_kernel",
    "compile_kernels",
    "compile_report",
    "compile_reports",
    "kernel_assembly",
    "kernel_tiles",
    "first_loop",
    "loop_pipeline",
    "tensor_core_class",
    "trim_loop",
]

#: the Triton kernels of :mod:`trainfast.kernels`, by the name the report uses
KERNELS = ("copy", "matmul", "attention_forward", "attention_dkdv", "attention_dq")
#: variants :func:`compile_kernel` also compiles on request (not in the default report): the
#: matmul with its bias + GELU epilogue (``HAS_BIAS``, ``ACTIVATION="gelu_tanh"``), and the
#: fused softmax of :mod:`~trainfast.kernels.softmax_triton` at its longest row
VARIANTS = ("matmul_bias_gelu", "softmax")


@dataclass(frozen=True)
class KernelReport:
    """One kernel compiled for one GPU: its tiles, the resources it needs, and whether it fits."""

    kernel: str
    gpu: str
    target: str  # e.g. "sm_90"
    dtype: str
    tiles: str  # e.g. "128×64, 8 warps, 3 stages"
    num_warps: int
    num_stages: int
    shared_bytes: int
    shared_limit_bytes: int
    registers: int  # per thread
    spill_bytes: int  # ptxas's spill stores
    tensor_cores: str  # "wgmma", "mma" or "none"
    blocks_per_sm: int
    limited_by: str
    seconds: float  # compile time of the run that compiled it (kept in the disk cache with it)

    @property
    def fits(self) -> bool:
        """True if the block's shared memory fits the GPU and at least one block is resident."""
        return self.shared_bytes <= self.shared_limit_bytes and self.blocks_per_sm >= 1

    @property
    def verdict(self) -> str:
        """One line with the numbers: fits (and how many blocks per SM), or what is over."""
        shared = f"{self.shared_bytes / 1024:.1f} KiB of shared memory"
        limit = f"{self.shared_limit_bytes / 1024:.0f} KiB per block on the {self.gpu}"
        if not self.fits:
            return f"{self.kernel} does not fit: {shared} > {limit}"
        blocks = f"{plural(self.blocks_per_sm, 'block')} per SM ({self.limited_by})"
        return f"{self.kernel} fits: {shared} <= {limit}; {blocks}"


def kernel_tiles(
    kernel: str, target: GPUSpec | None, dtype: torch.dtype, head_dim: int = 128
) -> Any:
    """The tiles ``kernel`` launches with on ``target``: the launcher's own tile function."""
    if kernel == "copy":
        from trainfast.kernels.elementwise import copy_tiles

        return copy_tiles(target, dtype)
    if kernel in ("matmul", "matmul_bias_gelu"):
        from trainfast.kernels.tiled_matmul import matmul_tiles

        return matmul_tiles(target, dtype)
    if kernel == "softmax":
        from trainfast.kernels.softmax_triton import MAX_SOFTMAX_COLUMNS, softmax_tiles

        return softmax_tiles(target, dtype, MAX_SOFTMAX_COLUMNS)
    from trainfast.kernels import attention_triton as attention

    functions = {
        "attention_forward": attention.attention_forward_tiles,
        "attention_dkdv": attention.attention_dkdv_tiles,
        "attention_dq": attention.attention_dq_tiles,
    }
    if kernel not in functions:
        raise ValueError(f"Unknown kernel: {kernel!r} (expected one of {KERNELS + VARIANTS})")
    return functions[kernel](target, dtype, head_dim)


def _describe(tiles: Any) -> str:
    """E.g. ``"128×64, 8 warps, 3 stages"`` (attention: queries × keys; matmul: M × N × K)."""
    names = (
        ("block_q", "block_k") if hasattr(tiles, "block_q") else ("block_m", "block_n", "block_k")
    )
    blocks = [getattr(tiles, n) for n in names if hasattr(tiles, n)] or [tiles.block_size]
    stages = "stage" if tiles.num_stages == 1 else "stages"
    return f"{'×'.join(map(str, blocks))}, {tiles.num_warps} warps, {tiles.num_stages} {stages}"


_CACHE: dict[tuple, dict[str, Any]] = {}


def compile_report(
    target: GPUSpec,
    dtype: torch.dtype = torch.float16,
    *,
    head_dim: int = 128,
    kernels: tuple[str, ...] = KERNELS,
) -> list[KernelReport]:
    """Compile ``kernels`` for ``target`` at their default tiles; one :class:`KernelReport` each.

    ``dtype`` is the inputs' dtype (float32, float16, or bfloat16 from sm_80); ``head_dim``
    sizes the attention kernels. No GPU is needed. The first report for a target takes tens of
    seconds on a laptop CPU (the chapter times it); repeats come from the caches.
    """
    return compile_reports([(target, dtype)], head_dim=head_dim, kernels=kernels)[
        target.name, dtype
    ]


def compile_reports(
    cases: list[tuple[GPUSpec, torch.dtype]],
    *,
    head_dim: int = 128,
    kernels: tuple[str, ...] = KERNELS,
) -> dict[tuple[str, torch.dtype], list[KernelReport]]:
    """:func:`compile_report` for several (GPU, dtype) pairs, compiled together (one child
    process on a CPU, which saves starting Python and torch per pair); keyed by (name, dtype)."""
    for target, dtype in cases:
        if dtype == torch.bfloat16 and target.compute_capability < (8, 0):
            raise ValueError(f"bfloat16 needs sm_80 or newer; {target.name} is {target.sm_target}")
    requests = [
        (k, kernel_tiles(k, target, dtype, head_dim), target, dtype)
        for target, dtype in cases
        for k in kernels
    ]
    rows = iter(_compile_many(requests, head_dim))
    return {(target.name, dtype): [next(rows) for _ in kernels] for target, dtype in cases}


def compile_kernel(
    kernel: str,
    target: GPUSpec,
    dtype: torch.dtype = torch.float16,
    *,
    head_dim: int = 128,
    tiles: Any = None,
) -> KernelReport:
    """One kernel's :class:`KernelReport` for ``target``, at ``tiles`` (default: the launcher's)."""
    tiles = tiles if tiles is not None else kernel_tiles(kernel, target, dtype, head_dim)
    return _compile_many([(kernel, tiles, target, dtype)], head_dim)[0]


def compile_kernels(
    requests: list[tuple[str, GPUSpec, torch.dtype, Any]], *, head_dim: int = 128
) -> list[KernelReport]:
    """:func:`compile_kernel` for several ``(kernel, target, dtype, tiles)`` at once (``tiles``
    None: the launcher's), compiled together: one child process on a CPU instead of one each."""
    jobs = [
        (
            kernel,
            tiles if tiles is not None else kernel_tiles(kernel, target, dtype, head_dim),
            target,
            dtype,
        )
        for kernel, target, dtype, tiles in requests
    ]
    return _compile_many(jobs, head_dim)


def kernel_assembly(
    kernel: str,
    target: GPUSpec,
    dtype: torch.dtype = torch.float16,
    *,
    head_dim: int = 128,
    tiles: Any = None,
    float_scalars: str = "fp32",
) -> dict[str, str]:
    """The Triton IR (``"ttir"``) and PTX (``"ptx"``) of one kernel compiled for ``target``.

    ``float_scalars`` types the kernel's Python-float arguments: ``"fp32"`` as a direct launch
    does, ``"fp64"`` as ``torch.compile`` does (:mod:`~trainfast.kernels.compile_jobs`).
    """
    tiles = tiles if tiles is not None else kernel_tiles(kernel, target, dtype, head_dim)
    request = (kernel, tiles, target, dtype)
    (result,) = _results([request], head_dim, want_asm=True, float_scalars=float_scalars)
    return {"ttir": result["ttir"], "ptx": result["ptx"]}


def attention_inner_loop_ptx(
    target: GPUSpec, dtype: torch.dtype = torch.float16, *, head_dim: int = 128
) -> str:
    """The PTX of the attention forward's first key loop, trimmed to the lines that matter.

    The loop is the first label that a later branch jumps back to, through that branch. Kept:
    tensor-core instructions (``wgmma``/``mma``) and the ``ldmatrix`` loads that feed ``mma``,
    asynchronous copies (``cp.async``, TMA's ``cp.async.bulk``) and their waits, global loads,
    barriers (``bar.sync``), and the loop's label and branch. Runs of one instruction collapse
    into one line with a count, and long register lists into ``{…}``.
    """
    ptx = kernel_assembly("attention_forward", target, dtype, head_dim=head_dim)["ptx"]
    return trim_loop(ptx)


_KEEP = re.compile(r"wgmma|\bmma\.|cp\.async|mbarrier|ld\.global|bar\.sync|ldmatrix|\bbra\b")


def first_loop(ptx: str) -> list[str]:
    """The lines of the first loop of ``ptx``: the first label that a later branch jumps back
    to, through that branch."""
    lines = [line.strip() for line in ptx.splitlines()]
    labels = [
        (n, line.split(":")[0]) for n, line in enumerate(lines) if re.match(r"^\$L__BB\w+:", line)
    ]
    start = end = None
    for n, label in labels:
        back = [
            m
            for m in range(n + 1, len(lines))
            if re.search(rf"\bbra(\.uni)?\s+{re.escape(label)};", lines[m])
        ]
        if back:
            start, end = n, back[0]
            break
    if start is None:
        raise ValueError("No loop found in the PTX")
    return lines[start : end + 1]


def trim_loop(ptx: str) -> str:
    """The first loop of ``ptx`` (:func:`first_loop`), filtered as
    :func:`attention_inner_loop_ptx` describes."""
    lines = first_loop(ptx)
    kept = [lines[0].split()[0]] + [line for line in lines[1:] if _KEEP.search(line)]
    out: list[list[Any]] = []
    for line in kept:
        line = re.sub(r"\{[^{}]{40,}\}", "{…}", line)
        opcode = re.sub(r"^@!?%p\d+\s+", "", line).split()[0]
        if out and out[-1][1] == opcode:
            out[-1][2] += 1
        else:
            out.append([line, opcode, 1])
    return "\n".join(line if n == 1 else f"{line}    // ×{n}" for line, _, n in out)


@dataclass(frozen=True)
class LoopPipeline:
    """What one pass of a kernel's loop says about its pipelines, counted from its PTX.

    ``commits_per_iteration``: ``cp.async.commit_group`` instructions per pass (one group per
    tile copied, e.g. K and V: two); ``pending_at_wait``: the ``N`` of ``cp.async.wait_group N``,
    the newest groups allowed to stay in flight while the loop goes on; ``mma_wait``: the ``N``
    of the first ``wgmma.wait_group N`` after the first warpgroup product (None without
    ``wgmma``), and ``waits_before_next_product``: whether that wait comes before the loop
    issues its next product, so nothing runs beside the products' wait."""

    commits_per_iteration: int
    pending_at_wait: int
    mma_wait: int | None
    waits_before_next_product: bool

    @property
    def stages_in_flight(self) -> float:
        """Tiles (of every copied tensor) still loading while this one is used."""
        return self.pending_at_wait / self.commits_per_iteration

    @property
    def mma_overlaps_softmax(self) -> bool | None:
        """False when the loop waits for every product (``wgmma.wait_group 0``) right after the
        first one: within a warpgroup the softmax then starts only once its products are done.
        None without asynchronous products (``mma.sync`` returns only when its product is done)."""
        if self.mma_wait is None:
            return None
        return not (self.mma_wait == 0 and self.waits_before_next_product)


def loop_pipeline(ptx: str) -> LoopPipeline:
    """:class:`LoopPipeline` of the first loop of ``ptx`` (:func:`first_loop`)."""
    lines = first_loop(ptx)
    commits = sum(line.startswith("cp.async.commit_group") for line in lines)
    waits = [re.search(r"cp\.async\.wait_group\s+(\d+)", line) for line in lines]
    pending = next((int(w.group(1)) for w in waits if w), None)
    if not commits or pending is None:
        raise ValueError(f"No cp.async pipeline in the loop: {commits} commits, wait {pending}")
    products = [n for n, line in enumerate(lines) if "wgmma.mma_async" in line]
    mma_wait, before_next = None, False
    if products:
        first_commit = next(
            n for n in range(products[0], len(lines)) if "wgmma.commit_group" in lines[n]
        )
        wait = next(
            (n for n in range(first_commit, len(lines)) if "wgmma.wait_group" in lines[n]), None
        )
        if wait is not None:
            mma_wait = int(re.search(r"aligned\s+(\d+)", lines[wait]).group(1))  # type: ignore[union-attr]
            later = [n for n in products if n > first_commit]
            before_next = not later or wait < later[0]
    return LoopPipeline(commits, pending, mma_wait, before_next)


def attention_loop_pipeline(
    target: GPUSpec, dtype: torch.dtype = torch.float16, *, head_dim: int = 128
) -> LoopPipeline:
    """:func:`loop_pipeline` of the attention forward's first key loop, compiled for ``target``."""
    ptx = kernel_assembly("attention_forward", target, dtype, head_dim=head_dim)["ptx"]
    return loop_pipeline(ptx)


def _key(
    kernel: str,
    tiles: Any,
    target: GPUSpec,
    dtype: torch.dtype,
    head_dim: int,
    float_scalars: str = "fp32",
) -> tuple:
    return (
        kernel,
        repr(tiles),
        target.compute_capability,
        str(dtype),
        head_dim if "attention" in kernel else 0,
        float_scalars,
    )


def _compile_many(
    requests: list[tuple[str, Any, GPUSpec, torch.dtype]], head_dim: int
) -> list[KernelReport]:
    rows = []
    for (kernel, tiles, target, dtype), result in zip(
        requests, _results(requests, head_dim, want_asm=False), strict=True
    ):
        fit = occupancy(
            target,
            threads_per_block=tiles.num_warps * 32,
            registers_per_thread=max(result["registers"], 1),
            shared_memory_per_block=result["shared"],
        )
        rows.append(
            KernelReport(
                kernel=kernel,
                gpu=target.name,
                target=target.sm_target,
                dtype=str(dtype).removeprefix("torch."),
                tiles=_describe(tiles),
                num_warps=tiles.num_warps,
                num_stages=tiles.num_stages,
                shared_bytes=result["shared"],
                shared_limit_bytes=target.shared_memory_per_block_bytes,
                registers=result["registers"],
                spill_bytes=result["spill_bytes"],
                tensor_cores=result["tensor_cores"],
                blocks_per_sm=fit.blocks_per_sm,
                limited_by=fit.limit,
                seconds=result["seconds"],
            )
        )
    return rows


def _results(
    requests: list[tuple[str, Any, GPUSpec, torch.dtype]],
    head_dim: int,
    want_asm: bool,
    float_scalars: str = "fp32",
) -> list[dict[str, Any]]:
    """Compile what is not cached (in one child process on a CPU); cached results after."""
    keys = [
        _key(kernel, tiles, target, dtype, head_dim, float_scalars)
        for kernel, tiles, target, dtype in requests
    ]
    missing = {
        key: (kernel, tiles, target, dtype)
        for key, (kernel, tiles, target, dtype) in zip(keys, requests, strict=True)
        if key not in _CACHE or (want_asm and "ptx" not in _CACHE[key])
    }
    if missing:
        jobs = [
            dict(
                kernel=kernel,
                tiles=dict(type=type(tiles).__name__, **asdict(tiles)),
                capability=list(target.compute_capability),
                dtype=str(dtype).removeprefix("torch."),
                head_dim=head_dim,
                want_asm=want_asm,
                float_scalars=float_scalars,
            )
            for kernel, tiles, target, dtype in missing.values()
        ]
        for key, result in zip(missing, run_compile_jobs(jobs), strict=True):
            _CACHE[key] = {**_CACHE.get(key, {}), **result}
    return [_CACHE[key] for key in keys]
