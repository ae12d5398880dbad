"""Time one optimizer step: ours against ``torch.optim``, single-tensor loop against foreach.

An optimizer step reads and writes every parameter and its state a few times; the arithmetic is
trivial, so its time is memory traffic plus, for a loop over tensors, one dispatch (and on a GPU
one kernel launch) per op per tensor. On a GPU the foreach path launches one kernel per op for a
whole *list* (or a few for a long one), which is why it wins there with many small tensors. On a
CPU torch runs each ``torch._foreach_*`` op as a C++ loop that calls the ordinary op on each
tensor, so it saves only the Python loop; and since it runs each op over the whole list before the
next, lists larger than the cache are read back from memory by every op, while the loop runs all
ops on one tensor while it is in cache, so there foreach can be slower than the loop. This module
measures that, side by side on identical parameters and gradients, for SGD (momentum), RMSprop,
Adam and AdamW.

``python -m trainfast.measure --only optimizer-step-time`` runs :func:`step_time_record` and
writes the result as a measurement record; ``python -m trainfast.optim.benchmarks`` prints a
quick table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
from trainfast.validation import check_int

__all__ = [
    "ADAMW_PASSES",
    "MemoryPass",
    "OpTraffic",
    "adamw_step_prediction",
    "bytes_per_parameter_of_passes",
    "compare_step_times",
    "count_step_traffic",
    "step_time_record",
    "transformer_shapes",
]

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


#: torch.optim classes with a ``fused=True`` kernel (on CUDA, and on CPU from torch 2.4)
_FUSED = ("SGD", "Adam", "AdamW")


def _variants(name: str) -> dict[str, Callable[[list[Tensor]], Optimizer]]:
    ours, theirs, settings = _OPTIMIZERS[name]
    variants = {
        "ours_single": lambda ps: ours(ps, foreach=False, **settings),
        "ours_foreach": lambda ps: ours(ps, foreach=True, **settings),
        "torch_single": lambda ps: theirs(ps, foreach=False, **settings),
        "torch_foreach": lambda ps: theirs(ps, foreach=True, **settings),
    }
    if name in _FUSED:
        variants["torch_fused"] = lambda ps: theirs(ps, fused=True, **settings)
    return variants


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
    ``foreach_speedup`` = ours_single / ours_foreach; ``torch_fused_ms`` times torch's
    ``fused=True`` kernel where torch has one (SGD, Adam, AdamW; else ``None``). Times include
    state creation only in the warm-up, never in the timed steps.
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
            "torch_fused_ms": ms.get("torch_fused"),  # None: torch has no fused kernel for it
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
        "single-tensor loop vs foreach, and torch's fused kernel; median over repeats."
    )
    variants = ("ours_single", "ours_foreach", "torch_single", "torch_foreach", "torch_fused")
    ms = {f"{v}_ms": "ms" for v in variants}
    ratios = {"ratio_foreach": "ours/torch", "ratio_single": "ours/torch", "foreach_speedup": "x"}
    return make_record(
        name="optimizer-step-time",
        description=description,
        rows=rows,
        units={**ms, **ratios},
        device=device,
    )


@dataclass(frozen=True)
class MemoryPass:
    """One operation of an optimizer step: how many weight-sized tensors it reads and writes."""

    op: str  # the aten operator torch dispatches
    reads: int
    writes: int
    what: str


#: The passes over memory that torch's AdamW makes per step (float32, ``weight_decay != 0``, no
#: ``amsgrad``, not ``capturable``), read from ``torch/optim/adam.py``. ``foreach`` is
#: ``_multi_tensor_adam``: eight ``torch._foreach_*`` ops, each a full pass over its tensors (an
#: operand listed twice, as ``grads`` in ``addcmul``, is read twice). ``fused`` is one kernel
#: that reads the parameter, gradient and both moments once and writes three of them: the floor.
#: :func:`count_step_traffic` counts what torch actually dispatches; a test checks the two agree.
ADAMW_PASSES: dict[str, tuple[MemoryPass, ...]] = {
    "foreach": (
        MemoryPass("_foreach_mul_", 1, 1, "θ ← θ (1 − γλ)"),
        MemoryPass("_foreach_lerp_", 2, 1, "m ← m + (1 − β₁)(g − m)"),
        MemoryPass("_foreach_mul_", 1, 1, "v ← β₂ v"),
        MemoryPass("_foreach_addcmul_", 3, 1, "v ← v + (1 − β₂) g·g"),
        MemoryPass("_foreach_sqrt", 1, 1, "d ← √v (a new tensor)"),
        MemoryPass("_foreach_div_", 1, 1, "d ← d / √(1 − β₂ᵗ)"),
        MemoryPass("_foreach_add_", 1, 1, "d ← d + ε"),
        MemoryPass("_foreach_addcdiv_", 3, 1, "θ ← θ − step_size · m / d"),
    ),
    "fused": (MemoryPass("_fused_adamw_", 4, 3, "read θ, g, m, v; write θ, m, v"),),
}


def bytes_per_parameter_of_passes(passes: Sequence[MemoryPass], element_bytes: int = 4) -> int:
    """Bytes per parameter that ``passes`` move: each read and write, ``element_bytes`` each."""
    return element_bytes * sum(p.reads + p.writes for p in passes)


@dataclass(frozen=True)
class OpTraffic:
    """The bytes one dispatched operator read and wrote (see :func:`count_step_traffic`)."""

    op: str
    read_bytes: int
    written_bytes: int


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _nbytes(tensors: list[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def count_step_traffic(step: Callable[[], Any]) -> list[OpTraffic]:
    """Run ``step()`` and list every aten operator it dispatched, with the bytes it moved.

    A tensor argument counts as read once per time it is passed (``addcmul(v, g, g)`` reads
    ``g`` twice, as a kernel with two input pointers does). An argument the operator's schema
    marks as mutable counts as written if its values changed, and a tensor it returns as new
    counts as written: so a fused kernel whose schema allows it to write the gradients (for
    unscaling) but does not is charged for reading them only. This is the traffic of a kernel
    that streams its operands once, not a cache simulation.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    traffic: list[OpTraffic] = []

    class _Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            kwargs = kwargs or {}
            mutable = [
                a.name
                for a in func._schema.arguments
                if a.alias_info is not None and a.alias_info.is_write
            ]
            named = dict(zip((a.name for a in func._schema.arguments), args, strict=False)) | kwargs
            inputs = [t for value in (*args, *kwargs.values()) for t in _tensors(value)]
            before = {name: [t.clone() for t in _tensors(named.get(name))] for name in mutable}
            out = func(*args, **kwargs)
            written = [
                t
                for name, copies in before.items()
                for t, copy in zip(_tensors(named.get(name)), copies, strict=True)
                if not torch.equal(t, copy)
            ]
            input_ids = {id(t) for t in inputs}
            fresh = [t for t in _tensors(out) if id(t) not in input_ids]
            if inputs or fresh:
                name = func.overloadpacket.__name__
                traffic.append(OpTraffic(name, _nbytes(inputs), _nbytes(written + fresh)))
            return out

    with _Counter():
        step()
    return traffic


def adamw_step_prediction(gpu: GPUSpec, n_params: int, path: str = "foreach") -> Prediction:
    """The time of one float32 AdamW step on ``gpu``: its bytes over the HBM bandwidth.

    A step does a few FLOPs per parameter, far below any GPU's ridge point, so it is
    memory-bound. ``path`` is ``"foreach"`` (torch's default on CUDA, with nonzero weight
    decay: 8 passes, 84 bytes per parameter as dispatched; about 80 if the gradient that
    ``addcmul`` reads twice comes from cache the second time) or ``"fused"`` (``fused=True``:
    one pass, 28 bytes, the floor); the passes are :data:`ADAMW_PASSES`. Launch overhead and
    the step counters are left out.
    ``optimizer-step-time`` measures both (``torch_foreach_ms``, ``torch_fused_ms``).
    """
    check_int("n_params", n_params, minimum=1)
    if path not in ADAMW_PASSES:
        raise ValueError(f"Unknown AdamW path: {path!r} (known: {sorted(ADAMW_PASSES)})")
    passes = ADAMW_PASSES[path]
    per_param = bytes_per_parameter_of_passes(passes)
    return Prediction(
        per_param * n_params / gpu.hbm_bytes_per_s * 1e3,
        "ms",
        f"memory-bound {path} AdamW: {len(passes)} pass{'es' if len(passes) > 1 else ''}, "
        f"{per_param} bytes per parameter at the {gpu.name} datasheet HBM bandwidth",
    )


if __name__ == "__main__":
    from trainfast.device import pick_device
    from trainfast.records import to_markdown

    print(to_markdown(step_time_record(pick_device(), quick=True)))
