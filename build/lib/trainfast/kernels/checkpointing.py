"""Activation checkpointing, measured: the memory it saves and the compute it costs.

A training step keeps, for the backward pass, the tensors each operation saves: the
*activations*. With activation checkpointing (Chen et al., 2016; ``torch.utils.checkpoint``)
a block keeps only its input and runs its forward again during the backward pass. Memory per
block drops from everything the block saves to one ``(batch, seq, d_model)`` tensor, plus one
block's activations at a time during the backward; the price is a second forward of every
block, about a third more FLOPs for a step (forward 2, backward 4, recompute 2 per weight and
token).

:func:`checkpointing_costs` measures both on the book's transformer
(:class:`trainfast.transformer.Transformer`, which has the switch) beside what
:mod:`trainfast.accounting` predicts; :func:`checkpointing_record` is the benchmark.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from trainfast.accounting import (
    activation_bytes,
    counted_flops,
    model_activation_bytes,
    saved_tensor_bytes,
    training_flops,
)
from trainfast.records import Record, make_record
from trainfast.timing import benchmark
from trainfast.transformer import Attention, TransformerShape

__all__ = [
    "checkpointing_costs",
    "checkpointing_record",
    "checkpointing_setup",
    "saved_after_forward_prediction",
    "with_saved_prediction",
]


def saved_after_forward_prediction(
    shape: TransformerShape,
    *,
    value_bytes: float,
    attention: Attention,
    checkpointing: bool,
) -> float:
    """The activation bytes a step keeps after its forward, from :mod:`trainfast.accounting`.

    :func:`~trainfast.accounting.model_activation_bytes` less, with ``checkpointing``, the one
    block's activations it adds for the backward's recomputation: those are not alive until the
    backward rebuilds them, so a measurement taken after the forward cannot contain them.
    """
    total = model_activation_bytes(
        shape, value_bytes=value_bytes, attention=attention, checkpointing=checkpointing
    )
    if checkpointing:
        total -= activation_bytes(shape, value_bytes=value_bytes, attention=attention)
    return total


def checkpointing_costs(
    shape: TransformerShape,
    *,
    device: torch.device,
    attention: Attention = "sdpa",
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
) -> list[dict[str, Any]]:
    """One row per setting (checkpointing off, on): time, FLOPs and activation memory of a step.

    ``step_seconds`` is the median of forward + backward over ``repeats`` samples
    (:func:`trainfast.timing.benchmark`), ``step_seconds_min`` and ``_max`` their range;
    ``counted_flops`` what ``FlopCounterMode`` counts for the step (recomputation included);
    ``saved_bytes`` the bytes autograd keeps after the forward (parameters excluded), measured
    with :func:`trainfast.counters.saved_tensor_bytes`, and ``predicted_saved_bytes`` its
    prediction (:func:`saved_after_forward_prediction`); ``predicted_bytes`` the formula of
    :func:`trainfast.accounting.model_activation_bytes` (with checkpointing it adds the one
    block recomputed during backward, which is not alive after the forward); on CUDA
    ``peak_step_bytes`` is the peak memory of the step above the model's own.
    """
    from trainfast.transformer import Transformer, random_batch

    rows = []
    tokens, targets = random_batch(shape, device=device)
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = Transformer(shape, attention=attention, checkpointing=checkpointing)
        model = model.to(device, dtype)

        def step(model: torch.nn.Module = model) -> None:
            model.loss(tokens, targets).backward()
            model.zero_grad(set_to_none=True)

        timing = benchmark(step, warmup=1, repeats=repeats, device=device)
        flops = counted_flops(step)
        weights = list(model.parameters()) + list(model.buffers())
        saved = saved_tensor_bytes(lambda model=model: model.loss(tokens, targets), exclude=weights)
        peak = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            step()
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) - before
        value_bytes = torch.tensor([], dtype=dtype).element_size()
        predicted = model_activation_bytes(
            shape, value_bytes=value_bytes, attention=attention, checkpointing=checkpointing
        )
        predicted_saved = saved_after_forward_prediction(
            shape, value_bytes=value_bytes, attention=attention, checkpointing=checkpointing
        )
        row = {
            "checkpointing": checkpointing,
            "step_seconds": timing.median,
            "step_seconds_min": min(timing.samples),
            "step_seconds_max": max(timing.samples),
            "repeats": repeats,
            "counted_flops": flops,
            "model_flops": training_flops(shape),
            "saved_bytes": saved,
            "predicted_saved_bytes": predicted_saved,
            "predicted_bytes": predicted,
            "peak_step_bytes": peak,
        }
        rows.append(row)
        del model
    return rows


def checkpointing_setup(
    device: torch.device, quick: bool = False
) -> tuple[TransformerShape, torch.dtype, Attention]:
    """The benchmark's model on ``device``'s kind: a GPT-2-small-like model on a GPU (bf16, SDPA
    attention, batch 8 of 1024 tokens), a small one elsewhere (float32, attention written out so
    that ``FlopCounterMode`` counts all of it, 4 layers of width 256, batch 4 of 256); tiny with
    ``quick``."""
    if device.type == "cuda":
        shape = TransformerShape(50_304, 768, 12, 12, 3_072, 1_024, 8 if not quick else 2)
        dtype, attention = torch.bfloat16, "sdpa"
    else:
        shape = TransformerShape(2_048, 256, 4, 4, 1_024, 256, 4)
        dtype, attention = torch.float32, "manual"
    if quick:
        shape = replace(shape, n_layers=2, seq_len=min(shape.seq_len, 128))
    return shape, dtype, attention


def with_saved_prediction(record: Record, quick: bool = False) -> Record:
    """``record`` with its ``predicted_saved_bytes`` column from today's model
    (:func:`saved_after_forward_prediction` of :func:`checkpointing_setup`'s model): added after
    ``saved_bytes`` for records made before the benchmark wrote it, recomputed in records that
    have it, so every record is read against the same prediction.

    Raises ``ValueError`` naming the row when its ``predicted_bytes`` is not that model's
    formula, in any record, old or new: the record then measured another model, and the
    prediction would not be its own.
    """
    shape, dtype, attention = checkpointing_setup(torch.device(record.device), quick)
    value_bytes = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for i, row in enumerate(record.rows):
        settings = dict(value_bytes=value_bytes, attention=attention)
        formula = model_activation_bytes(shape, **settings, checkpointing=row["checkpointing"])
        if row["predicted_bytes"] != formula:
            raise ValueError(
                f"Record {record.name!r} on {record.device_name}, row {i}: predicted_bytes "
                f"{row['predicted_bytes']:,.0f} is not the formula {formula:,.0f} of the "
                f"benchmark's model on {record.device} (quick={quick})"
            )
        saved = saved_after_forward_prediction(
            shape, **settings, checkpointing=row["checkpointing"]
        )
        rows.append({**row, "predicted_saved_bytes": saved})
    columns = list(record.columns)
    if "predicted_saved_bytes" not in columns:
        columns.insert(columns.index("saved_bytes") + 1, "predicted_saved_bytes")
    units = {**record.units, "predicted_saved_bytes": "bytes"}
    return replace(record, columns=columns, rows=rows, units=units)


def checkpointing_record(device: torch.device, quick: bool) -> Record:
    """The benchmark: :func:`checkpointing_setup`'s model on ``device``, with and without
    checkpointing every block."""
    shape, dtype, attention = checkpointing_setup(device, quick)
    repeats = 3 if quick else 7
    rows = checkpointing_costs(
        shape, device=device, attention=attention, dtype=dtype, repeats=repeats
    )
    return make_record(
        "activation-checkpointing",
        f"One training step (forward + backward) of the book's transformer, {shape.n_layers} "
        f"layers of width {shape.d_model}, batch {shape.batch_size} x {shape.seq_len} tokens, "
        f"{str(dtype).removeprefix('torch.')}, {attention} attention; with and without "
        "checkpointing every block.",
        rows,
        units={
            "step_seconds": "s",
            "step_seconds_min": "s",
            "step_seconds_max": "s",
            "saved_bytes": "bytes",
            "predicted_saved_bytes": "bytes",
            "predicted_bytes": "bytes",
            "peak_step_bytes": "bytes",
        },
        device=device,
    )
