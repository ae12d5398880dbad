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

Triton's interpreter runs a kernel's Python body on the CPU, one program at a time. It proves
the arithmetic (for float32 and float16) and checks none of this. This report is the other half
of testing a kernel without a GPU.

Our kernels are decorated for the interpreter on a CPU (see
:mod:`~trainfast.kernels.triton_runtime`), and an interpreted kernel cannot be compiled. So on a
CPU the compilation runs in a child process started with ``TRITON_INTERPRET=0``; where the
kernels are compiled already (a GPU machine), in this process. Results are cached per process
and on disk beside Triton's own cache (keyed by the job, the kernels' source and the Triton
version), so only the first report on a machine pays for compiling: about two minutes for
H100, A100 and T4 in three dtypes on a 2-core CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trainfast.gpus import GPUSpec
from trainfast.kernels.occupancy import occupancy
from trainfast.timing import timestamp

__all__ = [
    "KERNELS",
    "KernelReport",
    "VARIANTS",
    "attention_inner_loop_ptx",
    "compile_kernel",
    "compile_report",
    "compile_reports",
    "kernel_assembly",
    "kernel_tiles",
    "tensor_core_class",
    "trim_loop",
]

#: the Triton kernels of :mod:`trainfast.kernels`, by the name the report uses
KERNELS = ("copy", "matmul", "attention_forward", "attention_dkdv", "attention_dq")
#: variants :func:`compile_kernel` also compiles on request (not in the default report): the
#: matmul with its bias + GELU epilogue (``HAS_BIAS``, ``ACTIVATION="gelu_tanh"``)
VARIANTS = ("matmul_bias_gelu",)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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
    seconds: float  # compile time in this process (of the first compile; repeats are cached)

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
        blocks = f"{self.blocks_per_sm} block(s) per SM ({self.limited_by})"
        return f"{self.kernel} fits: {shared} <= {limit}; {blocks}"


def tensor_core_class(ptx: str) -> str:
    """``"wgmma"`` if the PTX issues Hopper warpgroup MMAs, ``"mma"`` for ``mma.sync``, or else
    ``"none"``."""
    if re.search(r"\bwgmma\.mma_async", ptx):
        return "wgmma"
    if re.search(r"\bmma\.sync", ptx):
        return "mma"
    return "none"


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
    return f"{'×'.join(map(str, blocks))}, {tiles.num_warps} warps, {tiles.num_stages} stages"


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


def kernel_assembly(
    kernel: str,
    target: GPUSpec,
    dtype: torch.dtype = torch.float16,
    *,
    head_dim: int = 128,
    tiles: Any = None,
) -> dict[str, str]:
    """The Triton IR (``"ttir"``) and PTX (``"ptx"``) of one kernel compiled for ``target``."""
    tiles = tiles if tiles is not None else kernel_tiles(kernel, target, dtype, head_dim)
    (result,) = _results([(kernel, tiles, target, dtype)], head_dim, want_asm=True)
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


def trim_loop(ptx: str) -> str:
    """The first loop of ``ptx`` (label to backward branch), filtered as
    :func:`attention_inner_loop_ptx` describes."""
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
    kept = [lines[start].split()[0]] + [
        line for line in lines[start + 1 : end + 1] if _KEEP.search(line)
    ]
    out: list[list[Any]] = []
    for line in kept:
        line = re.sub(r"\{[^{}]{40,}\}", "{…}", line)
        opcode = re.sub(r"^@!?%p\d+\s+", "", line).split()[0]
        if out and out[-1][1] == opcode:
            out[-1][2] += 1
        else:
            out.append([line, opcode, 1])
    return "\n".join(line if n == 1 else f"{line}    // ×{n}" for line, _, n in out)


def _key(kernel: str, tiles: Any, target: GPUSpec, dtype: torch.dtype, head_dim: int) -> tuple:
    return (
        kernel,
        repr(tiles),
        target.compute_capability,
        str(dtype),
        head_dim if "attention" in kernel else 0,
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
    requests: list[tuple[str, Any, GPUSpec, torch.dtype]], head_dim: int, want_asm: bool
) -> list[dict[str, Any]]:
    """Compile what is not cached (in one child process on a CPU); cached results after."""
    keys = [
        _key(kernel, tiles, target, dtype, head_dim) for kernel, tiles, target, dtype in requests
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
            )
            for kernel, tiles, target, dtype in missing.values()
        ]
        for key, result in zip(missing, _run_jobs(jobs), strict=True):
            _CACHE[key] = {**_CACHE.get(key, {}), **result}
    return [_CACHE[key] for key in keys]


_SOURCES = ("elementwise.py", "tiled_matmul.py", "attention_triton.py")  # kernels and launchers


def _disk_cache() -> Path:
    """Where results persist between processes: beside Triton's own cache."""
    root = os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache"
    return Path(root) / "trainfast_compile_report"


def _digest(job: dict[str, Any]) -> str:
    """A key that changes with the job, the kernels' source and the Triton version."""
    from trainfast.kernels.triton_runtime import triton

    here = Path(__file__).parent
    text = json.dumps(job, sort_keys=True) + triton.__version__
    text += "".join((here / name).read_text() for name in _SOURCES)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _run_jobs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results from the disk cache where present; the rest compiled (and stored)."""
    files = [_disk_cache() / f"{_digest(job)}.json" for job in jobs]
    results = [json.loads(f.read_text()) if f.exists() else None for f in files]
    todo = [n for n, result in enumerate(results) if result is None]
    if todo:
        for n, result in zip(todo, _compile_jobs([jobs[n] for n in todo]), strict=True):
            results[n] = result
            files[n].parent.mkdir(parents=True, exist_ok=True)
            temporary = files[n].with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(result))
            temporary.replace(files[n])  # atomic: a concurrent reader sees all or nothing
    return results


def _compile_jobs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from trainfast.kernels.triton_runtime import interpreting

    if not interpreting():
        return [_compile_job(job) for job in jobs]
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    process = subprocess.run(
        [sys.executable, "-m", "trainfast.kernels.compile_report"],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if process.returncode:
        raise RuntimeError(f"Compiling the Triton kernels failed:\n{process.stderr[-4000:]}")
    return json.loads(process.stdout.strip().splitlines()[-1])


def _stand_in(dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
    """A tensor stand-in (dtype, shape, contiguous strides, a 16-byte-aligned address)."""
    from triton.runtime.jit import MockTensor

    class StandIn(MockTensor):
        def numel(self) -> int:
            return int(torch.Size(self.shape).numel())

        def stride(self, dim: int | None = None) -> Any:
            strides = super().stride()
            return strides if dim is None else strides[dim]

    return StandIn(dtype, list(shape))


#: representative shapes: only divisibility by 16 of sizes and strides changes the compiled code
_SEQ, _BATCH_HEADS, _SIDE, _ELEMENTS = 4096, 32, 4096, 1 << 24


def _launch(
    kernel: str, tiles: Any, dtype: torch.dtype, head_dim: int
) -> tuple[Any, tuple, dict[str, Any]]:
    """The JIT function, arguments and keywords its launcher would use, with stand-ins."""
    if kernel == "copy":
        from trainfast.kernels.elementwise import copy_kernel, copy_launch

        x, y = _stand_in(dtype, (_ELEMENTS,)), _stand_in(dtype, (_ELEMENTS,))
        return copy_kernel, *copy_launch(x, y, tiles)[1:]
    if kernel == "matmul":
        from trainfast.kernels.tiled_matmul import matmul_kernel, matmul_launch

        a, b, c = (_stand_in(dtype, (_SIDE, _SIDE)) for _ in range(3))
        return matmul_kernel, *matmul_launch(a, b, c, tiles)[1:]
    if kernel == "matmul_bias_gelu":
        from trainfast.kernels.tiled_matmul import matmul_kernel, matmul_launch

        a, b, c = (_stand_in(dtype, (_SIDE, _SIDE)) for _ in range(3))
        launch = matmul_launch(a, b, c, tiles, _stand_in(dtype, (_SIDE,)), "gelu_tanh")
        return matmul_kernel, *launch[1:]
    from trainfast.kernels import attention_triton as attention

    q3, k3, v3, o3, do3, dq, dk, dv = (
        _stand_in(dtype, (_BATCH_HEADS, _SEQ, head_dim)) for _ in range(8)
    )
    lse, delta = (_stand_in(torch.float32, (_BATCH_HEADS, _SEQ)) for _ in range(2))
    if kernel == "attention_forward":
        launch = attention.attention_forward_launch(q3, k3, v3, o3, lse, False, tiles)
        return attention.flash_forward_kernel, *launch[1:]
    if kernel == "attention_dkdv":
        launch = attention.attention_dkdv_launch(q3, k3, v3, do3, lse, delta, dk, dv, False, tiles)
        return attention.flash_backward_dkdv_kernel, *launch[1:]
    launch = attention.attention_dq_launch(q3, k3, v3, do3, lse, delta, dq, False, tiles)
    return attention.flash_backward_dq_kernel, *launch[1:]


def _tiles_from(description: dict[str, Any]) -> Any:
    from trainfast.kernels.attention_triton import AttentionTiles
    from trainfast.kernels.elementwise import CopyTiles
    from trainfast.kernels.tiled_matmul import MatmulTiles

    kinds = {"AttentionTiles": AttentionTiles, "CopyTiles": CopyTiles, "MatmulTiles": MatmulTiles}
    fields = dict(description)
    return kinds[fields.pop("type")](**fields)


def _compile_job(job: dict[str, Any]) -> dict[str, Any]:
    """Compile one kernel as its launcher would for the job's target; resources and PTX."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    start = timestamp()
    fn, args, kwargs = _launch(
        job["kernel"], _tiles_from(job["tiles"]), _DTYPES[job["dtype"]], job["head_dim"]
    )
    target = GPUTarget("cuda", 10 * job["capability"][0] + job["capability"][1], 32)
    backend = make_backend(target)
    # Triton's own launch path: bind, specialise (sizes divisible by 16, aligned pointers), pack.
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, kwargs, bound, specialization, options
    )
    compiled = triton.compile(
        ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__
    )
    ptx = compiled.asm["ptx"]
    resources = _ptxas_resources(ptx, job["capability"], compiled.metadata.hash)
    result = dict(
        shared=int(compiled.metadata.shared),
        tensor_cores=tensor_core_class(ptx),
        seconds=timestamp() - start,
        **resources,
    )
    if job["want_asm"]:
        result.update(ptx=ptx, ttir=compiled.asm["ttir"])
    return result


def _ptxas_resources(ptx: str, capability: list[int], kernel_hash: str) -> dict[str, int]:
    """Registers per thread and spill-store bytes, from ``ptxas -v`` (cached beside Triton's)."""
    from triton import knobs
    from triton.runtime.cache import get_cache_manager

    cache = get_cache_manager(kernel_hash)
    cached = cache.get_file("trainfast_resources.json")
    if cached is not None:
        return json.loads(Path(cached).read_text())
    arch = f"sm_{capability[0]}{capability[1]}" + ("a" if capability[0] >= 9 else "")
    ptx_file = Path(cache.cache_dir) / "trainfast_kernel.ptx"
    ptx_file.parent.mkdir(parents=True, exist_ok=True)
    ptx_file.write_text(ptx)
    command = [
        knobs.nvidia.ptxas.path,
        "-lineinfo",
        "-v",
        "--regAllocOptLevel=2",
        f"--gpu-name={arch}",
        str(ptx_file),
        "-o",
        os.devnull,
    ]
    log = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    ptx_file.unlink()
    resources = dict(
        registers=int(re.search(r"Used (\d+) registers", log).group(1)),
        spill_bytes=int(re.search(r"(\d+) bytes spill stores", log).group(1)),
    )
    cache.put(json.dumps(resources), "trainfast_resources.json", binary=False)
    return resources


if (
    __name__ == "__main__"
):  # the child process of _run_jobs: jobs as JSON on stdin, results on stdout
    print(json.dumps([_compile_job(job) for job in json.loads(sys.stdin.read())]))
