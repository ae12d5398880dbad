"""Compiling one Triton kernel for a GPU that is not there (for the compile report).

A job names a kernel, its tiles, a dtype, a head dimension and a compute capability;
:func:`run_compile_jobs` returns what the compiled kernel needs (shared memory, registers,
spilled bytes, the tensor-core instruction class, and on request its PTX). Jobs run through
Triton's own launch path (bind, specialise, pack) with stand-ins that have the tensors' dtype,
shape and strides, and ``ptxas -v`` reads off the registers.

A job may also say how the kernel's Python-float arguments are typed (``float_scalars``):
``"fp32"``, as a direct launch types them, or ``"fp64"``, as ``torch.compile`` (Inductor) in
recent PyTorch types a Python float it passes to a user-defined Triton kernel, with its
defaults on a GPU with float64 (``signature_of`` in ``torch/_inductor/codegen/triton_utils.py``,
under ``config._use_fp64_for_unbacked_floats``).

Our kernels are decorated for the interpreter on a CPU (see
:mod:`~trainfast.kernels.triton_runtime`), and an interpreted kernel cannot be compiled. So on a
CPU the jobs run in a child process (``python -m trainfast.kernels.compile_jobs``) started
with ``TRITON_INTERPRET=0`` and kept for this process's later jobs; where the kernels are compiled
already (a GPU machine), in this process.
Results are cached on disk beside Triton's own cache, keyed by the job, the kernels' source and
the Triton version.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from trainfast.timing import timestamp

__all__ = ["DTYPES", "FLOAT_SCALARS", "run_compile_jobs", "tensor_core_class"]

#: the dtypes a job may name
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: the types a job may give the kernel's Python-float arguments (default: a direct launch's)
FLOAT_SCALARS = ("fp32", "fp64")


def tensor_core_class(ptx: str) -> str:
    """``"wgmma"`` if the PTX issues Hopper warpgroup MMAs, ``"mma"`` for ``mma.sync``, or else
    ``"none"``."""
    if re.search(r"\bwgmma\.mma_async", ptx):
        return "wgmma"
    if re.search(r"\bmma\.sync", ptx):
        return "mma"
    return "none"


#: the kernels and their launchers: a change to any of them invalidates the disk cache
_SOURCES = (
    "elementwise.py",
    "softmax_triton.py",
    "tiled_matmul.py",
    "attention_triton.py",
    "attention_triton_forward.py",
    "attention_triton_backward.py",
)


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


def run_compile_jobs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results from the disk cache where present; the rest compiled (and stored).

    ``RuntimeError`` naming the version if this Triton is too old for the report;
    ``ValueError`` naming a job's ``float_scalars`` if it is not one of :data:`FLOAT_SCALARS`.
    """
    import triton

    from trainfast.versions import compile_report_problem

    problem = compile_report_problem(triton.__version__)
    if problem:
        raise RuntimeError(problem)
    for job in jobs:
        if job.get("float_scalars", "fp32") not in FLOAT_SCALARS:
            raise ValueError(
                f"Invalid float_scalars: {job['float_scalars']!r} (expected one of {FLOAT_SCALARS})"
            )
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
    with _COMPILER_LOCK:
        return _compiler(env).compile(jobs)


#: environment variables that change while a process runs without changing what compiles
_VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})
#: marks the child's answers on its standard output, which Triton or ptxas may also write to
_ANSWER = "trainfast-compile-jobs:"


class _Compiler:
    """The child process that compiles this process's jobs, kept between calls.

    Starting Python, torch and Triton costs about 2 s on a laptop CPU, more than most kernels'
    compilation: a test module that asked for kernels a few at a time spent more time starting
    children than compiling. The child reads one JSON list of jobs a line and answers each with
    one line; it ends when this process does (its standard input closes).
    """

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.pid = env, os.getpid()
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: it cannot fill up
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainfast.kernels.compile_jobs"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )

    def usable(self, env: dict[str, str]) -> bool:
        """Still running, started by this process (not a fork's parent) with this environment
        (but for variables that say only where the caller is, such as pytest's current test)."""
        same = {k: v for k, v in self.env.items() if k not in _VOLATILE} == {
            k: v for k, v in env.items() if k not in _VOLATILE
        }
        return self.pid == os.getpid() and same and self.process.poll() is None

    def compile(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The jobs' results; ``RuntimeError`` with the child's error if compiling failed."""
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(jobs) + "\n")
            self.process.stdin.flush()
            for line in self.process.stdout:
                if line.startswith(_ANSWER):
                    answer = json.loads(line.removeprefix(_ANSWER))
                    if "error" in answer:
                        raise RuntimeError(
                            f"Compiling the Triton kernels failed:\n{answer['error']}"
                        )
                    return answer["results"]
        except BrokenPipeError:
            pass
        self._end()  # its output ended: the child died, or never started
        self.log.seek(0)
        error = self.log.read()[-4000:] or f"the child exited with {self.process.returncode}"
        self.log.close()
        raise RuntimeError(f"Compiling the Triton kernels failed:\n{error}")

    def _end(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()  # type: ignore[union-attr]  # the child's loop ends
            except BrokenPipeError:
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def close(self) -> None:
        self._end()
        self.log.close()


_COMPILER_LOCK = threading.Lock()
_COMPILER: list[_Compiler] = []  # at most one


def _compiler(env: dict[str, str]) -> _Compiler:
    """This process's compiling child, started (again) if it is not :meth:`~_Compiler.usable`."""
    if _COMPILER and not _COMPILER[0].usable(env):
        if _COMPILER[0].pid == os.getpid():
            _COMPILER[0].close()
        _COMPILER.clear()
    if not _COMPILER:
        _COMPILER.append(_Compiler(env))
    return _COMPILER[0]


@atexit.register
def _close_compiler() -> None:
    if _COMPILER and _COMPILER[0].pid == os.getpid():
        _COMPILER.pop().close()


def _serve() -> None:
    """The child's loop: a line of jobs in, a line of results (or the error) out."""
    import traceback

    for line in sys.stdin:
        try:
            answer: dict[str, Any] = {"results": [_compile_job(job) for job in json.loads(line)]}
        except Exception:  # noqa: BLE001  # reported to the parent, which raises it
            answer = {"error": traceback.format_exc()[-4000:]}
        print(_ANSWER + json.dumps(answer), flush=True)


def _stand_in(dtype: torch.dtype, shape: tuple[int, ...]) -> Any:
    """A tensor stand-in (dtype, shape, contiguous strides, a 16-byte-aligned address)."""
    from triton.runtime.jit import MockTensor

    class StandIn(MockTensor):
        # Sets its own fields: Triton 3.0's MockTensor takes the dtype only (the shape came later).
        def __init__(self, dtype: torch.dtype, shape: list[int]) -> None:
            self.dtype, self.shape = dtype, shape

        def numel(self) -> int:
            return int(torch.Size(self.shape).numel())

        def stride(self, dim: int | None = None) -> Any:
            strides = [1]
            for size in reversed(self.shape[1:]):
                strides.insert(0, strides[0] * size)
            return tuple(strides) if dim is None else strides[dim]

        @staticmethod
        def ptr_range() -> int:
            return 0  # a 32-bit pointer range, as Triton's own MockTensor assumes

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
    if kernel == "softmax":  # rows as long as the tiles' block
        from trainfast.kernels.softmax_triton import softmax_kernel, softmax_launch

        x, y = (_stand_in(dtype, (_SIDE, tiles.block_size)) for _ in range(2))
        return softmax_kernel, *softmax_launch(x, y, tiles)[1:]
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
    from trainfast.kernels.softmax_triton import SoftmaxTiles
    from trainfast.kernels.tiled_matmul import MatmulTiles

    kinds = {
        "AttentionTiles": AttentionTiles,
        "CopyTiles": CopyTiles,
        "MatmulTiles": MatmulTiles,
        "SoftmaxTiles": SoftmaxTiles,
    }
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
        job["kernel"], _tiles_from(job["tiles"]), DTYPES[job["dtype"]], job["head_dim"]
    )
    target = GPUTarget("cuda", 10 * job["capability"][0] + job["capability"][1], 32)
    backend = make_backend(target)
    # Triton's own launch path: bind, specialise (sizes divisible by 16, aligned pointers), pack.
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(
        backend, kwargs, bound, specialization, options
    )
    # Python floats: fp32 from a direct launch, fp64 from Inductor (see the module's docstring)
    float_type = job.get("float_scalars", "fp32")
    signature = {
        name: float_type if isinstance(bound[name], float) else kind
        for name, kind in signature.items()
    }
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
    # ptxas's input in a folder of this call's own: two processes compiling the same kernel
    # (pytest-xdist workers) shared one file in Triton's cache, and one unlinked it under the other
    with tempfile.TemporaryDirectory(prefix="trainfast-ptx-") as folder:
        ptx_file = Path(folder) / "kernel.ptx"
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
    resources = dict(
        registers=int(re.search(r"Used (\d+) registers", log).group(1)),
        spill_bytes=int(re.search(r"(\d+) bytes spill stores", log).group(1)),
    )
    cache.put(json.dumps(resources), "trainfast_resources.json", binary=False)
    return resources


if __name__ == "__main__":  # the child process of run_compile_jobs, kept running
    _serve()
