"""The book's one step model (trainfast.distributed.step_time) and the widget's data export.

The model's parts are the accounting functions and the alpha-beta collectives; its activation
memory is checked against Korthikanti et al. (2022) for the paper's own models, and its FLOPs
with full recomputation against Narayanan et al. (2021)'s Eq. 3.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from trainfast.accounting import (
    parameter_count,
    training_flops,
    training_memory,
    training_run_seconds,
)
from trainfast.calculator import estimate_dict, export, setup_from_dict, write_script
from trainfast.distributed.communication_bound import data_parallel_min_tokens
from trainfast.distributed.context_parallel import ring_attention_work
from trainfast.distributed.cost_model import (
    Link,
    all_gather_time,
    all_reduce_time,
    reduce_scatter_time,
)
from trainfast.distributed.launch import spawn
from trainfast.distributed.layout import layout_choices, propose_layout, recommend_layout
from trainfast.distributed.parity.collectives import (
    torch_fsdp_traffic_worker,
    zero_traffic_worker,
)
from trainfast.distributed.pipeline import (
    interleaved_schedule,
    one_f_one_b_schedule,
    peak_activations,
)
from trainfast.distributed.sequence_parallel import sequence_parallel_worker
from trainfast.distributed.step_time import (
    StepAssumptions,
    TrainingSetup,
    all_to_all_time,
    context_block_scores,
    data_parallel_bytes,
    data_parallel_link,
    estimate,
    layer_activation_bytes,
    layers_in_flight,
)
from trainfast.distributed.strategy import FSDP_ON_CPU
from trainfast.gpus import GPUS
from trainfast.transformer import PRESET_SHAPES, TransformerShape

SMALL = replace(PRESET_SHAPES["gpt2-small"], batch_size=4)
NO_OVERLAP = StepAssumptions(overlap=0.0)

# Korthikanti et al. 2022, Table 3: (heads a, hidden h, layers, tensor-parallel t, micro-batch b),
# sequences of s = 2048, vocabulary 51,200
KORTHIKANTI_MODELS = {
    "22B": (64, 6144, 48, 8, 4),
    "175B": (96, 12288, 96, 8, 1),
    "530B": (128, 20480, 105, 8, 1),
    "1T": (160, 25600, 128, 8, 1),
}


@pytest.mark.parametrize("name", list(KORTHIKANTI_MODELS))
def test_activation_memory_matches_korthikanti_et_al(name):
    a, h, layers, t, b = KORTHIKANTI_MODELS[name]
    s = 2048
    shape = TransformerShape(51_200, h, layers, a, 4 * h, s, b)
    sbh = s * b * h

    def ours(tensor, sp, recompute):
        return layer_activation_bytes(shape, tensor, sp, recompute, dropout=True)

    # Eq. 1: no parallelism, nothing recomputed
    assert ours(1, False, "none") == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)
    # Eq. 2: tensor parallelism alone
    assert ours(t, False, "none") == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12
    )
    # tensor and sequence parallelism (the gathered inputs are gathered again in backward)
    assert ours(t, True, "none") == pytest.approx(sbh / t * (34 + 5 * a * s / h), rel=1e-12)
    # Section 5: selective recomputation with sequence parallelism, sbh 34 / t; ours also keeps
    # the fused kernel's fp32 log-sum-exp per head and token, which the paper does not count
    lse = 4 * a * s * b / t
    assert ours(t, True, "selective") == pytest.approx(sbh * 34 / t + lse, rel=1e-12)
    assert lse / (sbh * 34 / t) < 0.002
    # full recomputation keeps the layer's input: 2 sbh bytes, over t with sequence parallelism
    assert ours(t, True, "full") == pytest.approx(2 * sbh / t, rel=1e-12)


@pytest.mark.parametrize(
    ("p", "v", "m"),
    [(4, 1, 2), (4, 1, 8), (4, 2, 4), (4, 2, 8), (4, 3, 12), (8, 2, 8), (16, 2, 16)],
)
def test_layers_in_flight_are_the_schedules_peak(p, v, m):
    L = 2 * p * v  # two layers per chunk
    schedule = interleaved_schedule(p, m, v) if v > 1 else one_f_one_b_schedule(p, m)
    peaks = peak_activations(schedule)
    first, last = layers_in_flight(L, p, m, v)
    assert (first, last) == (peaks[0] * L // (p * v), peaks[-1] * L // (p * v))


def test_interleaving_keeps_korthikanti_et_als_factor_only_with_many_micro_batches():
    L, p, v = 96, 8, 2
    assert layers_in_flight(L, p, 64, v)[0] == L * (1 + (p - 1) / (p * v))  # Section 4.2.3
    assert layers_in_flight(L, p, p, v)[0] == L  # m = p: every chunk of every micro-batch
    shape = TransformerShape(51_200, 12_288, L, 96, 4 * 12_288, 2048, 1)
    base = TrainingSetup(shape, tensor=8, pipeline=p, global_batch=p, recompute="selective")
    one = layer_activation_bytes(shape, 8, False, "selective")
    interleaved = estimate(replace(base, virtual_stages=v))
    assert interleaved.memory.activations == pytest.approx(L * one, rel=1e-12)


def test_the_head_lives_on_the_last_stage():
    base = TrainingSetup(SMALL, pipeline=4, global_batch=32)
    one = layer_activation_bytes(SMALL, recompute="selective")
    head = SMALL.tokens * (2 * SMALL.d_model + SMALL.vocab_size) * 2
    first, last = layers_in_flight(SMALL.n_layers, 4, base.micro_batches)
    assert estimate(base).memory.activations == max(first * one, last * one + head)


def test_full_recomputation_flops_are_narayanan_et_al_eq_3():
    # Narayanan et al. 2021, Table 1, the 145.6B row: F = 96 B s l h^2 (1 + s/6h + V/16lh)
    B, s, L, h, V = 2304, 2048, 80, 12288, 51_200
    shape = TransformerShape(V, h, L, 96, 4 * h, s, 1)
    setup = TrainingSetup(shape, data=24, tensor=8, pipeline=8, global_batch=B, recompute="full")
    result = estimate(setup)
    peak = GPUS[setup.gpu].peak_flops["bf16"] * setup.assumptions.matmul_efficiency
    eq3 = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    assert result.compute_s * setup.n_gpus * peak == pytest.approx(eq3, rel=1e-12)


@pytest.mark.parametrize("recipe", ["fp32", "bf16 + fp32 master", "pure bf16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_without_model_parallelism_memory_is_training_memory(recipe, stage, recompute):
    setup = TrainingSetup(
        SMALL, recipe, "adamw", stage, data=4, global_batch=32, recompute=recompute
    )
    expected = training_memory(
        SMALL,
        recipe=recipe,
        optimizer="adamw",
        checkpointing=recompute == "full",
        attention="sdpa",
        zero_stage=stage,
        world_size=4,
    )
    assert estimate(setup).memory.total == pytest.approx(expected.total, rel=1e-12)
    # and the loss's float32 buffers at the start of backward: the same peak
    assert estimate(setup).memory.peak == pytest.approx(expected.peak, rel=1e-12)
    assert estimate(setup).memory.master_weights == pytest.approx(
        expected.master_weights, rel=1e-12
    )


def test_compute_time_runs_at_the_peak_of_the_recipes_matmul_format():
    peaks = GPUS["H100 SXM 80GB"].peak_flops
    compute = {
        recipe: estimate(TrainingSetup(SMALL, recipe, "adamw", data=4, global_batch=32)).compute_s
        for recipe in ("fp32", "tf32", "bf16 autocast", "fp16 autocast + scaler", "pure bf16")
    }
    for recipe, format_ in [("fp32", "fp32"), ("tf32", "tf32"), ("fp16 autocast + scaler", "fp16")]:
        ratio = compute[recipe] / compute["bf16 autocast"]
        assert ratio == pytest.approx(peaks["bf16"] / peaks[format_], rel=1e-12), recipe
    assert compute["pure bf16"] == compute["bf16 autocast"]


def test_tensor_context_and_pipeline_parallelism_split_the_model_and_activations():
    one = estimate(TrainingSetup(SMALL, global_batch=4)).memory
    split = estimate(TrainingSetup(SMALL, tensor=4, pipeline=3, global_batch=4)).memory
    assert split.parameters == pytest.approx(one.parameters / 12)
    assert split.activations < one.activations
    context = estimate(TrainingSetup(SMALL, context=4, global_batch=4, zero_stage=1)).memory
    assert context.activations == pytest.approx(one.activations / 4)
    assert context.optimizer_state == pytest.approx(one.optimizer_state / 4)  # ZeRO over d c


def test_step_time_is_compute_at_mfu_plus_an_all_reduce():
    gpu = GPUS["A100 SXM 80GB"]
    assumptions = StepAssumptions(matmul_efficiency=0.5, overlap=0.0)
    setup = TrainingSetup(SMALL, data=4, global_batch=64, gpu=gpu.name, assumptions=assumptions)
    result = estimate(setup)
    flops = training_flops(replace(SMALL, batch_size=64))
    flops += SMALL.n_layers * 64 * SMALL.n_heads * 4 * SMALL.seq_len**2 * SMALL.head_dim
    assert result.compute_s == pytest.approx(flops / (4 * gpu.peak_flops["bf16"] * 0.5))
    assert result.compute_s > training_run_seconds(
        training_flops(SMALL) / SMALL.tokens,
        64 * SMALL.seq_len,
        n_gpus=4,
        peak_flops=gpu.peak_flops["bf16"],
        mfu=0.5,
    )  # selective recomputation repeats the attention core
    link = Link(assumptions.nvlink_latency_s, 2 / gpu.nvlink_bytes_per_s)  # 4 GPUs in a node
    gradient = all_reduce_time("ring", parameter_count(SMALL) * 2, 4, link)
    assert result.data_parallel_s == pytest.approx(gradient, rel=1e-12)
    assert result.bubble_s == result.tensor_parallel_s == result.pipeline_s == 0
    # 16 ranks, 8 in each node: 8 rings, each leaving the node through one of its 8 ports; a
    # rank sends 7/8 of its ring's bytes over NVLink, and on an A100 that binds, not the ports
    node_ports = assumptions.gpus_per_node * assumptions.network_bytes_per_s
    in_node = 7 / 8 * 2 / gpu.nvlink_bytes_per_s
    assert in_node > 1 / node_ports
    network = Link(assumptions.network_latency_s, in_node)
    across = estimate(replace(setup, data=16, global_batch=256))
    expected = all_reduce_time("ring", parameter_count(SMALL) * 2, 16, network)
    assert across.data_parallel_s == pytest.approx(expected, rel=1e-12)
    # overlap hides the reduction behind the last micro-batch's backward, 2/3 of its compute
    hidden = estimate(replace(setup, data=16, global_batch=256, assumptions=StepAssumptions(0.5)))
    assert hidden.data_parallel_s == pytest.approx(max(0, expected - hidden.compute_s / 4 * 2 / 3))


def test_zero3_gathers_the_weights_and_reduce_scatters_for_every_micro_batch():
    base = TrainingSetup(SMALL, zero_stage=3, data=16, global_batch=64, assumptions=NO_OVERLAP)
    result = estimate(base)
    n = parameter_count(SMALL)
    node_ports = NO_OVERLAP.gpus_per_node * NO_OVERLAP.network_bytes_per_s
    link = Link(NO_OVERLAP.network_latency_s, 1 / node_ports)
    expected = all_reduce_time("ring", 2 * n, 16, link) / 2 + 2 * all_gather_time(2 * n, 16, link)
    assert result.data_parallel_s == pytest.approx(expected, rel=1e-12)  # 1.5x an all-reduce
    twice = estimate(replace(base, global_batch=128))  # m = 2: all of it twice
    assert twice.data_parallel_s == pytest.approx(2 * expected, rel=1e-12)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize(("tensor", "hierarchical"), [(1, True), (2, True), (1, False)])
def test_the_data_parallel_time_is_the_bytes_over_the_bandwidth(stage, m, tensor, hierarchical):
    free = StepAssumptions(
        overlap=0.0, network_latency_s=0.0, hierarchical_data_parallel=hierarchical
    )
    setup = TrainingSetup(
        SMALL,
        zero_stage=stage,
        data=16,
        tensor=tensor,
        global_batch=64 * m,
        assumptions=free,
    )
    n = parameter_count(SMALL) / tensor
    sent = data_parallel_bytes(n, 16, stage, m, gradient_bytes=2, parameter_bytes=2)
    # a node holds 8 / t ranks of each data-parallel group; with the hierarchical reduction they
    # send through 8 / t ports at once, else each rank has one port
    ports = free.gpus_per_node // tensor if hierarchical else 1
    assert estimate(setup).data_parallel_s == pytest.approx(
        sent / (ports * free.network_bytes_per_s), rel=1e-12
    )


@pytest.mark.parametrize(
    ("port", "inner", "binds"),
    [(50e9, 1, "port"), (100e9, 1, "nvlink"), (100e9, 2, "port"), (50e9, 1, "nvlink a100")],
)
def test_the_slower_of_the_port_and_nvlink_binds_a_hierarchical_ring(port, inner, binds):
    """g rings leave a node through g ports: a rank sends 1 / g of the ring's bytes over its port
    and (g - 1) / g over NVLink (one direction: half the datasheet figure)."""
    nvlink = GPUS["A100 SXM 80GB" if "a100" in binds else "H100 SXM 80GB"].nvlink_bytes_per_s
    g = 8 // inner
    link = data_parallel_link(inner, 16, nvlink, StepAssumptions(network_bytes_per_s=port))
    # compared as bandwidths (bytes/s): approx's absolute tolerance would swallow a beta
    expected = g / (g - 1) * nvlink / 2 if "nvlink" in binds else g * port
    assert 1 / link.beta == pytest.approx(expected, rel=1e-12)
    assert 1 / link.beta == pytest.approx(min(g * port, g / (g - 1) * nvlink / 2), rel=1e-12)


@pytest.mark.parametrize("stage", [0, 3])
def test_expert_gradients_cross_the_nodes_on_fewer_ports_than_dense_ones(stage):
    """The expert group is the innermost 8 of the 16 data ranks, so a node holds 8 dense
    replicas (8 ports) but one replica of each expert shard (one port)."""
    free = StepAssumptions(overlap=0.0, network_latency_s=0.0)
    setup = TrainingSetup(
        SMALL,
        zero_stage=stage,
        data=16,
        experts=8,
        expert_parallel=8,
        global_batch=64,
        assumptions=free,
    )
    h, f, L = SMALL.d_model, SMALL.d_ff, SMALL.n_layers
    mlp = 2 * h * f + f + h  # one expert (the test above counts it alike)
    dense, experts = parameter_count(SMALL) - L * mlp + L * h * 8, L * mlp  # 8 experts over 8
    m = setup.micro_batches
    sent_dense = data_parallel_bytes(dense, 16, stage, m, gradient_bytes=2, parameter_bytes=2)
    sent_experts = data_parallel_bytes(experts, 2, stage, m, gradient_bytes=2, parameter_bytes=2)
    port = free.network_bytes_per_s
    assert estimate(setup).data_parallel_s == pytest.approx(
        sent_dense / (8 * port) + sent_experts / port, rel=1e-12
    )


@pytest.mark.parametrize("efficiency", [0.3, 1.0])
def test_the_threshold_rule_and_the_step_model_price_data_parallelism_alike(efficiency):
    """At the rule's threshold the model's all-reduce takes as long as its backward, across
    nodes too: both use data_parallel_link (the chapter's threshold cell does)."""
    free = StepAssumptions(
        matmul_efficiency=efficiency, overlap=0.0, network_latency_s=0.0, nvlink_latency_s=0.0
    )
    # tied head, short sequences: the model's FLOPs per token are close to the rule's 6 P
    shape = TransformerShape.gpt_like(n_layers=8, d_model=1024, n_heads=8, seq_len=64)
    gpu = GPUS["H100 SXM 80GB"]
    for data in (8, 64):  # inside a node, and across 8 nodes
        link = data_parallel_link(1, data, gpu.nvlink_bytes_per_s, free)
        tokens = data_parallel_min_tokens(
            gpu.peak_flops["bf16"], link, data, matmul_efficiency=efficiency
        )
        sequences = round(tokens / shape.seq_len)  # one micro-batch per GPU
        setup = TrainingSetup(
            replace(shape, batch_size=sequences),
            data=data,
            global_batch=sequences * data,
            assumptions=free,
        )
        result = estimate(setup)
        backward = result.compute_s * 2 / 3
        assert result.data_parallel_s == pytest.approx(backward, rel=0.05), data


def test_zero2_pays_a_reduce_scatter_per_micro_batch_and_zero1_does_not():
    base = TrainingSetup(SMALL, zero_stage=1, data=16, global_batch=256, assumptions=NO_OVERLAP)
    assert base.micro_batches == 4
    zero1, zero2 = estimate(base), estimate(replace(base, zero_stage=2))
    assert zero2.data_parallel_s > 1.9 * zero1.data_parallel_s
    one = replace(base, global_batch=64)  # one micro-batch: the same traffic
    assert estimate(replace(one, zero_stage=2)).data_parallel_s == pytest.approx(
        estimate(one).data_parallel_s, rel=1e-12
    )
    # the layout search offers no ZeRO-2 or 3 with pipeline stages (DeepSpeed refuses them)
    choices = layout_choices(TrainingSetup(SMALL, global_batch=64), 8)
    assert not [e for e in choices if e.setup.zero_stage >= 2 and e.setup.pipeline > 1]
    assert [e for e in choices if e.setup.zero_stage >= 2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("stage", "m"), [(0, 3), (1, 3), (2, 1), (2, 3), (3, 1), (3, 3)])
def test_the_model_counts_the_bytes_our_zero_sends(stage, m, dtype):
    """In fp32 and in bf16 (2-byte weights and gradients on the wire: our ZeRO-2 once sent its
    fp32 casts, twice the bytes the model charges)."""
    sent = spawn(zero_traffic_worker, 4, stage, m, dtype, timeout=120)
    weights, biases = 8 * 16 + 16 * 4, 16 + 4  # the worker's two Linear layers
    n, width = weights + biases, torch.finfo(dtype).bits // 8
    model = data_parallel_bytes(n, 4, stage, m, gradient_bytes=width, parameter_bytes=width)
    if stage == 1:  # as built: an all-reduce, then each owner broadcasts to the 3 others
        assert sum(sent) == 4 * model + 3 * width * n
        assert sum(sent) == pytest.approx(1.5 * 4 * model)
    elif stage == 3:  # our FSDP shards the weights; the biases stay whole and fp32, all-reduced
        sharded = data_parallel_bytes(weights, 4, 3, m, gradient_bytes=width, parameter_bytes=width)
        replicated = data_parallel_bytes(biases, 4, 0, m, gradient_bytes=4, parameter_bytes=4)
        assert sent == [pytest.approx(sharded + replicated, rel=1e-12)] * 4
    else:
        assert sent == [model] * 4


@pytest.mark.skipif(not FSDP_ON_CPU, reason="FSDP on CPU needs torch >= 2.9")
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("stage", [2, 3])
def test_accumulating_before_the_reduction_counts_what_torchs_fsdp_sends(stage, m):
    """PyTorch's fully_shard with gradient sync off until the last micro-batch (its pipelining's
    way, Llama 3's): one fp32 reduce-scatter a step, bf16 weights gathered once (ZeRO-2: kept
    from the first forward to the last backward) or for every forward and backward (ZeRO-3)."""
    sent = spawn(torch_fsdp_traffic_worker, 4, stage == 3, m, timeout=120)
    n = 8 * 16 + 16 + 16 * 4 + 4  # weights and biases, all sharded by FSDP2
    model = data_parallel_bytes(n, 4, stage, m, 4, 2, accumulate_before_reduce=True)
    assert sent == [pytest.approx(model, rel=1e-12)] * 4
    if m > 1:  # the other scheme sends more: a reduce-scatter per micro-batch
        assert data_parallel_bytes(n, 4, stage, m, 4, 2) > model


def test_accumulating_before_the_reduction_holds_whole_gradients_and_reduces_once():
    """accumulate_before_reduce: ZeRO-2 and 3 pay one reduce-scatter a step, hidden behind the
    last micro-batch's backward, and hold the whole gradients during the step; with one
    micro-batch the two schemes are the same; the layout search then pairs them with pipelines."""
    base = TrainingSetup(SMALL, zero_stage=2, data=16, global_batch=256, assumptions=NO_OVERLAP)
    m, n = base.micro_batches, parameter_count(SMALL)
    assert m == 4
    both = replace(NO_OVERLAP, accumulate_before_reduce=True)
    for stage in (2, 3):
        each, once = (
            estimate(replace(base, zero_stage=stage, assumptions=x)) for x in (NO_OVERLAP, both)
        )
        link = data_parallel_link(1, 16, GPUS[base.gpu].nvlink_bytes_per_s, NO_OVERLAP)
        one = reduce_scatter_time(n * 2, 16, link)
        assert each.data_parallel_s - once.data_parallel_s == pytest.approx((m - 1) * one)
        assert once.memory.gradients == n * 2  # whole bf16 gradients on every rank
        assert each.memory.gradients == pytest.approx(n * 2 / 16)
    single = replace(base, global_batch=64)  # one micro-batch: nothing to accumulate
    for stage in (2, 3):
        a, b = (
            estimate(replace(single, zero_stage=stage, assumptions=x)) for x in (NO_OVERLAP, both)
        )
        assert a == replace(b, setup=a.setup)
    hidden = estimate(replace(base, assumptions=replace(both, overlap=1.0)))
    exposed = estimate(replace(base, assumptions=both))
    backward = exposed.compute_s * 2 / 3
    assert exposed.data_parallel_s - hidden.data_parallel_s == pytest.approx(min(backward / m, one))
    plain = layout_choices(TrainingSetup(SMALL, global_batch=64), 8)
    paired = layout_choices(TrainingSetup(SMALL, global_batch=64, assumptions=both), 8)
    assert not [e for e in plain if e.setup.zero_stage >= 2 and e.setup.pipeline > 1]
    assert [e for e in paired if e.setup.zero_stage >= 2 and e.setup.pipeline > 1]


def test_zero2s_gather_of_the_updated_weights_is_never_hidden():
    """The all-gather of ZeRO-2's updated weights follows the optimizer step, after the last
    backward: with full overlap and a long backward, the reduce-scatters hide and it does not."""
    free = replace(NO_OVERLAP, overlap=1.0)
    setup = TrainingSetup(SMALL, zero_stage=2, data=16, global_batch=256, assumptions=free)
    e = estimate(setup)
    link = data_parallel_link(1, 16, GPUS[setup.gpu].nvlink_bytes_per_s, free)
    gather = all_gather_time(parameter_count(SMALL) * 2, 16, link)
    scatter = setup.micro_batches * reduce_scatter_time(parameter_count(SMALL) * 2, 16, link)
    assert scatter < e.compute_s * 2 / 3  # the backward hides every reduce-scatter
    assert e.data_parallel_s == pytest.approx(gather, rel=1e-12)


def test_sequence_parallel_activations_are_what_our_block_saves():
    shape = TransformerShape(8, 64, 1, 8, 256, 64, 2)  # the chapter's block, float32
    results = spawn(sequence_parallel_worker, 4, shape, 0, timeout=300)
    layer_norm_stats = 2 * 2 * shape.tokens * 4  # mean and 1/std of two LayerNorms, not counted
    for mode, sp in (("tp", False), ("sp", True)):
        model = layer_activation_bytes(shape, 4, sp, "selective", value_bytes=4)
        saved = results[0][mode]["saved_bytes"]
        assert saved == model + layer_norm_stats / (4 if sp else 1), mode


def test_sequence_parallelism_is_a_choice():
    base = TrainingSetup(SMALL, tensor=4, global_batch=4)
    assert (
        estimate(replace(base, sequence_parallel=True)).memory.activations
        < estimate(base).memory.activations
    )
    with pytest.raises(ValueError, match="Invalid sequence_parallel: 1"):
        replace(base, sequence_parallel=1)


def test_context_parallel_blocks_are_ring_attentions_causal_work():
    for c, s in ((2, 64), (4, 128), (8, 256)):
        size = s // (2 * c)  # a chunk of the balanced split
        work = ring_attention_work(c, s, is_causal=True, balanced=True)
        # every ring step computes one block's worth; the first adds the diagonals' own entries
        assert work == [c * context_block_scores(s, c) + size] * c


def test_mfu_and_hfu_are_outputs():
    setup = TrainingSetup(SMALL, data=4, global_batch=64, recompute="full")
    e = estimate(setup)
    peak = 4 * GPUS[setup.gpu].peak_flops["bf16"]
    assert e.mfu == pytest.approx(training_flops(replace(SMALL, batch_size=64)) / (e.step_s * peak))
    assert e.hfu > e.mfu  # full recomputation runs the forward twice
    alone = estimate(TrainingSetup(SMALL, global_batch=4, recompute="none"))  # nothing else
    assert alone.hfu == pytest.approx(alone.setup.assumptions.matmul_efficiency, rel=1e-12)


def test_pipeline_bubble_interleaving_and_recomputation_cost_time():
    base = TrainingSetup(SMALL, pipeline=4, global_batch=32)
    result = estimate(base)
    assert result.bubble_s == pytest.approx(result.compute_s * 3 / 8)
    interleaved = estimate(replace(base, virtual_stages=3))
    assert interleaved.bubble_s == pytest.approx(result.compute_s * 3 / (3 * 8))
    assert interleaved.pipeline_s == pytest.approx(3 * result.pipeline_s)
    full = estimate(replace(base, recompute="full"))
    none = estimate(replace(base, recompute="none"))
    assert full.compute_s > result.compute_s > none.compute_s
    assert full.memory.activations < result.memory.activations < none.memory.activations


def test_context_parallel_sends_hide_behind_long_blocks_only():
    long = replace(SMALL, seq_len=32_768, batch_size=1)
    hidden = estimate(TrainingSetup(long, context=2, global_batch=1))  # 16k-token blocks
    assert hidden.context_parallel_s == 0
    slow = StepAssumptions(network_bytes_per_s=1e6)
    exposed = estimate(TrainingSetup(long, context=16, global_batch=1, assumptions=slow))
    assert exposed.context_parallel_s > 0


def test_experts_add_parameters_and_all_to_alls():
    base = TrainingSetup(SMALL, data=4, global_batch=16)
    moe = replace(base, experts=8, top_k=2, expert_parallel=4)
    dense, sparse = estimate(base), estimate(moe)
    assert sparse.expert_parallel_s > 0 == dense.expert_parallel_s
    h, f, L = SMALL.d_model, SMALL.d_ff, SMALL.n_layers
    extra = L * (8 * (2 * h * f + f + h) / 4 - (2 * h * f + f + h) + 8 * h)
    assert sparse.memory.parameters - dense.memory.parameters == pytest.approx(2 * extra)
    activation = SMALL.tokens * h * 2 * 2  # 2 bytes, 2 experts per token
    link = Link(StepAssumptions().nvlink_latency_s, 2 / GPUS[base.gpu].nvlink_bytes_per_s)
    one = all_to_all_time(activation, 4, link)
    assert sparse.expert_parallel_s == pytest.approx(4 * one * L * sparse.setup.micro_batches)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tensor": 5}, "Invalid tensor: 5"),
        ({"pipeline": 13}, "Invalid virtual_stages: 1"),
        ({"context": 3}, "Invalid context: 3"),
        ({"global_batch": 6, "data": 4}, "Invalid global_batch: 6"),
        ({"pipeline": 4, "virtual_stages": 2, "global_batch": 8}, "Invalid global_batch: 8"),
        ({"experts": 4, "expert_parallel": 3}, "Invalid expert_parallel: 3"),
        ({"top_k": 2}, "Invalid top_k: 2"),
        ({"zero_stage": 4}, "Invalid zero_stage: 4"),
        ({"gpu": "V100"}, "Invalid gpu: 'V100'"),
        ({"recipe": "fp4"}, "Unknown recipe: 'fp4'"),
        ({"recompute": "some"}, "Invalid recompute: 'some'"),
        ({"data": 0}, "Invalid data: 0"),
    ],
)
def test_bad_setups_name_the_value(change, message):
    with pytest.raises(ValueError, match=message):
        replace(TrainingSetup(SMALL, global_batch=4), **change)
    with pytest.raises(ValueError, match="Invalid matmul_efficiency: 1.5"):
        StepAssumptions(matmul_efficiency=1.5)
    with pytest.raises(ValueError, match="Invalid network_bytes_per_s: 0"):
        StepAssumptions(network_bytes_per_s=0)
    with pytest.raises(ValueError, match="Invalid overlap: -0.5"):
        StepAssumptions(overlap=-0.5)


def test_an_odd_sequence_length_needs_no_context_parallelism():
    """Only the balanced split of context parallelism (2c chunks) needs 2c to divide the sequence:
    c = 1 takes any length, and the message names the sequence length when c > 1 refuses it."""
    odd = replace(SMALL, seq_len=1025)
    assert estimate(TrainingSetup(odd, global_batch=4)).step_s > 0
    with pytest.raises(ValueError, match="Invalid context: 2 .*seq_len = 1026"):
        TrainingSetup(replace(SMALL, seq_len=1026), context=2, global_batch=4)
    assert any(case["setup"]["shape"]["seq_len"] % 2 for case in export()["cases"])  # the widget


def test_layout_search_uses_the_one_model():
    shape = TransformerShape.gpt_like(n_layers=32, d_model=4096, n_heads=32, seq_len=4096)
    base = TrainingSetup(shape, global_batch=512)
    choices = layout_choices(base, 64)
    assert all(e == estimate(e.setup) for e in choices)
    keys = [
        (e.setup.tensor * e.setup.pipeline, e.setup.zero_stage, e.setup.pipeline) for e in choices
    ]
    assert keys == sorted(keys)
    proposal = propose_layout(base, 64)
    assert proposal == next(e for e in choices if e.fits)
    pick = recommend_layout(base, 64)
    assert pick.estimate == pick.considered[0] and pick.estimate.fits
    assert all(pick.estimate.step_s <= e.step_s + 1e-6 for e in pick.considered)
    assert f"tensor {pick.estimate.setup.tensor}" in pick.reason
    assert recommend_layout(replace(base, global_batch=8), 1) is None  # 7B does not fit
    small = TransformerShape.gpt_like(n_layers=12, d_model=768, n_heads=12, seq_len=1024)
    assert recommend_layout(TrainingSetup(small, global_batch=64), 8).estimate.setup.tensor == 1


def test_export_is_json_with_the_package_results(tmp_path):
    data = export()
    assert len(data["cases"]) >= 100
    for case in data["cases"][::17]:
        assert case["result"] == estimate_dict(estimate(setup_from_dict(case["setup"])))
    # the grid covers every choice the widget offers
    for key, names in [("recipe", "recipes"), ("optimizer", "optimizer_moments"), ("gpu", "gpus")]:
        assert {c["setup"][key] for c in data["cases"]} == set(data[names])
    for key, least in [
        ("zero_stage", 4),
        ("recompute", 3),
        ("virtual_stages", 3),
        ("context", 3),
        ("experts", 3),
        ("dropout", 2),
        ("tensor", 4),
        ("pipeline", 4),
    ]:
        assert len({c["setup"][key] for c in data["cases"]}) >= least, key
    assert {c["setup"]["assumptions"]["overlap"] for c in data["cases"]} == {0.0, 1.0}
    # and every choice of the model the widget counts
    for name, values in [("norm", 2), ("positions", 2), ("mlp", 3), ("qk_norm", 2), ("bias", 2)]:
        assert len({c["setup"]["shape"][name] for c in data["cases"]}) == values, name
    assert {c["setup"]["shape"]["tied_head"] for c in data["cases"]} == {True, False}
    assert len({c["setup"]["shape"]["n_kv_heads"] for c in data["cases"]}) >= 3
    path = tmp_path / "calculator-data.js"
    write_script(path)
    text = path.read_text()
    prefix = "window.TRAINFAST_CALCULATOR = "
    assert text.startswith(prefix)
    assert json.loads(text[len(prefix) :].rstrip().rstrip(";")) == json.loads(json.dumps(data))


# the modern decoder's choices: RMSNorm, RoPE, SwiGLU, grouped-query attention, QK-norm, an
# untied head, no biases (and each choice alone, so a miscount cannot hide behind another)
MODERN = replace(PRESET_SHAPES["llama3-8b"], seq_len=512, batch_size=2)
MODERN_SHAPES = [
    MODERN,
    replace(PRESET_SHAPES["tiny-modern"], vocab_size=512, d_model=64, seq_len=32),
    replace(SMALL, norm="rmsnorm"),
    replace(SMALL, positions="rope"),
    replace(SMALL, mlp="swiglu"),
    replace(SMALL, mlp="relu2", bias=False),
    replace(SMALL, qk_norm=True, n_kv_heads=4),
    replace(SMALL, tied_head=False),
]


@pytest.mark.parametrize("shape", MODERN_SHAPES, ids=lambda s: f"{s.norm}-{s.mlp}-{s.positions}")
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_model_counts_every_modern_choice_as_accounting_does(shape, recompute):
    setup = TrainingSetup(
        shape, data=4, global_batch=4 * shape.batch_size, zero_stage=1, recompute=recompute
    )
    expected = training_memory(
        shape,
        recipe=setup.recipe,
        optimizer="adamw",
        checkpointing=recompute == "full",
        attention="manual" if recompute == "none" else "sdpa",
        zero_stage=1,
        world_size=4,
    )
    e = estimate(setup)
    assert e.memory.total == pytest.approx(expected.total, rel=1e-12)
    assert e.memory.activations == pytest.approx(expected.activations, rel=1e-12)
    assert e.model_flops == training_flops(replace(shape, batch_size=setup.global_batch))


@pytest.mark.parametrize("shape", MODERN_SHAPES[:2], ids=["llama3-8b", "tiny-modern"])
def test_the_head_and_the_experts_of_a_modern_model(shape):
    base = TrainingSetup(shape, pipeline=2, global_batch=2 * shape.batch_size)
    one = layer_activation_bytes(shape, recompute="selective")
    # RMSNorm keeps its normalised input too: 3h + V values per token on the last stage
    head = shape.tokens * (3 * shape.d_model + shape.vocab_size) * 2
    first, last = layers_in_flight(shape.n_layers, 2, base.micro_batches)
    assert estimate(base).memory.activations == max(first * one, last * one + head)
    dense = TrainingSetup(shape, data=4, global_batch=4 * shape.batch_size)
    moe = replace(dense, experts=8, top_k=2, expert_parallel=4)
    h, f, L = shape.d_model, shape.d_ff, shape.n_layers
    expert = 3 * h * f  # SwiGLU: gate, up and down matrices, no biases
    extra = L * (8 * expert / 4 - expert + 8 * h)  # 8 experts over 4 ranks, minus the MLP, routers
    assert estimate(moe).memory.parameters - estimate(dense).memory.parameters == pytest.approx(
        2 * extra
    )


def test_mfu_divides_by_the_dense_bf16_peak_whatever_the_format():
    for recipe in ("fp32", "tf32", "bf16 + fp32 master"):
        e = estimate(TrainingSetup(SMALL, recipe, data=4, global_batch=16, recompute="none"))
        bf16 = 4 * GPUS[e.setup.gpu].peak_flops["bf16"]
        assert e.mfu == pytest.approx(e.model_flops / (e.step_s * bf16), rel=1e-12), recipe
    # an fp32 step's MFU is its matmul efficiency times fp32's share of the bf16 peak
    alone = estimate(TrainingSetup(SMALL, "fp32", global_batch=4, recompute="none"))
    peaks = GPUS[alone.setup.gpu].peak_flops
    efficiency = alone.setup.assumptions.matmul_efficiency
    assert alone.mfu == pytest.approx(efficiency * peaks["fp32"] / peaks["bf16"], rel=1e-12)
