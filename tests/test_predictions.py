"""The book's GPU predictions: each from its model, checked against arithmetic done by hand."""

from __future__ import annotations

import math

import pytest
import torch
from trainfast.accounting import training_memory
from trainfast.distributed.cost_model import INFINIBAND_NDR
from trainfast.distributed.measurements.all_reduce import all_reduce_prediction
from trainfast.gpus import GPUS
from trainfast.kernels.benchmarks import (
    attention_forward_prediction,
    copy_prediction,
    host_transfer_prediction,
    matmul_prediction,
)
from trainfast.kernels.tiled_matmul import MatmulTiles
from trainfast.optim.benchmarks import adamw_step_prediction
from trainfast.precision.benchmarks import step_memory_prediction

H100 = GPUS["H100 SXM 80GB"]


def test_copy_and_host_predictions_are_the_datasheet_bandwidths():
    assert copy_prediction(H100).value == pytest.approx(3350.0)  # 3.35 TB/s in GB/s
    assert copy_prediction(H100).unit == "GB/s" and "H100" in copy_prediction(H100).model
    assert host_transfer_prediction(H100).value == pytest.approx(64.0)  # 128 GB/s both ways
    assert copy_prediction(GPUS["A100 SXM 80GB"]).value < copy_prediction(H100).value


def test_matmul_prediction_is_memory_bound_when_small_and_the_peak_when_large():
    # 64³ bf16: 2·64³ FLOPs over 3·64²·2 bytes = 64/3 FLOPs per byte, below the ridge.
    small = matmul_prediction(H100, 64, "bf16")
    assert small.value == pytest.approx(64 / 3 * 3.35e12 / 1e12)
    assert matmul_prediction(H100, 8192, "bf16").value == pytest.approx(989.4)
    assert matmul_prediction(H100, 8192, "fp32").value == pytest.approx(66.9)
    with pytest.raises(ValueError, match="'int4'"):
        matmul_prediction(H100, 64, "int4")
    with pytest.raises(ValueError, match="size: 0"):
        matmul_prediction(H100, 0)


def test_matmul_prediction_with_tiles_counts_the_tiles_traffic():
    n, tiles = 4096, MatmulTiles(16, 16, 16)
    reads = (n // 16) ** 2 * (16 + 16) * n  # every program reads a strip of A and of B
    intensity = 2 * n**3 / ((reads + n * n) * 2)
    assert matmul_prediction(H100, n, tiles=tiles).value == pytest.approx(
        intensity * 3.35e12 / 1e12
    )
    larger = matmul_prediction(H100, n, tiles=MatmulTiles(128, 256, 64))
    assert larger.value > matmul_prediction(H100, n, tiles=tiles).value


def test_attention_forward_prediction_uses_the_launchers_tiles():
    """The no-cache bound streams K and V once per query tile of the launcher's size (128 rows
    for bf16 on an H100), not once per 64 rows."""
    import torch
    from trainfast.kernels.attention_triton_forward import attention_forward_tiles

    seq, head_dim = 4096, 64
    block = attention_forward_tiles(H100, torch.bfloat16, head_dim).block_q
    assert block == 128
    moved = (seq // block * 2 * seq * head_dim + 2 * seq * head_dim) * 2
    expected = min(989.4e12, 4 * seq * seq * head_dim / moved * 3.35e12) / 1e12
    prediction = attention_forward_prediction(H100, seq, head_dim)
    assert prediction.value == pytest.approx(expected)
    assert "128×64" in prediction.model and "no cache (the most traffic" in prediction.model
    with pytest.raises(ValueError, match="seq=0"):
        attention_forward_prediction(H100, 0, 64)
    with pytest.raises(ValueError, match="'disk'"):
        attention_forward_prediction(H100, 4096, 64, cache="disk")


def test_attention_forward_prediction_with_l2_reuse_reaches_the_peak():
    """With L2 reuse one head's K and V (2 MiB at seq 4096, d 128) come from HBM once: the
    intensity is about seq / 2 FLOPs per byte, far above the ridge, so the ceiling is the peak."""
    l2 = attention_forward_prediction(H100, 4096, 128, cache="l2")
    assert l2.value == pytest.approx(989.4)
    assert l2.value > attention_forward_prediction(H100, 4096, 128).value


def _forward_row(config: str, tflops: float) -> dict:
    return {
        "seq": 4096,
        "head_dim": 128,
        "causal": False,
        "dtype": "bfloat16",
        "implementation": "triton flash_forward_kernel",
        "config": config,
        "tflops": tflops,
    }


def test_the_forward_measurement_is_the_row_with_the_launchers_tiles():
    """The prediction assumes the launcher's tiles (128×64, 8 warps, 3 stages in bf16 at head
    dim 128 on an H100), so the measurement it is compared with is that row of the tile sweep,
    not the fastest row, which may have run other tiles."""
    from dataclasses import replace

    from trainfast.kernels.attention_benchmarks import launcher_forward_row
    from trainfast.records import Record, records_for

    rows = [
        _forward_row("64x64, 4 warps, 3 stages", 479.0),
        _forward_row("128x64, 8 warps, 3 stages", 466.0),
    ]
    record = Record("attention-forward", "", [], rows, {}, "2026-01-01T00:00:00", "")
    assert launcher_forward_row(record, H100, 4096, 128, causal=False)["tflops"] == 466.0
    with pytest.raises(ValueError, match="causal=True"):
        launcher_forward_row(record, H100, 4096, 128, causal=True)
    with pytest.raises(ValueError, match="float16"):  # a bf16 row never stands in for fp16
        launcher_forward_row(record, H100, 4096, 128, causal=False, dtype=torch.float16)
    with pytest.raises(ValueError, match="launcher's tiles"):
        launcher_forward_row(replace(record, rows=rows[:1]), H100, 4096, 128, causal=False)
    # the chapter's table reads the recorded H100 run's launcher row: it must have one
    for recorded in records_for("attention-forward", "cuda")[:1]:
        row = launcher_forward_row(recorded, H100, 4096, 128, causal=False)
        assert row["config"] == "128x64, 8 warps, 3 stages"


def test_adamw_step_prediction_is_its_bytes_per_parameter_over_hbm():
    assert adamw_step_prediction(H100, 10**9).value == pytest.approx(84e9 / 3.35e12 * 1e3)
    assert adamw_step_prediction(H100, 10**9, "fused").value == pytest.approx(28e9 / 3.35e12 * 1e3)
    with pytest.raises(ValueError, match="n_params: 0"):
        adamw_step_prediction(H100, 0)


def test_all_reduce_prediction_is_the_ring_alpha_beta_time():
    n_bytes, world = 2**28, 8
    # ring: 2(N-1) steps of n/N bytes each, 5 µs latency per step on NVLink 4 (450 GB/s)
    expected = 2 * (world - 1) * (5e-6 + n_bytes / world / 450e9)
    assert all_reduce_prediction(n_bytes, world).value == pytest.approx(expected * 1e3, rel=1e-6)
    slower = all_reduce_prediction(n_bytes, world, INFINIBAND_NDR, "InfiniBand NDR")
    assert slower.value > all_reduce_prediction(n_bytes, world).value
    assert "InfiniBand" in slower.model


def test_step_memory_prediction_is_the_accounting_of_the_gpu_benchmarks_model():
    predicted = step_memory_prediction("bf16 autocast")
    assert "12 layers" in predicted.model and predicted.unit == "GB"
    assert step_memory_prediction("fp32").value > predicted.value
    assert math.isfinite(predicted.value) and predicted.value > 0
    with pytest.raises(ValueError, match="'fp4'"):
        step_memory_prediction("fp4")


def test_step_memory_prediction_agrees_with_accounting_for_a_quick_model():
    from trainfast.transformer import TransformerShape

    shape = TransformerShape.gpt_like(
        d_model=768, n_layers=2, n_heads=12, seq_len=1024, batch_size=8
    )
    expected = training_memory(
        shape, recipe="bf16 autocast", optimizer="adamw", attention="sdpa"
    ).peak
    assert step_memory_prediction("fp16 autocast + scaler", quick=True).value == pytest.approx(
        expected / 1e9
    )


def test_published_cuda_autocast_policy_follows_the_documentations_lists():
    from trainfast.precision.benchmarks import published_cuda_autocast_policy
    from trainfast.precision.numerics import AUTOCAST_OPS

    policy = published_cuda_autocast_policy()
    assert set(policy) == set(AUTOCAST_OPS)
    assert policy["linear"] == policy["matmul"] == "lower precision"
    assert policy["softmax"] == policy["layer_norm"] == policy["cumsum"] == "float32"
    assert policy["gelu"] == policy["add"] == "input dtype"  # on neither list
    assert policy["vector_norm"] == "float32"  # the documentation's `norm`
    assert policy["scaled_dot_product_attention"] == "input dtype"  # not on its float16 list
    assert published_cuda_autocast_policy(["conv2d", "nll_loss"]) == {
        "conv2d": "lower precision",
        "nll_loss": "float32",
    }


def test_attention_sweep_prediction_counts_three_kernels_and_recomputation():
    import torch
    from trainfast.kernels.attention_triton_backward import attention_dkdv_tiles, attention_dq_tiles
    from trainfast.kernels.attention_triton_forward import attention_forward_tiles
    from trainfast.kernels.benchmarks import attention_sweep_prediction

    seq, head_dim = 4096, 128
    blocks = (
        attention_forward_tiles(H100, torch.bfloat16, head_dim).block_q,
        attention_dkdv_tiles(H100, torch.bfloat16, head_dim).block_k,
        attention_dq_tiles(H100, torch.bfloat16, head_dim).block_q,
    )
    assert blocks == (128, 64, 64)  # the launchers' tiles, not 64 rows for the forward too
    executed = 18 * seq * seq * head_dim  # forward 2 products, backward 7 (S and dP twice)
    streamed = sum(seq // block * 2 * seq * head_dim for block in blocks)
    # once each: forward Q, O; preprocessing O, dO; dK/dV kernel K, V, dK, dV; dQ kernel Q, dO, dQ
    moved = (streamed + 11 * seq * head_dim) * 2
    seconds = max(executed / 989.4e12, moved / 3.35e12)
    expected = 14 * seq * seq * head_dim / seconds / 1e12  # reported as 3.5 forwards
    assert attention_sweep_prediction(H100, seq, head_dim).value == pytest.approx(expected)
    with pytest.raises(ValueError, match="head_dim=0"):
        attention_sweep_prediction(H100, 4096, 0)
