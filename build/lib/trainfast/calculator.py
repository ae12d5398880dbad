"""The data of the book's calculator widget: presets, assumptions, and cases to check it by.

The widget (``book/_static/calculator-accounting.js``, ``calculator-step.js`` and
``calculator.js``, hand-written) repeats
:func:`trainfast.distributed.step_time.estimate`, the book's one model of a training step, in
JavaScript. This module exports what it needs (:func:`export`): the preset shapes, precision
recipes, optimizers, GPUs and default assumptions, and a grid of cases with the Python results;
the HTML build writes them next to the widget (:func:`write_script`, called by
``book/_ext/build_support.py``; ``python -m trainfast.calculator --out FILE`` does the same),
and ``tests/test_calculator_widget.py`` checks in a browser that the widget gives the same
numbers on every case, so the two cannot drift apart.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from trainfast.accounting import LOSS_BYTES_PER_LOGIT, OPTIMIZER_MOMENTS
from trainfast.distributed.step_time import (
    NVLINK_GPUS,
    RECOMPUTE,
    StepAssumptions,
    StepEstimate,
    TrainingSetup,
    estimate,
)
from trainfast.recipes import RECIPES
from trainfast.transformer import MLP_KINDS, NORMS, POSITIONS, PRESET_SHAPES, TransformerShape

__all__ = [
    "DEFAULT_SHAPE",
    "WIDGET_SHAPES",
    "estimate_dict",
    "export",
    "grid",
    "setup_from_dict",
    "write_script",
]


#: The shapes the widget offers: GPT-2 small and XL, and the Llama presets as their papers give
#: them (RMSNorm, RoPE, SwiGLU, grouped-query attention in Llama 3, untied heads); the widget
#: counts every choice of :class:`~trainfast.transformer.TransformerShape` that the costs depend
#: on, as :mod:`trainfast.accounting` does.
WIDGET_SHAPES: dict[str, TransformerShape] = {
    name: PRESET_SHAPES[name]
    for name in ("gpt2-small", "gpt2-xl", "llama2-7b", "llama3-8b", "llama3-405b")
}
#: The preset a page gets when it names none the widget offers.
DEFAULT_SHAPE = "llama2-7b"

#: The shape's choices the widget shows, with what each may be.
_CHOICES = {"norm": NORMS, "positions": POSITIONS, "mlp": MLP_KINDS}
_SIZES = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "seq_len", "batch_size")
_FLAGS = ("qk_norm", "bias", "tied_head")

#: Small shapes with one modern choice each, and all of them, so the browser test meets every
#: branch of the widget's counts.
_CHOICE_SHAPES = [
    replace(PRESET_SHAPES["gpt2-small"], batch_size=2, **changes)
    for changes in (
        {"norm": "rmsnorm"},
        {"positions": "rope"},
        {"mlp": "swiglu"},
        {"mlp": "relu2", "bias": False},
        {"qk_norm": True, "n_kv_heads": 4},
        {"qk_norm": True, "positions": "rope"},
        {"tied_head": False, "n_kv_heads": 1},
    )
] + [replace(PRESET_SHAPES["tiny-modern"], vocab_size=512, d_model=64, seq_len=64, batch_size=4)]


def grid() -> list[TrainingSetup]:
    """The cases the browser test compares: every recipe, optimizer, ZeRO stage, GPU and
    recomputation choice, and layouts with tensor, pipeline (plain and interleaved), context and
    expert parallelism, sequence parallelism, grouped-query attention, dropout, accumulation and
    both ends of the overlap assumption, data parallelism across nodes with and without the
    hierarchical link (dense and expert replicas, port- and NVLink-bound), ZeRO-2 and 3 that
    accumulate before reducing, and an odd sequence length."""
    small, large = WIDGET_SHAPES["gpt2-small"], WIDGET_SHAPES["llama2-7b"]
    cases = [
        TrainingSetup(
            replace(small, batch_size=8), recipe, optimizer, stage, data=4, global_batch=64, gpu=gpu
        )
        for recipe in RECIPES
        for optimizer in OPTIMIZER_MOMENTS
        for stage in (0, 3)
        for gpu in NVLINK_GPUS
    ]
    # no overlap, and every rank on its own network port (hierarchical_data_parallel off)
    no_overlap = StepAssumptions(
        overlap=0.0, matmul_efficiency=0.7, hierarchical_data_parallel=False
    )
    grouped = replace(WIDGET_SHAPES["llama3-8b"], batch_size=1)  # grouped-query attention
    for t, p, d, c, v, stage, recompute, experts in [
        (1, 1, 8, 1, 1, 1, "none", 1),
        (2, 1, 4, 1, 1, 2, "selective", 1),
        (4, 2, 8, 1, 1, 1, "full", 1),
        (8, 4, 2, 1, 2, 3, "full", 1),
        (8, 8, 16, 1, 4, 1, "selective", 1),
        (4, 2, 4, 4, 1, 1, "selective", 1),
        (8, 4, 2, 2, 2, 2, "none", 1),
        (2, 2, 8, 1, 1, 1, "selective", 8),
        (1, 4, 4, 2, 2, 3, "full", 16),
    ]:
        for assumptions in (StepAssumptions(), no_overlap):
            cases.append(
                TrainingSetup(
                    grouped
                    if c > 1 and assumptions is no_overlap
                    else replace(large, batch_size=1),
                    zero_stage=stage,
                    data=d,
                    tensor=t,
                    pipeline=p,
                    context=c,
                    virtual_stages=v,
                    experts=experts,
                    top_k=min(2, experts),
                    expert_parallel=min(4, experts),
                    global_batch=32 * d,
                    recompute=recompute,
                    dropout=stage == 2,
                    sequence_parallel=t > 1 and (assumptions is no_overlap or recompute == "full"),
                    assumptions=assumptions,
                )
            )
    # no overlap, the hierarchical reduction across nodes (t c p < 8: several ranks of a group to
    # a node), the experts' replicas one to a node, and NVLink binding (a fast port, an A100)
    shared, fast_port = (
        StepAssumptions(overlap=0.0),
        StepAssumptions(overlap=0.0, network_bytes_per_s=100e9),
    )
    for t, d, experts, stage, assumptions, gpu in [
        (1, 16, 1, 1, shared, "H100 SXM 80GB"),
        (2, 8, 1, 2, shared, "H100 SXM 80GB"),
        (1, 16, 8, 1, shared, "H100 SXM 80GB"),
        (2, 16, 8, 3, shared, "H100 SXM 80GB"),
        (1, 16, 1, 1, fast_port, "H100 SXM 80GB"),
        (1, 16, 1, 3, shared, "A100 SXM 80GB"),
    ]:
        cases.append(
            TrainingSetup(
                replace(large, batch_size=1),
                zero_stage=stage,
                data=d,
                tensor=t,
                experts=experts,
                top_k=min(2, experts),
                expert_parallel=experts,
                global_batch=2 * d,
                gpu=gpu,
                assumptions=assumptions,
            )
        )
    # ZeRO-2 and 3 accumulating whole gradients before one reduce-scatter, with pipelines too
    accumulating = StepAssumptions(accumulate_before_reduce=True)
    for t, p, d, stage, v in [(8, 4, 4, 2, 1), (8, 4, 4, 3, 2), (1, 1, 16, 2, 1), (2, 1, 8, 3, 1)]:
        cases.append(
            TrainingSetup(
                replace(large, batch_size=1),
                "bf16 + fp32 master and gradients",
                zero_stage=stage,
                data=d,
                tensor=t,
                pipeline=p,
                virtual_stages=v,
                global_batch=16 * d,
                sequence_parallel=t > 1,
                assumptions=accumulating,
            )
        )
    # an odd sequence length without context parallelism (only c > 1 needs 2c to divide it)
    cases.append(TrainingSetup(replace(small, seq_len=1025, batch_size=2), data=2, global_batch=8))
    for shape in _CHOICE_SHAPES:
        for recompute, t, p in (("none", 1, 1), ("selective", 2, 2), ("full", 4, 1)):
            cases.append(
                TrainingSetup(
                    shape,
                    recipe="fp32" if recompute == "none" else "bf16 + fp32 master",
                    zero_stage=1,
                    data=2,
                    tensor=t,
                    pipeline=p,
                    global_batch=4 * shape.batch_size,
                    recompute=recompute,
                    dropout=recompute == "full",
                    sequence_parallel=t == 4,
                    experts=2 if p == 2 else 1,
                    expert_parallel=2 if p == 2 else 1,
                )
            )
    return cases


def _widget_fields(shape: TransformerShape) -> dict[str, Any]:
    """The sizes and choices the widget reads (not ``rope_theta`` or ``norm_eps``: no cost
    depends on them)."""
    names = (*_SIZES, "n_kv_heads", *_CHOICES, *_FLAGS)
    return {name: getattr(shape, name) for name in names}


def _setup_dict(setup: TrainingSetup) -> dict[str, Any]:
    out = {f.name: getattr(setup, f.name) for f in fields(setup)}
    shape = _widget_fields(setup.shape)
    return {**out, "shape": shape, "assumptions": asdict(setup.assumptions)}


def setup_from_dict(values: dict[str, Any]) -> TrainingSetup:
    """The :class:`~trainfast.distributed.step_time.TrainingSetup` of an exported case."""
    values = dict(values)
    shape = replace(PRESET_SHAPES["tiny"], **values.pop("shape"))
    assumptions = StepAssumptions(**values.pop("assumptions"))
    return TrainingSetup(shape, assumptions=assumptions, **values)


def estimate_dict(result: StepEstimate) -> dict[str, Any]:
    """An estimate as the widget returns it: memory by part and total, fits, time by part, and
    whole-step MFU and HFU."""
    memory = asdict(result.memory)
    return {
        "memory": {**memory, "total": result.memory.total},
        "fits": result.fits,
        "time": {
            "compute": result.compute_s,
            "bubble": result.bubble_s,
            "data_parallel": result.data_parallel_s,
            "tensor_parallel": result.tensor_parallel_s,
            "context_parallel": result.context_parallel_s,
            "expert_parallel": result.expert_parallel_s,
            "pipeline": result.pipeline_s,
            "step": result.step_s,
        },
        "utilization": {"mfu": result.mfu, "hfu": result.hfu},
    }


def export() -> dict[str, Any]:
    """Everything the widget needs, as JSON-ready data: the presets (shapes, recipes, optimizer
    moments, GPUs, default assumptions) and the grid of cases with the model's results."""
    return {
        "shapes": {name: _widget_fields(shape) for name, shape in WIDGET_SHAPES.items()},
        "default_shape": DEFAULT_SHAPE,
        "choices": {name: list(allowed) for name, allowed in _CHOICES.items()},
        "recipes": {
            name: {**recipe.bytes, "compute_format": recipe.compute_format}
            for name, recipe in RECIPES.items()
        },
        "optimizer_moments": dict(OPTIMIZER_MOMENTS),
        "loss_bytes_per_logit": LOSS_BYTES_PER_LOGIT,
        "recompute": list(RECOMPUTE),
        "gpus": {
            name: {
                "memory_bytes": spec.memory_bytes,
                "peak_flops": dict(spec.peak_flops),
                "nvlink_bytes_per_s": spec.nvlink_bytes_per_s,
            }
            for name, spec in NVLINK_GPUS.items()
        },
        "assumptions": asdict(StepAssumptions()),
        "cases": [
            {"setup": _setup_dict(setup), "result": estimate_dict(estimate(setup))}
            for setup in grid()
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
