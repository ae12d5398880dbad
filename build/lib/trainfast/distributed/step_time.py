"""The book's one model of a training step: memory per GPU and seconds per step of a layout.

:func:`estimate` takes a :class:`TrainingSetup` (the model, the recipe, the layout ``data x
context x tensor x pipeline`` with optional interleaving and experts, the recomputation choice)
and :class:`StepAssumptions` (what cannot be derived: utilisation, overlap, the links), and
returns a :class:`StepEstimate`. The layout calculator (:mod:`~trainfast.distributed.layout`),
the browser widget (its data come from :mod:`trainfast.calculator`, and
``book/_static/calculator.js`` repeats this module line for line) and the chapters all call it.

**Placement.** Ranks are ordered ``[tensor, context, pipeline, data]``, innermost first, as in
Llama 3 (Dubey et al. 2024, Section 3.3.2): a group talks over NVLink when its span (the
product of its size and the sizes inside it) fits in a node, else over the network, one port per
GPU; a data-parallel group across nodes reduces inside each node first and shares the node's
ports (:func:`data_parallel_link`, ``StepAssumptions.hierarchical_data_parallel``); the experts'
replicas are ``t c p e`` apart (the expert group is the innermost ``e`` of the data axis), so
fewer of them share a node's ports.

**Memory per GPU.** Model state: the dense parameters over ``t p``, the experts over ``t p e``
(``e`` = expert parallelism), times the recipe's bytes per parameter
(:func:`~trainfast.accounting.bytes_per_parameter`), sharded by the ZeRO stage over the ``d c``
ranks that hold the same weights (``d c / e`` for the experts). Activations: one micro-batch per
layer (:func:`layer_activation_bytes`, divided by ``c``), for the layers a stage keeps alive
(:func:`layers_in_flight`: ``ceil(L / p) min(p, m)`` under 1F1B, the peak of
:func:`~trainfast.distributed.pipeline.interleaved_schedule` under interleaved 1F1B); the head
(:func:`~trainfast.accounting.head_activation_values`: the final norm and ``V / t`` logits) lives on
the last stage, which keeps fewer micro-batches alive, so the peak is the larger of the first stage
and the last stage with it. Sequence parallelism is a choice (``sequence_parallel``), as it is in
Megatron-LM; it divides every activation by ``t`` and adds two all-gathers per layer in backward.

**Time.** Compute: the step's matmul FLOPs (:func:`~trainfast.accounting.training_flops`, MLP times
``k`` routed experts, plus what recomputation repeats: hardware FLOPs) over ``n_gpus x peak x
matmul_efficiency``, at the peak of the recipe's matmul format. Whole-step MFU and HFU are outputs
(:attr:`StepEstimate.mfu`, :attr:`StepEstimate.hfu`), not inputs, over the dense bf16 peak whatever
the format (:mod:`trainfast.utilization`). Bubble: ``(p - 1) / (v m)`` of the compute and of the
critical-path tensor, context and expert communication that fills the same slots (Narayanan et al.
2021, Section 2.2). Tensor parallelism: 4 ring all-reduces of a micro-batch's activations per layer
(6 with full recomputation: the forward runs twice), on the critical path (Shoeybi et al. 2019).
Context parallelism (ring attention): ``c - 1`` steps per layer, each sending a key/value block
(``n_kv_heads`` heads) while the previous block's causal attention computes (with the balanced
split, half a full block per step, :func:`context_block_scores`); only the excess is counted.
Experts: 4 all-to-alls per MoE layer (6 with full recomputation). Pipeline: 2 point-to-point
messages per micro-batch, stage boundary and virtual stage. Data parallelism:
:func:`data_parallel_bytes` (stages 0 and 1: one all-reduce of the accumulated gradients; stage 2: a
reduce-scatter per micro-batch, or one with ``accumulate_before_reduce``, and an all-gather of the
weights; stage 3: per micro-batch two all-gathers and a reduce-scatter, or one reduce-scatter a
step, Rajbhandari et al. 2020). ``overlap`` of the backward hides the gradient reduction: the last
micro-batch's backward a reduction that waits for the accumulated gradient (stages 0 and 1, and 2
with ``accumulate_before_reduce``), every micro-batch's for stage 2's reduce-scatters; ZeRO-2's
all-gather of the updated weights follows the optimizer step, after the last backward, so the
model hides none of it (at best it could overlap the next step's forward); stage 3's traffic
hides behind all the compute, as FSDP prefetches.

Not modelled: kernel efficiency beyond the one ``matmul_efficiency``, stragglers, the
embedding stage's imbalance, communication buffers and fragmentation (the ``reserve``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainfast.accounting import (
    MemoryBreakdown,
    activation_bytes,
    bytes_per_parameter,
    checkpointed_layer_bytes,
    head_activation_values,
    linear_training_flops,
    loss_buffer_bytes,
    mlp_parameter_count,
    parameter_count,
    training_flops,
    zero_memory,
)
from trainfast.distributed.cost_model import (
    Link,
    all_gather_time,
    all_reduce_time,
    reduce_scatter_time,
)

# the model's inputs, re-exported for their callers; documented where they live
from trainfast.distributed.training_setup import NVLINK_GPUS as NVLINK_GPUS
from trainfast.distributed.training_setup import RECOMPUTE as RECOMPUTE
from trainfast.distributed.training_setup import Recompute as Recompute
from trainfast.distributed.training_setup import StepAssumptions as StepAssumptions
from trainfast.distributed.training_setup import TrainingSetup as TrainingSetup
from trainfast.recipes import RECIPES
from trainfast.transformer import TransformerShape
from trainfast.utilization import mfu_peak_flops, model_flops_utilization
from trainfast.validation import check_counts, check_instance, check_int, check_number

__all__ = [
    "StepEstimate",
    "all_to_all_time",
    "context_block_scores",
    "data_parallel_bytes",
    "data_parallel_link",
    "estimate",
    "layer_activation_bytes",
    "layers_in_flight",
]


@dataclass(frozen=True)
class StepEstimate:
    """Memory per GPU by part (bytes), whether it fits, and a step's time by part (seconds)."""

    setup: TrainingSetup
    memory: MemoryBreakdown
    fits: bool
    compute_s: float  # matmul FLOPs (with recomputation) at matmul_efficiency
    bubble_s: float  # the pipeline's idle slots: (compute + TP, CP, EP comms) x (p - 1) / (v m)
    data_parallel_s: float  # gradient reduction (+ ZeRO-3 gathers) not hidden by overlap
    tensor_parallel_s: float  # activation all-reduces, on the critical path
    context_parallel_s: float  # ring attention's key/value sends beyond the block compute
    expert_parallel_s: float  # all-to-alls of the routed tokens
    pipeline_s: float  # point-to-point sends between stages
    model_flops: float  # the step's FLOPs without recomputation
    hardware_flops: float  # with what recomputation repeats (Korthikanti et al.'s HFU counts it)
    peak_flops: float  # MFU's denominator: every GPU's dense bf16 peak (mfu_peak_flops)

    @property
    def mfu(self) -> float:
        """Whole-step model FLOPs utilisation, the book's one convention
        (:mod:`trainfast.utilization`): model FLOPs over step time x the GPUs' dense bf16 peak,
        whatever format the recipe's matmuls run in."""
        return model_flops_utilization(self.model_flops, self.step_s, self.peak_flops)

    @property
    def hfu(self) -> float:
        """Whole-step hardware FLOPs utilisation: recomputation counted (Korthikanti et al.),
        over the same peak."""
        return model_flops_utilization(self.hardware_flops, self.step_s, self.peak_flops)

    @property
    def step_s(self) -> float:
        return (
            self.compute_s
            + self.bubble_s
            + self.data_parallel_s
            + self.tensor_parallel_s
            + self.context_parallel_s
            + self.expert_parallel_s
            + self.pipeline_s
        )


def layer_activation_bytes(
    shape: TransformerShape,
    tensor: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    *,
    value_bytes: float = 2.0,
    dropout: bool = False,
) -> float:
    """Bytes one layer keeps for backward for one micro-batch, by recomputation choice.

    ``"none"``: everything, :func:`~trainfast.accounting.activation_bytes` with the attention
    scores (Korthikanti et al. 2022: ``s b h (34 + 5 a s / h)`` for 2-byte values and dropout).
    ``sequence_parallel`` as Megatron-LM and
    :class:`~trainfast.distributed.sequence_parallel.ParallelTransformerBlock` build it: the
    all-gathered inputs of the QKV and first MLP matmuls are kept as this rank's shard and
    gathered again in backward, so every term is divided by ``t``: ``s b h (34 + 5 a s / h) / t``
    (a test checks it against the bytes the block saves).
    ``"selective"``: the attention core is recomputed, so the scores, softmax and its dropout
    are not kept: the fused-attention count, ``34 s b h`` plus an fp32 log-sum-exp per head and
    token (``4 a s b`` bytes, which the paper does not count). ``"full"``: only the layer's
    input (:func:`~trainfast.accounting.checkpointed_layer_bytes`).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"Invalid recompute: {recompute!r} (expected one of {RECOMPUTE})")
    if recompute == "full":
        return checkpointed_layer_bytes(shape, tensor, sequence_parallel, value_bytes=value_bytes)
    attention = "manual" if recompute == "none" else "sdpa"
    return activation_bytes(
        shape,
        tensor,
        sequence_parallel,
        value_bytes=value_bytes,
        dropout=dropout,
        attention=attention,
    )


def _sizes(**sizes: float) -> None:
    """Each of ``sizes`` is a finite number >= 0 (of parameters or bytes)."""
    for name, value in sizes.items():
        check_number(name, value, minimum=0.0)


def layers_in_flight(
    n_layers: int, pipeline: int, micro_batches: int, virtual_stages: int = 1
) -> tuple[int, int]:
    """Layers' activations the first and the last pipeline stage keep alive at their peak.

    1F1B: stage ``r`` runs ``p - r`` forwards before its first backward, so ``min(p - r, m)``
    micro-batches of ``ceil(L / p)`` layers. Interleaved 1F1B: rank ``r`` runs
    ``2 (p - r - 1) + (v - 1) p`` warm-up forwards of chunks of ``ceil(L / (p v))`` layers, then
    one more before its first backward; at most all ``m v`` chunks (the peak of the pipeline
    module's ``interleaved_schedule``). With ``m = p`` that is ``L``,
    below Korthikanti et al.'s ``L (1 + (p - 1) / (p v))``, which holds for ``m`` large.
    """
    p, m, v = pipeline, micro_batches, virtual_stages
    check_counts(n_layers=n_layers, pipeline=p, micro_batches=m, virtual_stages=v)
    if v == 1:
        stage = -(-n_layers // p)
        return stage * min(p, m), stage * min(1, m)
    chunk = -(-n_layers // (p * v))
    return chunk * min(v * p + p - 1, m * v), chunk * min((v - 1) * p + 1, m * v)


def context_block_scores(seq_len: int, context: int) -> float:
    """Causal attention scores one rank computes per ring step with the balanced split.

    Each rank holds chunks ``r`` and ``2c - 1 - r`` of ``2c``; at every step but the first it
    meets one full ``(s / 2c)^2`` block of each of two chunk pairs and skips the other two: half
    of the ``(s / c)^2`` a non-causal step computes (the context-parallel module's
    ``ring_attention_work`` counts them; a test compares)."""
    check_counts(seq_len=seq_len, context=context)
    return (seq_len / context) ** 2 / 2


def data_parallel_bytes(
    n_parameters: float,
    replicas: int,
    zero_stage: int,
    micro_batches: int,
    gradient_bytes: float,
    parameter_bytes: float,
    accumulate_before_reduce: bool = False,
) -> float:
    """Bytes each rank sends per step for data parallelism with ring collectives (a
    reduce-scatter or all-gather of ``B`` bytes sends ``(N - 1) B / N``, an all-reduce twice).

    Stages 0 and 1: one all-reduce of the gradients accumulated over the ``m`` micro-batches
    (DDP's ``no_sync``; stage 1 as Megatron-LM's distributed optimizer does it, a reduce-scatter
    then an all-gather of the updated weights: the same bytes when ``parameter_bytes`` equals
    ``gradient_bytes``, fewer when the weights are narrower, which this model does not credit).
    Stage 2: sharded gradients cannot
    accumulate a full gradient, so every micro-batch's backward reduce-scatters (as our
    ``Zero2Optimizer`` does), then one all-gather of the weights.
    Stage 3: per micro-batch, a reduce-scatter and all-gathers of the weights for forward and for
    backward. ``accumulate_before_reduce`` (Llama 3's FSDP, PyTorch's pipelining): the unsharded
    gradients add up over the micro-batches and are reduce-scattered once a step."""
    check_counts(replicas=replicas, micro_batches=micro_batches)
    _sizes(
        n_parameters=n_parameters, gradient_bytes=gradient_bytes, parameter_bytes=parameter_bytes
    )
    check_int("zero_stage", zero_stage, minimum=0, maximum=3)
    share = (replicas - 1) / replicas
    grads, weights = n_parameters * gradient_bytes, n_parameters * parameter_bytes
    reductions = 1 if accumulate_before_reduce else micro_batches  # reduce-scatters a step
    if zero_stage <= 1:
        return 2 * share * grads
    if zero_stage == 2:
        return share * (reductions * grads + weights)
    return share * (reductions * grads + 2 * micro_batches * weights)


def all_to_all_time(n_bytes: float, world_size: int, link: Link) -> float:
    """Pairwise all-to-all of ``n_bytes`` per rank: ``(N-1) alpha + ((N-1)/N) n beta`` (each rank
    keeps ``1 / N`` and sends one block to each of the others, Thakur et al. 2005)."""
    check_counts(world_size=world_size)
    _sizes(n_bytes=n_bytes)
    check_instance("link", link, Link)
    n = world_size
    return (n - 1) * link.alpha + (n - 1) / n * n_bytes * link.beta


def _link(span: int, nvlink_bytes_per_s: float, a: StepAssumptions) -> Link:
    """NVLink (one direction) if a group of ``span`` consecutive GPUs fits in a node."""
    if span <= a.gpus_per_node:
        return Link(alpha=a.nvlink_latency_s, beta=2.0 / nvlink_bytes_per_s)
    return Link(alpha=a.network_latency_s, beta=1.0 / a.network_bytes_per_s)


def data_parallel_link(
    inner: int, data: int, nvlink_bytes_per_s: float, assumptions: StepAssumptions
) -> Link:
    """The link a data-parallel group's ring sees: ``data`` ranks ``inner = t c p`` apart.

    Inside a node, NVLink. Across nodes with ``hierarchical_data_parallel``, each node holds
    ``g = gpus_per_node / min(inner, gpus_per_node)`` ranks of the group, and the reduction is
    ``g`` rings (channels), each leaving the node through a different rank's port: a rank sends
    ``1 / g`` of the ring's bytes over its port and the other ``(g - 1) / g`` over NVLink, at
    the same time, so the slower of the two binds: ``beta = max(beta_port / g, (g - 1) / g x
    beta_NVLink)`` (the port binds with 400 Gb/s ports and an H100's NVLink; NVLink binds with
    ``g = 8`` on an A100, or with a faster port). The node's ports are shared by the ``min(inner,
    gpus_per_node)`` groups that cross them. The ring's ``(N-1)/N`` over all ``N`` ranks, not
    over the nodes, is kept (it differs by under ``1 / nodes``); ``inner`` that does not divide
    ``gpus_per_node`` (a fractional ``g``) or a last node only partly filled is priced as if the
    ranks spread evenly, an idealisation. Without it, one port per rank (:func:`_link`).
    """
    a = assumptions
    check_int("inner", inner, minimum=1)
    check_int("data", data, minimum=1)
    link = _link(inner * data, nvlink_bytes_per_s, a)
    if inner * data <= a.gpus_per_node or not a.hierarchical_data_parallel:
        return link
    g = a.gpus_per_node / min(inner, a.gpus_per_node)  # the group's ranks in a node
    nvlink_beta = _link(1, nvlink_bytes_per_s, a).beta
    return Link(alpha=link.alpha, beta=max(link.beta / g, (g - 1) / g * nvlink_beta))


def estimate(setup: TrainingSetup) -> StepEstimate:
    """Memory per GPU and step time of ``setup`` (the model is in the module's docstring)."""
    check_instance("setup", setup, TrainingSetup)
    a, shape, gpu = setup.assumptions, setup.shape, NVLINK_GPUS[setup.gpu]
    d, t, p, c = setup.data, setup.tensor, setup.pipeline, setup.context
    v, m, k, e = setup.virtual_stages, setup.micro_batches, setup.top_k, setup.expert_parallel
    h, f, L = shape.d_model, shape.d_ff, shape.n_layers
    value_bytes = RECIPES[setup.recipe].activation_bytes_per_value
    routed = replace(shape, d_ff=f * k)  # the k experts a token visits: k times the MLP
    local = replace(routed, seq_len=shape.seq_len // c)  # this rank's share of the sequence
    stage_layers = -(-L // p)
    nvlink = gpu.nvlink_bytes_per_s

    # memory: model state of one slice, sharded by ZeRO over the ranks holding the same weights
    per = bytes_per_parameter(setup.recipe, setup.optimizer)
    mlp = mlp_parameter_count(shape)  # one expert's
    expert_params = L * setup.experts * mlp if setup.experts > 1 else 0
    dense_params = parameter_count(shape) - (L * mlp if setup.experts > 1 else 0)
    dense_params += L * h * setup.experts if setup.experts > 1 else 0  # the routers
    parts = [(dense_params / (t * p), d * c), (expert_params / (t * p * e), d * c // e)]
    state = [0.0, 0.0, 0.0, 0.0]  # weights, gradients, master weights, optimizer state
    # ZeRO-2 and 3 accumulating before the reduction hold whole gradients during the step
    accumulate = a.accumulate_before_reduce and setup.zero_stage >= 2 and m > 1
    for n, replicas in parts:
        shard = zero_memory(
            n, replicas, setup.zero_stage, per.parameters, per.gradients, per.optimizer_state
        )
        master = zero_memory(n, replicas, setup.zero_stage, optimizer_bytes=per.master_weights)
        state[0] += shard.parameters
        state[1] += n * per.gradients if accumulate else shard.gradients
        state[2] += master.optimizer_state  # master weights shard like the moments
        state[3] += shard.optimizer_state
    sp = setup.sequence_parallel and t > 1
    one = layer_activation_bytes(
        local, t, sp, setup.recompute, value_bytes=value_bytes, dropout=setup.dropout
    )
    first, last = layers_in_flight(L, p, m, v)
    working = 0.0
    if setup.recompute == "full":  # backward recomputes one layer's activations at a time
        working = layer_activation_bytes(
            local, t, sp, "selective", value_bytes=value_bytes, dropout=setup.dropout
        )
    head = local.tokens * head_activation_values(shape, t) * value_bytes  # on the last stage
    activations = max(first * one, last * one + head) + working
    # the loss's float32 buffers at the start of backward, on the last stage: in the peak, not
    # in the total that places the stages
    loss = loss_buffer_bytes(local, t, value_bytes=value_bytes)
    memory = MemoryBreakdown(*state, activations=activations, loss_buffers=loss)

    # compute at mfu, the bubble, then communication
    step = replace(routed, batch_size=setup.global_batch)
    flops = model_flops = training_flops(step)
    attention_forward = step.batch_size * shape.n_heads * 4 * shape.seq_len**2 * shape.head_dim
    if setup.recompute == "full":  # one more forward of every layer
        flops += (flops - linear_training_flops(step.tokens, h, shape.vocab_size)) / 3
    elif setup.recompute == "selective":  # one more forward of the attention core
        flops += L * attention_forward
    peak = gpu.peak_flops[RECIPES[setup.recipe].compute_format]
    achieved = peak * a.matmul_efficiency
    compute = flops / (setup.n_gpus * achieved)
    forwards = 2 if setup.recompute == "full" else 1  # full recomputation runs it twice

    activation = local.tokens * h * value_bytes  # one micro-batch's (s / c, b, h) on this rank
    tp_link = _link(t, nvlink, a)
    tensor = 2 * (forwards + 1) * all_reduce_time("ring", activation, t, tp_link)
    if sp:  # backward gathers each region's input again: two more all-gathers per layer
        tensor += 2 * all_gather_time(activation, t, tp_link)
    tensor_parallel = tensor * stage_layers * m

    context_parallel = 0.0
    if c > 1:
        kv_heads = max(shape.kv_heads / t, 1)  # this rank's key/value heads (GQA: fewer)
        kv_block = 2 * local.tokens * kv_heads * shape.head_dim * value_bytes  # K and V
        send = _link(t * c, nvlink, a)
        scores = context_block_scores(shape.seq_len, c)  # causal, balanced split
        block_s = shape.batch_size * shape.n_heads / t * 4 * scores * shape.head_dim
        block_s /= achieved  # one ring step of attention forward (QK^T and PV) on this rank
        forward = max(0.0, send.alpha + kv_block * send.beta - block_s)
        backward = max(0.0, send.alpha + 2 * kv_block * send.beta - 2 * block_s)  # + dK, dV
        per_layer = (c - 1) * (forwards * forward + backward)
        context_parallel = per_layer * stage_layers * m

    expert_parallel = 0.0
    if e > 1:
        routed_bytes = activation / t * k  # the tokens of this rank, k copies
        one_a2a = all_to_all_time(routed_bytes, e, _link(t * c * p * e, nvlink, a))
        expert_parallel = 2 * (forwards + 1) * one_a2a * stage_layers * m

    # the bubble's idle slots also hold the critical-path communication of the stage's layers
    bubble = (compute + tensor_parallel + context_parallel + expert_parallel) * (p - 1) / (v * m)

    pipeline = 0.0
    if p > 1:
        hop = _link(t * c * p, nvlink, a)
        pipeline = 2 * v * m * (hop.alpha + activation / t * hop.beta)

    reduce_s = gather_s = 0.0  # the gradient reduction, and the gathers of weights
    # each part has its own ring: the dense replicas are d ranks t c p apart; the expert group is
    # the innermost e of the data axis (the all-to-all's span), so the ranks holding the same
    # experts are d / e ranks t c p e apart, fewer to a node (when e does not divide d the group
    # takes context ranks too: priced as one port per rank, an upper estimate)
    expert_link = (
        data_parallel_link(t * c * p * e, d // e, nvlink, a)
        if d % e == 0
        else data_parallel_link(t * c * p * d, 1, nvlink, a)
    )
    links = [data_parallel_link(t * c * p, d, nvlink, a), expert_link]
    replicas = [(n, r, link) for (n, r), link in zip(parts, links, strict=True) if n and r > 1]
    reductions = 1 if accumulate else m  # ZeRO-2 and 3: reduce-scatters a step
    for n, r, data_link in replicas:  # the collectives of data_parallel_bytes, with latencies
        grad_bytes, weight_bytes = n * per.gradients, n * per.parameters
        if setup.zero_stage <= 1:
            reduce_s += all_reduce_time("ring", grad_bytes, r, data_link)
        elif setup.zero_stage == 2:  # reduce-scatters, then one gather of the updated weights
            reduce_s += reductions * reduce_scatter_time(grad_bytes, r, data_link)
            gather_s += all_gather_time(weight_bytes, r, data_link)
        else:  # and gather the weights for every forward and backward
            reduce_s += reductions * reduce_scatter_time(grad_bytes, r, data_link)
            gather_s += 2 * m * all_gather_time(weight_bytes, r, data_link)
    # what hides it: the last micro-batch's backward (with its recomputation) a reduction of the
    # accumulated gradients, every micro-batch's backward stage 2's reduce-scatters; ZeRO-2's
    # gather follows the optimizer step (nothing hides it); ZeRO-3 prefetches behind all compute
    backward = compute * (forwards + 1) / (forwards + 2)
    if setup.zero_stage == 3:
        data_parallel = max(0.0, reduce_s + gather_s - a.overlap * compute)
    else:
        hidden = backward if setup.zero_stage == 2 and not accumulate else backward / m
        data_parallel = max(0.0, reduce_s - a.overlap * hidden) + gather_s

    return StepEstimate(
        setup=setup,
        memory=memory,
        fits=memory.total <= gpu.memory_bytes * (1 - a.reserve),
        compute_s=compute,
        bubble_s=bubble,
        data_parallel_s=data_parallel,
        tensor_parallel_s=tensor_parallel,
        context_parallel_s=context_parallel,
        expert_parallel_s=expert_parallel,
        pipeline_s=pipeline,
        model_flops=model_flops,
        hardware_flops=flops,
        peak_flops=mfu_peak_flops(gpu, setup.n_gpus),
    )
