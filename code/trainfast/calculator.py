"""Will it fit, and how long will a step take? The formulas behind the book's calculator widget.

:func:`estimate` composes :mod:`trainfast.accounting` (parameters, FLOPs, bytes per parameter,
ZeRO sharding, activations) and the alpha-beta all-reduce model of
:mod:`trainfast.distributed.cost_model` for one training step of the book's transformer on
``data x tensor x pipeline`` GPUs. The widget (``book/_static/calculator.js``) repeats these
formulas in JavaScript; the build exports the presets and a grid of cases computed here
(:func:`export`, ``python -m trainfast.calculator --out FILE``) and a browser test checks the
widget against them, so the two cannot drift apart.

**Memory per GPU.** Model state: the ``N / (t p)`` parameters of one tensor and pipeline slice
(an even split; really the first and last stages also hold the embeddings), times the recipe's
bytes per parameter (:func:`~trainfast.accounting.bytes_per_parameter`), sharded over the ``d``
data-parallel ranks by the ZeRO stage (:func:`~trainfast.accounting.zero_memory`).
Activations: one micro-batch per layer (:func:`~trainfast.accounting.activation_bytes`, fused
attention, no dropout, sequence parallelism when ``t > 1``), for the ``L / p`` layers of a
stage times the ``min(p, m)`` micro-batches a 1F1B stage keeps alive, plus the head's (final
LayerNorm and ``V / t`` logits per token). With checkpointing a layer keeps only its input and
one layer's activations are recomputed at a time.

**Step time.** Compute: the step's matmul FLOPs (:func:`~trainfast.accounting.training_flops`,
plus one more forward with checkpointing) over ``n_gpus x peak x mfu``; the pipeline idles for
the 1F1B bubble, a fraction ``(p - 1) / m`` of it. Communication, with no overlap (an upper
estimate): the gradient all-reduce over ``d`` ranks (ZeRO-3 adds 50 %: it gathers the weights
again for backward), four activation all-reduces per layer and micro-batch over ``t`` ranks, and
two point-to-point sends per micro-batch and stage boundary. Links inside a node of
:data:`GPUS_PER_NODE` GPUs are NVLink, between nodes the network.

Not modelled: overlap of communication with compute, kernel efficiency beyond the one ``mfu``,
the CUDA context and allocator slack (the widget leaves :data:`RESERVE` of memory free).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from trainfast.accounting import (
    OPTIMIZER_MOMENTS,
    PRECISION_RECIPES,
    PRESET_SHAPES,
    MemoryBreakdown,
    TransformerShape,
    activation_bytes,
    bytes_per_parameter,
    checkpointed_layer_bytes,
    parameter_count,
    training_flops,
    zero_memory,
)
from trainfast.distributed.cost_model import Link, all_reduce_time
from trainfast.gpus import GPUS

__all__ = [
    "GPUS_PER_NODE",
    "NVLINK_GPUS",
    "LINK_LATENCY_S",
    "NETWORK_BYTES_PER_S",
    "RESERVE",
    "StepEstimate",
    "TrainingSetup",
    "estimate",
    "export",
    "write_script",
]

#: GPUs that share NVLink: an HGX/DGX H100 or A100 board has 8.
GPUS_PER_NODE = 8
#: The GPUs the calculator offers: those built into NVLink nodes (not the L4 or T4).
NVLINK_GPUS = {name: spec for name, spec in GPUS.items() if spec.nvlink_bytes_per_s}
#: Bytes/s one GPU sends to other nodes: one 400 Gb/s InfiniBand port per GPU (DGX H100
#: datasheet: 8 single-port ConnectX-7 400 Gb/s).
NETWORK_BYTES_PER_S = 400e9 / 8
#: Seconds of latency per message (alpha) assumed for every link: an order of magnitude of
#: NCCL's small-message all-reduce time, not a measurement.
LINK_LATENCY_S = 10e-6
#: Fraction of a GPU's memory left for the CUDA context, the allocator and temporary buffers.
RESERVE = 0.1

#: Matmul format of each precision recipe (a key of ``GPUSpec.peak_flops``).
_COMPUTE_FORMAT = {"fp32": "fp32", "amp": "bf16"}


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Invalid {name}: {value!r} (expected a positive integer)")


@dataclass(frozen=True)
class TrainingSetup:
    """One training configuration. ``shape.batch_size`` is the micro-batch (sequences per GPU
    per forward); ``global_batch`` is in sequences and must be a multiple of ``micro_batch x
    data``; the quotient is ``m``, the micro-batches per step (gradient accumulation, or the
    pipeline's micro-batches). ``mfu`` is the assumed model FLOPs utilisation of the matmuls."""

    shape: TransformerShape
    recipe: str = "bf16-mixed"
    optimizer: str = "adamw"
    zero_stage: int = 0
    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    global_batch: int = 1
    gpu: str = "H100 SXM 80GB"
    checkpointing: bool = False
    mfu: float = 0.4

    def __post_init__(self) -> None:
        for name in ("data", "tensor", "pipeline", "global_batch"):
            _positive(name, getattr(self, name))
        bytes_per_parameter(self.recipe, self.optimizer)  # checks both names
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"Invalid zero_stage: {self.zero_stage!r} (expected 0, 1, 2 or 3)")
        if self.gpu not in NVLINK_GPUS:
            raise ValueError(f"Unknown gpu: {self.gpu!r} (expected one of {sorted(NVLINK_GPUS)})")
        if self.shape.n_heads % self.tensor:
            raise ValueError(
                f"Invalid tensor: {self.tensor} (must divide n_heads = {self.shape.n_heads})"
            )
        if self.shape.n_layers % self.pipeline:
            raise ValueError(
                f"Invalid pipeline: {self.pipeline} (must divide n_layers = {self.shape.n_layers})"
            )
        if self.global_batch % (self.shape.batch_size * self.data):
            raise ValueError(
                f"Invalid global_batch: {self.global_batch} (must be a multiple of micro-batch "
                f"{self.shape.batch_size} x data {self.data})"
            )
        if isinstance(self.mfu, bool) or not 0 < self.mfu <= 1:
            raise ValueError(f"Invalid mfu: {self.mfu!r} (expected 0 < mfu <= 1)")

    @property
    def n_gpus(self) -> int:
        return self.data * self.tensor * self.pipeline

    @property
    def micro_batches(self) -> int:
        """``m``: micro-batches each pipeline runs per step."""
        return self.global_batch // (self.shape.batch_size * self.data)


@dataclass(frozen=True)
class StepEstimate:
    """Memory per GPU by part (bytes), whether it fits, and a step's time by part (seconds)."""

    memory: MemoryBreakdown
    fits: bool
    compute_s: float
    bubble_s: float
    data_parallel_s: float
    tensor_parallel_s: float
    pipeline_s: float

    @property
    def step_s(self) -> float:
        return (
            self.compute_s
            + self.bubble_s
            + self.data_parallel_s
            + self.tensor_parallel_s
            + self.pipeline_s
        )


def _link(group: int, gpus_per_group_member: int, nvlink_bytes_per_s: float) -> Link:
    """NVLink (one direction: the datasheet counts both) if the group fits in a node."""
    inside = group * gpus_per_group_member <= GPUS_PER_NODE
    bandwidth = nvlink_bytes_per_s / 2 if inside else NETWORK_BYTES_PER_S
    return Link(alpha=LINK_LATENCY_S, beta=1.0 / bandwidth)


def estimate(setup: TrainingSetup) -> StepEstimate:
    """Memory per GPU and step time of ``setup`` (the model is in the module's docstring)."""
    shape, gpu = setup.shape, NVLINK_GPUS[setup.gpu]
    d, t, p, m = setup.data, setup.tensor, setup.pipeline, setup.micro_batches
    recipe = PRECISION_RECIPES[setup.recipe]
    value_bytes = recipe.activation_bytes_per_value

    # memory: model state of one slice, sharded by ZeRO; master weights shard like the moments
    per = bytes_per_parameter(setup.recipe, setup.optimizer)
    local = parameter_count(shape) / (t * p)
    state = zero_memory(
        local, d, setup.zero_stage, per.parameters, per.gradients, per.optimizer_state
    )
    master = zero_memory(local, d, setup.zero_stage, optimizer_bytes=per.master_weights)
    sequence_parallel = t > 1
    layer = activation_bytes(shape, t, sequence_parallel, value_bytes=value_bytes, attention="sdpa")
    layers_alive = shape.n_layers // p * min(p, m)
    if setup.checkpointing:
        kept = checkpointed_layer_bytes(shape, t, sequence_parallel, value_bytes=value_bytes)
        layers = layers_alive * kept + layer
    else:
        layers = layers_alive * layer
    head = shape.tokens * (2 * shape.d_model + shape.vocab_size / t) * value_bytes
    memory = MemoryBreakdown(
        parameters=state.parameters,
        gradients=state.gradients,
        master_weights=master.optimizer_state,
        optimizer_state=state.optimizer_state,
        activations=layers + head,
    )

    # time: compute at mfu, the pipeline bubble, then communication with no overlap
    flops = training_flops(replace(shape, batch_size=setup.global_batch))
    if setup.checkpointing:
        flops *= 4 / 3  # one more forward: 2 of the 6 FLOPs per weight and token
    peak = gpu.peak_flops[_COMPUTE_FORMAT.get(setup.recipe, "bf16")]
    compute = flops / (setup.n_gpus * peak * setup.mfu)
    bubble = compute * (p - 1) / m
    grad_bytes = local * per.gradients
    data_link = _link(d, t * p, gpu.nvlink_bytes_per_s)
    data_parallel = all_reduce_time("ring", grad_bytes, d, data_link)
    if setup.zero_stage == 3:
        data_parallel *= 1.5
    activation = shape.tokens * shape.d_model * value_bytes  # one micro-batch's (s, b, h)
    tensor_link = _link(t, 1, gpu.nvlink_bytes_per_s)
    per_layer = 4 * all_reduce_time("ring", activation, t, tensor_link)
    tensor_parallel = per_layer * (shape.n_layers // p) * m
    stage_link = _link(t * p, 1, gpu.nvlink_bytes_per_s)
    pipeline = 2 * m * (stage_link.alpha + activation / t * stage_link.beta) if p > 1 else 0.0
    return StepEstimate(
        memory=memory,
        fits=memory.total <= gpu.memory_bytes * (1 - RESERVE),
        compute_s=compute,
        bubble_s=bubble,
        data_parallel_s=data_parallel,
        tensor_parallel_s=tensor_parallel,
        pipeline_s=pipeline,
    )


def _grid() -> list[TrainingSetup]:
    """The cases the browser test compares: every recipe, optimizer, ZeRO stage and GPU, and
    layouts with and without tensor and pipeline parallelism, checkpointing and accumulation."""
    small, large = PRESET_SHAPES["gpt2-small"], PRESET_SHAPES["llama2-7b-like"]
    cases = [
        TrainingSetup(
            replace(small, batch_size=8), recipe, optimizer, stage, data=4, global_batch=64, gpu=gpu
        )
        for recipe in PRECISION_RECIPES
        for optimizer in OPTIMIZER_MOMENTS
        for stage in (0, 3)
        for gpu in NVLINK_GPUS
    ]
    for t, p, d, stage, checkpointing in [
        (1, 1, 8, 1, False),
        (2, 1, 4, 2, False),
        (4, 2, 8, 1, True),
        (8, 4, 2, 3, True),
        (8, 8, 16, 1, False),
    ]:
        cases.append(
            TrainingSetup(
                replace(large, batch_size=1),
                zero_stage=stage,
                data=d,
                tensor=t,
                pipeline=p,
                global_batch=32 * d,
                checkpointing=checkpointing,
            )
        )
    return cases


def _setup_dict(setup: TrainingSetup) -> dict[str, Any]:
    out = {f.name: getattr(setup, f.name) for f in fields(setup) if f.name != "shape"}
    return {"shape": asdict(setup.shape), **out}


def _estimate_dict(result: StepEstimate) -> dict[str, Any]:
    memory = asdict(result.memory)
    return {
        "memory": {**memory, "total": result.memory.total},
        "fits": result.fits,
        "time": {
            "compute": result.compute_s,
            "bubble": result.bubble_s,
            "data_parallel": result.data_parallel_s,
            "tensor_parallel": result.tensor_parallel_s,
            "pipeline": result.pipeline_s,
            "step": result.step_s,
        },
    }


def export() -> dict[str, Any]:
    """Everything the widget needs, as JSON-ready data: the presets (shapes, recipes, optimizer
    moments, GPUs, constants) and the grid of cases with this module's results."""
    return {
        "shapes": {name: asdict(shape) for name, shape in PRESET_SHAPES.items()},
        "recipes": {name: asdict(recipe) for name, recipe in PRECISION_RECIPES.items()},
        "compute_format": {name: _COMPUTE_FORMAT.get(name, "bf16") for name in PRECISION_RECIPES},
        "optimizer_moments": dict(OPTIMIZER_MOMENTS),
        "gpus": {
            name: {
                "memory_bytes": spec.memory_bytes,
                "peak_flops": dict(spec.peak_flops),
                "nvlink_bytes_per_s": spec.nvlink_bytes_per_s,
            }
            for name, spec in NVLINK_GPUS.items()
        },
        "constants": {
            "gpus_per_node": GPUS_PER_NODE,
            "network_bytes_per_s": NETWORK_BYTES_PER_S,
            "link_latency_s": LINK_LATENCY_S,
            "reserve": RESERVE,
        },
        "cases": [
            {"setup": _setup_dict(setup), "result": _estimate_dict(estimate(setup))}
            for setup in _grid()
        ],
    }


def write_script(path: Path) -> None:
    """Write :func:`export` as a script that sets ``window.TRAINFAST_CALCULATOR`` (a script, not
    a ``.json`` file, so a page opened from the file system can load it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("window.TRAINFAST_CALCULATOR = " + json.dumps(export(), indent=1) + ";\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the .js file to write")
    write_script(parser.parse_args(argv).out)


if __name__ == "__main__":
    main()
