"""Bad input, tried as a user would: a clear error that names the value, and nothing lost.

Each table below is one *kind* of bad input (a non-finite number, a float or bool for an int, a
string for a number or a flag, a value torch accepts but cannot train with, mismatched data, a
broken file) applied to every public entry point it fits. A case passes when the call raises
``ValueError`` whose message matches ``names``: the field and the value the user gave, so the
message says what to fix. The data-loss tests at the end fail or kill a write half-way and check
that what was finished before is still there.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset
from trainfast import accounting, measure, records, sweeps, timing, validation
from trainfast.device import pick_device
from trainfast.distributed.launch import spawn
from trainfast.distributed.step_time import StepAssumptions, TrainingSetup, data_parallel_link
from trainfast.files import read_json, write_atomically, write_json_atomically
from trainfast.kernels.attention import attention_reference, flash_attention
from trainfast.optim import SGD, Adam, AdamW, Muon, RMSprop
from trainfast.precision.compensated import KahanAdamW
from trainfast.precision.formats import representable_values
from trainfast.precision.loss_scaling import GradScaler
from trainfast.precision.recipes import train_recipe
from trainfast.profiling.traces import trace_times
from trainfast.training.arguments import TrainingArguments
from trainfast.training.data import ClassSubset, load_images
from trainfast.training.schedules import lr_multiplier
from trainfast.transformer import TransformerShape

INF, NAN = float("inf"), float("nan")
SHAPE = TransformerShape(
    vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=128, seq_len=16, batch_size=2
)


#: local sweeps run on W&B's engine (`sweeps`, a book extra the package's own tests may lack)
needs_sweeps = pytest.mark.skipif(
    importlib.util.find_spec("sweeps") is None, reason="W&B's sweep engine is not installed"
)


def _sgd(params: list[torch.nn.Parameter]) -> SGD:
    return SGD(params, lr=0.1)


def _weights() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(4, 4))]


@dataclass(frozen=True)
class Case:
    """``call()`` must raise ValueError whose message matches ``names`` (the field and value)."""

    id: str
    call: Callable[[], Any]
    names: str
    marks: tuple[Any, ...] = ()


def _params(cases: list[Case]) -> list[Any]:
    return [pytest.param(case, id=case.id, marks=case.marks) for case in cases]


def _raises_naming(case: Case) -> None:
    with pytest.raises(ValueError, match=case.names):
        case.call()


# ---------------------------------------------------------------- non-finite numbers: inf, NaN
NON_FINITE = [
    Case("SGD lr=inf", lambda: SGD(_weights(), lr=INF), r"learning rate: inf"),
    Case("SGD lr=nan", lambda: SGD(_weights(), lr=NAN), r"learning rate: nan"),
    Case("RMSprop lr=inf", lambda: RMSprop(_weights(), lr=INF), r"learning rate: inf"),
    Case("Adam lr=inf", lambda: Adam(_weights(), lr=INF), r"learning rate: inf"),
    Case("AdamW lr=inf", lambda: AdamW(_weights(), lr=INF), r"learning rate: inf"),
    Case("Muon lr=inf", lambda: Muon(_weights(), lr=INF), r"learning rate: inf"),
    Case("Muon adamw_lr=inf", lambda: Muon(_weights(), adamw_lr=INF), r"learning rate: inf"),
    Case("KahanAdamW lr=inf", lambda: KahanAdamW(_weights(), lr=INF), r"learning rate: inf"),
    Case(
        "SGD weight_decay=nan",
        lambda: SGD(_weights(), lr=0.1, weight_decay=NAN),
        r"weight_decay value: nan",
    ),
    Case(
        "AdamW weight_decay=nan",
        lambda: AdamW(_weights(), lr=0.1, weight_decay=NAN),
        r"weight_decay value: nan",
    ),
    Case(
        "AdamW weight_decay=inf",
        lambda: AdamW(_weights(), lr=0.1, weight_decay=INF),
        r"weight_decay value: inf",
    ),
    Case("Adam eps=inf", lambda: Adam(_weights(), lr=0.1, eps=INF), r"epsilon value: inf"),
    Case(
        "Adam beta=nan",
        lambda: Adam(_weights(), lr=0.1, betas=(NAN, 0.9)),
        r"beta parameter at index 0: nan",
    ),
    Case(
        "a group's lr=inf",
        lambda: SGD([{"params": _weights(), "lr": INF}], lr=0.1),
        r"learning rate: inf",
    ),
    Case("TrainingArguments lr=inf", lambda: TrainingArguments(lr=INF), r"learning rate: inf"),
    Case(
        "TrainingArguments momentum=nan", lambda: TrainingArguments(momentum=NAN), r"momentum: nan"
    ),
    Case(
        "TrainingArguments weight_decay=inf",
        lambda: TrainingArguments(weight_decay=INF),
        r"weight_decay: inf",
    ),
    Case(
        "GradScaler init_scale=inf", lambda: GradScaler("cpu", init_scale=INF), r"init_scale: inf"
    ),
    Case(
        "GradScaler init_scale=nan", lambda: GradScaler("cpu", init_scale=NAN), r"init_scale: nan"
    ),
    Case(
        "GradScaler init_scale=1e39 (inf in float32)",
        lambda: GradScaler("cpu", init_scale=1e39),
        r"init_scale: 1e\+39",
    ),
    Case(
        "GradScaler.update(new_scale=inf)",
        lambda: GradScaler("cpu").update(new_scale=INF),
        r"new_scale: inf",
    ),
    Case(
        "GradScaler growth_factor=inf",
        lambda: GradScaler("cpu", growth_factor=INF),
        r"growth_factor: inf",
    ),
    Case(
        "StepAssumptions matmul_efficiency=nan",
        lambda: StepAssumptions(matmul_efficiency=NAN),
        r"matmul_efficiency: nan",
    ),
    Case(
        "StepAssumptions network_bytes_per_s=inf",
        lambda: StepAssumptions(network_bytes_per_s=INF),
        r"network_bytes_per_s: inf",
    ),
    Case(
        "StepAssumptions hierarchical_data_parallel='no'",
        lambda: StepAssumptions(hierarchical_data_parallel="no"),
        r"hierarchical_data_parallel: 'no'",
    ),
    Case(
        "data_parallel_link inner=0",
        lambda: data_parallel_link(0, 8, 1e12, StepAssumptions()),
        r"inner: 0",
    ),
    Case(
        "StepAssumptions nvlink_latency_s=inf",
        lambda: StepAssumptions(nvlink_latency_s=INF),
        r"nvlink_latency_s: inf",
    ),
    Case("StepAssumptions reserve=nan", lambda: StepAssumptions(reserve=NAN), r"reserve: nan"),
    Case("spawn timeout=inf", lambda: spawn(print, 1, timeout=INF), r"timeout: inf"),
    Case("spawn timeout=nan", lambda: spawn(print, 1, timeout=NAN), r"timeout: nan"),
    Case(
        "spawn collective_timeout=nan",
        lambda: spawn(print, 1, collective_timeout=NAN),
        r"collective_timeout: nan",
    ),
    Case(
        "lr_multiplier total_steps=inf",
        lambda: lr_multiplier(0, total_steps=INF),
        r"total_steps: inf",
    ),
    Case(
        "lr_multiplier total_steps=nan",
        lambda: lr_multiplier(0, total_steps=NAN),
        r"total_steps: nan",
    ),
    Case("zero_memory n_params=nan", lambda: accounting.zero_memory(NAN, 8, 1), r"n_params: nan"),
    Case("zero_memory n_params=-1", lambda: accounting.zero_memory(-1, 8, 1), r"n_params: -1"),
    Case(
        "zero_memory optimizer_bytes=-12",
        lambda: accounting.zero_memory(1e9, 8, 1, optimizer_bytes=-12),
        r"optimizer_bytes: -12",
    ),
    Case(
        "activation_bytes value_bytes=nan",
        lambda: accounting.activation_bytes(SHAPE, value_bytes=NAN),
        r"value_bytes: nan",
    ),
    Case(
        "activation_bytes value_bytes=-2",
        lambda: accounting.activation_bytes(SHAPE, value_bytes=-2),
        r"value_bytes: -2",
    ),
    Case(
        "model_activation_bytes value_bytes=-2",
        lambda: accounting.model_activation_bytes(SHAPE, value_bytes=-2),
        r"value_bytes: -2",
    ),
    Case(
        "checkpointed_layer_bytes value_bytes=nan",
        lambda: accounting.checkpointed_layer_bytes(SHAPE, value_bytes=NAN),
        r"value_bytes: nan",
    ),
    Case("matmul_flops m=-4", lambda: accounting.matmul_flops(-4, 8, 8), r"Invalid m: -4"),
    Case(
        "training_run_seconds mfu=nan",
        lambda: accounting.training_run_seconds(6e9, 1e9, n_gpus=8, peak_flops=1e15, mfu=NAN),
        r"mfu: nan",
    ),
    Case(
        "model_flops_utilization peak_flops=inf",
        lambda: accounting.model_flops_utilization(1e12, 1.0, INF),
        r"peak_flops: inf",
    ),
    Case(
        "train_recipe loss_divisor=inf",
        lambda: train_recipe(
            "fp32", torch.zeros(4, 64), torch.zeros(4), _sgd, steps=1, loss_divisor=INF
        ),
        r"loss_divisor: inf",
    ),
    Case(
        "representable_values low=nan",
        lambda: representable_values("float16", NAN, 1.0),
        r"low: nan",
    ),
    Case(
        "load_images validation_fraction=nan",
        lambda: load_images(validation_fraction=NAN),
        r"validation_fraction: nan",
    ),
]


@pytest.mark.parametrize("case", _params(NON_FINITE))
def test_non_finite_numbers_are_named(case: Case) -> None:
    _raises_naming(case)


# ------------------------------------------- values torch accepts but cannot train with: say so
TORCH_WOULD_ACCEPT = [
    Case("SGD lr=inf", lambda: SGD(_weights(), lr=INF), r"inf .*torch.optim would accept it"),
    Case(
        "SGD momentum=1.5",
        lambda: SGD(_weights(), lr=0.1, momentum=1.5),
        r"momentum value: 1.5 .*torch.optim would accept it",
    ),
    Case(
        "SGD momentum=1",
        lambda: SGD(_weights(), lr=0.1, momentum=1.0),
        r"momentum value: 1.0 .*torch.optim would accept it",
    ),
    Case(
        "RMSprop alpha=1.5",
        lambda: RMSprop(_weights(), lr=0.1, alpha=1.5),
        r"alpha value: 1.5 .*torch.optim would accept it",
    ),
    Case(
        "RMSprop momentum=2",
        lambda: RMSprop(_weights(), lr=0.1, momentum=2),
        r"momentum value: 2 .*torch.optim would accept it",
    ),
    Case(
        "Muon momentum=1.5",
        lambda: Muon(_weights(), momentum=1.5),
        r"momentum value: 1.5 .*torch.optim would accept it",
    ),
    Case("Adam lr=inf", lambda: Adam(_weights(), lr=INF), r"torch.optim would accept it"),
    Case(
        "GradScaler init_scale=inf",
        lambda: GradScaler("cpu", init_scale=INF),
        r"torch.amp.GradScaler would accept it",
    ),
    Case(
        "GradScaler.update(new_scale=inf)",
        lambda: GradScaler("cpu").update(new_scale=INF),
        r"torch.amp.GradScaler would accept it",
    ),
]


@pytest.mark.parametrize("case", _params(TORCH_WOULD_ACCEPT))
def test_values_torch_accepts_are_refused_saying_torch_would(case: Case) -> None:
    _raises_naming(case)


def test_torch_really_accepts_what_the_messages_say_it_does() -> None:
    """The "torch would accept it" notes are true of the installed torch."""
    torch.optim.SGD(_weights(), lr=INF)
    torch.optim.SGD(_weights(), lr=0.1, momentum=1.5)
    torch.optim.RMSprop(_weights(), lr=0.1, alpha=1.5)
    torch.optim.Adam(_weights(), lr=INF)
    torch.amp.GradScaler("cpu", init_scale=INF)


# --------------------------------------------------------- floats and bools where ints belong
NOT_AN_INT = [
    Case(
        "checkpoint_sequential_segments segments=4.0",
        lambda: accounting.checkpoint_sequential_segments(16, 4.0),
        r"segments: 4.0",
    ),
    Case("TrainingArguments epochs=1.5", lambda: TrainingArguments(epochs=1.5), r"epochs: 1.5"),
    Case("TrainingArguments epochs=True", lambda: TrainingArguments(epochs=True), r"epochs: True"),
    Case(
        "TrainingArguments batch_size=32.0",
        lambda: TrainingArguments(batch_size=32.0),
        r"batch_size: 32.0",
    ),
    Case(
        "TrainingArguments log_every=2.5",
        lambda: TrainingArguments(log_every=2.5),
        r"log_every: 2.5",
    ),
    Case(
        "TrainingArguments eval_every=0.5",
        lambda: TrainingArguments(eval_every=0.5),
        r"eval_every: 0.5",
    ),
    Case("TrainingArguments seed=0.5", lambda: TrainingArguments(seed=0.5), r"seed: 0.5"),
    Case(
        "TrainingSetup zero_stage=True",
        lambda: TrainingSetup(SHAPE, zero_stage=True),
        r"zero_stage: True",
    ),
    Case(
        "TrainingSetup zero_stage=1.0",
        lambda: TrainingSetup(SHAPE, zero_stage=1.0),
        r"zero_stage: 1.0",
    ),
    Case("TrainingSetup data=2.0", lambda: TrainingSetup(SHAPE, data=2.0), r"data: 2.0"),
    Case(
        "StepAssumptions gpus_per_node=8.0",
        lambda: StepAssumptions(gpus_per_node=8.0),
        r"gpus_per_node: 8.0",
    ),
    Case(
        "TransformerShape d_model=32.0",
        lambda: TransformerShape(64, 32.0, 2, 4, 128, 16, 2),
        r"d_model: 32.0",
    ),
    Case("zero_memory stage=True", lambda: accounting.zero_memory(1e9, 8, True), r"stage: True"),
    Case(
        "training_memory zero_stage=True",
        lambda: accounting.training_memory(
            SHAPE, recipe="fp32", optimizer="adamw", zero_stage=True
        ),
        r"stage: True",
    ),
    Case("matmul_flops k=8.5", lambda: accounting.matmul_flops(4, 8.5, 8), r"k: 8.5"),
    Case("Muon ns_steps=2.5", lambda: Muon(_weights(), ns_steps=2.5), r"ns_steps: 2.5"),
    Case(
        "GradScaler growth_interval=1.5",
        lambda: GradScaler("cpu", growth_interval=1.5),
        r"growth_interval: 1.5",
    ),
    Case(
        "benchmark repeats=2.5",
        lambda: timing.benchmark(lambda: None, repeats=2.5),
        r"repeats: 2.5",
    ),
    Case(
        "benchmark warmup=True",
        lambda: timing.benchmark(lambda: None, warmup=True),
        r"warmup: True",
    ),
    Case("benchmark number=0", lambda: timing.benchmark(lambda: None, number=0), r"number: 0"),
    Case(
        "benchmark_side_by_side number=1.5",
        lambda: timing.benchmark_side_by_side({"a": lambda: None}, number={"a": 1.5}),
        r"number.*: 1.5",
    ),
    Case(
        "lr_multiplier total_steps=10.0",
        lambda: lr_multiplier(0, total_steps=10.0),
        r"total_steps: 10.0",
    ),
    Case(
        "lr_multiplier warmup_steps=1.5",
        lambda: lr_multiplier(0, total_steps=10, warmup_steps=1.5),
        r"warmup_steps: 1.5",
    ),
    Case("spawn world_size=2.0", lambda: spawn(print, 2.0), r"world_size: 2.0"),
    Case(
        "spawn threads_per_rank=0",
        lambda: spawn(print, 1, threads_per_rank=0),
        r"threads_per_rank: 0",
    ),
    Case(
        "train_recipe steps=1.5",
        lambda: train_recipe("fp32", torch.zeros(4, 64), torch.zeros(4), _sgd, steps=1.5),
        r"steps: 1.5",
    ),
    Case("load_images channels=1.5", lambda: load_images(channels=1.5), r"channels: 1.5"),
    Case("load_images size=True", lambda: load_images(size=True), r"size: True"),
    Case(
        "representable_values max_count=1e6",
        lambda: representable_values("float16", 1.0, 2.0, max_count=1e6),
        r"max_count: 1000000.0",
    ),
    Case(
        "sweeps.run_locally count=2.5",
        lambda: sweeps.run_locally(
            {"method": "grid", "parameters": {"x": {"values": [1]}}}, lambda c: {}, 2.5
        ),
        r"count: 2.5",
    ),
]


@pytest.mark.parametrize("case", _params(NOT_AN_INT))
def test_floats_and_bools_for_ints_are_named(case: Case) -> None:
    _raises_naming(case)


# ------------------------------------------------------ strings where numbers or flags belong
STRING_FOR_NUMBER_OR_FLAG = [
    Case("SGD lr='1e-3'", lambda: SGD(_weights(), lr="1e-3"), r"learning rate: '1e-3'"),
    Case("AdamW lr='0.001'", lambda: AdamW(_weights(), lr="0.001"), r"learning rate: '0.001'"),
    Case(
        "Adam betas='0.9,0.99'",
        lambda: Adam(_weights(), lr=0.1, betas="0.9,0.99"),
        r"betas: '0.9,0.99'",
    ),
    Case(
        "Adam betas=('0.9', 0.99)",
        lambda: Adam(_weights(), lr=0.1, betas=("0.9", 0.99)),
        r"index 0: '0.9'",
    ),
    Case("Muon ns_steps='5'", lambda: Muon(_weights(), ns_steps="5"), r"ns_steps: '5'"),
    Case(
        "KahanAdamW eps='1e-8'",
        lambda: KahanAdamW(_weights(), eps="1e-8"),
        r"epsilon value: '1e-8'",
    ),
    Case(
        "TrainingArguments lr='1e-3'",
        lambda: TrainingArguments(lr="1e-3"),
        r"learning rate: '1e-3'",
    ),
    Case("TrainingArguments epochs='2'", lambda: TrainingArguments(epochs="2"), r"epochs: '2'"),
    Case(
        "GradScaler init_scale='65536'",
        lambda: GradScaler("cpu", init_scale="65536"),
        r"init_scale: '65536'",
    ),
    Case(
        "StepAssumptions matmul_efficiency='0.4'",
        lambda: StepAssumptions(matmul_efficiency="0.4"),
        r"matmul_efficiency: '0.4'",
    ),
    Case(
        "zero_memory n_params='1e9'",
        lambda: accounting.zero_memory("1e9", 8, 1),
        r"n_params: '1e9'",
    ),
    Case("spawn timeout='60'", lambda: spawn(print, 1, timeout="60"), r"timeout: '60'"),
    Case("Adam amsgrad='no'", lambda: Adam(_weights(), lr=0.1, amsgrad="no"), r"amsgrad: 'no'"),
    Case("SGD nesterov='no'", lambda: SGD(_weights(), lr=0.1, nesterov="no"), r"nesterov: 'no'"),
    Case(
        "RMSprop centered='false'",
        lambda: RMSprop(_weights(), lr=0.1, centered="false"),
        r"centered: 'false'",
    ),
    Case("AdamW maximize=1", lambda: AdamW(_weights(), lr=0.1, maximize=1), r"maximize: 1"),
    Case(
        "flash_attention is_causal='no'",
        lambda: flash_attention(*torch.zeros(3, 1, 4, 8), is_causal="no"),
        r"is_causal: 'no'",
    ),
    Case(
        "attention_reference is_causal='no'",
        lambda: attention_reference(*torch.zeros(3, 1, 4, 8), is_causal="no"),
        r"is_causal: 'no'",
    ),
    Case(
        "TrainingArguments progress_bar='no'",
        lambda: TrainingArguments(progress_bar="no"),
        r"progress_bar: 'no'",
    ),
    Case(
        "TrainingSetup dropout='yes'",
        lambda: TrainingSetup(SHAPE, dropout="yes"),
        r"dropout: 'yes'",
    ),
    Case(
        "activation_bytes sequence_parallel='no'",
        lambda: accounting.activation_bytes(SHAPE, sequence_parallel="no"),
        r"sequence_parallel: 'no'",
    ),
    Case(
        "benchmark synchronize='no'",
        lambda: timing.benchmark(lambda: None, synchronize="no"),
        r"synchronize: 'no'",
    ),
    Case("benchmark fn not callable", lambda: timing.benchmark(3), r"function 'fn': 3"),
]


@pytest.mark.parametrize("case", _params(STRING_FOR_NUMBER_OR_FLAG))
def test_strings_for_numbers_and_flags_are_named(case: Case) -> None:
    _raises_naming(case)


# ------------------------------------------- config files: YAML's strings, converted by one rule
def test_config_text_that_is_a_plain_number_is_converted() -> None:
    """YAML reads ``lr: 1e-3`` as the string '1e-3'; from_config converts it, and ints too."""
    args = TrainingArguments.from_config(
        {"lr": "1e-3", "epochs": "2", "momentum": "0.5", "eval_every": "64"}
    )
    assert (args.lr, args.epochs, args.momentum, args.eval_every) == (1e-3, 2, 0.5, 64)
    assert isinstance(args.epochs, int) and isinstance(args.lr, float)


CONFIG_TEXT = [
    Case("lr: fast", lambda: TrainingArguments.from_config({"lr": "fast"}), r"lr: 'fast'"),
    Case("lr: nan", lambda: TrainingArguments.from_config({"lr": "nan"}), r"lr: 'nan'"),
    Case("lr: inf", lambda: TrainingArguments.from_config({"lr": "inf"}), r"lr: 'inf'"),
    Case("epochs: 1.5", lambda: TrainingArguments.from_config({"epochs": "1.5"}), r"epochs: '1.5'"),
    Case(
        "epochs: 1.5 (a number)",
        lambda: TrainingArguments.from_config({"epochs": 1.5}),
        r"epochs: 1.5",
    ),
    Case(
        "batch_size: 3e1",
        lambda: TrainingArguments.from_config({"batch_size": "3e1"}),
        r"batch_size: '3e1'",
    ),
    Case(
        "lr: -1e-3",
        lambda: TrainingArguments.from_config({"lr": "-1e-3"}),
        r"learning rate: -0.001",
    ),
    Case("a default given as text", lambda: TrainingArguments.from_config({}, lr="x"), r"lr: 'x'"),
]


@pytest.mark.parametrize("case", _params(CONFIG_TEXT))
def test_config_text_that_is_not_a_number_is_named(case: Case) -> None:
    _raises_naming(case)


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("1e-3", float, 1e-3),
        (" 0.5 ", float, 0.5),
        ("-2", int, -2),
        ("32", float, 32.0),
        (".5", float, 0.5),
        (3, int, 3),
    ],
)
def test_number_from_config_has_one_rule(text: Any, kind: type, expected: Any) -> None:
    value = validation.number_from_config("x", text, integer=kind is int)
    assert value == expected and type(value) is type(expected)


# ------------------------------------------------------------------ devices go through pick_device
DEVICES = [
    Case("pick_device('gpu')", lambda: pick_device("gpu"), r"'gpu'"),
    Case("pick_device('')", lambda: pick_device(""), r"''"),
    Case("pick_device(0)", lambda: pick_device(0), r"device: 0"),
    Case("TrainingArguments device='gpu'", lambda: TrainingArguments(device="gpu"), r"'gpu'"),
    Case("TrainingArguments device=0", lambda: TrainingArguments(device=0), r"device: 0"),
    Case("benchmark device='gpu'", lambda: timing.benchmark(lambda: None, device="gpu"), r"'gpu'"),
]
if not torch.cuda.is_available():
    DEVICES += [
        Case(
            "benchmark device='cuda:0' without one",
            lambda: timing.benchmark(lambda: None, device="cuda:0"),
            r"'cuda' is not available",
        ),
    ]


@pytest.mark.parametrize("case", _params(DEVICES))
def test_device_strings_are_checked_by_pick_device(case: Case) -> None:
    _raises_naming(case)


# ---------------------------------------------------------------- mismatched or impossible data
DATA = [
    Case(
        "train_recipe 8 inputs, 5 targets",
        lambda: train_recipe(
            "fp32", torch.zeros(8, 64), torch.zeros(5, dtype=torch.long), _sgd, steps=1
        ),
        r"8 inputs but 5 targets",
    ),
    Case(
        "ClassSubset per_class=-1",
        lambda: ClassSubset(
            TensorDataset(torch.zeros(4, 1), torch.tensor([0, 0, 1, 1])), [0, 1], per_class=-1
        ),
        r"per_class: -1",
    ),
    Case(
        "ClassSubset per_class=0",
        lambda: ClassSubset(
            TensorDataset(torch.zeros(4, 1), torch.tensor([0, 0, 1, 1])), [0, 1], per_class=0
        ),
        r"per_class: 0",
    ),
    Case(
        "ClassSubset classes=[]",
        lambda: ClassSubset(TensorDataset(torch.zeros(4, 1), torch.tensor([0, 0, 1, 1])), []),
        r"classes: \[\]",
    ),
    Case("load_images channels=0", lambda: load_images(channels=0), r"channels: 0"),
    Case("load_images size=-8", lambda: load_images(size=-8), r"size: -8"),
    Case(
        "representable_values float32 from 1e-45 to inf",
        lambda: representable_values("float32", 1e-45, INF),
        r"float32 has up to 2,139,095,040 values.*max_count=1,000,000",
    ),
    Case(
        "training_run_seconds mfu=4",
        lambda: accounting.training_run_seconds(6e9, 1e9, n_gpus=8, peak_flops=1e15, mfu=4),
        r"mfu: 4",
    ),
    Case(
        "checkpoint_sequential_segments 4 layers in 5 segments",
        lambda: accounting.checkpoint_sequential_segments(4, 5),
        r"segments: 5 \(expected an integer from 1 to 4\)",
    ),
    Case(
        "segmented_activation_bytes no segment",
        lambda: accounting.segmented_activation_bytes(()),
        r"segment_layers: \(\)",
    ),
    Case(
        "segmented_activation_bytes a segment of 0 layers",
        lambda: accounting.segmented_activation_bytes((3, 0)),
        r"segment_layers\[1\]: 0",
    ),
    Case(
        "segmented_activation_bytes a number of layers, not segments",
        lambda: accounting.segmented_activation_bytes(16),
        r"segment_layers: 16",
    ),
]


@pytest.mark.parametrize("case", _params(DATA))
def test_mismatched_or_impossible_data_is_named(case: Case) -> None:
    _raises_naming(case)


def test_an_mfu_above_100_percent_raises_naming_the_figures() -> None:
    """1000 % cannot be (inputs swapped, or the wrong units); a run in fp8 says it may be."""
    with pytest.raises(ValueError, match=r"MFU of 1000%.*flops_per_step=1e\+13.*peak_flops=1e\+12"):
        accounting.model_flops_utilization(1e13, 1.0, 1e12)
    with pytest.raises(ValueError, match=r"above 100%.*peak_flops=989 .*other units"):
        accounting.model_flops_utilization(4e14, 1.0, 989)  # the peak in TFLOP/s
    assert accounting.model_flops_utilization(
        1.5e12, 1.0, 1e12, faster_than_bf16=True
    ) == pytest.approx(1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert accounting.model_flops_utilization(4e11, 1.0, 1e12) == pytest.approx(0.4)


def test_representable_values_still_lists_a_small_range() -> None:
    assert len(representable_values("float16", 1.0, 2.0)) == 1024  # 2^10 between 1 and 2


# -------------------------------------------------------------- collectives: ranks that disagree
def _disagreeing_ranks(rank: int, world_size: int) -> list[str]:
    """Each collective called with an argument that differs on rank 1; every rank must raise."""
    from trainfast.distributed import collectives

    calls = [
        lambda: collectives.broadcast(torch.ones(3), src=rank),
        lambda: collectives.all_reduce(torch.ones(3), op="sum" if rank == 0 else "max"),
        lambda: collectives.ring_all_reduce(torch.ones(3), op="sum" if rank == 0 else "mean"),
        lambda: collectives.reduce(torch.ones(3), dst=0 if rank == 0 else 5),
        lambda: collectives.all_reduce(torch.ones(3 + rank)),
        lambda: (collectives.broadcast if rank == 0 else collectives.all_reduce)(torch.ones(3)),
    ]
    messages = []
    for call in calls:
        try:
            call()
            messages.append("no error")
        except ValueError as error:
            messages.append(str(error))
    t = torch.full((2,), float(rank))
    collectives.all_reduce(t)  # the group still works afterwards
    messages.append(str(t.tolist()))
    return messages


def test_collectives_name_the_rank_and_the_argument_it_disagrees_on() -> None:
    start = time.monotonic()
    results = spawn(_disagreeing_ranks, 2, timeout=120)
    assert results[0] == results[1]  # every rank raised, and the same error
    expected = [
        r"broadcast across ranks: rank 1 has src=1, but rank 0 has src=0",
        r"all_reduce across ranks: rank 1 has op='max', but rank 0 has op='sum'",
        r"ring_all_reduce across ranks: rank 1 has op='mean', but rank 0 has op='sum'",
        r"reduce across ranks: rank 1 has dst=5, but rank 0 has dst=0",
        r"Mismatched tensor across ranks: rank 1 has shape \(4,\)",
        r"Mismatched collectives across ranks: rank 1 called all_reduce, but rank 0 called "
        r"broadcast",
    ]
    assert len(results[0]) == len(expected) + 1
    for message, pattern in zip(results[0], expected, strict=False):
        assert re.search(pattern, message), (pattern, message)
    assert results[0][-1] == "[1.0, 1.0]"
    assert time.monotonic() - start < 100  # no 60 s gloo timeout on the way


# ------------------------------------------------------------------------------- file readers
def _record_dict() -> dict[str, Any]:
    return {
        "name": "bench",
        "description": "d",
        "columns": ["x"],
        "rows": [{"x": 1}],
        "environment": {"device": "cpu", "device_name": "cpu"},
        "created": "2026-01-01T00:00:00+00:00",
        "command": "python -m trainfast.measure",
    }


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rows", {"x": 1}),
        ("columns", "x"),
        ("environment", ["cpu"]),
        ("name", 3),
        ("schema_version", "1"),
        ("rows", [[1]]),
        ("columns", [1]),
    ],
)
def test_record_from_dict_checks_types_naming_the_file_and_key(key: str, value: Any) -> None:
    data = {**_record_dict(), key: value}
    with pytest.raises(ValueError, match=rf"records/bench.json: invalid .*{key}"):
        records.Record.from_dict(data, source="records/bench.json")


@pytest.mark.parametrize(
    ("reader", "name"),
    [
        (records.load_records, "bench.json"),
        (trace_times, "trace.json"),
        pytest.param(
            lambda path: sweeps.SharedSweep(path).records(), "sweep.json", marks=needs_sweeps
        ),
        (read_json, "state.json"),
    ],
)
def test_a_cut_off_json_file_is_named(tmp_path: Path, reader: Callable[[Path], Any], name: str):
    path = tmp_path / name
    path.write_text('{"traceEvents": [{"name": "ProfilerSt')  # a write that was killed
    before = path.read_text()
    target = tmp_path if reader is records.load_records else path
    with pytest.raises(ValueError, match=rf"{name}.*(JSON|json)"):
        reader(target)
    assert path.read_text() == before  # never replaced by an empty state


# ------------------------------------------------------- measure --out, checked before any run
@pytest.mark.parametrize("out", ["", "  ", "a-file"])
def test_measure_checks_out_before_running(tmp_path: Path, monkeypatch, capsys, out: str):
    ran = []
    monkeypatch.setitem(measure.BENCHMARKS, "fake", lambda device, quick: ran.append(1))
    if out == "a-file":
        out = str(tmp_path / "a-file")
        Path(out).write_text("not a folder")
    with pytest.raises(SystemExit):
        measure.main(["--out", out, "--only", "fake", "--device", "cpu"])
    assert ran == []  # nothing was run, so nothing was lost
    assert repr(out) in capsys.readouterr().err


def test_measure_names_a_bad_device_as_usage(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(measure.BENCHMARKS, "fake", lambda device, quick: None)
    with pytest.raises(SystemExit):
        measure.main(["--out", str(tmp_path), "--only", "fake", "--device", "gpu"])
    assert "'gpu'" in capsys.readouterr().err


# ---------------------------------------------------------------------- nothing finished is lost
def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    record = records.Record.from_dict(_record_dict())
    path = records.write_record(record, tmp_path)
    before = path.read_text()
    broken = records.Record.from_dict({**_record_dict(), "rows": [{"x": torch.ones(1)}]})
    with pytest.raises(ValueError, match="cannot write this as JSON"):
        records.write_record(broken, tmp_path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


_WRITER = textwrap.dedent(
    """
    import sys
    from trainfast.files import write_json_atomically
    i = 0
    while True:
        write_json_atomically(sys.argv[1], {"i": i, "rows": ["x" * 1000] * 2000})
        if i == 0:
            print("wrote", flush=True)
        i += 1
    """
)


def test_a_writer_killed_mid_write_leaves_a_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json_atomically(path, {"i": -1, "rows": []})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for delay in (0.0, 0.003, 0.01, 0.05):  # a 2 MB write takes milliseconds: kill inside one
        writer = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path)], env=env, stdout=subprocess.PIPE, text=True
        )
        assert writer.stdout is not None and writer.stdout.readline() == "wrote\n"
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        data = read_json(path)  # a whole state, never half of one
        assert data["i"] >= 0 and len(data["rows"]) == 2000


def test_a_write_that_fails_half_way_keeps_the_old_file(tmp_path: Path, monkeypatch) -> None:
    """The disk fills after the new text is written but before it is in place: the old file
    stays whole and no temporary file is left behind."""
    path = tmp_path / "summary.json"
    write_json_atomically(path, {"steps": ["finished"]})

    def disk_full(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_json_atomically(path, {"steps": ["finished", "half"]})
    assert read_json(path) == {"steps": ["finished"]}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_write_atomically_keeps_the_mode_of_the_file_it_replaces(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    write_atomically(path, "a")
    assert path.stat().st_mode & 0o777 == 0o644
    path.chmod(0o600)
    write_atomically(path, "b")
    assert path.read_text() == "b" and path.stat().st_mode & 0o777 == 0o600


_GRID = {
    "method": "grid",
    "metric": {"name": "loss", "goal": "minimize"},
    "parameters": {"x": {"values": [1, 2, 3, 4]}},
}


@needs_sweeps
def test_a_shared_sweep_names_a_bad_metric_and_marks_the_run_failed(tmp_path: Path) -> None:
    shared = sweeps.SharedSweep(tmp_path / "sweep.json")
    done = sweeps.run_locally(_GRID, lambda c: {"loss": float(c["x"])}, 2, shared=shared)
    assert len(done) == 2

    with pytest.raises(ValueError, match=r"metric 'loss' of run-2: tensor\(3\.\).*Tensor"):
        sweeps.run_locally(_GRID, lambda c: {"loss": torch.tensor(float(c["x"]))}, 1, shared=shared)
    states = {r["name"]: (r["state"], r["summary"]) for r in shared.records()}
    assert states["run-0"] == ("finished", {"loss": 1.0})  # finished work is still there
    assert states["run-1"] == ("finished", {"loss": 2.0})
    assert states["run-2"][0] == "failed"  # never left "running" for ever
    failed = next(r for r in shared.records() if r["name"] == "run-2")
    assert "loss" in failed["error"]

    # another agent carries on: it reads the file, and the sweep ends with nothing running
    sweeps.run_locally(_GRID, lambda c: {"loss": float(c["x"])}, 10, shared=shared)
    assert all(r["state"] in ("finished", "failed") for r in shared.records())
    assert {r["config"]["x"]["value"] for r in shared.records() if r["state"] == "finished"} >= {
        1,
        2,
        4,
    }


@needs_sweeps
def test_a_sweep_function_that_raises_marks_its_run_failed(tmp_path: Path) -> None:
    shared = sweeps.SharedSweep(tmp_path / "sweep.json")

    def crash(config: dict[str, Any]) -> dict[str, float]:
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        sweeps.run_locally(_GRID, crash, 1, shared=shared)
    (run,) = shared.records()
    assert run["state"] == "failed" and "out of memory" in run["error"]


def test_validation_messages_keep_their_shape() -> None:
    """One shape for every message: ``Invalid <name>: <value!r> (expected ...)``."""
    for check, value in [
        (lambda v: validation.check_int("n", v, minimum=1), 1.5),
        (lambda v: validation.check_number("x", v, above=0), math.inf),
        (lambda v: validation.check_flag("f", v), "no"),
        (lambda v: validation.check_positive("n", v), True),
        (lambda v: validation.check_positive_number("x", v), "1"),
        (lambda v: validation.number_from_config("x", v), "one"),
        (lambda v: validation.check_choice("goal", v, ("minimize", "maximize")), "maximise"),
        (lambda v: validation.check_choice("n", v, (1, 2)), True),  # True == 1, but not an option
        (lambda v: validation.check_instance("shape", v, TransformerShape), {"d_model": 8}),
        (lambda v: validation.check_counts(m=4, k=v), 2.5),
        (lambda v: validation.existing_folder("directory", v), "/nonexistent/records"),
        (lambda v: validation.output_folder("out", v), ""),
    ]:
        with pytest.raises(ValueError, match=r"^Invalid \w+: .+ \(expected .+\)"):
            check(value)
    with pytest.raises(ValueError, match="got a string: write the number without quotes"):
        validation.check_number("lr", "1e-3")
    assert json.dumps(validation.check_number("x", 2)) == "2.0"


# ===================================================================== third pass (issue 51)
# The classes of the third pass, each a table: results that cannot be (SILENT before), options
# that are not options (SILENT), the model's inputs and the trainer's data, a dict where a
# dataclass goes, numbers where an integer goes, devices, paths and files (VAGUE before).


def _tiny_classifier() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _train(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    model: torch.nn.Module | None = None,
    eval_data: Any = None,
    **trainer: Any,
) -> Any:
    from trainfast.training import Trainer

    args = TrainingArguments(batch_size=4, log_every=8, device="cpu", progress_bar=False)
    model = model if model is not None else _tiny_classifier()
    data = TensorDataset(inputs, targets)
    return Trainer(model, args, data, eval_data, **trainer).train()


X4, Y3 = torch.randn(16, 4), torch.randint(0, 3, (16,))


def _ring_chunks(*args: Any) -> Any:
    from trainfast.distributed.collectives import ring_chunks

    return ring_chunks(*args)


def _schedules() -> Any:
    from trainfast.training import schedules

    return schedules


_COSINE = {"max_lr": 1.0, "min_lr": 0.1, "warmup_iters": 10, "cosine_cycle_iters": 100}
_WSD = {"max_lr": 1.0, "min_lr": 0.1, "warmup_iters": 2, "stable_iters": 2, "decay_iters": 2}


def _cost_model() -> Any:
    from trainfast.distributed import cost_model

    return cost_model


def _link() -> Any:
    return _cost_model().Link(alpha=1e-5, beta=1e-9)


# ------------------------------------------- SILENT before: a result that cannot be is refused
IMPOSSIBLE_RESULTS = [
    Case(
        "MFU 1000% (flops and peak mixed up)",
        lambda: accounting.model_flops_utilization(1e13, 1.0, 1e12),
        r"MFU of 1000%.*flops_per_step=1e\+13",
    ),
    Case(
        "activation_bytes tensor=3 with 4 heads",
        lambda: accounting.activation_bytes(SHAPE, tensor=3),
        r"tensor: 3 .*divides n_heads = 4",
    ),
    Case(
        "checkpointed_layer_bytes tensor=3",
        lambda: accounting.checkpointed_layer_bytes(SHAPE, tensor=3, sequence_parallel=True),
        r"tensor: 3",
    ),
    Case(
        "loss_buffer_bytes tensor=3",
        lambda: accounting.loss_buffer_bytes(SHAPE, tensor=3),
        r"tensor: 3",
    ),
    Case(
        "head_activation_values tensor=3",
        lambda: accounting.head_activation_values(SHAPE, tensor=3),
        r"tensor: 3",
    ),
    Case(
        "TrainingSetup tensor not dividing d_ff",
        lambda: TrainingSetup(TransformerShape(64, 32, 2, 8, 100, 16, 2), tensor=8, global_batch=2),
        r"tensor: 8 .*d_ff = 100",
    ),
    Case("ring_chunks rank=5 of 4", lambda: _ring_chunks(5, 0, 4, "all-gather"), r"rank: 5"),
    Case("ring_chunks rank=-1", lambda: _ring_chunks(-1, 0, 4, "reduce-scatter"), r"rank: -1"),
    Case("ring_chunks step=3 of 4 ranks", lambda: _ring_chunks(1, 3, 4, "all-gather"), r"step: 3"),
    Case(
        "ring_block_kind rank=4 of 4",
        lambda: __import__(
            "trainfast.distributed.context_parallel", fromlist=["x"]
        ).ring_block_kind(4, 0, 4, True),
        r"rank: 4",
    ),
    Case(
        "context_chunks rank=4 of 4",
        lambda: __import__("trainfast.distributed.context_parallel", fromlist=["x"]).context_chunks(
            4, 4, True
        ),
        r"rank: 4",
    ),
    Case(
        "shard_range rank=-1 (would slice the last)",
        lambda: __import__("trainfast.distributed.tensor_parallel", fromlist=["x"]).shard_range(
            16, -1, 4
        ),
        r"rank: -1",
    ),
    Case(
        "cosine_with_warmup it=-1 (a negative lr)",
        lambda: _schedules().cosine_with_warmup(-1, **_COSINE),
        r"Invalid it: -1",
    ),
    Case(
        "cosine_with_warmup max_lr=inf",
        lambda: _schedules().cosine_with_warmup(5, **{**_COSINE, "max_lr": INF}),
        r"max_lr: inf",
    ),
    Case("wsd it=-1", lambda: _schedules().wsd(-1, **_WSD), r"Invalid it: -1"),
    Case("wsd min_lr=nan", lambda: _schedules().wsd(3, **{**_WSD, "min_lr": NAN}), r"min_lr: nan"),
    Case(
        "batch_size_ramp examples_seen=-8",
        lambda: _schedules().batch_size_ramp(-8, start=4, end=16, ramp_examples=64),
        r"examples_seen: -8",
    ),
    Case(
        "all_reduce_time n_bytes=nan",
        lambda: _cost_model().all_reduce_time("ring", NAN, 4, _link()),
        r"n_bytes: nan",
    ),
    Case(
        "bytes_sent_per_rank n_bytes=-1",
        lambda: _cost_model().bytes_sent_per_rank("ring", -1.0, 4),
        r"n_bytes: -1",
    ),
    Case("Link beta=inf", lambda: _cost_model().Link(alpha=1e-5, beta=INF), r"beta: inf"),
    Case(
        "data_parallel_min_tokens gradient_bytes=-1",
        lambda: __import__(
            "trainfast.distributed.communication_bound", fromlist=["x"]
        ).data_parallel_min_tokens(1e15, _link(), 8, gradient_bytes=-1.0),
        r"gradient_bytes: -1",
    ),
    Case(
        "data_parallel_bytes zero_stage=4",
        lambda: __import__("trainfast.distributed.step_time", fromlist=["x"]).data_parallel_bytes(
            1e9, 4, 4, 2, 2.0, 2.0
        ),
        r"zero_stage: 4",
    ),
    Case(
        "layers_in_flight pipeline=-1",
        lambda: __import__("trainfast.distributed.step_time", fromlist=["x"]).layers_in_flight(
            8, -1, 4
        ),
        r"pipeline: -1",
    ),
    Case(
        "expert_capacity n_experts=-1 (a negative capacity)",
        lambda: __import__("trainfast.distributed.moe", fromlist=["x"]).expert_capacity(
            16, -1, 2, 1.25
        ),
        r"n_experts: -1",
    ),
    Case(
        "simulate forward=-1 (ops that end before they start)",
        lambda: __import__("trainfast.distributed.pipeline", fromlist=["x"]).simulate(
            [[("F", 0), ("B", 0)]], forward=-1.0
        ),
        r"forward: -1",
    ),
    Case(
        "updated_scale scale=-1",
        lambda: __import__("trainfast.precision.loss_scaling", fromlist=["x"]).updated_scale(
            -1.0, 0, False, growth_factor=2.0, backoff_factor=0.5, growth_interval=2
        ),
        r"scale: -1",
    ),
    Case(
        "elementwise_cost n=-1 (negative bytes)",
        lambda: __import__("trainfast.kernels.roofline", fromlist=["x"]).elementwise_cost(
            "add", -1, inputs=2
        ),
        r"Invalid n: -1",
    ),
    Case(
        "strided_traffic_bytes n=-1",
        lambda: __import__("trainfast.kernels.bandwidth", fromlist=["x"]).strided_traffic_bytes(
            -1, 4, unit_bytes=64
        ),
        r"Invalid n: -1",
    ),
    Case(
        "softcap cap=inf (NaN logits)",
        lambda: __import__("trainfast.stability", fromlist=["x"]).softcap(torch.ones(3), INF),
        r"cap: inf",
    ),
    Case(
        "rms_norm eps=-1",
        lambda: __import__("trainfast.kernels.fusion", fromlist=["x"]).rms_norm(
            torch.ones(2, 4), torch.ones(4), eps=-1.0
        ),
        r"eps: -1",
    ),
]


@pytest.mark.parametrize("case", _params(IMPOSSIBLE_RESULTS))
def test_results_that_cannot_be_are_refused(case: Case) -> None:
    _raises_naming(case)


# ----------------------------------------------- SILENT before: options that are not options
NOT_AN_OPTION = [
    Case("GradScaler device='tpu'", lambda: GradScaler(device="tpu"), r"device: 'tpu'"),
    Case(
        "sweeps.sample count=0",
        lambda: sweeps.sample({"method": "grid", "parameters": {"x": {"values": [1]}}}, 0),
        r"count: 0",
        (needs_sweeps,),
    ),
    Case(
        "sweeps.sample count=-1",
        lambda: sweeps.sample({"method": "grid", "parameters": {"x": {"values": [1]}}}, -1),
        r"count: -1",
        (needs_sweeps,),
    ),
    Case(
        "Newton-Schulz steps=-3",
        lambda: __import__("trainfast.optim.muon", fromlist=["x"]).zeropower_via_newtonschulz5(
            torch.randn(4, 4), -3
        ),
        r"steps: -3",
    ),
    Case(
        "format_from_bits exponent_bits=4.5",
        lambda: __import__("trainfast.precision.formats", fromlist=["x"]).format_from_bits(
            "x", 4.5, 3
        ),
        r"exponent_bits: 4.5",
    ),
    Case(
        "format_from_bits exponent_bits=12 (overflows a float)",
        lambda: __import__("trainfast.precision.formats", fromlist=["x"]).format_from_bits(
            "x", 12, 3
        ),
        r"exponent_bits: 12",
    ),
    Case(
        "DelayedScaling margin=-200 (saturates every value)",
        lambda: __import__("trainfast.precision.fp8", fromlist=["x"]).DelayedScaling(margin=-200),
        r"margin: -200",
    ),
    Case(
        "DelayedScaling margin=18 (flushes every value)",
        lambda: __import__("trainfast.precision.fp8", fromlist=["x"]).DelayedScaling(margin=18),
        r"margin: 18 .*0 to 17",
    ),
    Case(
        "DelayedScaling amax_compute='mean'",
        lambda: __import__("trainfast.precision.fp8", fromlist=["x"]).DelayedScaling(
            amax_compute="mean"
        ),
        r"amax_compute: 'mean'",
    ),
    Case(
        "matmul_reference activation='gelu' (only 'gelu_tanh')",
        lambda: __import__("trainfast.kernels.tiled_matmul", fromlist=["x"]).matmul_reference(
            torch.ones(2, 2), torch.ones(2, 2), activation="gelu"
        ),
        r"activation: 'gelu'",
    ),
    Case(
        "limited_precision_sum rounding='up'",
        lambda: __import__(
            "trainfast.precision.accumulation", fromlist=["x"]
        ).limited_precision_sum(torch.ones(2, 4), 7, rounding="up"),
        r"rounding: 'up'",
    ),
    Case(
        "cached_block_use pool='medium'",
        lambda: __import__("trainfast.kernels.allocator", fromlist=["x"]).cached_block_use(
            512, 2**20, pool="medium"
        ),
        r"pool: 'medium'",
    ),
    Case(
        "all_reduce_time algorithm='rings'",
        lambda: _cost_model().all_reduce_time("rings", 1e6, 4, _link()),
        r"algorithm: 'rings'",
    ),
    Case(
        "verdict lower_is_better='yes'",
        lambda: __import__("trainfast.optim.comparison", fromlist=["x"]).verdict(
            "a", [1.0, 2.0], "b", [2.0, 3.0], "s", lower_is_better="yes"
        ),
        r"lower_is_better: 'yes'",
    ),
    Case(
        "ring_attention_work is_causal='no'",
        lambda: __import__(
            "trainfast.distributed.context_parallel", fromlist=["x"]
        ).ring_attention_work(4, 16, is_causal="no"),
        r"is_causal: 'no'",
    ),
    Case(
        "clip_grad_norm_ foreach='no'",
        lambda: __import__("trainfast.stability", fromlist=["x"]).clip_grad_norm_(
            [torch.nn.Parameter(torch.ones(2))], 1.0, foreach="no"
        ),
        r"foreach: 'no'",
    ),
]


def _parallel_coordinates(goal: str = "minimize", metric: str = "loss") -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from trainfast.sweeps.analysis import parallel_coordinates

    results = [sweeps.SweepResult({"x": i}, {"loss": float(i)}) for i in range(4)]
    return parallel_coordinates(results, metric, goal=goal)


NOT_AN_OPTION += [
    Case(
        "parallel_coordinates goal='maximise'",
        lambda: _parallel_coordinates("maximise"),
        r"goal: 'maximise' .*'minimize', 'maximize'",
    ),
]


NOT_AN_OPTION += [
    Case(
        "backbone name='resnet81'",
        lambda: __import__("trainfast.training.transfer", fromlist=["x"]).backbone(
            "resnet81", in_channels=3
        ),
        r"name: 'resnet81' .*torchvision classifier",
    ),
    Case(
        "as_lambda of a wsd with warmup_iters=-1 (named when built, not at its first step)",
        lambda: _schedules().as_lambda(_schedules().wsd, **{**_WSD, "warmup_iters": -1}),
        r"warmup_iters: -1",
    ),
]


@pytest.mark.parametrize("case", _params(NOT_AN_OPTION))
def test_options_that_are_not_options_are_named(case: Case) -> None:
    _raises_naming(case)


def test_a_maximised_parallel_coordinates_still_draws() -> None:
    """The check refuses typos only: W&B's two spellings both draw."""
    import matplotlib.pyplot as plt

    for goal in ("minimize", "maximize"):
        assert _parallel_coordinates(goal).get_title().startswith("Parallel coordinates of 4")
    plt.close("all")


# ---------------------------------------------- VAGUE before: the model's inputs, named as tokens
_MODEL_SHAPE = TransformerShape(64, 16, 1, 2, 32, 8, 2)


def _model() -> Any:
    from trainfast.transformer import Transformer

    torch.manual_seed(0)
    return Transformer(_MODEL_SHAPE)


MODEL_INPUTS = [
    Case(
        "forward id = vocab_size", lambda: _model()(torch.full((2, 4), 64)), r"tokens: id 64 .*63"
    ),
    Case("forward a negative id", lambda: _model()(torch.full((2, 4), -1)), r"tokens: id -1"),
    Case(
        "forward float tokens",
        lambda: _model()(torch.zeros(2, 4)),
        r"tokens: a torch.float32 tensor .*integer",
    ),
    Case("forward 1-D tokens", lambda: _model()(torch.zeros(4, dtype=torch.long)), r"shape \(4,\)"),
    Case(
        "forward too long",
        lambda: _model()(torch.zeros(2, 9, dtype=torch.long)),
        r"sequence length: 9 .*seq_len, 8",
    ),
    Case("forward a list", lambda: _model()([[1, 2]]), r"tokens: \[\[1, 2\]\]"),
    Case(
        "loss targets of another shape",
        lambda: _model().loss(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3)),
        r"targets: shape \(2, 3\) .*\(2, 4\)",
    ),
]


@pytest.mark.parametrize("case", _params(MODEL_INPUTS))
def test_the_models_inputs_are_named(case: Case) -> None:
    _raises_naming(case)


def test_in_range_tokens_of_either_integer_dtype_still_run() -> None:
    model = _model()
    for dtype in (torch.int64, torch.int32):
        assert model(torch.randint(0, 64, (2, 8), dtype=dtype)).shape == (2, 8, 64)


# ------------------------------------------- VAGUE before: the trainer's data, before any step
TRAINER_DATA = [
    Case(
        "an empty training set",
        lambda: _train(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)),
        r"train_data: an empty data set",
    ),
    Case(
        "float targets for cross-entropy",
        lambda: _train(X4, Y3.float()),
        r"train_data: float targets of shape \(2,\) .*class indices",
    ),
    Case(
        "a label above the outputs",
        lambda: _train(X4, torch.full((16,), 5)),
        r"train_data: label 5 .*0 to 2: the model has 3 outputs",
    ),
    Case("a negative label", lambda: _train(X4, torch.full((16,), -1)), r"train_data: label -1"),
    Case(
        "one bad label among good ones (every label is checked)",
        lambda: _train(X4, torch.cat([Y3[:-1], torch.tensor([7])])),
        r"train_data: label 7",
    ),
    Case(
        "a bad label in a Subset, past its first batch",
        lambda: _train_on(
            torch.utils.data.Subset(
                TensorDataset(X4, torch.cat([Y3[:-1], torch.tensor([9])])), [0, 1, 15]
            )
        ),
        r"train_data: label 9",
    ),
    Case(
        "inputs whose feature count does not fit",
        lambda: _train(torch.randn(16, 5), Y3),
        r"train_data: inputs of shape \(5,\) per example do not fit the model",
    ),
    Case(
        "NaN inputs",
        lambda: _train(torch.full((16, 4), NAN), Y3),
        r"train_data: its inputs hold NaN or inf",
    ),
    Case(
        "an empty evaluation set",
        lambda: _train(X4, Y3, eval_data=TensorDataset(torch.zeros(0, 4), torch.zeros(0))),
        r"eval_data: an empty data set",
    ),
    Case(
        "evaluation data of another width",
        lambda: _train(X4, Y3, eval_data=TensorDataset(torch.randn(4, 6), Y3[:4])),
        r"eval_data: inputs of shape \(6,\)",
    ),
    Case(
        "examples that are not pairs",
        lambda: _train_on(TensorDataset(X4)),
        r"train_data: its examples are not \(input, target\) pairs",
    ),
    Case(
        "a loss_fn that cannot take the targets",
        lambda: _train(X4, Y3, loss_fn=torch.nn.functional.mse_loss),
        r"train_data: loss_fn cannot take the model's outputs of shape \(2, 3\)",
    ),
    Case(
        "loop.train on a feature count that does not fit",
        lambda: __import__("trainfast.loop", fromlist=["x"]).train(
            _tiny_classifier(),
            SGD(_tiny_classifier().parameters(), lr=0.1),
            TensorDataset(torch.randn(8, 5), Y3[:8]),
            batch_size=4,
            steps=1,
        ),
        r"dataset: inputs of shape \(5,\)",
    ),
    Case(
        "loop.train steps=1.5",
        lambda: __import__("trainfast.loop", fromlist=["x"]).train(
            _tiny_classifier(),
            SGD(_tiny_classifier().parameters(), lr=0.1),
            TensorDataset(X4, Y3),
            batch_size=4,
            steps=1.5,
        ),
        r"steps: 1.5",
    ),
]


def _train_on(dataset: Any) -> Any:
    from trainfast.training import Trainer

    args = TrainingArguments(batch_size=4, device="cpu", progress_bar=False)
    return Trainer(_tiny_classifier(), args, dataset).train()


@pytest.mark.parametrize("case", _params(TRAINER_DATA))
def test_the_trainers_data_is_checked_before_the_first_step(case: Case) -> None:
    _raises_naming(case)


def test_the_data_check_changes_nothing_a_run_depends_on() -> None:
    """The check's forward pass runs in eval mode without gradients and on a forked random
    stream: a run gives the same losses and leaves the model in train mode."""
    from trainfast.loop import check_data

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3))
    torch.manual_seed(1)
    before = torch.rand(3)
    torch.manual_seed(1)
    check_data(model, TensorDataset(X4, Y3))
    assert torch.equal(torch.rand(3), before)
    assert model.training
    first = _train(X4, Y3)
    assert len(first) == 2 and first == _train(X4, Y3)  # deterministic, check included
    # class probabilities of the outputs' shape are a valid cross-entropy target
    probabilities = torch.softmax(torch.randn(16, 3), dim=-1)
    assert _train(X4, probabilities)[-1]["train/loss"] > 0


# ------------------------------------------------ training on garbage: a NaN loss stops the run
class _Diverges(torch.nn.Module):
    """A classifier whose outputs turn infinite from its fourth forward pass in training."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
        scale = float("inf") if self.calls >= 4 else 1.0
        return self.linear(x) * scale


def test_a_non_finite_loss_stops_training_naming_its_step() -> None:
    model = _Diverges()
    with pytest.raises(
        ValueError,
        match=r"Training diverged: the loss is nan at step 4 of 4 .*torch's optimizers would step",
    ):
        _train(X4, Y3, model=model)
    assert model.calls == 4  # stopped at the check, not after more epochs


def test_allow_divergence_trains_on_and_logs_the_nan() -> None:
    history = _train(X4, Y3, model=_Diverges(), allow_divergence=True)
    assert math.isfinite(history[0]["train/loss"])  # steps 1 and 2
    assert math.isnan(history[1]["train/loss"])  # steps 3 and 4: the fourth diverged


def test_allow_divergence_is_a_flag() -> None:
    with pytest.raises(ValueError, match=r"allow_divergence: 'yes'"):
        _train(X4, Y3, allow_divergence="yes")


# --------------------------------------------- VAGUE before: a dict where a dataclass belongs
_AS_DICT = {"vocab_size": 64, "d_model": 32}

DICT_FOR_DATACLASS = [
    Case(
        "parameter_count(shape={...})",
        lambda: accounting.parameter_count(_AS_DICT),
        r"shape: .*expected a TransformerShape, got a dict.*TransformerShape\(\*\*fields\)",
    ),
    Case("training_flops(shape={...})", lambda: accounting.training_flops(_AS_DICT), r"shape: "),
    Case(
        "activation_bytes(shape={...})",
        lambda: accounting.activation_bytes(_AS_DICT),
        r"expected a TransformerShape",
    ),
    Case(
        "training_memory(shape={...})",
        lambda: accounting.training_memory(_AS_DICT, recipe="fp32", optimizer="adamw"),
        r"expected a TransformerShape",
    ),
    Case(
        "TrainingSetup(shape={...})",
        lambda: TrainingSetup(_AS_DICT),
        r"shape: .*expected a TransformerShape",
    ),
    Case(
        "TrainingSetup(assumptions={...})",
        lambda: TrainingSetup(SHAPE, assumptions={"overlap": 1.0}),
        r"assumptions: .*expected a StepAssumptions",
    ),
    Case(
        "estimate(setup={...})",
        lambda: __import__("trainfast.distributed.step_time", fromlist=["x"]).estimate(
            {"shape": SHAPE}
        ),
        r"setup: .*expected a TrainingSetup",
    ),
    Case(
        "layout_choices(base={...})",
        lambda: __import__("trainfast.distributed.layout", fromlist=["x"]).layout_choices(
            {"shape": SHAPE}, 4
        ),
        r"base: .*expected a TrainingSetup",
    ),
    Case(
        "to_markdown({...})",
        lambda: records.to_markdown(_record_dict()),
        r"record: .*expected a Record, got a dict.*Record.from_dict",
    ),
    Case("provenance({...})", lambda: records.provenance(_record_dict()), r"expected a Record"),
    Case(
        "write_record({...})",
        lambda: records.write_record(_record_dict(), "/nonexistent"),
        r"expected a Record",
    ),
    Case(
        "make_record(rows={...})",
        lambda: records.make_record("a", "b", {"x": 1}, device="cpu"),
        r"rows: \{'x': 1\} .*list of dicts",
    ),
    Case(
        "make_record(rows=[[1]])",
        lambda: records.make_record("a", "b", [[1]], device="cpu"),
        r"rows: \[\[1\]\]",
    ),
    Case(
        "mfu_peak_flops(gpu={...})",
        lambda: __import__("trainfast.utilization", fromlist=["x"]).mfu_peak_flops(
            {"name": "H100"}
        ),
        r"gpu: .*expected a GPUSpec.*GPUS",
    ),
    Case(
        "occupancy(spec={...})",
        lambda: __import__("trainfast.kernels.occupancy", fromlist=["x"]).occupancy(
            {}, threads_per_block=128, registers_per_thread=32
        ),
        r"spec: .*expected a GPUSpec",
    ),
    Case(
        "all_reduce_time(link={...})",
        lambda: _cost_model().all_reduce_time("ring", 1e6, 4, {"alpha": 1e-5}),
        r"link: .*expected a Link",
    ),
    Case(
        "random_batch(shape={...})",
        lambda: __import__("trainfast.transformer", fromlist=["x"]).random_batch(_AS_DICT),
        r"shape: .*expected a TransformerShape",
    ),
    Case(
        "Trainer(args={...})",
        lambda: __import__("trainfast.training", fromlist=["x"]).Trainer(
            _tiny_classifier(), {"lr": 0.1}, TensorDataset(X4, Y3)
        ),
        r"args: .*expected a TrainingArguments",
    ),
    Case(
        "tile_traffic_bytes(tiles={...})",
        lambda: __import__("trainfast.kernels.tiled_matmul", fromlist=["x"]).tile_traffic_bytes(
            64, 64, 64, {"block_m": 64}, 2
        ),
        r"tiles: .*expected a MatmulTiles",
    ),
]


@pytest.mark.parametrize("case", _params(DICT_FOR_DATACLASS))
def test_a_dict_where_a_dataclass_goes_names_the_type(case: Case) -> None:
    _raises_naming(case)


# --------------------------------- VAGUE before: floats, strings and NaN where an integer goes
NOT_AN_INT_THIRD_PASS = [
    Case(
        "online_softmax block_size=2.5",
        lambda: __import__("trainfast.kernels.softmax", fromlist=["x"]).online_softmax(
            torch.ones(2, 8), block_size=2.5
        ),
        r"block_size: 2.5",
    ),
    Case(
        "round_mantissa mantissa_bits=2.5",
        lambda: __import__("trainfast.precision.formats", fromlist=["x"]).round_mantissa(
            torch.ones(3), 2.5
        ),
        r"mantissa_bits: 2.5",
    ),
    Case(
        "DelayedScaling history_len=2.5",
        lambda: __import__("trainfast.precision.fp8", fromlist=["x"]).DelayedScaling(
            history_len=2.5
        ),
        r"history_len: 2.5",
    ),
    Case(
        "profile_steps warmup=1.5",
        lambda: trace_times_profile(warmup=1.5),
        r"warmup: 1.5",
    ),
    Case("profile_steps wait=nan", lambda: trace_times_profile(wait=NAN), r"wait: nan"),
    Case(
        "profile_steps record_shapes='no'",
        lambda: trace_times_profile(record_shapes="no"),
        r"record_shapes: 'no'",
    ),
    Case(
        "sweeps.sample count='3'",
        lambda: sweeps.sample({"method": "grid", "parameters": {"x": {"values": [1]}}}, "3"),
        r"count: '3'",
        (needs_sweeps,),
    ),
    Case(
        "linear_training_flops tokens=2.5 (names tokens, not m)",
        lambda: accounting.linear_training_flops(2.5, 3, 4),
        r"Invalid tokens: 2.5",
    ),
    Case(
        "linear_training_flops out_features=4.0",
        lambda: accounting.linear_training_flops(8, 3, 4.0),
        r"Invalid out_features: 4.0",
    ),
    Case(
        "gpipe_schedule n_micro=2.5",
        lambda: __import__("trainfast.distributed.pipeline", fromlist=["x"]).gpipe_schedule(4, 2.5),
        r"n_micro: 2.5",
    ),
    Case(
        "interleaved_schedule n_chunks=True",
        lambda: __import__("trainfast.distributed.pipeline", fromlist=["x"]).interleaved_schedule(
            2, 4, True
        ),
        r"n_chunks: True",
    ),
    Case(
        "PipelineConfig width='256'",
        lambda: __import__("trainfast.distributed.pipeline", fromlist=["x"]).PipelineConfig(
            width="256"
        ),
        r"width: '256'",
    ),
    Case(
        "MoEConfig d_model=16.0",
        lambda: __import__("trainfast.distributed.moe", fromlist=["x"]).MoEConfig(d_model=16.0),
        r"d_model: 16.0",
    ),
    Case(
        "crossover_bytes world_size=nan",
        lambda: _cost_model().crossover_bytes(NAN, _link()),
        r"world_size: nan",
    ),
    Case(
        "context_block_scores context=0",
        lambda: __import__("trainfast.distributed.step_time", fromlist=["x"]).context_block_scores(
            16, 0
        ),
        r"context: 0",
    ),
    Case(
        "widths_by_sqrt2 count=2.5",
        lambda: __import__("trainfast.training.scaling", fromlist=["x"]).widths_by_sqrt2(4, 2.5),
        r"count: 2.5",
    ),
    Case(
        "ScalingCNN num_classes=2.5",
        lambda: __import__("trainfast.training.scaling", fromlist=["x"]).ScalingCNN(
            8, num_classes=2.5
        ),
        r"num_classes: 2.5",
    ),
    Case(
        "optimizers_curse repeats=2.5",
        lambda: __import__("trainfast.training.selection", fromlist=["x"]).optimizers_curse(
            [2], repeats=2.5
        ),
        r"repeats: 2.5",
    ),
    Case(
        "gradient_noise_scale batches=0",
        lambda: __import__("trainfast.training.noise_scale", fromlist=["x"]).gradient_noise_scale(
            _tiny_classifier(), TensorDataset(X4, Y3), small=2, big=8, batches=0
        ),
        r"batches: 0",
    ),
    Case(
        "update_scale rows=2.5",
        lambda: __import__("trainfast.optim.muon", fromlist=["x"]).update_scale(2.5, 4),
        r"rows: 2.5",
    ),
    Case(
        "matmul_cost element_bytes='4'",
        lambda: __import__("trainfast.kernels.roofline", fromlist=["x"]).matmul_cost(
            4, 4, 4, element_bytes="4"
        ),
        r"element_bytes: '4'",
    ),
    Case(
        "MatmulTiles num_warps=4.0",
        lambda: __import__("trainfast.kernels.tiled_matmul", fromlist=["x"]).MatmulTiles(
            num_warps=4.0
        ),
        r"num_warps: 4.0",
    ),
    Case(
        "digits seed=2.5",
        lambda: __import__("trainfast.datasets", fromlist=["x"]).digits(seed=2.5),
        r"seed: 2.5",
    ),
    Case(
        "take_fraction fraction='0.5'",
        lambda: __import__("trainfast.training.data", fromlist=["x"]).take_fraction(
            TensorDataset(X4), "0.5"
        ),
        r"fraction: '0.5'",
    ),
    Case(
        "matmul_error k=True",
        lambda: __import__("trainfast.precision.numerics", fromlist=["x"]).matmul_error(
            4, True, 4, "fp32"
        ),
        r"Invalid k: True",
    ),
]


def trace_times_profile(**overrides: Any) -> Any:
    from trainfast.profiling.traces import profile_steps

    return profile_steps(lambda: None, out_dir="/nonexistent/never-made", **overrides)


@pytest.mark.parametrize("case", _params(NOT_AN_INT_THIRD_PASS))
def test_numbers_where_an_integer_goes_are_named(case: Case) -> None:
    _raises_naming(case)


# ------------------------------------------- VAGUE before: every device through parse_device
DEVICES_THIRD_PASS = [
    Case(
        "random_batch device='tpu'",
        lambda: __import__("trainfast.transformer", fromlist=["x"]).random_batch(
            SHAPE, device="tpu"
        ),
        r"device: 'tpu' .*'cpu', 'cuda' or 'mps'",
    ),
    Case("profile_steps device='tpu'", lambda: trace_times_profile(device="tpu"), r"device: 'tpu'"),
    Case("timing.timestamp('tpu')", lambda: timing.timestamp("tpu"), r"device: 'tpu'"),
    Case(
        "gpu_for_device('tpu')",
        lambda: __import__("trainfast.gpus", fromlist=["x"]).gpu_for_device("tpu"),
        r"device: 'tpu'",
    ),
    Case(
        "matmul_error device='gpu'",
        lambda: __import__("trainfast.precision.numerics", fromlist=["x"]).matmul_error(
            4, 4, 4, "fp32", device="gpu"
        ),
        r"device: 'gpu'",
    ),
    Case(
        "strided_order device='tpu'",
        lambda: __import__("trainfast.kernels.bandwidth", fromlist=["x"]).strided_order(
            8, 2, device="tpu"
        ),
        r"device: 'tpu'",
    ),
    Case(
        "parse_device('meta'): torch knows it, the book does not run on it",
        lambda: __import__("trainfast.device", fromlist=["x"]).parse_device("meta"),
        r"device: 'meta' .*torch.device accepts 'meta'",
    ),
]


@pytest.mark.parametrize("case", _params(DEVICES_THIRD_PASS))
def test_every_device_argument_goes_through_parse_device(case: Case) -> None:
    _raises_naming(case)


# torch itself accepts these; the book's function says so
TORCH_WOULD_ACCEPT_THIRD_PASS = [
    Case(
        "GradScaler device='tpu'",
        lambda: GradScaler(device="tpu"),
        r"torch.amp.GradScaler would accept it, and stay enabled",
    ),
]


@pytest.mark.parametrize("case", _params(TORCH_WOULD_ACCEPT_THIRD_PASS))
def test_values_torch_accepts_say_so_third_pass(case: Case) -> None:
    _raises_naming(case)


def test_torch_really_accepts_a_tpu_grad_scaler() -> None:
    assert torch.amp.GradScaler("tpu").is_enabled()  # what the message above says


# ---------------------------------------- VAGUE before: paths that are not what is expected
def test_an_output_folder_that_is_a_file_is_named(tmp_path: Path) -> None:
    from trainfast.profiling.traces import profile_steps
    from trainfast.training.checkpoints import save_checkpoint

    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    with pytest.raises(ValueError, match=r"out_dir: '.*a-file' \(expected a folder to write"):
        profile_steps(lambda: None, out_dir=a_file)
    record = records.Record.from_dict(_record_dict())
    with pytest.raises(ValueError, match=r"directory: '.*a-file' .*it is a file"):
        records.write_record(record, a_file)
    with pytest.raises(ValueError, match=r"'.*a-file' is a file"):
        records.write_record(record, a_file / "inside")
    trainer = __import__("trainfast.training", fromlist=["x"]).Trainer(
        _tiny_classifier(),
        TrainingArguments(device="cpu", progress_bar=False),
        TensorDataset(X4, Y3),
    )
    with pytest.raises(ValueError, match=r"a-file' \(expected a folder to write into"):
        save_checkpoint(trainer, a_file / "checkpoint.pt")
    with pytest.raises(ValueError, match=r"path: '.*' \(expected a file to write; it is a folder"):
        save_checkpoint(trainer, tmp_path)
    assert a_file.read_text() == "not a folder"  # nothing was written over it


def test_load_records_names_a_missing_folder_or_a_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"directory: '.*recrods' \(expected an existing folder"):
        records.load_records(tmp_path / "recrods")  # a typo, not "no records"
    (tmp_path / "r.json").write_text("{}")
    with pytest.raises(ValueError, match=r"directory: '.*r.json' .*it is a file"):
        records.load_records(tmp_path / "r.json")
    with pytest.raises(ValueError, match=r"directory: '.*recrods'"):
        records.records_for("a", "cpu", tmp_path / "recrods")
    (tmp_path / "empty").mkdir()
    assert records.load_records(tmp_path / "empty") == []  # a folder that has none: none


def test_every_load_records_caller_reads_a_folder_that_exists() -> None:
    """The book and the package call load_records only on a folder found for them (the
    launching appendix once passed "../records" relative to the page)."""
    root = Path(__file__).resolve().parents[1]
    callers = [
        path
        for folder in ("book", "code")
        for path in (root / folder).rglob("*")
        if path.suffix in (".md", ".py") and "load_records(" in path.read_text(errors="ignore")
    ]
    for path in callers:
        text = path.read_text()
        assert 'load_records("../' not in text, path
    assert records.records_for("launcher-failure", None)  # what the appendix reads now


def test_a_checkpoint_from_before_every_generator_was_kept_still_loads() -> None:
    from trainfast.training import Trainer

    def trainer() -> Trainer:
        args = TrainingArguments(device="cpu", progress_bar=False, batch_size=2)
        return Trainer(_tiny_classifier(), args, TensorDataset(X4, Y3))

    state = trainer().state_dict()
    saved = state.pop("random_states")  # the old layout: two RNG states of its own
    old = {**state, "torch_rng": saved["cpu"], "data_order": saved["generators"]["data_order"]}
    resumed = trainer()
    torch.manual_seed(123)  # knocked out of place: loading must put it back
    resumed.load_state_dict(old)
    assert torch.equal(torch.get_rng_state(), saved["cpu"])
    assert torch.equal(resumed.train_loader.generator.get_state(), old["data_order"])
    del old["data_order"]  # neither layout: named
    with pytest.raises(ValueError, match=r"not a Trainer checkpoint .*'data_order'"):
        resumed.load_state_dict(old)


# ------------------------------------ VAGUE before: files that are not what they claim to be
def test_a_dict_that_is_not_a_trainer_checkpoint_is_named(tmp_path: Path) -> None:
    from trainfast.training import Trainer
    from trainfast.training.checkpoints import load_checkpoint

    trainer = Trainer(
        _tiny_classifier(),
        TrainingArguments(device="cpu", progress_bar=False),
        TensorDataset(X4, Y3),
    )
    with pytest.raises(ValueError, match=r"state: not a Trainer checkpoint .*'args'"):
        trainer.load_state_dict(_tiny_classifier().state_dict())  # a model's, not a trainer's
    with pytest.raises(ValueError, match=r"state: not a Trainer checkpoint"):
        trainer.load_state_dict([1, 2])
    model_only = tmp_path / "model.pt"
    torch.save(_tiny_classifier().state_dict(), model_only)
    with pytest.raises(ValueError, match=r"model.pt'.*not a Trainer checkpoint"):
        load_checkpoint(trainer, model_only)
    text = tmp_path / "notes.pt"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"notes.pt'.*torch.load cannot read it"):
        load_checkpoint(trainer, text)


def test_a_record_without_a_device_names_the_file_and_the_key(tmp_path: Path) -> None:
    data = {**_record_dict(), "environment": {"device_name": "cpu"}}
    with pytest.raises(
        ValueError, match=r"bench.json: invalid 'environment': it lacks \['device'\]"
    ):
        records.Record.from_dict(data, source="records/bench.json")
    (tmp_path / "bench.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"bench.json: invalid 'environment'"):
        records.load_records(tmp_path)


@pytest.mark.parametrize("analysis", ["parallel_coordinates", "parameter_importance"])
def test_a_sweep_metric_that_does_not_exist_names_the_metrics_there_are(analysis: str) -> None:
    from trainfast.sweeps import analysis as module

    results = [sweeps.SweepResult({"x": i}, {"loss": float(i)}) for i in range(4)]
    with pytest.raises(ValueError, match=r"metric: 'lsos' \(0 of 4 runs .*report \['loss'\]"):
        if analysis == "parallel_coordinates":
            _parallel_coordinates(metric="lsos")
        else:
            module.parameter_importance(results, "lsos")
