"""The data of the book's calculator widget: presets, assumptions, and cases to check it by.

The widget (``book/_static/calculator.js``, hand-written) repeats
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

from trainfast.accounting import OPTIMIZER_MOMENTS
from trainfast.distributed.step_time import (
    NVLINK_GPUS,
    RECOMPUTE,
    StepAssumptions,
    StepEstimate,
    TrainingSetup,
    estimate,
)
from trainfast.recipes import RECIPES
from trainfast.transformer import PRESET_SHAPES, TransformerShape

__all__ = ["WIDGET_SHAPES", "estimate_dict", "export", "grid", "setup_from_dict", "write_script"]


def _gpt2_style(shape: TransformerShape) -> bool:
    """Whether ``shape`` makes GPT-2's choices (grouped-query attention aside), the only ones
    the widget counts."""
    gpt2 = TransformerShape(1, 1, 1, 1, 1, 1, 1)
    choices = ("norm", "positions", "mlp", "qk_norm", "bias", "tied_head")
    return all(getattr(shape, name) == getattr(gpt2, name) for name in choices)


#: The shapes the widget offers. Its JavaScript counts GPT-2-style layers (LayerNorm, learned
#: positions, a GELU MLP, a tied head; grouped-query attention too), so it offers the presets
#: of that family and a GPT-2-style model of Llama 2 7B's sizes (width 4,096, 32 layers and heads,
#: context 4,096, vocabulary 32,000; a GELU MLP of width 4 x 4,096: 6.6B parameters). The modern
#: presets (``llama3-8b`` and so on) are Python's alone until the widget counts their choices.
WIDGET_SHAPES: dict[str, TransformerShape] = {
    **{name: shape for name, shape in PRESET_SHAPES.items() if _gpt2_style(shape)},
    "gpt-7b": TransformerShape.gpt_like(
        d_model=4_096, n_layers=32, n_heads=32, seq_len=4_096, vocab_size=32_000
    ),
}


def grid() -> list[TrainingSetup]:
    """The cases the browser test compares: every recipe, optimizer, ZeRO stage, GPU and
    recomputation choice, and layouts with tensor, pipeline (plain and interleaved), context and
    expert parallelism, sequence parallelism, grouped-query attention, dropout, accumulation and
    both ends of the overlap assumption."""
    small, large = WIDGET_SHAPES["gpt2-small"], WIDGET_SHAPES["gpt-7b"]
    cases = [
        TrainingSetup(
            replace(small, batch_size=8), recipe, optimizer, stage, data=4, global_batch=64, gpu=gpu
        )
        for recipe in RECIPES
        for optimizer in OPTIMIZER_MOMENTS
        for stage in (0, 3)
        for gpu in NVLINK_GPUS
    ]
    no_overlap = StepAssumptions(overlap=0.0, matmul_efficiency=0.7)
    grouped = replace(large, batch_size=1, n_kv_heads=8)  # grouped-query attention
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
    return cases


def _widget_fields(shape: TransformerShape) -> dict[str, Any]:
    """The sizes the widget reads (its shapes are all GPT-2-style: :data:`WIDGET_SHAPES`)."""
    sizes = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "seq_len", "batch_size")
    return {name: getattr(shape, name) for name in (*sizes, "n_kv_heads")}


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
        "recipes": {
            name: {**recipe.bytes, "compute_format": recipe.compute_format}
            for name, recipe in RECIPES.items()
        },
        "optimizer_moments": dict(OPTIMIZER_MOMENTS),
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
