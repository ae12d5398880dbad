"""The Triton kernels compiled ahead of time for GPUs this CPU does not have.

Every (GPU, kernel, dtype) is compiled once per session (module-scoped fixture, one child
process, the module's tests on one xdist worker: tests/conftest.py); a test that compiles
several kernels asks for them at once (``compile_kernels``, one child process, not one each).
The report's disk cache beside Triton's makes later sessions fast.
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import triton
from trainfast.gpus import GPUS
from trainfast.kernels.compile_report import (
    KERNELS,
    compile_kernel,
    compile_kernels,
    compile_reports,
    kernel_assembly,
    tensor_core_class,
)
from trainfast.kernels.occupancy import occupancy
from trainfast.versions import compile_report_problem

H100, A100, T4 = GPUS["H100 SXM 80GB"], GPUS["A100 SXM 80GB"], GPUS["T4 16GB"]
#: every listed GPU, in float16 and float32, and bfloat16 from sm_80 (the T4 has none)
CASES = [
    (gpu, dtype)
    for gpu in GPUS.values()
    for dtype in (torch.float16, torch.bfloat16, torch.float32)
    if dtype != torch.bfloat16 or gpu.compute_capability >= (8, 0)
]
NVCC = shutil.which("nvcc") or (
    "/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None
)


#: the report drives Triton's private launch internals: too old a Triton is named, not failed on
TOO_OLD = compile_report_problem(triton.__version__)
compiles = pytest.mark.skipif(TOO_OLD is not None, reason=TOO_OLD or "")


@pytest.fixture(scope="module")
def reports():
    if TOO_OLD:
        pytest.skip(TOO_OLD)
    return compile_reports(CASES)


@pytest.mark.parametrize(
    "gpu,dtype", CASES, ids=[f"{g.sm_target}-{d}".replace("torch.", "") for g, d in CASES]
)
def test_every_kernel_compiles_within_the_targets_limits(reports, gpu, dtype):
    rows = reports[gpu.name, dtype]
    assert [r.kernel for r in rows] == list(KERNELS)
    for row in rows:
        assert row.target == gpu.sm_target
        assert row.fits, row.verdict
        assert 0 < row.registers <= 255
        assert row.shared_bytes <= gpu.shared_memory_per_block_bytes
        assert row.blocks_per_sm >= 1


@pytest.mark.parametrize("gpu,instruction", [(H100, "wgmma"), (A100, "mma")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_dots_use_tensor_cores(reports, gpu, instruction, dtype):
    classes = {r.kernel: r.tensor_cores for r in reports[gpu.name, dtype]}
    assert classes["copy"] == "none"
    for kernel in ("matmul", "attention_forward", "attention_dkdv", "attention_dq"):
        assert classes[kernel] == instruction, (kernel, classes)


def test_tensor_core_class_reads_ptx():
    assert tensor_core_class("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {...}") == "wgmma"
    assert tensor_core_class("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {...}") == "mma"
    assert tensor_core_class("fma.rn.f32 %f1, %f2, %f3, %f4;") == "none"


@compiles
def test_an_oversized_tile_is_reported_as_not_fitting_with_the_numbers():
    from trainfast.kernels.tiled_matmul import MatmulTiles

    tiles = MatmulTiles(
        256, 256, 64, group_m=8, num_warps=8, num_stages=4
    )  # 4 × 512 × 64 × 2 B = 256 KiB
    row = compile_kernel("matmul", H100, torch.float16, tiles=tiles)
    assert row.shared_bytes > H100.shared_memory_per_block_bytes
    assert not row.fits and row.blocks_per_sm == 0 and row.limited_by == "shared memory"
    assert f"{row.shared_bytes / 1024:.1f} KiB" in row.verdict and "227 KiB" in row.verdict
    assert "does not fit" in row.verdict


def test_occupancy_against_hand_worked_cases():
    def occ(gpu, threads, registers, shared):
        return occupancy(
            gpu,
            threads_per_block=threads,
            registers_per_thread=registers,
            shared_memory_per_block=shared,
        )

    # 256 threads, 32 registers: a warp takes 32·32 = 1,024 registers, 64 warps fit in 64 K, i.e.
    # 8 blocks of 8 warps; threads allow 2,048 / 256 = 8 too; shared memory only the 1 KiB CUDA
    # reserves per block: 228 KiB // 1 KiB = 228.
    h100 = occ(H100, 256, 32, 0)
    assert h100.blocks_per_sm == 8 and h100.fraction == 1.0
    assert h100.limits == {"threads": 8, "registers": 8, "blocks": 32, "shared memory": 228}
    # 255 registers round up to 256 per thread: 8,192 per warp, 8 warps per SM, 1 block of 8 warps.
    assert occ(H100, 256, 255, 0).limits["registers"] == 1
    # 100 KiB of shared memory + 1 KiB reserved per block: 228 // 101 = 2 blocks on an H100.
    big = occ(H100, 128, 64, 100 * 1024)
    assert big.blocks_per_sm == 2 and big.limit == "shared memory"
    # Shared memory is allocated in 128-byte units: 100 KiB + 1 byte takes 100 KiB + 128 B.
    assert occ(H100, 128, 64, 100 * 1024 + 1).limits["shared memory"] == 2
    # The T4 reserves nothing: 64 KiB // 32 KiB = 2 blocks; 1,024 threads // 128 = 8.
    t4 = occ(T4, 128, 64, 32 * 1024)
    assert t4.limits["shared memory"] == 2 and t4.limits["threads"] == 8 and t4.blocks_per_sm == 2
    # Over the per-block limit: nothing launches.
    over = occ(T4, 128, 64, 64 * 1024 + 1)
    assert over.blocks_per_sm == 0 and over.limit == "shared memory"
    # Tiny blocks hit the block limit: 32 threads, 16 registers on an A100: 32 blocks.
    tiny = occ(A100, 32, 16, 0)
    assert tiny.blocks_per_sm == 32 and tiny.limit == "blocks"
    with pytest.raises(ValueError, match="threads_per_block: 2048"):
        occ(H100, 2048, 32, 0)


@compiles
def test_tiled_matmul_offsets_are_int64():
    """Every pointer offset in the matmul's Triton IR is int64 (an int32 offset wraps at 2**31)."""
    ttir = kernel_assembly("matmul", A100, torch.float16)["ttir"]
    addptr = [line for line in ttir.splitlines() if "tt.addptr" in line]
    assert addptr
    offset_types = {
        re.findall(r"(i32|i64)>?\s*(?:loc\(.*\))?$", line.split(":")[-1].strip())[-1]
        for line in addptr
    }
    assert offset_types == {"i64"}, addptr


def test_attention_grid_holds_more_than_65535_heads():
    from trainfast.kernels.attention_triton import MAX_GRID_X, attention_grid

    (programs,) = attention_grid(
        n_rows=4096, block=128, batch_heads=70_000
    )  # axis 1 would cap at 65,535
    assert programs == 32 * 70_000 <= MAX_GRID_X
    assert attention_grid(70, 32, 3) == (9,)
    with pytest.raises(ValueError, match="exceed"):
        attention_grid(n_rows=1 << 20, block=16, batch_heads=1 << 20)


def test_attention_tiles_fit_the_t4_at_head_dim_128(reports):
    from trainfast.kernels.attention_triton import attention_forward_tiles

    for row in reports[T4.name, torch.float16] + reports[T4.name, torch.float32]:
        assert row.shared_bytes <= 64 * 1024, row.verdict
    assert (
        attention_forward_tiles(None, torch.float16, 128).num_stages == 1
    )  # the interpreter's tiles


@pytest.mark.skipif(
    NVCC is None, reason="nvcc not found (install the CUDA toolkit to compile CUDA C++)"
)
@pytest.mark.parametrize("arch", ["sm_90", "sm_75"])
def test_cuda_bias_gelu_source_compiles_with_nvcc(tmp_path, arch):
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS, include_paths
    from trainfast.kernels.custom_ops import CUDA_SOURCE

    source = tmp_path / "bias_gelu.cu"
    source.write_text(CUDA_SOURCE)
    # torch 2.4's include_paths takes cuda=True; newer versions take device_type="cuda"
    new_api = "device_type" in inspect.signature(include_paths).parameters
    paths = include_paths(device_type="cuda") if new_api else include_paths(cuda=True)
    includes = [f"-I{p}" for p in paths]
    command = [
        NVCC,
        f"-arch={arch}",
        "--ptx",
        "-std=c++20",
        *COMMON_NVCC_FLAGS,
        *includes,
        str(source),
        "-o",
        str(tmp_path / "out.ptx"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    ptx = (tmp_path / "out.ptx").read_text()
    assert re.search(r"ld\.global(\.nc)?\.v4\.", ptx), "no 16-byte vector loads in the PTX"
    assert "rem.s64" not in ptx and "rem.u64" not in ptx, "a 64-bit remainder per element"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_live_launch_matches_the_ahead_of_time_report():
    """Launch each kernel on the GPU and compare what Triton compiled with the report's row."""
    from trainfast.kernels import attention_triton as attention
    from trainfast.kernels.compile_report import compile_report, kernel_tiles
    from trainfast.kernels.elementwise import copy_kernel, copy_launch
    from trainfast.kernels.targets import launch_target
    from trainfast.kernels.tiled_matmul import matmul_kernel, matmul_launch

    gpu = launch_target("cuda")
    if gpu.name not in {spec.name for spec in GPUS.values()}:
        pytest.skip("the live GPU is not in trainfast.gpus.GPUS")
    dtype = torch.float16
    rows = {r.kernel: r for r in compile_report(gpu, dtype)}
    cuda = dict(device="cuda", dtype=dtype)
    x, y = torch.randn(1 << 20, **cuda), torch.empty(1 << 20, **cuda)
    a, b, c = (torch.randn(512, 512, **cuda) for _ in range(3))
    q3, k3, v3, o3, do3, dq, dk, dv = (torch.randn(4, 512, 128, **cuda) for _ in range(8))
    lse, delta = (torch.randn(4, 512, device="cuda") for _ in range(2))
    launches = {
        "copy": (copy_kernel, copy_launch(x, y, kernel_tiles("copy", gpu, dtype))),
        "matmul": (matmul_kernel, matmul_launch(a, b, c, kernel_tiles("matmul", gpu, dtype))),
        "attention_forward": (
            attention.flash_forward_kernel,
            attention.attention_forward_launch(
                q3, k3, v3, o3, lse, False, kernel_tiles("attention_forward", gpu, dtype)
            ),
        ),
        "attention_dkdv": (
            attention.flash_backward_dkdv_kernel,
            attention.attention_dkdv_launch(
                q3,
                k3,
                v3,
                do3,
                lse,
                delta,
                dk,
                dv,
                False,
                kernel_tiles("attention_dkdv", gpu, dtype),
            ),
        ),
        "attention_dq": (
            attention.flash_backward_dq_kernel,
            attention.attention_dq_launch(
                q3, k3, v3, do3, lse, delta, dq, False, kernel_tiles("attention_dq", gpu, dtype)
            ),
        ),
    }
    for name, (kernel, (grid, args, kwargs)) in launches.items():
        compiled = kernel[grid](*args, **kwargs)
        torch.cuda.synchronize()
        assert compiled.metadata.shared == rows[name].shared_bytes, name
        assert compiled.n_regs == rows[name].registers, name
        assert tensor_core_class(compiled.asm["ptx"]) == rows[name].tensor_cores, name


def test_flash_attention_op_is_registered_where_wrap_triton_takes_the_kernels():
    from trainfast.kernels.attention_triton import flash_forward_kernel, register_flash_attention_op

    op = register_flash_attention_op()
    if not hasattr(torch.library, "triton_op"):  # torch 2.4 and 2.5
        assert op is None
        return
    try:  # a compiled kernel always; an interpreted one in PyTorch 2.14 (returned unchanged)
        torch.library.wrap_triton(flash_forward_kernel)
    except RuntimeError:
        assert op is None
    else:
        assert op is register_flash_attention_op()  # registered once per process
        assert hasattr(torch.ops.trainfast_kernels, "flash_attention_forward")
        assert hasattr(torch.ops.trainfast_kernels, "flash_attention_backward")


def test_torch_compile_cannot_trace_the_op_under_the_interpreter():
    """Registered on a CPU, the operator runs eagerly (tests/test_memory_hierarchy.py), but
    tracing its body with fake tensors reaches the interpreted launch, which reads data."""
    from trainfast.kernels.attention_triton import flash_forward_kernel, register_flash_attention_op
    from trainfast.kernels.triton_runtime import is_interpreted

    op = register_flash_attention_op() if is_interpreted(flash_forward_kernel) else None
    if op is None:
        pytest.skip("needs the operator registered over interpreted kernels (PyTorch 2.14, CPU)")
    q = torch.randn(1, 1, 16, 16)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q: op(q, q, q, False)[0], backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="Cannot access data pointer"):
        compiled(q)


#: AOT autograd (torch.compile's tracer of forward and backward) on meta tensors, with the
#: kernels compiled rather than interpreted. Only a GPU's Triton driver can lower a kernel to find
#: which arguments it writes, so the trace is told: the outputs each kernel stores to.
_AOT_TRACE = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "0"
from unittest import mock
import torch
import torch._higher_order_ops.triton_kernel_wrap as wrap
from torch._functorch.aot_autograd import aot_function
import trainfast.kernels.attention_triton as attention
from trainfast.gpus import GPUS

WRITES = {
    "flash_forward_kernel": ["o_ptr", "lse_ptr"],
    "flash_backward_preprocess_kernel": ["delta_ptr"],
    "flash_backward_dkdv_kernel": ["dk_ptr", "dv_ptr"],
    "flash_backward_dq_kernel": ["dq_ptr"],
}
def name(index):
    return wrap.kernel_side_table.get_kernel(index).fn.__name__
wrap.get_mutated_tensors = lambda index, *_: WRITES[name(index)]
op = attention.register_flash_attention_op()
graphs = []
def keep(graph, _):
    graphs.append(graph)
    return graph
def kernels(graph):
    return [
        name(node.kwargs["kernel_idx"])
        for node in graph.graph.nodes
        if node.target is torch.ops.higher_order.triton_kernel_wrapper_functional
    ]
with mock.patch.object(attention, "launch_target", lambda device: GPUS["H100 SXM 80GB"]):
    q = torch.empty(1, 4, 128, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.empty(1, 2, 128, 64, device="meta", dtype=torch.bfloat16, requires_grad=True)
            for _ in "kv")
    traced = aot_function(lambda q, k, v: op(q, k, v, True)[0], fw_compiler=keep, bw_compiler=keep)
    traced(q, k, v).sum().backward()
print(json.dumps({"forward": kernels(graphs[0]), "backward": kernels(graphs[1]),
                  "grads": [list(t.grad.shape) for t in (q, k, v)]}))
"""


@pytest.mark.skipif(
    not hasattr(torch.library, "triton_op"),
    reason=f"torch.library.triton_op needs torch 2.6; this is {torch.__version__}",
)
def test_torch_compile_traces_the_registered_backward_into_its_kernels():
    """The registered backward calls an operator whose body AOT autograd traces kernel by
    kernel, as torch.compile would on a GPU, not an opaque call it cannot trace."""
    import json
    import os
    import sys

    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-c", _AOT_TRACE]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    trace = json.loads(result.stdout.strip().splitlines()[-1])
    assert trace["forward"] == ["flash_forward_kernel"]
    assert trace["backward"] == [
        "flash_backward_preprocess_kernel",
        "flash_backward_dkdv_kernel",
        "flash_backward_dq_kernel",
    ]
    assert trace["grads"] == [[1, 4, 128, 64], [1, 2, 128, 64], [1, 2, 128, 64]]  # GQA summed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(
    not hasattr(torch.library, "triton_op"), reason="torch.library.triton_op needs torch 2.6"
)
def test_gpu_flash_attention_op_runs_under_torch_compile_fullgraph():
    from trainfast.kernels.attention_triton import register_flash_attention_op

    op = register_flash_attention_op()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: op(q, k, v, True)[0] * 2, fullgraph=True)
    expected = 2 * torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(compiled(q, k, v), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(
    not hasattr(torch.library, "triton_op"), reason="torch.library.triton_op needs torch 2.6"
)
def test_gpu_flash_attention_op_trains_under_torch_compile_with_its_registered_backward():
    from trainfast.kernels.attention_triton import register_flash_attention_op

    op = register_flash_attention_op()
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad_out = torch.randn_like(q)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: op(q, k, v, True)[0], fullgraph=True)
    grads = torch.autograd.grad(compiled(q, k, v), (q, k, v), grad_out)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(t.float() for t in (q, k, v)), is_causal=True
    )
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out.float())
    for name, grad, reference in zip("qkv", grads, expected_grads, strict=True):
        torch.testing.assert_close(grad.float(), reference.float(), atol=5e-2, rtol=5e-2, msg=name)


#: the Python-float arguments of each kernel (the softmax scale, and the backward's scale of dK,
#: dQ); the others (KERNELS + VARIANTS) take none
FLOAT_ARGUMENTS = {"attention_forward": 1, "attention_dkdv": 2, "attention_dq": 2}


@compiles
@pytest.mark.parametrize("kernel", sorted(FLOAT_ARGUMENTS))
def test_kernels_compute_in_float32_when_torch_compile_passes_float64_scalars(kernel):
    """Inductor types a Python float argument of a user-defined Triton kernel as fp64, where a
    direct launch types it fp32. Compiled so for an H100, every kernel still compiles (the
    forward did not: its accumulator, carried through the key loop, turned float64) and does no
    float64 arithmetic: each float argument is truncated to float32 once, and nothing else in
    its Triton IR is float64 (the backward kernels had computed scores and exp2 in float64)."""
    ttir = kernel_assembly(kernel, H100, torch.bfloat16, head_dim=64, float_scalars="fp64")["ttir"]
    f64 = [line.strip() for line in ttir.splitlines() if "f64" in line]
    truncations = [line for line in f64 if re.search(r"arith\.truncf %\w+ : f64 to f32", line)]
    arithmetic = [line for line in f64 if line not in truncations and "tt.func" not in line]
    assert not arithmetic, arithmetic
    assert len(truncations) == FLOAT_ARGUMENTS[kernel], f64


def test_a_compile_job_refuses_an_unknown_float_type():
    from trainfast.kernels.compile_jobs import run_compile_jobs

    if TOO_OLD:
        pytest.skip(TOO_OLD)
    with pytest.raises(ValueError, match="float_scalars: 'fp16'"):
        run_compile_jobs([dict(kernel="copy", float_scalars="fp16")])


def _copy_job(block_size: int) -> dict:
    """A compile job for the copy kernel on a T4 in float32 (cheap to compile)."""
    from dataclasses import asdict

    from trainfast.kernels.compile_report import kernel_tiles

    tiles = asdict(kernel_tiles("copy", T4, torch.float32))
    tiles["block_size"] = block_size
    return dict(
        kernel="copy", tiles=dict(type="CopyTiles", **tiles), capability=[7, 5],
        dtype="float32", head_dim=128, want_asm=False, float_scalars="fp32",
    )  # fmt: skip


@compiles
def test_one_child_compiles_a_process_s_jobs_and_survives_a_failing_job(monkeypatch, tmp_path):
    """Jobs asked for one call at a time go to one child process, started once (about 2 s each
    on a CPU), even as pytest renames the current test in the environment; a job that fails
    there raises its error here and the child serves the next; a child that died is replaced;
    a new environment (a Triton cache elsewhere) gets a new child."""
    from trainfast.kernels import compile_jobs
    from trainfast.kernels.triton_runtime import interpreting

    if not interpreting():
        pytest.skip("the kernels compile in this process here (a GPU machine)")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "one"))
    first, second = (compile_jobs.run_compile_jobs([_copy_job(b)])[0] for b in (256, 512))
    child = compile_jobs._COMPILER[0].process
    assert first["shared"] == second["shared"] == 0 and child.poll() is None
    bad = {**_copy_job(1024), "dtype": "float64"}  # no such job dtype: a KeyError there
    with pytest.raises(RuntimeError, match="(?s)Triton kernels failed:.*KeyError: 'float64'"):
        compile_jobs.run_compile_jobs([bad])
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test (call)")  # pytest's, per test
    compile_jobs.run_compile_jobs([_copy_job(1024)])
    assert compile_jobs._COMPILER[0].process is child  # the same child, still serving
    child.kill()
    child.wait()
    compile_jobs.run_compile_jobs([_copy_job(2048)])
    replacement = compile_jobs._COMPILER[0].process
    assert replacement is not child and replacement.poll() is None
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "two"))
    compile_jobs.run_compile_jobs([_copy_job(256)])
    assert compile_jobs._COMPILER[0].process is not replacement
    assert replacement.wait(timeout=10) == 0  # closed: its standard input ended its loop
    # a child that dies before it answers: its error output is raised here, and the next call
    # starts a working child again
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'the child could not start' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setattr(compile_jobs.sys, "executable", str(broken))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "three"))
    with pytest.raises(RuntimeError, match="(?s)Triton kernels failed:.*the child could not start"):
        compile_jobs.run_compile_jobs([_copy_job(256)])
    monkeypatch.undo()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "three"))
    assert compile_jobs.run_compile_jobs([_copy_job(256)])[0]["shared"] == 0


def test_trim_loop_keeps_the_loop_and_collapses_repeats():
    from trainfast.kernels.compile_report import trim_loop

    mma = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    ptx = "\n".join(
        [
            "ld.global.b32 %r1, [%rd1];",  # before the loop: dropped
            "$L__BB0_2:",
            "cp.async.wait_group 2;",
            "add.s32 %r2, %r2, 1;",  # not an instruction that moves or multiplies tiles: dropped
            mma + " {%r1, %r2}, {%r3}, {%r4}, {%r1, %r2};",
            mma + " {%r5, %r6}, {%r3}, {%r4}, {%r5, %r6};",
            "bar.sync 0;",
            "@%p1 bra $L__BB0_2;",
            "st.global.b32 [%rd2], %r2;",  # after the loop: dropped
        ]
    )
    lines = trim_loop(ptx).splitlines()
    assert lines[0] == "$L__BB0_2:" and lines[-1] == "@%p1 bra $L__BB0_2;"
    assert lines[1] == "cp.async.wait_group 2;"
    assert lines[2].startswith("mma.sync") and lines[2].endswith("// ×2")
    assert not any("add.s32" in line or "ld.global" in line for line in lines)
    with pytest.raises(ValueError, match="No loop"):
        trim_loop("mov.u32 %r1, 0;")


def _loop(body: list[str]) -> str:
    return "\n".join(["cp.async.commit_group;", "$L__BB0_2:", *body, "@%p1 bra $L__BB0_2;"])


def test_loop_pipeline_counts_commits_and_waits_from_the_ptx():
    from trainfast.kernels.compile_report import loop_pipeline

    wgmma = "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%f1}, %rd1, %rd2;"
    qk = ["cp.async.wait_group 3;", wgmma, wgmma, "wgmma.commit_group.sync.aligned;"]
    pv = [wgmma, "wgmma.commit_group.sync.aligned;"]
    copies = ["cp.async.commit_group;"] * 3  # K, V and a third tensor: three groups a tile
    waits_at_once = loop_pipeline(_loop(qk + ["wgmma.wait_group.sync.aligned 0;"] + pv + copies))
    assert waits_at_once.commits_per_iteration == 3 and waits_at_once.pending_at_wait == 3
    assert waits_at_once.stages_in_flight == 1  # not 3 / 2: the commits are counted
    assert waits_at_once.mma_overlaps_softmax is False
    # planted: the wait lets one product group run on, or comes only after the next product
    assert (
        loop_pipeline(_loop(qk + ["wgmma.wait_group.sync.aligned 1;"] + pv + copies)).mma_wait == 1
    )
    assert loop_pipeline(
        _loop(qk + pv + ["wgmma.wait_group.sync.aligned 0;"] + copies)
    ).mma_overlaps_softmax
    mma = ["cp.async.wait_group 2;", "mma.sync.aligned.m16n8k16 {%r1}, {%r2}, {%r3}, {%r1};"]
    synchronous = loop_pipeline(_loop(mma + copies[:2]))
    assert synchronous.stages_in_flight == 1 and synchronous.mma_overlaps_softmax is None
    with pytest.raises(ValueError, match="No cp.async pipeline"):
        loop_pipeline(_loop(["bar.sync 0;"]))


@compiles
@pytest.mark.parametrize("gpu", [H100, A100], ids=lambda g: g.sm_target)
def test_the_attention_loop_keeps_one_stage_in_flight(gpu):
    """The book's attention forward, compiled: K and V are two groups a tile, and the loop waits
    with two pending, so one tile of each loads while this one is used; on an H100 the loop
    waits for every product right after QK^T (the gap FlashAttention-3 closes)."""
    from trainfast.kernels.compile_report import attention_loop_pipeline

    pipeline = attention_loop_pipeline(gpu)
    assert (pipeline.commits_per_iteration, pipeline.stages_in_flight) == (2, 1)
    assert pipeline.mma_overlaps_softmax is (False if gpu is H100 else None)


@compiles
@pytest.mark.parametrize("gpu", [H100, A100, T4], ids=lambda g: g.sm_target)
def test_every_autotuning_candidate_of_the_fused_matmul_fits(gpu):
    """Each tile the autotuner may pick, compiled with the bias + GELU epilogue, fits the GPU.

    Registers are not asserted: the epilogue's float32 arithmetic raises their count (on sm_90
    the 128×256×64 tile goes from 193 to 255 and spills a few bytes), which costs speed, not
    correctness; the autotuner's timings decide.
    """
    from trainfast.kernels.tiled_matmul import matmul_tile_candidates

    candidates = matmul_tile_candidates(gpu, torch.float16)
    requests = [("matmul_bias_gelu", gpu, torch.float16, tiles) for tiles in candidates]
    for row in compile_kernels(requests):  # one child process for all, not one each
        assert row.fits, row.verdict
        assert row.shared_bytes <= gpu.shared_memory_per_block_bytes and row.blocks_per_sm >= 1
        if gpu.compute_capability >= (8, 0):
            assert row.tensor_cores == ("wgmma" if gpu is H100 else "mma"), row


@compiles
@pytest.mark.parametrize("gpu", [H100, A100, T4], ids=lambda g: g.sm_target)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_fused_softmax_at_its_longest_row_fits_and_spills_nothing(gpu, dtype):
    """The softmax variant at MAX_SOFTMAX_COLUMNS (a 16,384-value block over 16 warps): a row
    held in registers, no shared memory beyond the reductions' scratch, no spills, no tensor
    cores (it multiplies nothing)."""
    from trainfast.kernels.softmax_triton import MAX_SOFTMAX_COLUMNS

    row = compile_kernel("softmax", gpu, dtype)
    assert row.fits, row.verdict
    assert row.tiles.startswith(f"{MAX_SOFTMAX_COLUMNS}, 16 warps"), row.tiles
    assert row.spill_bytes == 0 and row.tensor_cores == "none", row


def test_two_processes_compiling_one_kernel_keep_their_own_ptx(monkeypatch, tmp_path):
    # a fresh clone's make test: two xdist workers compiled the same kernel, both wrote its PTX
    # to one file in Triton's cache, and the first to finish unlinked it under the other
    # (FileNotFoundError in 16 compile-report tests)
    import subprocess
    import types

    pytest.importorskip("triton")
    import triton.runtime.cache
    from trainfast.kernels import compile_jobs

    shared = types.SimpleNamespace(
        cache_dir=str(tmp_path), get_file=lambda name: None, put=lambda *args, **kwargs: None
    )
    monkeypatch.setattr(triton.runtime.cache, "get_cache_manager", lambda key: shared)
    calls = []

    run = subprocess.run

    def ptxas(command, **kwargs):
        if "-v" not in command:  # Triton asking ptxas for its version
            return run(command, **kwargs)
        ptx = Path(command[-3])
        calls.append(ptx)
        if len(calls) == 1:  # the other process compiles the same kernel meanwhile
            compile_jobs._ptxas_resources("// ptx", [9, 0], "same-hash")
        assert ptx.read_text() == "// ptx", ptx
        log = "ptxas info: Used 40 registers, 0 bytes spill stores, 0 bytes spill loads"
        return subprocess.CompletedProcess(command, 0, "", log)

    monkeypatch.setattr(compile_jobs.subprocess, "run", ptxas)
    resources = compile_jobs._ptxas_resources("// ptx", [9, 0], "same-hash")
    assert resources == {"registers": 40, "spill_bytes": 0}
    assert len(set(calls)) == 2


@compiles
@pytest.mark.parametrize(
    "gpu", [g for g in GPUS.values() if g.compute_capability >= (8, 0)], ids=lambda g: g.name
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_matmul_autotuning_candidate_fits_and_spills_nothing(gpu, dtype):
    """The configurations :func:`tune_matmul_tiles` times are those the compile report accepts:
    each fits the GPU's shared memory per block, holds at least one block per SM, uses the
    tensor cores and, without an epilogue, spills no register."""
    from trainfast.kernels.tiled_matmul import matmul_tile_candidates

    candidates = matmul_tile_candidates(gpu, dtype)
    assert len(candidates) >= 4  # the L4's 99 KiB a block leaves 4 of them
    for row in compile_kernels([("matmul", gpu, dtype, tiles) for tiles in candidates]):
        assert row.fits and row.blocks_per_sm >= 1, row.verdict
        assert row.spill_bytes == 0, (row.tiles, row.spill_bytes)
        assert row.tensor_cores == ("wgmma" if gpu.compute_capability >= (9, 0) else "mma")


@compiles
@pytest.mark.parametrize("gpu", [H100, GPUS["H200 SXM 141GB"]], ids=lambda g: g.name)
def test_hopper_backward_tiles_at_head_dim_128_double_the_work_a_step_and_spill_nothing(gpu):
    """Why the head-dim-128 backward was slow and what its new tiles change, read from the
    compile report: the 64 × 64 tiles with 8 warps held 209 (dK/dV) and 138 (dQ) registers a
    thread, so one block of 8 warps per SM, each step loading 64 rows for 64 keys or queries;
    the new ones (128 keys × 32 queries, 128 queries × 32 keys) keep one block of 8 warps,
    spill nothing, and load each 32-row tile for 128 rows of the program's own."""
    from trainfast.kernels.attention_triton import (
        AttentionTiles,
        attention_dkdv_tiles,
        attention_dq_tiles,
    )

    old = AttentionTiles(64, 64, num_warps=8, num_stages=2)
    cases = (
        ("attention_dkdv", attention_dkdv_tiles(gpu, torch.bfloat16, 128), "block_k"),
        ("attention_dq", attention_dq_tiles(gpu, torch.bfloat16, 128), "block_q"),
    )
    requests = [(k, gpu, torch.bfloat16, t) for k, tiles, _ in cases for t in (tiles, old)]
    rows = iter(compile_kernels(requests, head_dim=128))  # one child process for the four
    for (_, tiles, own), new, before in zip(cases, rows, rows, strict=True):
        assert getattr(tiles, own) == 128 and tiles.num_warps == 8
        assert before.blocks_per_sm == new.blocks_per_sm == 1, (before, new)
        assert before.limited_by == "registers"
        assert new.spill_bytes == 0 and new.fits and new.tensor_cores == "wgmma", new
    # sm_80's mma.sync needs more registers: the dK/dV tiles would spill there, so it keeps 64 × 64
    assert attention_dkdv_tiles(A100, torch.bfloat16, 128) == old
    assert attention_dkdv_tiles(H100, torch.bfloat16, 64) == AttentionTiles(64, 64, 4, 2)
