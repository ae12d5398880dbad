"""The mixed-precision chapter's measurements, as ``python -m trainfast.measure`` benchmarks.

* ``matmul-throughput`` (:func:`matmul_throughput_record`): TFLOP/s of ``torch.matmul`` per
  dtype (fp32 with TF32 off, TF32, fp16, bf16, and FP8 through
  :func:`~trainfast.precision.fp8.scaled_matmul` where the GPU has FP8 tensor cores: operands
  quantised beforehand with float32 promotion (``fp8``) or fast accumulation
  (``fp8 fast-accum``), and with both per-tensor casts inside the timed call (``fp8 + casts``))
  and shape (aligned squares, a dimension off by one, a GPT-2 LM head with
  the raw 50,257-token vocabulary and the padded 50,304), against the datasheet peak and the
  best figure of the run. The largest bf16 square is also timed as a bare loop of back-to-back
  products, to show what the harness costs.
* ``precision-step-time`` (:func:`step_time_record`): one training step of the book's transformer
  under each recipe (loss scaling by ``torch.amp.GradScaler``, whose state stays on the device, not
  the book's host-side :class:`~trainfast.precision.GradScaler`): time, tokens/s, model FLOPs
  utilisation, and peak memory measured by the caching allocator beside the memory
  :mod:`trainfast.accounting` predicts.
* ``autocast-policy`` (:func:`autocast_policy_record`): which dtype autocast gives each op, on
  the device it ran on (CPU and CUDA policies differ).
* ``matmul-error`` (:func:`matmul_error_record`): a product's relative error against float64 per
  precision mode (TF32 and FP8 real on a GPU that has them, emulated elsewhere).

All timing goes through :func:`trainfast.timing.benchmark` (CUDA events on a GPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import torch

from trainfast.accounting import training_flops, training_memory
from trainfast.gpus import gpu_for_device
from trainfast.precision.fp8 import has_fp8_tensor_cores, scaled_matmul, to_fp8
from trainfast.precision.numerics import MATMUL_MODES, autocast_policy, matmul_error
from trainfast.precision.recipes import training_step
from trainfast.precision.tf32 import tf32_matmuls
from trainfast.recipes import RECIPES
from trainfast.records import Prediction, Record, make_record
from trainfast.timing import benchmark
from trainfast.transformer import TransformerShape
from trainfast.utilization import mfu_peak_flops, model_flops_utilization

__all__ = [
    "PUBLISHED_CUDA_FLOAT16_OPS",
    "PUBLISHED_CUDA_FLOAT32_OPS",
    "PUBLISHED_NAMES",
    "TF32_BACKWARD_SINCE",
    "autocast_policy_record",
    "matmul_error_record",
    "matmul_throughput",
    "matmul_throughput_record",
    "published_cuda_autocast_policy",
    "gpu_step_shape",
    "stale_recipes",
    "step_memory_prediction",
    "step_time_record",
]

#: dtype name -> (storage dtype, TF32 on, datasheet key)
_MATMUL_DTYPES: dict[str, tuple[torch.dtype, bool, str]] = {
    "fp32": (torch.float32, False, "fp32"),
    "tf32": (torch.float32, True, "tf32"),
    "fp16": (torch.float16, False, "fp16"),
    "bf16": (torch.bfloat16, False, "bf16"),
}

#: FP8 variants :func:`matmul_throughput` can time (datasheet key "fp8").
FP8_VARIANTS = ("fp8", "fp8 fast-accum", "fp8 + casts")


def _matmul_fn(m: int, k: int, n: int, name: str, device: torch.device) -> Callable[[], object]:
    """A function that runs one ``(m, k) @ (k, n)`` product in ``name``'s format, inputs ready."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(device)  # random data, never zeros
    b = torch.randn(k, n, generator=generator).to(device)
    # What a training step pays: amax, scale and cast, then the product. Eager and unfused (to_fp8
    # upcasts to float32 first), so an upper bound on the casts' cost; fused casts are cheaper.
    if name == "fp8 + casts":
        a16, b16_t = a.bfloat16(), b.t().contiguous().bfloat16()  # (M, K), (N, K)

        def with_casts() -> object:
            a8, scale_a = to_fp8(a16)
            b8_t, scale_b = to_fp8(b16_t)
            return scaled_matmul(a8, b8_t.t(), scale_a.reciprocal(), scale_b.reciprocal())

        return with_casts
    if name in FP8_VARIANTS:  # operands quantised once, outside the timed call
        a8, scale_a = to_fp8(a)
        b8, scale_b = to_fp8(b)
        b8 = b8.t().contiguous().t()  # column-major, as the scaled product wants
        inv_a, inv_b = scale_a.reciprocal(), scale_b.reciprocal()
        fast = name == "fp8 fast-accum"
        return lambda: scaled_matmul(a8, b8, inv_a, inv_b, use_fast_accum=fast)
    dtype = _MATMUL_DTYPES[name][0]
    a, b = a.to(dtype), b.to(dtype)
    return lambda: a @ b


def matmul_throughput(
    shapes: list[tuple[str, int, int, int]],
    dtypes: list[str],
    device: torch.device,
    *,
    warmup: int = 3,
    repeats: int = 10,
) -> list[dict[str, Any]]:
    """TFLOP/s of each ``(label, m, k, n)`` shape in each dtype; one row per pair.

    FP8 rows (:data:`FP8_VARIANTS`) need FP8 tensor cores and dimensions that are multiples of 16
    (other shapes are left out); on a CPU they are skipped. ``of_peak`` is the fraction of the
    datasheet's dense peak for the dtype (None where :func:`~trainfast.gpus.gpu_for_device` does
    not know the device); ``of_best`` the fraction of the best figure of the same dtype in this run.
    """
    spec = gpu_for_device(device)  # None on a CPU, and (with a warning) for a GPU with no row
    rows = []
    for name in dtypes:
        fp8 = name in FP8_VARIANTS
        if fp8 and not has_fp8_tensor_cores(device):
            continue
        with tf32_matmuls(_MATMUL_DTYPES.get(name, (None, False, "fp8"))[1]):
            for label, m, k, n in shapes:
                if fp8 and any(size % 16 for size in (m, k, n)):
                    continue
                timing = benchmark(
                    _matmul_fn(m, k, n, name, device), warmup=warmup, repeats=repeats, device=device
                )
                tflops = 2 * m * k * n / timing.median / 1e12
                peak = (
                    spec.peak_flops.get(_MATMUL_DTYPES.get(name, (None, None, "fp8"))[2])
                    if spec
                    else None
                )
                row = {
                    "shape": label,
                    "m": m,
                    "k": k,
                    "n": n,
                    "dtype": name,
                    "median_ms": timing.median * 1e3,
                    "tflops": tflops,
                    "of_peak": tflops * 1e12 / peak if peak else None,
                }
                rows.append(row)
    for row in rows:
        best = max(r["tflops"] for r in rows if r["dtype"] == row["dtype"])
        row["of_best"] = row["tflops"] / best
    return rows


def _bare_loop(size: int, name: str, device: torch.device, calls: int, repeats: int) -> float:
    """TFLOP/s of the same product timed as ``calls`` back-to-back launches per sample."""
    run = _matmul_fn(size, size, size, name, device)

    def loop() -> None:
        for _ in range(calls):
            run()

    timing = benchmark(loop, warmup=1, repeats=repeats, device=device)
    return 2 * size**3 / (timing.median / calls) / 1e12


def matmul_throughput_record(device: torch.device, quick: bool) -> Record:
    """``matmul-throughput``: see the module docstring. Sizes by device and ``quick``."""
    if device.type == "cuda":
        sizes = [1024, 4096] if quick else [1024, 2048, 4096, 8192]
        odd = [("square, K = 4095", 4096, 4095, 4096)]
        head = [(f"LM head, vocab {v}", 8192, 768, v) for v in (50257, 50304)]
        runs = [(["fp32", "tf32", "fp16", "bf16", *FP8_VARIANTS], sizes, odd + head)]
        repeats, calls = (5 if quick else 20), 20
    else:  # CPU: fp32, and bf16 only at sizes its slow kernels can afford
        sizes = [64, 128] if quick else [256, 512, 1024]
        odd = (
            [("square, K = 127", 128, 127, 128)] if quick else [("square, K = 511", 512, 511, 512)]
        )
        head = [] if quick else [(f"LM head, vocab {v}", 256, 128, v) for v in (50257, 50304)]
        runs = [(["fp32"], sizes, odd + head), (["bf16"], [s for s in sizes if s <= 512], odd)]
        repeats, calls = (3 if quick else 5), 3
    rows = []
    for dtypes, squares, others in runs:
        shapes = [(f"square {s}", s, s, s) for s in squares] + others
        rows += matmul_throughput(shapes, dtypes, device, repeats=repeats)
    for row in rows:
        row["timing"] = "harness"
    largest = max(r["m"] for r in rows if r["dtype"] == "bf16" and r["shape"].startswith("square "))
    harness = next(r for r in rows if r["dtype"] == "bf16" and r["shape"] == f"square {largest}")
    bare_tflops = _bare_loop(largest, "bf16", device, calls, repeats)
    rows.append(
        dict(
            harness,
            timing=f"bare loop of {calls}",
            median_ms=2 * largest**3 / bare_tflops / 1e9,
            tflops=bare_tflops,
            of_peak=harness["of_peak"] and harness["of_peak"] * bare_tflops / harness["tflops"],
            of_best=None,
        )
    )
    print(
        f"matmul-throughput: bf16 {largest}^3 through the harness reaches "
        f"{harness['tflops'] / bare_tflops:.1%} of a bare loop of {calls} products "
        f"({bare_tflops:.3g} TFLOP/s)"
    )
    return make_record(
        "matmul-throughput",
        "TFLOP/s of torch.matmul per dtype and shape (fp32 with TF32 off; FP8 via the scaled "
        "matmul with per-tensor scales: fp8 = operands quantised beforehand, float32 promotion; "
        "fp8 fast-accum = use_fast_accum=True; fp8 + casts = both casts from bf16 timed too), "
        "random inputs, median of timings with CUDA events on a GPU; of_peak: fraction of the "
        "datasheet dense peak; of_best: of the best of that dtype in this run. The last row times "
        "the largest bf16 square as a bare loop of back-to-back calls.",
        rows,
        units={"median_ms": "ms", "tflops": "TFLOP/s"},
        device=device,
    )


# --- training steps per recipe --------------------------------------------------------------------


def _step_row(
    shape: TransformerShape, recipe_name: str, device: torch.device, repeats: int
) -> dict[str, Any]:
    from trainfast.transformer import Transformer, random_batch

    recipe = RECIPES[recipe_name]
    torch.manual_seed(0)
    model = Transformer(shape, attention="sdpa").to(device=device, dtype=recipe.param_dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    # torch's scaler keeps scale and found-inf on the device; the book's reads them on the host
    scaler = torch.amp.GradScaler(device.type) if recipe.loss_scaling else None
    tokens, targets = random_batch(shape, device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses: list[float] = []
    timing = benchmark(
        lambda: losses.append(training_step(model, optimizer, tokens, targets, recipe, scaler)),
        warmup=2,
        repeats=repeats,
        device=device,
    )
    row: dict[str, Any] = {
        "recipe": recipe_name,
        "step_ms": timing.median * 1e3,
        "iqr_ms": timing.iqr * 1e3,
        "tokens_per_s": shape.tokens / timing.median,
    }
    spec = gpu_for_device(device)  # None on a CPU, and (with a warning) for a GPU with no row
    # MFU as PaLM defines it (Chowdhery et al. 2023, appendix B): the model's FLOPs per second over
    # one theoretical peak per system, here the GPU's dense bf16 rate, the same for every recipe
    # (so an fp32 step cannot reach 100 % and an FP8 step could exceed it). Nothing is recomputed
    # here, so hardware FLOPs utilisation would be the same.
    peak = mfu_peak_flops(spec) if spec else None
    row["mfu"] = (
        model_flops_utilization(training_flops(shape), timing.median, peak) if peak else None
    )
    predicted = training_memory(shape, recipe=recipe, optimizer="adamw", attention="sdpa")
    row["predicted_gb"] = predicted.peak / 1e9
    row["peak_memory_gb"] = (
        torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    )
    row["final_loss"] = float(losses[-1])
    return row


def gpu_step_shape(quick: bool) -> TransformerShape:
    """The transformer ``precision-step-time`` trains on a GPU: GPT-2 small (2 layers quick)."""
    return TransformerShape.gpt_like(
        d_model=768, n_layers=2 if quick else 12, n_heads=12, seq_len=1024, batch_size=8
    )


#: when a tf32 step's backward started to run in TF32 too (commit ab66a8a): a record made before
#: timed a recipe the book no longer has under the name "tf32"
TF32_BACKWARD_SINCE = "2026-11-26T15:51:50+00:00"


def stale_recipes(record: Record) -> set[str]:
    """The recipes of a ``precision-step-time`` record that today's benchmark measures otherwise:
    ``{"tf32"}`` for a record made before :data:`TF32_BACKWARD_SINCE`, none for a later one.

    Decided by the record's date, not by whether it has a ``source_commit``: a record measured
    without the commit known (a GPU pass without ``.whl/COMMIT``) still ran today's recipe.
    """
    made = datetime.fromisoformat(record.created)
    return {"tf32"} if made < datetime.fromisoformat(TF32_BACKWARD_SINCE) else set()


def step_memory_prediction(recipe_name: str, quick: bool = False) -> Prediction:
    """The memory of one training step under ``recipe_name``, on the GPU benchmark's model.

    :func:`~trainfast.accounting.training_memory` (weights, gradients, AdamW moments, master
    weights where the recipe keeps them, and the activations saved with SDPA attention) for the
    transformer ``precision-step-time`` trains on a GPU; it measures the peak the caching
    allocator reports (``peak_memory_gb``), which adds temporaries and the allocator's rounding.
    """
    if recipe_name not in RECIPES:
        raise ValueError(f"Unknown recipe: {recipe_name!r} (expected one of {sorted(RECIPES)})")
    shape = gpu_step_shape(quick)
    recipe = RECIPES[recipe_name]
    memory = training_memory(shape, recipe=recipe, optimizer="adamw", attention="sdpa")
    return Prediction(
        memory.peak / 1e9,
        "GB",
        f"trainfast.accounting.training_memory, {recipe_name}, AdamW, GPT-2 small "
        f"({shape.n_layers} layers), batch {shape.batch_size} × {shape.seq_len} tokens",
    )


def step_time_record(device: torch.device, quick: bool) -> Record:
    """``precision-step-time``: one AdamW training step of the transformer under each recipe."""
    if device.type == "cuda":
        shape = gpu_step_shape(quick)
        recipes = ["fp32", "tf32", "bf16 autocast", "fp16 autocast + scaler", "pure bf16"]
        repeats = 3 if quick else 10
    else:
        shape = TransformerShape.gpt_like(
            d_model=32 if quick else 64,
            n_layers=2,
            n_heads=4,
            seq_len=16 if quick else 64,
            vocab_size=256,
            batch_size=4,
        )
        recipes = ["fp32", "bf16 autocast", "fp16 autocast + scaler", "pure bf16"]
        repeats = 2 if quick else 5
    rows = [_step_row(shape, name, device, repeats) for name in recipes]
    baseline = rows[0]["step_ms"]
    for row in rows:
        row["speedup_vs_fp32"] = baseline / row["step_ms"]
    if device.type != "cuda":
        for row in rows:
            del row["peak_memory_gb"], row["mfu"]
    fields = ", ".join(f"{f.name}={getattr(shape, f.name)}" for f in dataclasses.fields(shape))
    return make_record(
        "precision-step-time",
        f"One training step (AdamW, SDPA attention) of the book's transformer ({fields}) per "
        "precision recipe: median time, tokens/s, model FLOPs utilisation (MFU, against the GPU's "
        "dense bf16 peak), the memory trainfast.accounting predicts and, on a GPU, the peak the "
        "caching allocator measured.",
        rows,
        units={"step_ms": "ms", "iqr_ms": "ms", "predicted_gb": "GB", "peak_memory_gb": "GB"},
        device=device,
    )


#: PyTorch's autocast op reference (docs of ``torch.amp``, "CUDA Ops that can autocast to
#: float16"), the names as the documentation writes them.
PUBLISHED_CUDA_FLOAT16_OPS = frozenset(
    "__matmul__ addbmm addmm addmv addr baddbmm bmm chain_matmul multi_dot conv1d conv2d conv3d "
    "conv_transpose1d conv_transpose2d conv_transpose3d GRUCell linear LSTMCell matmul mm mv "
    "prelu RNNCell".split()
)
#: The same reference, "CUDA Ops that can autocast to float32".
PUBLISHED_CUDA_FLOAT32_OPS = frozenset(
    "__pow__ __rdiv__ __rpow__ __rtruediv__ acos asin binary_cross_entropy_with_logits cosh "
    "cosine_embedding_loss cdist cosine_similarity cross_entropy cumprod cumsum dist erfinv exp "
    "expm1 group_norm hinge_embedding_loss kl_div l1_loss layer_norm log log_softmax log10 log1p "
    "log2 margin_ranking_loss mse_loss multilabel_margin_loss multi_margin_loss nll_loss norm "
    "normalize pdist poisson_nll_loss pow prod reciprocal rsqrt sinh smooth_l1_loss "
    "soft_margin_loss softmax softmin softplus sum renorm tan triplet_margin_loss".split()
)
#: The documentation's name for an op of :data:`~trainfast.precision.numerics.AUTOCAST_OPS` where
#: the two differ: the reference lists ``norm``, and ``torch.norm`` computes a vector norm by
#: calling ``torch.linalg.vector_norm`` (``torch/functional.py``), the op ``autocast-policy``
#: runs.
PUBLISHED_NAMES = {"vector_norm": "norm"}


def published_cuda_autocast_policy(ops: Iterable[str] | None = None) -> dict[str, str]:
    """The float16 CUDA policy PyTorch's documentation publishes for each op of ``ops``.

    ``ops`` defaults to :data:`~trainfast.precision.numerics.AUTOCAST_OPS`, the ops
    ``autocast-policy`` measures. Policies use that benchmark's words: "lower precision" for the
    documentation's float16 list, "float32" for its float32 list, and "input dtype" for an op
    on neither list, which, the documentation says, runs in the type of its inputs. This is what
    the documentation promises, not a measurement: a CUDA record of ``autocast-policy`` says
    what the installed PyTorch does (the reference's float16 list, for one, omits
    ``scaled_dot_product_attention``, which CUDA autocast casts to float16). An op the
    documentation names differently is looked up under its name there (:data:`PUBLISHED_NAMES`).
    """
    from trainfast.precision.numerics import AUTOCAST_OPS

    policy = {}
    for op in AUTOCAST_OPS if ops is None else ops:
        name = PUBLISHED_NAMES.get(op, op)
        if name in PUBLISHED_CUDA_FLOAT16_OPS:
            policy[op] = "lower precision"
        elif name in PUBLISHED_CUDA_FLOAT32_OPS:
            policy[op] = "float32"
        else:
            policy[op] = "input dtype"
    return policy


def autocast_policy_record(device: torch.device, quick: bool) -> Record:
    """``autocast-policy``: :func:`~trainfast.precision.numerics.autocast_policy` for fp16, bf16."""
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        low = str(dtype).removeprefix("torch.")
        for row in autocast_policy(device, dtype):
            entry = {
                "op": row["op"],
                "autocast dtype": low,
                "from float32 inputs": row["from float32 inputs"],
                "from 16-bit inputs": row[f"from {low} inputs"],
                "policy": row["policy"],
            }
            rows.append(entry)
    return make_record(
        "autocast-policy",
        "The dtype torch.autocast gives each op on this device, "
        "from float32 and from 16-bit inputs.",
        rows,
        device=device,
    )


def matmul_error_record(device: torch.device, quick: bool) -> Record:
    """``matmul-error``: relative error against float64 per precision mode and inner size K."""
    size = 256 if device.type != "cuda" else 1024
    ks = [64, 256] if quick else [256, 1024, 4096]
    rows = [matmul_error(size, k, size, mode, device=device) for k in ks for mode in MATMUL_MODES]
    return make_record(
        "matmul-error",
        f"Relative Frobenius error of a ({size}, K) @ (K, {size}) product of standard normal "
        "matrices against float64, per precision mode (emulated: rounding done in software).",
        rows,
        device=device,
    )
