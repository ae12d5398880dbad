"""What the step-time model takes: a training configuration and the assumptions it rests on.

:class:`TrainingSetup` is one configuration (the model's shape, the recipe and optimizer, the
layout ``data x context x tensor x pipeline`` with interleaving and experts, the recomputation
choice), checked when it is made, each bad value named; :class:`StepAssumptions` holds what cannot
be derived (matmul efficiency, overlap, the links, the memory reserve), each with its source.
:func:`~trainfast.distributed.step_time.estimate` turns one into memory per GPU and step time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trainfast.accounting import bytes_per_parameter
from trainfast.distributed.cost_model import INFINIBAND_NDR, NVLINK4
from trainfast.gpus import GPUS
from trainfast.transformer import TransformerShape
from trainfast.validation import (
    check_flag,
    check_instance,
    check_int,
    check_number,
    check_positive,
)

__all__ = ["NVLINK_GPUS", "RECOMPUTE", "Recompute", "StepAssumptions", "TrainingSetup"]

Recompute = Literal["none", "selective", "full"]
#: Activation recomputation choices (Korthikanti et al. 2022): keep everything; recompute the
#: attention core (scores, softmax, dropout, scores x V) in backward; recompute whole layers.
RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")
#: The GPUs the model offers: those built into NVLink nodes (not the L4 or T4).
NVLINK_GPUS = {name: spec for name, spec in GPUS.items() if spec.nvlink_bytes_per_s}


@dataclass(frozen=True)
class StepAssumptions:
    """What the model cannot derive, each with where its default comes from.

    ``matmul_efficiency``: the fraction of the GPU's peak FLOP/s in the recipe's matmul format that
    the step's matmuls reach while they run, recomputed ones included (not an MFU). The default 0.5
    is the book's assumption, from no source and no measurement; the chapter shows which layout wins
    at 0.3 and 0.7. (A whole-step MFU such as Llama 3's 38-43 %, Dubey et al. 2024, Table 4, already
    contains the bubble and the communication this model adds, so it is an output here,
    ``StepEstimate.mfu``.)
    ``overlap``: the fraction of the backward that hides the gradient reduction (1: DDP's and
    Megatron's bucketed overlap works fully; 0: none, an upper estimate). The links: NVLink at
    half the GPU's datasheet figure (which counts both directions) with
    ``cost_model.NVLINK4``'s latency; across nodes one 400 Gb/s
    InfiniBand NDR port per GPU (a DGX H100 has eight ConnectX-7 ports),
    ``cost_model.INFINIBAND_NDR``. ``hierarchical_data_parallel``: a data-parallel group that
    spans nodes reduces inside each node over NVLink first, and the node's members of the group
    each send their share over their own port, so the node's ports are shared by the groups that
    cross them (the scaling book's GPU part, Austin et al. 2025); ``False``: every rank sends
    everything over its own port, an upper estimate
    (:func:`~trainfast.distributed.step_time.data_parallel_link`). Latencies are assumptions of
    a few microseconds per message, not measurements. ``reserve``: the share of memory left for the
    CUDA context, the allocator and buffers.
    ``accumulate_before_reduce``: how ZeRO-2 and 3 accumulate gradients over the ``m``
    micro-batches. ``False`` (as our ``Zero2Optimizer`` and DeepSpeed's ZeRO-2 do: "ZeRO stage
    >= 2 communicates during non gradient accumulation boundaries as well",
    ``deepspeed/runtime/engine.py``): every micro-batch's backward reduces into the shard, so no
    full gradient is kept. ``True`` (as PyTorch's pipelining does: it turns FSDP2's
    ``set_requires_gradient_sync`` off for every backward but the last,
    ``torch/distributed/pipelining/stage.py``; the book reads Llama 3 this way, Dubey et al. 2024,
    Section 3.3.2: "FP32 gradient accumulation during backward computation over multiple
    micro-batches" and "reduce-scatter gradients in FP32", which does not say how often):
    unsharded gradients add up locally and are reduce-scattered once a step, at the price of
    holding them whole during the step.
    """

    matmul_efficiency: float = 0.5
    overlap: float = 1.0
    gpus_per_node: int = 8
    nvlink_latency_s: float = NVLINK4.alpha
    network_latency_s: float = INFINIBAND_NDR.alpha
    network_bytes_per_s: float = INFINIBAND_NDR.bandwidth
    hierarchical_data_parallel: bool = True
    reserve: float = 0.1
    accumulate_before_reduce: bool = False

    def __post_init__(self) -> None:
        check_number("matmul_efficiency", self.matmul_efficiency, above=0.0, maximum=1.0)
        check_number("overlap", self.overlap, minimum=0.0, maximum=1.0)
        check_number("reserve", self.reserve, minimum=0.0, below=1.0)
        check_positive("gpus_per_node", self.gpus_per_node)
        check_number("nvlink_latency_s", self.nvlink_latency_s, minimum=0.0)
        check_number("network_latency_s", self.network_latency_s, minimum=0.0)
        check_number("network_bytes_per_s", self.network_bytes_per_s, above=0.0)
        check_flag("hierarchical_data_parallel", self.hierarchical_data_parallel)
        check_flag("accumulate_before_reduce", self.accumulate_before_reduce)


@dataclass(frozen=True)
class TrainingSetup:
    """One training configuration. ``shape.batch_size`` is the micro-batch (sequences per model
    replica per forward); ``global_batch`` is in sequences, a multiple of ``micro_batch x data``;
    the quotient is ``m``, the micro-batches per step. ``context`` splits each sequence (ring
    attention), ``virtual_stages`` interleaves ``v`` model chunks per pipeline rank.
    ``experts > 1`` makes every MLP a mixture of ``experts`` MLPs of ``d_ff``, ``top_k`` per
    token, sharded over ``expert_parallel`` ranks of the ``data x context`` group.
    ``sequence_parallel`` (with ``tensor > 1``) shards the token-wise regions over the tensor
    ranks, as :class:`~trainfast.distributed.sequence_parallel.ParallelTransformerBlock` does.
    ZeRO stages 2 and 3 are priced with ``pipeline > 1`` either way
    (``StepAssumptions.accumulate_before_reduce``); DeepSpeed's pipeline engine refuses them, and
    :func:`~trainfast.distributed.layout.layout_choices` offers them only when gradients
    accumulate before the reduction, as PyTorch's pipelining with FSDP does."""

    shape: TransformerShape
    recipe: str = "bf16 + fp32 master"
    optimizer: str = "adamw"
    zero_stage: int = 0
    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    virtual_stages: int = 1
    experts: int = 1
    top_k: int = 1
    expert_parallel: int = 1
    global_batch: int = 1
    gpu: str = "H100 SXM 80GB"
    recompute: str = "selective"
    dropout: bool = False
    sequence_parallel: bool = False
    assumptions: StepAssumptions = field(default_factory=StepAssumptions)

    def __post_init__(self) -> None:
        check_instance("shape", self.shape, TransformerShape)
        check_instance("assumptions", self.assumptions, StepAssumptions)
        for name in (
            "data",
            "tensor",
            "pipeline",
            "context",
            "virtual_stages",
            "experts",
            "top_k",
            "expert_parallel",
            "global_batch",
        ):
            check_positive(name, getattr(self, name))
        check_int("zero_stage", self.zero_stage, minimum=0, maximum=3)  # True is not stage 1
        check_flag("dropout", self.dropout)
        bytes_per_parameter(self.recipe, self.optimizer)  # checks both names
        check_flag("sequence_parallel", self.sequence_parallel)
        s, b = self.shape, self.shape.batch_size
        problems = [
            (self.zero_stage not in (0, 1, 2, 3), "zero_stage", "expected 0, 1, 2 or 3"),
            (self.gpu not in NVLINK_GPUS, "gpu", f"expected one of {sorted(NVLINK_GPUS)}"),
            (self.recompute not in RECOMPUTE, "recompute", f"expected one of {RECOMPUTE}"),
            (s.n_heads % self.tensor, "tensor", f"must divide n_heads = {s.n_heads}"),
            (s.d_ff % self.tensor, "tensor", f"must divide d_ff = {s.d_ff}"),
            (
                self.context > 1 and s.seq_len % (2 * self.context),  # the balanced split's chunks
                "context",
                f"2 x context must divide seq_len = {s.seq_len}",
            ),
            (
                self.pipeline * self.virtual_stages > s.n_layers,
                "virtual_stages",
                f"pipeline x virtual_stages must not exceed n_layers = {s.n_layers}",
            ),
            (self.top_k > self.experts, "top_k", f"must not exceed experts = {self.experts}"),
            (self.experts % self.expert_parallel, "expert_parallel", "must divide experts"),
            (
                (self.data * self.context) % self.expert_parallel,
                "expert_parallel",
                "must divide data x context",
            ),
            (
                self.global_batch % (b * self.data),
                "global_batch",
                f"must be a multiple of micro-batch {b} x data {self.data}",
            ),
        ]
        for bad, name, why in problems:
            if bad:
                raise ValueError(f"Invalid {name}: {getattr(self, name)!r} ({why})")
        if self.virtual_stages > 1 and self.micro_batches % self.pipeline:
            raise ValueError(
                f"Invalid global_batch: {self.global_batch!r} (interleaving needs micro-batches "
                f"{self.micro_batches} to be a multiple of pipeline {self.pipeline})"
            )

    @property
    def n_gpus(self) -> int:
        return self.data * self.context * self.tensor * self.pipeline

    @property
    def micro_batches(self) -> int:
        """``m``: micro-batches each pipeline runs per step."""
        return self.global_batch // (self.shape.batch_size * self.data)
