"""Time one optimizer step: ours against ``torch.optim``, single-tensor loop against foreach.

An optimizer step reads and writes every parameter and its state a few times; the arithmetic is
trivial, so its time is memory traffic plus, for a loop over tensors, one kernel launch per op
per tensor. The foreach path launches one kernel per op per *list*, which is why it wins on a
GPU with many small tensors and barely matters on a CPU. This module measures that, side by
side on identical parameters and gradients, for SGD (momentum), RMSprop, Adam and AdamW.

``python -m trainfast.measure --only optimizer-step-time`` runs :func:`step_time_record` and
writes the result as a measurement record; ``python -m trainfast.optim.benchmarks`` prints a
quick table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from trainfast.gpus import GPUSpec
from trainfast.optim.adam import Adam, AdamW
from trainfast.optim.rmsprop import RMSprop
from trainfast.optim.sgd import SGD
from trainfast.records import Prediction, Record, make_record
from trainfast.timing import benchmark_side_by_side

__all__ = ["adamw_step_prediction", "compare_step_times", "step_time_record", "transformer_shapes"]

#: name -> (ours, torch's, settings); every variant of one name gets the same settings
_OPTIMIZERS: dict[str, tuple[type[Optimizer], type[Optimizer], dict[str, Any]]] = {
    "SGD": (SGD, torch.optim.SGD, {"lr": 1e-3, "momentum": 0.9}),
    "RMSprop": (RMSprop, torch.optim.RMSprop, {"lr": 1e-4}),
    "Adam": (Adam, torch.optim.Adam, {"lr": 1e-4}),
    "AdamW": (AdamW, torch.optim.AdamW, {"lr": 1e-4}),
}


def transformer_shapes(width: int, depth: int) -> list[tuple[int, ...]]:
    """Parameter shapes of ``depth`` GPT-2-style transformer blocks of model width ``width``.

    Per block: two layer norms (weight, bias), the fused QKV projection, the attention output,
    and the 4x MLP, each with a bias: 12 tensors, about ``12 * width**2`` parameters. Embeddings
    are left out (one big tensor says little about per-tensor overhead). ``width=768,
    depth=12`` is GPT-2 small's 85M block parameters.
    """
    if width < 1 or depth < 1:
        raise ValueError(f"Invalid transformer size: width={width}, depth={depth}")
    w = width
    layers = [  # (weight shape, bias shape)
        ((w,), (w,)),  # ln_1
        ((3 * w, w), (3 * w,)),  # attention QKV projection, weight (out, in)
        ((w, w), (w,)),  # attention output projection
        ((w,), (w,)),  # ln_2
        ((4 * w, w), (4 * w,)),  # MLP up
        ((w, 4 * w), (w,)),  # MLP down
    ]
    block = [shape for pair in layers for shape in pair]
    return block * depth


def _variants(name: str) -> dict[str, Callable[[list[Tensor]], Optimizer]]:
    ours, theirs, settings = _OPTIMIZERS[name]
    return {
        "ours_single": lambda ps: ours(ps, foreach=False, **settings),
        "ours_foreach": lambda ps: ours(ps, foreach=True, **settings),
        "torch_single": lambda ps: theirs(ps, foreach=False, **settings),
        "torch_foreach": lambda ps: theirs(ps, foreach=True, **settings),
    }


def compare_step_times(
    shapes: Sequence[tuple[int, ...]] | None = None,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    n_steps: int = 5,
    n_warmup: int = 2,
    n_repeats: int = 3,
    optimizers: Sequence[str] = ("SGD", "RMSprop", "Adam", "AdamW"),
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Milliseconds per ``step()`` of each optimizer, four ways, on the same tensors.

    For each name in ``optimizers`` (SGD with momentum 0.9, RMSprop, Adam, AdamW, default
    settings otherwise) it builds ours with ``foreach=False`` and ``True`` and ``torch.optim``'s
    with ``foreach=False`` and ``True``, each on its own copy of the same parameters (``shapes``;
    default :func:`transformer_shapes` ``(128, 8)``: 96 tensors, 1.6M parameters) and gradients.
    After ``n_warmup`` steps, the four take turns timing ``n_steps`` steps, ``n_repeats``
    times (:func:`~trainfast.timing.benchmark_side_by_side`); a time is the median over
    repeats, per step. On CUDA the clock is the GPU's (CUDA events).

    Returns one row per optimizer with the four times in ms, ``ratio_foreach`` = ours_foreach /
    torch_foreach and ``ratio_single`` = ours_single / torch_single (1.0: as fast as torch), and
    ``foreach_speedup`` = ours_single / ours_foreach. Times include state creation only in the
    warm-up, never in the timed steps.
    """
    device = torch.device(device)
    shapes = list(shapes) if shapes is not None else transformer_shapes(128, 8)
    if n_steps < 1 or n_repeats < 1 or n_warmup < 0:
        raise ValueError(
            f"Invalid counts: n_steps={n_steps}, n_repeats={n_repeats}, n_warmup={n_warmup}"
        )
    unknown = [name for name in optimizers if name not in _OPTIMIZERS]
    if unknown:
        raise ValueError(f"Unknown optimizers: {unknown} (known: {sorted(_OPTIMIZERS)})")

    generator = torch.Generator().manual_seed(seed)
    weights = [torch.randn(s, generator=generator, dtype=dtype).to(device) for s in shapes]
    grads = [torch.randn(s, generator=generator, dtype=dtype).to(device) * 1e-2 for s in shapes]
    rows = []
    for name in optimizers:
        runs: dict[str, Optimizer] = {}
        for label, build in _variants(name).items():
            params = [w.clone().requires_grad_() for w in weights]
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
            runs[label] = build(params)
        timings = benchmark_side_by_side(  # take turns, so drift hits all four alike
            {label: optimizer.step for label, optimizer in runs.items()},
            warmup=n_warmup,
            repeats=n_repeats,
            number=n_steps,
            device=device,
        )
        ms = {label: timing.median * 1e3 for label, timing in timings.items()}
        row = {
            "optimizer": name,
            "tensors": len(shapes),
            "parameters": sum(w.numel() for w in weights),
            **{f"{label}_ms": value for label, value in ms.items()},
            "ratio_foreach": ms["ours_foreach"] / ms["torch_foreach"],
            "ratio_single": ms["ours_single"] / ms["torch_single"],
            "foreach_speedup": ms["ours_single"] / ms["ours_foreach"],
        }
        rows.append(row)
        del runs  # free this optimizer's copies and state before the next
    return rows


def step_time_record(device: torch.device, quick: bool) -> Record:
    """Run :func:`compare_step_times` on ``device`` and return it as a measurement record.

    Full size is GPT-2 small's transformer blocks (144 tensors, 85M parameters; minutes on a
    CPU); ``quick`` uses 8 blocks of width 128 (96 tensors, 1.6M parameters; seconds).
    """
    width, depth = (128, 8) if quick else (768, 12)
    shapes = transformer_shapes(width, depth)
    rows = compare_step_times(
        shapes,
        device=device,
        n_steps=10 if quick else 20,
        n_warmup=3 if quick else 5,
        n_repeats=7,  # the median of 7 shrugs off a burst of load on a shared machine
    )
    n_params = rows[0]["parameters"]
    description = (
        f"Time of one optimizer step on {len(shapes)} float32 tensors ({n_params / 1e6:.1f}M "
        f"parameters: {depth} transformer blocks of width {width}), ours vs torch.optim, "
        "single-tensor loop vs foreach; median over repeats."
    )
    ms = {f"{v}_ms": "ms" for v in ("ours_single", "ours_foreach", "torch_single", "torch_foreach")}
    ratios = {"ratio_foreach": "ours/torch", "ratio_single": "ours/torch", "foreach_speedup": "x"}
    return make_record(
        name="optimizer-step-time",
        description=description,
        rows=rows,
        units={**ms, **ratios},
        device=device,
    )


if __name__ == "__main__":
    from trainfast.device import pick_device
    from trainfast.records import to_markdown

    print(to_markdown(step_time_record(pick_device(), quick=True)))


def adamw_step_prediction(gpu: GPUSpec, n_params: int) -> Prediction:
    """The time of a foreach AdamW step on ``gpu``: bytes moved over HBM bandwidth.

    An optimizer step does a few FLOPs per parameter, far below any GPU's ridge, so it is
    memory-bound: in float32 it reads the parameter, its gradient and both moments (16 bytes)
    and writes the parameter and both moments (12 bytes), 28 bytes per parameter. It ignores
    launch overhead, which the foreach path amortises over many tensors and the single-tensor
    loop pays per tensor. ``optimizer-step-time`` measures it (``torch_foreach_ms``).
    """
    if n_params < 1:
        raise ValueError(f"Invalid parameter count: {n_params!r} (expected >= 1)")
    return Prediction(
        28 * n_params / gpu.hbm_bytes_per_s * 1e3,
        "ms",
        f"memory-bound AdamW, 28 bytes per parameter at the {gpu.name} datasheet HBM bandwidth",
    )
