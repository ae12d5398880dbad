"""trainfast.calculator: its parts are the accounting functions, and the export is what it says."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from trainfast.accounting import (
    PRESET_SHAPES,
    parameter_count,
    training_flops,
    training_memory,
    training_run_seconds,
)
from trainfast.calculator import (
    LINK_LATENCY_S,
    NETWORK_BYTES_PER_S,
    TrainingSetup,
    estimate,
    export,
    write_script,
)
from trainfast.distributed.cost_model import Link, all_reduce_time
from trainfast.gpus import GPUS

SMALL = replace(PRESET_SHAPES["gpt2-small"], batch_size=4)


@pytest.mark.parametrize("recipe", ["fp32", "bf16-mixed", "pure-bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_without_model_parallelism_memory_is_training_memory(recipe, stage, checkpointing):
    setup = TrainingSetup(
        SMALL, recipe, "adamw", stage, data=4, global_batch=32, checkpointing=checkpointing
    )
    expected = training_memory(
        SMALL,
        recipe=recipe,
        optimizer="adamw",
        checkpointing=checkpointing,
        attention="sdpa",
        zero_stage=stage,
        world_size=4,
    )
    assert estimate(setup).memory.total == pytest.approx(expected.total, rel=1e-12)
    assert estimate(setup).memory.master_weights == pytest.approx(
        expected.master_weights, rel=1e-12
    )


def test_tensor_and_pipeline_parallelism_split_the_model_state():
    one = estimate(TrainingSetup(SMALL, global_batch=4)).memory
    split = estimate(TrainingSetup(SMALL, tensor=4, pipeline=3, global_batch=4)).memory
    assert split.parameters == pytest.approx(one.parameters / 12)
    assert split.activations < one.activations


def test_step_time_is_compute_at_mfu_plus_an_all_reduce():
    gpu = GPUS["A100 SXM 80GB"]
    setup = TrainingSetup(
        SMALL, "bf16-mixed", "adamw", data=4, global_batch=64, gpu=gpu.name, mfu=0.5
    )
    result = estimate(setup)
    compute = training_run_seconds(
        training_flops(SMALL) / SMALL.tokens,
        64 * SMALL.seq_len,
        n_gpus=4,
        peak_flops=gpu.peak_flops["bf16"],
        mfu=0.5,
    )
    assert result.compute_s == pytest.approx(compute, rel=1e-12)
    link = Link(LINK_LATENCY_S, 2 / gpu.nvlink_bytes_per_s)  # 4 GPUs share a node's NVLink
    assert result.data_parallel_s == pytest.approx(
        all_reduce_time("ring", parameter_count(SMALL) * 2, 4, link), rel=1e-12
    )
    assert result.bubble_s == result.tensor_parallel_s == result.pipeline_s == 0
    across_nodes = estimate(replace(setup, data=16, global_batch=256))
    network = Link(LINK_LATENCY_S, 1 / NETWORK_BYTES_PER_S)
    assert across_nodes.data_parallel_s == pytest.approx(
        all_reduce_time("ring", parameter_count(SMALL) * 2, 16, network), rel=1e-12
    )


def test_pipeline_bubble_and_checkpointing_cost_time():
    base = TrainingSetup(SMALL, pipeline=4, global_batch=32)
    result = estimate(base)
    assert result.bubble_s == pytest.approx(result.compute_s * 3 / 8)
    assert estimate(replace(base, checkpointing=True)).compute_s == pytest.approx(
        result.compute_s * 4 / 3
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tensor": 5}, "Invalid tensor: 5"),
        ({"pipeline": 5}, "Invalid pipeline: 5"),
        ({"global_batch": 6, "data": 4}, "Invalid global_batch: 6"),
        ({"zero_stage": 4}, "Invalid zero_stage: 4"),
        ({"gpu": "V100"}, "Unknown gpu: 'V100'"),
        ({"recipe": "fp4"}, "Unknown recipe: 'fp4'"),
        ({"mfu": 1.5}, "Invalid mfu: 1.5"),
        ({"data": 0}, "Invalid data: 0"),
    ],
)
def test_bad_setups_name_the_value(change, message):
    with pytest.raises(ValueError, match=message):
        replace(TrainingSetup(SMALL, global_batch=4), **change)


def test_export_is_json_with_the_package_results(tmp_path):
    data = export()
    assert len(data["cases"]) >= 100
    case = data["cases"][-1]
    setup = TrainingSetup(
        replace(SMALL, **case["setup"]["shape"]),
        **{k: v for k, v in case["setup"].items() if k != "shape"},
    )
    assert case["result"]["time"]["step"] == estimate(setup).step_s
    assert case["result"]["memory"]["total"] == estimate(setup).memory.total
    # the grid covers every choice the widget offers
    for key, names in [("recipe", "recipes"), ("optimizer", "optimizer_moments"), ("gpu", "gpus")]:
        assert {c["setup"][key] for c in data["cases"]} == set(data[names])
    assert {c["setup"]["zero_stage"] for c in data["cases"]} == {0, 1, 2, 3}
    assert {c["setup"]["checkpointing"] for c in data["cases"]} == {False, True}
    assert len({(c["setup"]["tensor"], c["setup"]["pipeline"]) for c in data["cases"]}) >= 4
    path = tmp_path / "calculator-data.js"
    write_script(path)
    text = path.read_text()
    prefix = "window.TRAINFAST_CALCULATOR = "
    assert text.startswith(prefix)
    assert json.loads(text[len(prefix) :].rstrip().rstrip(";")) == json.loads(json.dumps(data))
