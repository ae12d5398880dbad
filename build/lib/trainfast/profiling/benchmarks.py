"""The profiling chapter's ``python -m trainfast.measure`` benchmarks, one function each.

* ``profiling-case-study`` (:func:`case_study_record`): step time of the case study with each
  fix added in turn, side by side in one run, with each run's loss deviation from the baseline;
* ``timing-pitfalls`` (:func:`timing_pitfalls_record`): wrong against right timing, zeros
  against random data, a cold cache against a warm one;
* ``launch-overhead`` (:func:`launch_overhead_record`): a chain of small kernels eager, compiled
  and replayed as CUDA graphs;
* ``copy-compute-overlap`` (:func:`copy_compute_overlap_record`, GPU only): a step that copies
  its batch in line, against one whose next batch is copied on a side stream;
* ``compile-by-width`` (:func:`compile_by_width_record`): a feed-forward block eager and
  compiled across widths, to show from which width compiling pays;
* ``compile-time`` (:func:`compile_time_record`): the case study's first compiled step in a new
  process with a cold compile cache, then with the cache the first run filled;
* ``gpu-bound-case-study`` (:func:`gpu_bound_case_study_record`, GPU only at full size): a
  decoder of GPT-2 small's size at the batch that fills the GPU, each fix added in turn.

Each takes ``(device, quick)``. ``quick`` is a smoke test of the code path, seconds on a CPU:
it never calls Inductor (a first compile takes tens of seconds on a small CPU), and says so in
its rows.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from trainfast.records import Record, make_record
from trainfast.transformer import TransformerShape
from trainfast.validation import plural

__all__ = [
    "case_study_record",
    "compile_by_width_record",
    "compile_time_record",
    "copy_compute_overlap_record",
    "gpu_bound_case_study_record",
    "launch_overhead_record",
    "timing_pitfalls_record",
]


def _quick_shape() -> TransformerShape:
    """The case study's model, shrunk for a smoke test: one layer of width 16."""
    from trainfast.profiling.case_study import CaseStudyConfig

    shape = CaseStudyConfig().shape
    return replace(
        shape,
        vocab_size=64,
        d_model=16,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        d_ff=32,
        seq_len=8,
        batch_size=2,
    )


def case_study_record(device: torch.device, quick: bool = False) -> Record:
    """Every fix this device can run, added one at a time; on a CPU, bf16 is measured alone.

    At the CPU model's width (``d_model`` 32) autocast's casts cost more than bfloat16
    arithmetic saves, even on a CPU with ``avx512_bf16``, so bf16 makes the step slower
    (:func:`~trainfast.profiling.overhead.autocast_matmul_ratio` shows the crossover by width),
    which would blur every later fix; so on a CPU the
    chain leaves it out and one extra run measures it alone against the baseline. The foreach
    AdamW, which ``AdamW(params)`` picks on CUDA, is measured alone everywhere. ``quick`` leaves
    out the fixes that compile and trains a few steps.
    """
    from trainfast.profiling.case_study import (
        LOSS_HORIZON,
        CaseStudyConfig,
        Fixes,
        compare_fixes,
        cumulative_fixes,
    )

    skip = [] if device.type == "cuda" else ["bf16"]
    config = CaseStudyConfig.for_device(device)
    if quick:
        skip += ["compile", "cuda_graphs"]
        config = CaseStudyConfig(shape=_quick_shape(), workers=1)
    variants = cumulative_fixes(device, skip=skip)
    if device.type != "cuda":
        variants["bf16 alone"] = Fixes(bf16=True)
    variants["foreach alone"] = Fixes(foreach_optimizer=True)  # AdamW's default on CUDA
    if device.type == "cpu":
        torch.set_num_threads(1)  # a tiny model: threads would only wait for each other
    passes = 1 if quick else 3
    rows, _ = compare_fixes(
        variants,
        config,
        device,
        steps_per_sample=2 if quick else 10,
        rounds=2 if quick else 9,
        passes=passes,
    )
    shape = config.shape
    description = (
        "Training step of the profiling case study (a decoder with Llama's choices: RMSNorm, "
        "RoPE, SwiGLU, grouped-query attention, no biases, an untied head; "
        f"{shape.n_layers} layers, d_model {shape.d_model}, {shape.n_heads} heads of which "
        f"{shape.kv_heads} key/value heads, d_ff {shape.d_ff}, vocabulary "
        f"{shape.vocab_size}, {shape.batch_size} x {shape.seq_len} tokens per step; word-level "
        f"tokens of Python's docs, {plural(config.workers, 'loader worker')} when on) with "
        "each fix "
        "added to the ones before, each run built, timed and torn down in turn, "
        f"{plural(passes, 'pass', 'passes')} over all of them (median of the samples); speedup is "
        "over the baseline; loss_deviation is the largest relative difference from the "
        f"baseline's loss over the first {LOSS_HORIZON} steps."
        + (" Quick smoke test: compile left out, tiny model." if quick else "")
    )
    units = {"step_ms": "ms", "iqr_ms": "ms", "speedup": "x", "first_step_s": "s"}
    return make_record("profiling-case-study", description, rows, units=units, device=device)


def timing_pitfalls_record(device: torch.device, quick: bool = False) -> Record:
    """The three pitfalls of :mod:`trainfast.profiling.pitfalls` at sizes that fit ``device``."""
    from trainfast.profiling.pitfalls import cold_and_warm, wrong_and_right, zeros_and_random

    if device.type == "cpu":
        torch.set_num_threads(1)
    if device.type == "cuda":
        size, dtype, buffer = (2048, 8192)[not quick], torch.bfloat16, 16 * 2**20  # fits 50 MB L2
        repeats, number = (10, 100)[not quick], (5, 20)[not quick]
    else:
        size, dtype, buffer = (128, 512)[not quick], torch.float32, (2 if quick else 8) * 2**20
        repeats, number = (5, 15)[not quick], (2, 5)[not quick]
    rows = wrong_and_right(device, size, dtype, repeats)
    rows += zeros_and_random(device, size, dtype, repeats, number)
    rows += cold_and_warm(device, buffer, repeats)
    description = (
        "Three timing pitfalls, each beside the right way: a matmul timed without warm-up and "
        "without waiting for the device (ratio: over the right way's median), the same matmul on "
        "zeros and on random inputs (ratio: over random), and a sum over a buffer that stays in "
        "cache or is flushed before every sample, one call a sample, on a GPU queued behind the "
        "flush or a busy-wait kernel so that its launch is hidden (ratio: over cold)."
    )
    return make_record(
        "timing-pitfalls",
        description,
        rows,
        units={"median_ms": "ms", "iqr_ms": "ms"},
        device=device,
    )


def launch_overhead_record(device: torch.device, quick: bool = False) -> Record:
    """:func:`~trainfast.profiling.overhead.launch_overhead`, with the dispatch rate in a row's
    note."""
    from trainfast.profiling.overhead import launch_overhead

    if device.type == "cpu":
        torch.set_num_threads(1)
    compiled = not quick
    rows = launch_overhead(
        device, repeats=5 if quick else 20, number=5 if quick else 50, compiled=compiled
    )
    description = (
        "A chain of 32 rounds of tanh(x * 1.01 + 0.01) on 1,024 float32 numbers (96 small "
        "kernels in eager mode): time per call eager, compiled, and replayed as a CUDA graph; "
        "first_call_s includes compiling or capturing."
        + ("" if compiled else " Quick smoke test: the compiled modes are left out.")
    )
    units = {"per_call_us": "µs", "iqr_us": "µs", "first_call_s": "s", "speedup": "x"}
    return make_record("launch-overhead", description, rows, units=units, device=device)


def compile_by_width_record(device: torch.device, quick: bool = False) -> Record:
    """:func:`~trainfast.profiling.overhead.compile_speedup_by_width` at widths that fit
    ``device``; ``quick`` takes three small widths (it still compiles: a minute on a CPU)."""
    from torch._inductor.utils import fresh_inductor_cache

    from trainfast.profiling.overhead import compile_speedup_by_width

    if device.type == "cpu":
        torch.set_num_threads(1)
        widths = [32, 128, 512] if quick else [32, 64, 128, 256, 512, 1024]
    else:
        widths = [64, 256, 1024] if quick else [64, 128, 256, 512, 1024, 2048, 4096]
    tokens = 256 if device.type == "cpu" else 8192
    # cold compiles, so compile_s is a real compile: Inductor's own fresh-cache context (a
    # temporary cache folder, and on leaving it the paths Inductor memoised inside it forgotten;
    # pointing TORCHINDUCTOR_CACHE_DIR at a folder deleted afterwards left torch 2.4 including a
    # deleted header in the next compile of the process)
    with fresh_inductor_cache():
        rows = compile_speedup_by_width(widths, device, tokens=tokens, repeats=5 if quick else 15)
    description = (
        f"A transformer feed-forward block (layer norm, width -> 4 x width, GELU, back to width, "
        f"residual add) on {tokens} float32 tokens, eager against torch.compile (Inductor, "
        "dynamic=False), timed side by side; ratio is compiled over eager, compile_s the first "
        "compiled call, with an empty Inductor cache."
        + (" Quick run: three widths, five samples." if quick else "")
    )
    units = {"eager_us": "µs", "compiled_us": "µs", "compile_s": "s"}
    units |= {"eager_iqr_us": "µs", "compiled_iqr_us": "µs"}
    return make_record("compile-by-width", description, rows, units=units, device=device)


def copy_compute_overlap_record(device: torch.device, quick: bool = False) -> Record:
    """:func:`~trainfast.profiling.streams.copy_compute_overlap` (CUDA only: ``ValueError``
    elsewhere), with the predicted copy time of one batch from the GPU's datasheet."""
    from dataclasses import asdict

    from trainfast.gpus import gpu_for_device
    from trainfast.profiling.streams import copy_compute_overlap, host_to_device_seconds

    batch_shape = (2048, 1024) if quick else (8192, 1024)
    rows = [
        asdict(row)
        for row in copy_compute_overlap(
            device, batch_shape=batch_shape, steps=4 if quick else 8, repeats=3 if quick else 11
        )
    ]
    gpu = gpu_for_device(device)
    predicted = host_to_device_seconds(4 * batch_shape[0] * batch_shape[1], gpu) if gpu else None
    for row in rows:
        row["predicted_copy_ms"] = predicted * 1e3 if predicted is not None else None
    description = (
        f"Steps that copy a float32 batch of {batch_shape[0]} x {batch_shape[1]} to the GPU and "
        "then run 8 matmuls of width 1024 with tanh: from pageable memory in line, from pinned "
        "memory in line (same stream), and prefetched on a side stream while the previous step "
        "computes; speedup is over the first; predicted_copy_ms is one batch's copy at the "
        "datasheet's one-way PCIe bandwidth." + (" Quick run: smaller batches." if quick else "")
    )
    units = {"step_ms": "ms", "iqr_ms": "ms", "speedup": "x", "predicted_copy_ms": "ms"}
    return make_record("copy-compute-overlap", description, rows, units=units, device=device)


def compile_time_record(device: torch.device, quick: bool = False) -> Record:
    """The case study's first compiled step, cold and cached, each in a new process.

    ``quick`` instead compiles in this process with the ``aot_eager`` backend (Dynamo and
    AOTAutograd, no Inductor): it checks the code path, not the compile time.
    """
    if quick:
        rows = [_quick_compile_row(device)]
    else:
        from trainfast.profiling.compilation import compile_time_in_fresh_process

        times = compile_time_in_fresh_process(device)
        rows = [
            {
                "backend": "inductor",
                "cache": cache,
                "first_step_s": times[f"{cache}_first_step_s"],
                "step_ms": times[cache]["step_s"] * 1e3,
                "fx_graph_hits": times[cache]["fx_graph_hits"],
                "fx_graph_misses": times[cache]["fx_graph_misses"],
            }
            for cache in ("cold", "cached")
        ]
    description = (
        "First training step of the case study with torch.compile (fused optimizer, SDPA, "
        "losses kept on the device), each in a new Python process: with an empty Inductor "
        "cache, then with the cache the first process filled; step_ms is a later step."
        + (" Quick smoke test: aot_eager backend in this process, no Inductor." if quick else "")
    )
    return make_record(
        "compile-time",
        description,
        rows,
        units={"first_step_s": "s", "step_ms": "ms"},
        device=device,
    )


def _quick_compile_row(device: torch.device) -> dict[str, object]:
    from trainfast.profiling.case_study import CaseStudy, CaseStudyConfig, Fixes
    from trainfast.timing import benchmark

    config = CaseStudyConfig(shape=_quick_shape(), compile_backend="aot_eager")
    study = CaseStudy(Fixes(sdpa=True, compile=True), config, device)
    first = benchmark(lambda: study.run(1), warmup=0, repeats=1, device=device)
    step = benchmark(lambda: study.run(1), warmup=1, repeats=3, device=device)
    return {
        "backend": "aot_eager",
        "cache": "n/a",
        "first_step_s": first.median,
        "step_ms": step.median * 1e3,
        "fx_graph_hits": 0,
        "fx_graph_misses": 0,
    }


def gpu_bound_case_study_record(device: torch.device, quick: bool = False) -> Record:
    """The GPU-bound case study (:mod:`trainfast.profiling.gpu_bound`): a decoder of GPT-2 small's
    size at sequences of 1,024 and the batch that fills the GPU's memory, with each fix added in
    turn, timed one after the other on the same batches.

    CUDA only at full size (``ValueError`` elsewhere): on another device the model is far from
    its regime. ``quick`` is a tiny model on any device, compiled with ``aot_eager``. Where the
    baseline's first step runs out of memory (the accounting model's batch, with its reserve,
    was too large for what this GPU holds), the batch shrinks by a fifth and the study starts
    again, at most twice; the record's description says which batch ran.
    """
    from trainfast.profiling.gpu_bound import (
        GPU_TIMING,
        GpuBoundConfig,
        compare_gpu_bound,
        gpu_bound_chain,
    )

    if quick:
        config = GpuBoundConfig.quick()
        if device.type == "cpu":
            torch.set_num_threads(1)
    elif device.type != "cuda":
        raise ValueError(
            f"gpu-bound-case-study needs a CUDA device at full size (got {device.type}): use "
            "--quick for a smoke test"
        )
    else:
        total = torch.cuda.get_device_properties(device).total_memory
        config = GpuBoundConfig.for_memory(total)
    import gc

    sizes = dict(steps_per_sample=1, rounds=4) if quick else dict(GPU_TIMING)
    rows = None
    for attempt in range(3):
        try:
            rows = compare_gpu_bound(gpu_bound_chain(), config, device, **sizes)
        except torch.cuda.OutOfMemoryError:  # the baseline did not fit: a smaller batch
            if attempt == 2:
                raise
        if rows is not None:
            break
        gc.collect()  # outside the except block: its traceback no longer holds the tensors
        torch.cuda.empty_cache()
        shape = config.shape
        config = replace(config, shape=replace(shape, batch_size=shape.batch_size * 4 // 5))
    for row in rows:
        row.pop("curve")
    shape = config.shape
    description = (
        "Training step of the GPU-bound case study (a decoder of GPT-2 small's size with Llama's "
        f"choices: {shape.n_layers} layers, d_model {shape.d_model}, {shape.n_heads} heads of "
        f"which {shape.kv_heads} key/value heads, SwiGLU width {shape.d_ff}, vocabulary "
        f"{shape.vocab_size}; {shape.batch_size} x {shape.seq_len} tokens per step, windows of "
        "Python's docs kept on the device) with each fix added to the ones before, each run "
        "built, timed and torn down in turn (median of the samples); speedup is over the "
        "baseline; loss_deviation is the largest relative difference from the baseline's loss "
        "over the steps every run took; model_flops are the unpadded model's matmul FLOPs per "
        "step; peak_gb the most memory the run allocated."
        + (" Quick smoke test: a tiny model, compiled with aot_eager." if quick else "")
    )
    units = {"step_ms": "ms", "iqr_ms": "ms", "speedup": "x", "first_step_s": "s"}
    units |= {"peak_gb": "GB", "model_flops": "FLOP"}
    return make_record("gpu-bound-case-study", description, rows, units=units, device=device)
