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


def _params(cases: list[Case]) -> list[Any]:
    return [pytest.param(case, id=case.id) for case in cases]


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
]


@pytest.mark.parametrize("case", _params(DATA))
def test_mismatched_or_impossible_data_is_named(case: Case) -> None:
    _raises_naming(case)


def test_an_mfu_above_100_percent_warns_naming_the_figures() -> None:
    with pytest.warns(UserWarning, match=r"MFU of 1000%.*flops_per_step=1e\+13.*peak_flops=1e\+12"):
        assert accounting.model_flops_utilization(1e13, 1.0, 1e12) == pytest.approx(10.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accounting.model_flops_utilization(4e11, 1.0, 1e12)  # 40 %: no warning


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
    ]:
        with pytest.raises(ValueError, match=r"^Invalid \w+: .+ \(expected .+\)"):
            check(value)
    with pytest.raises(ValueError, match="got a string: write the number without quotes"):
        validation.check_number("lr", "1e-3")
    assert json.dumps(validation.check_number("x", 2)) == "2.0"
