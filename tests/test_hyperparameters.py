"""Chapter "Hyperparameters and experiment tracking" (book/hyperparameters/, its section pages).

The trainer (a short run lowers the loss, train/eval modes, frozen layers stay frozen,
parameter groups get their learning rates, also in a plain torch optimizer, an exact resume),
the data splits, the sweep semantics (grid coverage, log-uniform spread, probabilities,
Hyperband, config errors before any run, agents sharing a sweep), tracking without W&B or
offline (artifacts), the schedules, the optimizer's curse, the scaling-law helpers and their
benchmark, every exercise check failing on a wrong answer, and the chapter.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import sys

import chapters
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset
from trainfast import sweeps
from trainfast.training import (
    ClassSubset,
    LocalTracker,
    Trainer,
    TrainingArguments,
    WandbTracker,
    load_images,
    lr_multiplier,
    start_run,
)
from trainfast.training.exercises import (
    check_cosine_schedule,
    check_logged_loop,
    check_parameter_groups,
    check_power_law_fit,
    check_refit,
    check_weight_decay_sweep,
    check_wsd_schedule,
)
from trainfast.training.scaling import (
    PowerLaw,
    ScalingCNN,
    ScalingRun,
    compute_frontier,
    exponent_difference,
    fit_power_law,
    scaling_study,
    training_flops,
    widths_by_sqrt2,
)
from trainfast.training.selection import optimizers_curse, shrink, shrink_robust
from trainfast.training.tracking import wandb_mode
from trainfast.training.transfer import (
    NarrowResNet,
    backbone,
    freeze,
    parameter_groups,
    replace_head,
)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is as fast and does not stall on a shared machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def digits_data():
    return load_images("digits")


def quiet(**overrides) -> TrainingArguments:
    return TrainingArguments(**{"device": "cpu", "progress_bar": False, **overrides})


# --------------------------------------------------------------------------- the chapter


def test_listings_resolve_and_nothing_is_copied():
    assert chapters.listing_problems("hyperparameters") == []


# --------------------------------------------------------------------------- the trainer


def test_a_short_run_lowers_the_loss(digits_data):
    torch.manual_seed(0)
    trainer = Trainer(
        ScalingCNN(8), quiet(lr=3e-3, batch_size=32, epochs=2), digits_data.train, digits_data.test
    )
    before = trainer.evaluate().loss
    history = trainer.train()
    after = history[-1]["eval/loss"]
    assert after < 0.6 * before, (before, after)
    assert trainer.examples_seen == 2 * len(digits_data.train)
    examples = [row["examples"] for row in history]
    assert examples == sorted(examples)  # one monotone x axis: examples seen
    train_losses = [row["train/loss"] for row in history if "train/loss" in row]
    assert train_losses[-1] < train_losses[0]


def test_training_step_trains_and_evaluate_infers():
    seen: list[tuple[bool, bool, bool]] = []

    class Probe(nn.Linear):
        def forward(self, x):
            seen.append((self.training, torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
            return super().forward(x)

    data = TensorDataset(torch.randn(20, 4), torch.randint(0, 3, (20,)))
    trainer = Trainer(Probe(4, 3), quiet(batch_size=10), data, data)
    trainer.model.eval()  # a step must switch back to train mode by itself
    trainer.training_step(next(iter(trainer.train_loader)))
    assert seen[-1] == (True, True, False)
    trainer.evaluate()
    assert seen[-1] == (False, False, True)
    trainer.training_step(next(iter(trainer.train_loader)))
    assert seen[-1] == (True, True, False)


def test_batch_sizes_share_the_examples_axis(digits_data):
    small = Trainer(ScalingCNN(4), quiet(batch_size=16, log_every=256), digits_data.train)
    large = Trainer(ScalingCNN(4), quiet(batch_size=64, log_every=256), digits_data.train)
    small.train()
    large.train()
    assert small.examples_seen == large.examples_seen == len(digits_data.train)
    assert (len(small.train_loader), len(large.train_loader)) == (90, 23)  # steps differ
    # the same number of training-loss rows, at (about) the same examples
    assert len(small.history) == len(large.history) == len(digits_data.train) // 256


def test_a_callback_stops_training(digits_data):
    calls = []
    trainer = Trainer(
        ScalingCNN(4),
        quiet(epochs=5),
        digits_data.train,
        digits_data.test,
        callbacks=[lambda row: calls.append(row) or len(calls) == 2],
    )
    trainer.train()
    assert len(calls) == 2
    assert trainer.examples_seen == 2 * len(digits_data.train)


def test_arguments_fail_early_naming_the_value():
    with pytest.raises(ValueError, match="-1"):
        TrainingArguments(lr=-1)
    with pytest.raises(ValueError, match="'lamb'"):
        TrainingArguments(optimizer="lamb")
    with pytest.raises(ValueError, match="warmup_fraction: 1.5"):
        TrainingArguments(warmup_fraction=1.5)
    with pytest.raises(ValueError, match="learning_rate"):
        TrainingArguments.from_config({"learning_rate": 0.1})
    args = TrainingArguments.from_config({"lr": 0.1, "width": 8}, ignore=("width",), epochs=3)
    assert (args.lr, args.epochs) == (0.1, 3)


def test_lr_multiplier_warms_up_then_decays():
    total, warmup = 100, 10
    cosine = [
        lr_multiplier(s, total_steps=total, warmup_steps=warmup, schedule="cosine")
        for s in range(total)
    ]
    assert cosine[0] == pytest.approx(1 / 11)
    assert np.all(np.diff(cosine[: warmup + 1]) > 0)
    assert cosine[warmup] == pytest.approx(1.0)
    assert np.all(np.diff(cosine[warmup:]) < 0)
    assert cosine[-1] < 0.01
    linear = lr_multiplier(55, total_steps=total, warmup_steps=warmup, schedule="linear")
    assert linear == pytest.approx(0.5)
    assert lr_multiplier(99, total_steps=total, schedule="constant") == 1.0
    with pytest.raises(ValueError, match="'step'"):
        lr_multiplier(0, total_steps=10, schedule="step")


# --------------------------------------------------------------------------- transfer


def test_frozen_layers_stay_unchanged(digits_data):
    torch.manual_seed(0)
    model = NarrowResNet(10)
    Trainer(model, quiet(epochs=1), digits_data.train).train()  # BN statistics not at init
    freeze(replace_head(model, num_classes=3))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["fc.weight", "fc.bias"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    target = ClassSubset(digits_data.train, [7, 8, 9])
    Trainer(model, quiet(lr=1e-2, epochs=2), target).train()
    after = model.state_dict()
    for name, value in before.items():
        if name.startswith("fc."):
            assert not torch.equal(value, after[name]), name
        else:
            assert torch.equal(value, after[name]), f"{name} changed although frozen"


def test_freeze_can_keep_the_last_stage(digits_data):
    model = freeze(NarrowResNet(3), keep=("layer4", "fc"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    Trainer(model, quiet(lr=1e-2), ClassSubset(digits_data.train, [0, 1, 2], per_class=20)).train()
    after = model.state_dict()
    assert torch.equal(before["layer1.0.conv1.weight"], after["layer1.0.conv1.weight"])
    assert torch.equal(before["layer1.0.bn1.running_mean"], after["layer1.0.bn1.running_mean"])
    assert not torch.equal(before["layer4.0.conv1.weight"], after["layer4.0.conv1.weight"])
    with pytest.raises(AttributeError, match="layer9"):
        freeze(NarrowResNet(3), keep=("layer9",))


def test_parameter_groups_get_their_learning_rates(digits_data):
    model = NarrowResNet(10)
    groups = parameter_groups(model, lr=0.02, backbone_lr_scale=0.1)
    args = quiet(lr=0.02, warmup_fraction=0.2, schedule="cosine", log_every=64)
    trainer = Trainer(model, args, digits_data.train, parameter_groups=groups)
    by_name = {g["name"]: g for g in trainer.optimizer.param_groups}
    assert by_name["head"]["initial_lr"] == pytest.approx(0.02)
    assert by_name["backbone"]["initial_lr"] == pytest.approx(0.002)
    assert {id(p) for p in by_name["head"]["params"]} == {id(p) for p in model.fc.parameters()}
    assert len(by_name["backbone"]["params"]) + 2 == len(list(model.parameters()))
    trainer.train()
    for row in trainer.history:
        if "lr/head" in row:  # the schedule scales both groups alike
            assert row["lr/backbone"] == pytest.approx(0.1 * row["lr/head"])
    frozen = freeze(NarrowResNet(10), keep=("layer4", "fc"))
    backbone_group = parameter_groups(frozen, lr=0.1)[0]["params"]
    assert {id(p) for p in backbone_group} == {id(p) for p in frozen.layer4.parameters()}


def test_resnet18_takes_the_same_path():
    model = backbone("resnet18", num_classes=4, in_channels=3)  # weights=None: no download
    assert model.fc.out_features == 4
    freeze(model)
    groups = parameter_groups(model, lr=0.1)
    assert [g["name"] for g in groups] == ["head"]
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 4)
    with pytest.raises(ValueError, match="in_channels=3"):
        backbone("resnet18", in_channels=1)


def test_check_parameter_groups_tells_right_from_wrong(capsys):
    def right(model, lr):
        head = {id(p) for p in model.fc.parameters()}
        trainable = [p for p in model.parameters() if p.requires_grad]
        return [
            {"params": [p for p in trainable if id(p) not in head], "lr": lr / 10},
            {"params": [p for p in trainable if id(p) in head], "lr": lr},
        ]

    def one_rate(model, lr):
        return [{"params": list(model.parameters()), "lr": lr}]

    check_parameter_groups(right)
    with pytest.raises(AssertionError, match="the backbone gets lr / 10"):
        check_parameter_groups(one_rate)
    assert "FAILED" in capsys.readouterr().out


def test_class_subset_relabels(digits_data):
    subset = ClassSubset(digits_data.train, [5, 7], per_class=3, seed=1)
    assert len(subset) == 6
    assert sorted(int(y) for _, y in subset) == [0, 0, 0, 1, 1, 1]
    original = digits_data.train.tensors[1][subset.indices]
    assert sorted(original.tolist()) == [5, 5, 5, 7, 7, 7]
    resized = load_images("digits", channels=3, size=16)
    assert resized.shape == (3, 16, 16) and resized.train[0][0].shape == (3, 16, 16)


def test_cifar10_without_download_fails_clearly(tmp_path):
    with pytest.raises(RuntimeError, match="download=True"):
        load_images("cifar10", root=tmp_path)


# --------------------------------------------------------------------------- sweeps


def test_grid_covers_every_combination():
    config = {
        "method": "grid",
        "parameters": {
            "a": {"values": [1, 2, 3]},
            "b": {"values": ["x", "y"]},
            "c": {"min": 1, "max": 3},  # integer bounds: int_uniform, enumerated by a grid
            "d": {"value": "fixed"},
        },
    }
    results = sweeps.run(config, lambda c: {"loss": 0.0}, count=100)
    seen = [(r.config["a"], r.config["b"], r.config["c"]) for r in results]
    assert len(seen) == 18 and set(seen) == set(itertools.product([1, 2, 3], "xy", [1, 2, 3]))
    assert all(r.config["d"] == "fixed" for r in results)


def test_log_uniform_samples_spread_evenly_in_log_space():
    from scipy import stats

    config = {
        "method": "random",
        "parameters": {"lr": {"distribution": "log_uniform_values", "min": 1e-5, "max": 1e-1}},
    }
    lr = np.array([c["lr"] for c in sweeps.sample(config, 4000, seed=3)])
    assert lr.min() >= 1e-5 and lr.max() <= 1e-1
    per_decade = np.histogram(np.log10(lr), bins=[-5, -4, -3, -2, -1])[0]
    assert np.all(np.abs(per_decade - 1000) < 120), per_decade  # 4.4 standard deviations
    assert stats.kstest(np.log10(lr), "uniform", args=(-5, 4)).pvalue > 1e-3
    # a plain uniform range would put 90% in the top decade: the test can tell them apart
    plain = {"method": "random", "parameters": {"lr": {"min": 1e-5, "max": 1e-1}}}
    uniform = np.array([c["lr"] for c in sweeps.sample(plain, 1000)])
    assert np.mean(uniform > 1e-2) > 0.85


def test_probabilities_are_respected():
    config = {
        "method": "random",
        "parameters": {
            "optimizer": {"values": ["adamw", "sgd", "muon"], "probabilities": [0.6, 0.3, 0.1]}
        },
    }
    draws = [c["optimizer"] for c in sweeps.sample(config, 5000, seed=4)]
    for value, p in zip(["adamw", "sgd", "muon"], [0.6, 0.3, 0.1], strict=True):
        assert abs(draws.count(value) / 5000 - p) < 0.03, (value, draws.count(value))


def test_runs_follow_the_sampled_configs_reproducibly():
    config = {
        "method": "random",
        "parameters": {"x": {"min": 0.0, "max": 1.0}, "n": {"values": [1, 2, 3]}},
    }
    random.seed(123)
    np.random.seed(123)
    outside = random.random(), np.random.random_sample()
    random.seed(123)
    np.random.seed(123)
    results = sweeps.run(config, lambda c: {"y": c["x"] * c["n"]}, count=5, seed=7)
    assert (random.random(), np.random.random_sample()) == outside  # caller's RNGs untouched
    assert [r.config for r in results] == sweeps.sample(config, 5, seed=7)
    assert [r.metrics["y"] for r in results] == [r.config["x"] * r.config["n"] for r in results]


def test_bayes_learns_from_the_results():
    def sweep_towards(target: float) -> float:
        config = {
            "method": "bayes",
            "metric": {"name": "loss", "goal": "minimize"},
            "parameters": {"lr": {"distribution": "log_uniform_values", "min": 1e-5, "max": 1.0}},
        }
        results = sweeps.run(
            config, lambda c: {"loss": (math.log10(c["lr"]) - target) ** 2}, count=10, seed=0
        )
        return float(np.median([math.log10(r.config["lr"]) for r in results[5:]]))

    assert sweep_towards(-4.5) < -3.0 < sweep_towards(-0.5)


def test_hyperband_stops_runs_that_fall_behind():
    config = {
        "method": "grid",
        "metric": {"name": "loss", "goal": "minimize"},
        "early_terminate": {"type": "hyperband", "min_iter": 1, "eta": 2},
        "parameters": {"quality": {"values": [1.0, 1.1, 3.0, 0.9, 4.0, 5.0]}},
    }

    def curve(config, report):
        for epoch in range(1, 5):
            if report({"loss": config["quality"] / epoch}):
                return {"loss": config["quality"] / epoch, "epochs": epoch}
        return {"loss": config["quality"] / 4, "epochs": 4}

    results = {r.config["quality"]: r for r in sweeps.run(config, curve, count=10)}
    assert results[1.0].metrics["epochs"] == 4 and not results[1.0].stopped
    assert results[0.9].metrics["epochs"] == 4  # better than everything before it
    for bad in (3.0, 4.0, 5.0):
        assert results[bad].stopped and results[bad].metrics["epochs"] == 1, bad
    no_stopping = {k: v for k, v in config.items() if k != "early_terminate"}
    assert all(r.metrics["epochs"] == 4 for r in sweeps.run(no_stopping, curve, count=10))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"method": "evolution", "parameters": {"lr": {"values": [0.1]}}}, "'evolution'"),
        (
            {"method": "random", "parameters": {"lr": {"distribution": "log_uniform_values"}}},
            "invalid hyperparameter configuration: lr",
        ),
        ({"method": "random", "parameters": {"wd": {}}}, "configuration: wd"),
        (
            {"method": "random", "parameters": {"lr": {"min": 0.1, "max": 0.001}}},
            "lr: min 0.1 is not less than max 0.001",
        ),
        (
            {
                "method": "random",
                "parameters": {
                    "lr": {"distribution": "log_uniform_values", "min": 0.0, "max": 1.0}
                },
            },
            "'min': 0.0",
        ),
        (
            {
                "method": "random",
                "parameters": {"o": {"values": ["a", "b"], "probabilities": [0.5, 0.6]}},
            },
            "[0.5, 0.6]",
        ),
        ({"method": "grid", "parameters": {"lr": {"min": 0.1, "max": 1.0}}}, "'lr': grid"),
        (
            {
                "method": "bayes",
                "metric": {"name": "loss"},
                "parameters": {"o": {"values": ["a", "b"], "probabilities": [0.5, 0.5]}},
            },
            "only random search",
        ),
        ({"method": "bayes", "parameters": {"lr": {"min": 0.1, "max": 1.0}}}, "metric"),
        (
            {
                "method": "random",
                "metric": {"name": "loss", "goal": "lowest"},
                "parameters": {"lr": {"value": 1}},
            },
            "'lowest'",
        ),
        ({"method": "random", "parameters": {}}, "{} should be non-empty"),
    ],
)
def test_invalid_configs_fail_before_any_run(config, message):
    calls = []
    with pytest.raises(sweeps.SweepConfigError) as error:
        sweeps.run(config, lambda c: calls.append(c) or {"loss": 0.0}, count=3)
    assert message in str(error.value)
    assert calls == []


def test_a_sweep_function_must_return_metrics():
    with pytest.raises(TypeError, match="float"):
        sweeps.run({"method": "random", "parameters": {"x": {"value": 1}}}, lambda c: 0.5, 1)


def test_check_weight_decay_sweep_tells_right_from_wrong(capsys):
    def config(distribution: str, probabilities: list[float]) -> dict:
        return {
            "method": "random",
            "parameters": {
                "on": {"values": [True, False], "probabilities": probabilities},
                "wd": {"distribution": distribution, "min": 1e-5, "max": 1e-1},
            },
        }

    def decay(c: dict) -> float:
        return c["wd"] if c["on"] else 0.0

    check_weight_decay_sweep(config("log_uniform_values", [0.5, 0.5]), decay)
    with pytest.raises(AssertionError, match="uniform"):
        check_weight_decay_sweep(config("uniform", [0.5, 0.5]), decay)
    with pytest.raises(AssertionError, match="zero in half"):
        check_weight_decay_sweep(config("log_uniform_values", [0.8, 0.2]), decay)
    with pytest.raises(AssertionError, match="zero in half"):
        check_weight_decay_sweep(config("log_uniform_values", [0.5, 0.5]), lambda c: c["wd"])
    with pytest.raises(AssertionError, match="valid"):
        check_weight_decay_sweep({"method": "random", "parameters": {}}, decay)
    assert "FAILED" in capsys.readouterr().out


def synthetic_results(n: int = 40) -> list[sweeps.SweepResult]:
    rng = np.random.default_rng(0)
    results = []
    for _ in range(n):
        lr, other = 10 ** rng.uniform(-5, -1), rng.uniform()
        loss = (math.log10(lr) + 3) ** 2 + 0.01 * other + rng.normal(0, 0.01)
        results.append(sweeps.SweepResult({"lr": lr, "other": other, "const": 1}, {"loss": loss}))
    return results


def test_parameter_importance_finds_what_matters():
    config = {
        "parameters": {
            "lr": {"distribution": "log_uniform_values", "min": 1e-5, "max": 1e-1},
            "other": {"min": 0.0, "max": 1.0},
        }
    }
    found = sweeps.parameter_importance(synthetic_results(), "loss", sweep_config=config)
    assert [p.name for p in found] == ["lr", "other"]  # "const" does not vary
    assert found[0].importance > 0.8
    assert abs(sum(p.importance for p in found) - 1.0) < 1e-9


def test_parallel_coordinates_draws_every_run():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = synthetic_results(12)
    ax = sweeps.parallel_coordinates(results, "loss")
    assert len(ax.lines) >= len(results) + 1  # one line per run, the best run again
    assert [t.get_text() for t in ax.get_xticklabels()] == ["lr", "other", "loss"]
    plt.close(ax.figure)


# --------------------------------------------------------------------------- tracking


def test_without_wandb_the_history_is_kept_locally(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with start_run("p", {"lr": 0.1}) as tracker:
        tracker.watch(nn.Linear(2, 2))
        tracker.log({"examples": 8, "loss": 1.0})
    assert isinstance(tracker, LocalTracker)
    assert tracker.history == [{"examples": 8, "loss": 1.0}]


def test_wandb_never_goes_online_without_a_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
    monkeypatch.setenv("RANK", "1")
    assert isinstance(start_run("p", {}), LocalTracker)  # only rank 0 tracks


def test_offline_wandb_run_writes_outside_the_repository(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with start_run("trainfast-tests", {"lr": 0.1}, directory=tmp_path) as tracker:
        tracker.log({"examples": 16, "train/loss": 2.0})
    assert isinstance(tracker, WandbTracker)
    assert tracker.kind == "wandb (offline)"
    assert tracker.directory.is_relative_to(tmp_path)
    assert list(tracker.directory.glob("run-*.wandb"))
    assert tracker.history == [{"examples": 16, "train/loss": 2.0}]


# --------------------------------------------------------------------------- selection


def test_the_best_of_many_noisy_trials_disappoints():
    outcomes = optimizers_curse([2, 16, 128], true_std=1.0, noise_std=1.0, mean=0.0, repeats=4000)
    gaps = [o.reevaluated - o.measured for o in outcomes]
    assert all(g > 0 for g in gaps) and gaps == sorted(gaps)  # worse again, more so with n
    for o in outcomes:
        assert abs(o.reevaluated - o.true) < 0.05  # a fresh measurement is unbiased
        assert o.best_true <= o.true
        if o.n_trials >= 16:  # enough runs to estimate the spread: shrinkage removes the bias
            assert abs(o.shrunk - o.true) < 0.1 * (o.true - o.measured)
    assert np.allclose(shrink(np.array([[1.0, 3.0]]), noise_std=0.0), [[1.0, 3.0]])
    assert np.allclose(shrink(np.array([[1.0, 3.0]]), noise_std=10.0), [[2.0, 2.0]])


# --------------------------------------------------------------------------- scaling


def test_training_flops_are_counted_exactly():
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    flops = training_flops(model, torch.randn(8, 64), torch.randint(0, 10, (8,)))
    # forward 2 * weights; backward: weight gradients everywhere (2 * weights), input
    # gradients only where the input needs them (the second layer)
    assert flops == 2 * (64 * 32 + 32 * 10) + 2 * (64 * 32 + 32 * 10) + 2 * 32 * 10
    assert all(p.grad is None for p in model.parameters())


def test_fit_power_law_recovers_a_known_law():
    compute = np.logspace(6, 12, 13)
    fit = fit_power_law(compute, 50.0 * compute**-0.25)
    assert fit.exponent == pytest.approx(0.25) and fit.coefficient == pytest.approx(50.0)
    assert fit.exponent_stderr < 1e-9 and fit.points == 13
    noisy = fit_power_law(compute, 50.0 * compute**-0.25 * np.exp(np.sin(np.arange(13)) / 10))
    assert 0.0 < noisy.exponent_stderr < 0.05
    with pytest.raises(ValueError, match="positive"):
        fit_power_law([1.0, 2.0], [1.0, -1.0])


def test_exponent_difference_states_the_interval_and_whether_it_holds_zero():
    stats = pytest.importorskip("scipy.stats")
    a, b = PowerLaw(1.0, 0.30, 0.01, 8), PowerLaw(1.0, 0.20, 0.02, 6)  # dof: min(8, 6) - 2
    half = stats.t.ppf(0.975, 4) * math.hypot(0.01, 0.02)
    assert exponent_difference(a, b) == (
        f"+0.10 ± {half:.2f} (95%, Student's t with 4 degrees of freedom), "
        "an interval that excludes zero"
    )
    assert exponent_difference(b, PowerLaw(1.0, 0.25, 0.03, 6)).endswith("contains zero")
    # a two-point fit has no standard error: said, not a crash in student_t_975(0)
    two = PowerLaw(1.0, 0.1, float("nan"), 2)
    assert exponent_difference(a, two) == (
        "+0.20, not testable: a fit of 2 points has no standard error"
    )


def test_compute_frontier_keeps_what_no_cheaper_run_beats():
    def point(flops: float, loss: float) -> ScalingRun:
        return ScalingRun(4, 1.0, 0.0, 10, 10, flops, loss)

    runs = [point(4, 1.0), point(1, 2.0), point(2, 2.5), point(3, 1.5), point(5, 1.2)]
    assert [(r.flops, r.eval_loss) for r in compute_frontier(runs)] == [
        (1, 2.0),
        (3, 1.5),
        (4, 1.0),
    ]


def test_scaling_study_measures_compute_and_loss(digits_data):
    assert widths_by_sqrt2(4, 5) == [4, 6, 8, 11, 16]
    runs = scaling_study([2, 4], [0.25], data=digits_data)
    assert [r.width for r in runs] == [2, 4]
    assert all(r.examples == round(0.25 * len(digits_data.train)) for r in runs)
    assert runs[0].flops < runs[1].flops and runs[0].parameters < runs[1].parameters
    assert all(0 < r.eval_loss < 3 for r in runs)


def test_check_power_law_fit_tells_right_from_wrong(capsys):
    def right(compute, loss):
        slope, intercept = np.polyfit(np.log(compute), np.log(loss), 1)
        return float(np.exp(intercept)), float(-slope)

    check_power_law_fit(right)
    with pytest.raises(AssertionError, match="true exponent"):
        check_power_law_fit(lambda c, y: (1.0, float(np.polyfit(np.log(c), np.log(y), 1)[0])))
    assert "FAILED" in capsys.readouterr().out


# --------------------------------------------------------------------------- schedules, new checks


def test_cosine_with_warmup_follows_the_cs336_convention():
    from trainfast.training.schedules import cosine_with_warmup

    kw = {"max_lr": 1.0, "min_lr": 0.1, "warmup_iters": 10, "cosine_cycle_iters": 30}
    assert cosine_with_warmup(0, **kw) == 0.0
    assert cosine_with_warmup(5, **kw) == pytest.approx(0.5)  # it / warmup_iters * max_lr
    assert cosine_with_warmup(10, **kw) == pytest.approx(1.0)
    assert cosine_with_warmup(20, **kw) == pytest.approx(0.55)  # half way down the cosine
    assert cosine_with_warmup(30, **kw) == pytest.approx(0.1)
    assert cosine_with_warmup(31, **kw) == cosine_with_warmup(1000, **kw) == 0.1
    with pytest.raises(ValueError, match="warmup_iters: 40"):
        cosine_with_warmup(0, **{**kw, "warmup_iters": 40})


def test_wsd_holds_then_decays_linearly():
    from trainfast.training.schedules import wsd

    kw = {"max_lr": 2.0, "min_lr": 0.0, "warmup_iters": 4, "stable_iters": 10, "decay_iters": 6}
    assert [wsd(i, **kw) for i in (0, 2, 4, 13, 14, 17, 20, 99)] == pytest.approx(
        [0.0, 1.0, 2.0, 2.0, 2.0, 1.0, 0.0, 0.0]
    )
    with pytest.raises(ValueError, match="min_lr"):
        wsd(0, **{**kw, "min_lr": 3.0})


@pytest.mark.parametrize("name", ["cosine_with_warmup", "wsd"])
def test_lambda_lr_form_matches_the_schedule(name):
    from trainfast.training import schedules

    schedule = getattr(schedules, name)
    kw = (
        {"max_lr": 0.3, "min_lr": 0.03, "warmup_iters": 5, "cosine_cycle_iters": 20}
        if name == "cosine_with_warmup"
        else {"max_lr": 0.3, "min_lr": 0.03, "warmup_iters": 5, "stable_iters": 8, "decay_iters": 7}
    )
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=kw["max_lr"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedules.as_lambda(schedule, **kw))
    seen = []
    for _ in range(25):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([schedule(it, **kw) for it in range(25)])
    with pytest.raises(ValueError, match="max_lr"):
        schedules.as_lambda(schedule, **{**kw, "max_lr": 0.0})


def test_a_plain_torch_optimizer_trains_the_backbone_at_the_scaled_lr():
    torch.manual_seed(0)
    model = NarrowResNet(3)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(parameter_groups(model, lr=0.5, backbone_lr_scale=0.1))
    loss = nn.functional.cross_entropy(model(torch.randn(4, 1, 8, 8)), torch.tensor([0, 1, 2, 0]))
    loss.backward()
    optimizer.step()
    head = {id(p) for p in model.fc.parameters()}
    for p, old in zip(model.parameters(), before, strict=True):
        expected = old - (0.5 if id(p) in head else 0.05) * p.grad
        assert torch.allclose(p.detach(), expected, atol=1e-7)


def test_digits_validation_split_is_disjoint_and_optional():
    from trainfast.datasets import digits

    default_train = digits("train", images=True)
    data = load_images("digits", validation_fraction=0.2)
    sizes = len(data.train), len(data.validation), len(data.test)
    assert sum(sizes) == 1797 and sizes[1] == sizes[2] == 359
    rows = {tuple(x.flatten().tolist()) for x, _ in data.validation}
    assert not rows & {tuple(x.flatten().tolist()) for x, _ in data.train}
    assert load_images("digits").validation is None
    assert load_images("digits").train.tensors[0].equal(default_train.tensors[0])  # unchanged
    with pytest.raises(ValueError, match="validation_fraction: 0.9"):
        digits("train", validation_fraction=0.9)


def test_trainer_and_loop_evaluate_alike(digits_data):
    from trainfast.loop import Evaluation, evaluate

    torch.manual_seed(0)
    model = ScalingCNN(4)
    trainer = Trainer(model, quiet(), digits_data.train, digits_data.test)
    ours, theirs = trainer.evaluate(), evaluate(model, digits_data.test)
    assert isinstance(ours, Evaluation) and ours == pytest.approx(theirs)
    assert Trainer(model, quiet(), digits_data.train).evaluate() is None


def test_one_optimizer_factory():
    from trainfast.training.arguments import build_optimizer

    params = [nn.Parameter(torch.zeros(2))]
    assert isinstance(build_optimizer("sgd", params, lr=0.1), torch.optim.SGD)
    adamw = build_optimizer("adamw", params, lr=0.1)
    assert isinstance(adamw, torch.optim.AdamW) and adamw.defaults["weight_decay"] == 0.01
    assert type(build_optimizer("adam", params, lr=0.1)) is torch.optim.Adam
    with pytest.raises(ValueError, match="'lamb'"):
        build_optimizer("lamb", params, lr=0.1)


def _right_cosine(it, *, max_lr, min_lr, warmup_iters, cosine_cycle_iters):
    if it < warmup_iters:
        return it / warmup_iters * max_lr
    if it > cosine_cycle_iters:
        return min_lr
    progress = (it - warmup_iters) / (cosine_cycle_iters - warmup_iters)
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def test_check_cosine_schedule_tells_right_from_wrong(capsys):
    check_cosine_schedule(_right_cosine)

    def off_by_one(it, **kw):  # warmup that starts above zero, as lr_multiplier's does
        if it < kw["warmup_iters"]:
            return (it + 1) / (kw["warmup_iters"] + 1) * kw["max_lr"]
        return _right_cosine(it, **kw)

    with pytest.raises(AssertionError, match="it=0"):
        check_cosine_schedule(off_by_one)
    assert "FAILED" in capsys.readouterr().out


def test_check_wsd_schedule_tells_right_from_wrong():
    from trainfast.training.schedules import wsd

    check_wsd_schedule(wsd)

    def decays_to_zero(it, **kw):
        return wsd(it, **{**kw, "min_lr": 0.0})

    with pytest.raises(AssertionError, match="min_lr=0.0002"):
        check_wsd_schedule(decays_to_zero)


def test_check_refit_tells_right_from_wrong():
    def right(compute, loss, drop):
        order = np.argsort(compute)
        return fit_power_law(compute[order][drop:], loss[order][drop:]).exponent

    def unsorted(compute, loss, drop):  # drops the first points in the given order
        return fit_power_law(compute[drop:], loss[drop:]).exponent

    check_refit(right)
    with pytest.raises(AssertionError, match="without the 2 cheapest"):
        check_refit(unsorted)


def test_check_logged_loop_tells_right_from_wrong():
    from torch.utils.data import DataLoader

    def logged(model, optimizer, dataset, *, batch_size, steps, tracker, every=1):
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
        )
        step, seen = 0, 0
        while step < steps:
            for inputs, targets in loader:
                optimizer.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(model(inputs), targets)
                loss.backward()
                optimizer.step()
                step, seen = step + 1, seen + len(targets)
                if step % every == 0:
                    tracker.log({"train/loss": loss.item(), "examples": seen})
                if step == steps:
                    return

    check_logged_loop(logged)
    with pytest.raises(AssertionError, match="one logged row per step"):
        check_logged_loop(lambda *a, **k: logged(*a, **k, every=2))


# ------------------------------------------------------------------------ resume, artifacts, agents


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(digits_data, tmp_path):
    from trainfast.training.checkpoints import load_checkpoint, save_checkpoint

    args = quiet(lr=3e-3, batch_size=64, epochs=3, log_every=128)

    def fresh() -> Trainer:
        torch.manual_seed(0)
        return Trainer(ScalingCNN(4, dropout=0.2), args, digits_data.train, digits_data.test)

    whole = fresh()
    whole.train()
    interrupted = fresh()
    interrupted.callbacks.append(lambda record: record["epoch"] >= 1)  # "crash" after epoch 1
    interrupted.train()
    assert interrupted.examples_seen == len(digits_data.train)
    path = save_checkpoint(interrupted, tmp_path / "checkpoint.pt")
    resumed = fresh()
    load_checkpoint(resumed, path)
    resumed.train()
    assert resumed.examples_seen == whole.examples_seen and resumed.steps == whole.steps
    for a, b in zip(resumed.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="lr"):
        Trainer(ScalingCNN(4), quiet(lr=1.0), digits_data.train).load_state_dict(
            torch.load(path, weights_only=False)
        )
    with pytest.raises(ValueError, match="only online"):
        load_checkpoint(fresh(), "checkpoint:latest")


class _NoiseLayer(nn.Module):
    """Adds noise drawn from a generator of its own while training: a generator that no global
    seed or state covers, as an augmentation's would be."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        return x + 0.1 * torch.randn(x.shape, generator=self.generator, device=x.device)


def _resume_twice(data, device: str, make_model, generators=lambda: {}, tmp_path=None):
    """An uninterrupted run and one that "crashes" after epoch 1, has every generator it draws
    from knocked out of place (planted draws), and resumes from its checkpoint."""
    from trainfast.training.checkpoints import load_checkpoint, save_checkpoint

    args = quiet(lr=3e-3, batch_size=64, epochs=3, log_every=128, device=device)

    def fresh():
        torch.manual_seed(0)
        run_generators = generators()
        return Trainer(
            make_model(run_generators), args, data.train, data.test, generators=run_generators
        )

    whole = fresh()
    whole.train()
    interrupted = fresh()
    interrupted.callbacks.append(lambda record: record["epoch"] >= 1)
    interrupted.train()
    path = save_checkpoint(interrupted, tmp_path / "checkpoint.pt")
    resumed = fresh()
    torch.manual_seed(12345)  # planted: every default generator elsewhere
    torch.rand(7, device=device)
    for generator in [resumed.train_loader.generator, *resumed.generators.values()]:
        generator.manual_seed(12345)
    load_checkpoint(resumed, path)
    resumed.train()
    return whole, resumed


def test_a_resume_restores_every_generator_the_run_draws_from(digits_data, tmp_path):
    """Dropout (the CPU generator), the data order and a generator of the run's own: all three
    are knocked out of place before the resume, and the resumed run still ends bit for bit where
    the uninterrupted one does. A generator the run does not name is not restored (the control:
    the same runs then end elsewhere)."""

    def noisy_cnn(generators):
        return nn.Sequential(_NoiseLayer(generators["noise"]), ScalingCNN(4, dropout=0.2))

    def named():
        return {"noise": torch.Generator().manual_seed(7)}

    whole, resumed = _resume_twice(digits_data, "cpu", noisy_cnn, named, tmp_path)
    assert resumed.steps == whole.steps
    for a, b in zip(resumed.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(a, b)
    shared = torch.Generator().manual_seed(7)  # the run's generator, kept from the trainer

    def unnamed_cnn(generators):
        return nn.Sequential(_NoiseLayer(shared), ScalingCNN(4, dropout=0.2))

    shared.manual_seed(7)
    whole, resumed = _resume_twice(digits_data, "cpu", unnamed_cnn, tmp_path=tmp_path)
    assert not all(
        torch.equal(a, b)
        for a, b in zip(resumed.model.parameters(), whole.model.parameters(), strict=True)
    )
    with pytest.raises(ValueError, match=r"holds the generators \['data_order'\], this run has"):
        from trainfast.training.random_state import random_states, restore_random_states

        restore_random_states(
            random_states(torch.device("cpu"), {"data_order": torch.Generator()}),
            {"data_order": torch.Generator(), "noise": torch.Generator()},
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_resume_on_a_gpu_continues_dropout_exactly(tmp_path):
    """Dropout on a CUDA tensor draws from the CUDA generator: a resume that restored only the
    CPU's (torch.get_rng_state) would draw other masks after the crash. An MLP, so that no
    nondeterministic kernel (a convolution's backward) blurs the comparison."""

    def mlp(generators):
        return nn.Sequential(
            nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 10)
        )

    whole, resumed = _resume_twice(load_images("digits"), "cuda", mlp, tmp_path=tmp_path)
    assert next(resumed.model.parameters()).is_cuda
    for a, b in zip(resumed.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_an_offline_wandb_run_logs_the_checkpoint_as_an_artifact(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    from trainfast.training.checkpoints import save_checkpoint

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    with start_run("trainfast-tests", {"x": 1}, directory=tmp_path) as tracker:
        trainer = Trainer(nn.Linear(4, 2), quiet(batch_size=8), data, tracker=tracker)
        trainer.train()
        save_checkpoint(trainer, tmp_path / "ckpt.pt", tracker=tracker, name="tiny")
        run_id = tracker.id
    assert (tmp_path / "ckpt.pt").exists()
    # an offline run's record (the file `wandb sync` uploads) holds the artifact; W&B's service
    # writes it after the run has finished, so on a busy machine it may take a while to appear
    import time

    deadline = time.monotonic() + 120
    while True:
        transactions = b"".join(p.read_bytes() for p in tmp_path.rglob("run-*.wandb"))
        if (b"tiny" in transactions and b"ckpt.pt" in transactions) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert b"tiny" in transactions and b"ckpt.pt" in transactions
    with start_run("trainfast-tests", {"x": 1}, directory=tmp_path, run_id=run_id) as again:
        assert again.id == run_id


def test_agents_of_one_shared_sweep_never_repeat_a_grid_point(tmp_path):
    import threading

    config = {
        "method": "grid",
        "metric": {"name": "loss", "goal": "minimize"},
        "parameters": {"x": {"values": [1, 2, 3, 4, 5]}, "y": {"values": [0, 1]}},
    }
    shared = sweeps.SharedSweep(tmp_path / "sweep.json")
    results = {}

    def agent(name: str) -> None:
        results[name] = sweeps.run_locally(
            config, lambda c: {"loss": float(c["x"] * c["y"])}, 100, shared=shared, agent=name
        )

    threads = [threading.Thread(target=agent, args=(f"agent-{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = shared.records()
    assert sum(len(r) for r in results.values()) == len(records) == 10
    assert len({json.dumps(r["config"], sort_keys=True) for r in records}) == 10
    assert all(r["state"] == "finished" for r in records)


def test_scaling_study_benchmark_quick_record():
    from trainfast.training.benchmarks import scaling_study_record

    record = scaling_study_record(torch.device("cpu"), quick=True)
    assert record.name == "scaling-study"
    assert {row["dropout"] for row in record.rows} == {0.0, 0.2}
    assert all(row["lr"] > 0 and 0 < row["eval_loss"] < 3 for row in record.rows)
    small = min(record.rows, key=lambda r: r["width"])
    large = max(record.rows, key=lambda r: r["width"])
    assert small["lr"] > large["lr"]  # 1/sqrt(fan_in)


def test_scaling_study_widens_a_multiplier_chosen_at_the_grid_edge(monkeypatch):
    """A planted study whose loss is lowest at a learning-rate multiplier of 8 for the widest
    model and of 1 elsewhere: the record tries 4 and 8 (and 16, to see 8 is interior) for that
    width only, leaves the others at the three-point grid, and says so in its rows."""
    from trainfast.training import benchmarks
    from trainfast.training.scaling import ScalingRun

    calls = []

    def planted(widths, fractions, *, dropout, seeds, data, args, lr_of_width):
        calls.append((tuple(widths), tuple(fractions)))
        runs = []
        for fraction in fractions:
            for width in widths:
                lr = lr_of_width(width)
                multiplier = lr / (1e-2 * math.sqrt(benchmarks.BASE_WIDTH / width))
                best = 8.0 if width == max(benchmarks.widths_by_sqrt2(4, 8)) else 1.0
                loss = 0.5 + abs(math.log2(multiplier / best))
                runs.append(
                    ScalingRun(width, fraction, dropout, 100, 100, 1e6, loss, 0.0, loss, lr)
                )
        return runs

    monkeypatch.setattr(benchmarks, "scaling_study", planted)
    monkeypatch.setattr(benchmarks, "load_images", lambda *a, **k: None)
    record = benchmarks.scaling_study_record(torch.device("cpu"))
    widest = max(r["width"] for r in record.rows)
    for row in record.rows:
        if row["width"] == widest:
            assert row["lr_multiplier"] == pytest.approx(8.0)
            assert row["lr_multipliers_tried"] == 6 and not row["lr_at_edge"]  # 0.5 ... 16
        else:
            assert row["lr_multiplier"] == 1.0 and row["lr_multipliers_tried"] == 3
    single = [call for call in calls if len(call[0]) == 1]  # widening: one configuration a call
    assert len(calls) - len(single) == 2 * 3  # the grid, per dropout setting
    assert {w for (w,), _ in single} == {widest} and len(single) == 2 * 3 * 3  # 4, 8, 16


#: Constants the hyperparameters chapter may type: the batch sizes and data settings its runs
#: are keyed by (16, 64, 256, 1,024; digits 0–4 and 5–9; 8×8 images; 20% dropout; logging
#: every 25 steps; 3×3 grids and Hyperband's eta 3 with brackets 1, 3, 9), published settings
#: (β₂ 0.999 and 0.95, Hoffmann et al.'s exponent 0.5), the 2 + 4 = 6 FLOPs per weight per token
#: of Kaplan et al.'s section 2.1, the unit noise of the optimizer's-curse simulation (1), 95% for
#: every interval, McCandlish et al.'s section 2.3, and the noise scale's former 32 batch pairs.


def test_robust_shrinkage_shrinks_a_heavy_tailed_sweep_that_gaussian_shrinkage_leaves_alone():
    """Most runs near 0.1 with seed noise, three diverged at the chance loss 2.3."""
    rng = np.random.default_rng(0)
    true = np.exp(rng.normal(np.log(0.1), 0.1, size=29))
    measured = np.concatenate([true * np.exp(rng.normal(0, 0.1, size=29)), [2.3, 2.3, 2.3]])
    best = int(np.argmin(measured))
    gaussian = shrink(measured, noise_std=0.01)  # noise of 0.1 in log is about 0.01 in loss
    robust = shrink_robust(measured, noise_std=0.1)
    assert gaussian[best] == pytest.approx(measured[best], rel=0.02)  # the outliers' variance
    assert robust[best] > measured[best] * 1.05  # pulled toward the typical run
    assert robust[best] < np.median(measured)
    # on log-normal data with no outliers the two agree roughly
    clean = measured[:29]
    assert shrink_robust(clean, noise_std=0.0) == pytest.approx(clean)
    with np.errstate(divide="ignore"):
        assert np.all(np.isfinite(shrink_robust(clean, noise_std=1.0)))


def test_next_range_check_passes_the_rule_and_catches_a_range_kept_at_its_edge(capsys):
    import math

    from trainfast.training.exercises import check_next_range

    def next_range(low, high, best, inner=0.25, keep=False):
        position = math.log(best / low) / math.log(high / low)
        if keep or inner <= position <= 1 - inner:
            return low, high
        half = math.sqrt(high / low)
        return best / half, best * half

    check_next_range(next_range)
    assert "All 6 cases passed." in capsys.readouterr().out
    with pytest.raises(AssertionError, match="best 0.01"):  # never moves the range
        check_next_range(lambda lo, hi, b: next_range(lo, hi, b, keep=True))
    with pytest.raises(AssertionError, match="best 0.009"):  # only reacts exactly at the edge
        check_next_range(lambda lo, hi, b: next_range(lo, hi, b, inner=0.01))
    with pytest.raises(AssertionError, match="best 0.01"):  # widens linearly, not in decades
        check_next_range(lambda lo, hi, b: (lo, hi) if lo < b < hi else (lo, 2 * hi))


def test_choose_batch_check_catches_ignoring_the_noise_scale_or_the_curve(capsys):
    from trainfast.training.exercises import check_choose_batch

    def choose_batch(throughput, b_simple):
        candidates = [b for b in sorted(throughput) if b <= b_simple] or [min(throughput)]
        best = max(throughput[b] for b in candidates)
        return min(b for b in candidates if throughput[b] >= 0.95 * best)

    check_choose_batch(choose_batch)
    assert "All 6 cases passed." in capsys.readouterr().out
    with pytest.raises(AssertionError, match="B_simple 256: batch 256"):  # "up to" read as "<"
        check_choose_batch(
            lambda tp, b: choose_batch({s: v for s, v in tp.items() if s < b} or tp, b)
        )
    with pytest.raises(AssertionError, match="B_simple 100"):  # the fastest, whatever B_simple
        check_choose_batch(lambda tp, b: max(tp, key=tp.get))
    with pytest.raises(AssertionError, match="B_simple 2000"):  # the largest below B_simple
        check_choose_batch(lambda tp, b: max([s for s in tp if s <= b] or [min(tp)]))
    with pytest.raises(AssertionError, match="flat curve"):  # no tolerance on a flat curve
        check_choose_batch(lambda tp, b: max([s for s in tp if s <= b] or [min(tp)], key=tp.get))


def test_rerun_plan_check_catches_rerunning_only_the_winner_or_too_few_seeds(capsys):
    import math

    from trainfast.training.exercises import check_rerun_plan

    def rerun_plan(losses, seed_std, target_se):
        finalists = sum(loss <= min(losses) + 2 * seed_std for loss in losses)
        return finalists, max(2, math.ceil((seed_std / target_se) ** 2))

    check_rerun_plan(rerun_plan)
    assert "All 4 cases passed." in capsys.readouterr().out
    with pytest.raises(AssertionError, match="seed std 0.005"):  # only the winner
        check_rerun_plan(lambda ls, s, t: (1, rerun_plan(ls, s, t)[1]))
    with pytest.raises(AssertionError, match="seed std 0.005"):  # seeds from std/se, unsquared
        check_rerun_plan(lambda ls, s, t: (rerun_plan(ls, s, t)[0], max(2, math.ceil(s / t))))
    with pytest.raises(AssertionError, match="seed std 0.001"):  # one seed is no mean
        check_rerun_plan(lambda ls, s, t: (rerun_plan(ls, s, t)[0], math.ceil((s / t) ** 2)))


def test_training_arguments_listing_lines_are_exactly_the_fields():
    """The chapter shows lines 14-26 of TrainingArguments: every field, nothing else.

    Sphinx counts a ``:pyobject:``'s lines from its decorator, as ``inspect.getsource`` does.
    """
    import dataclasses
    import inspect
    import re

    from trainfast.training import TrainingArguments

    page = chapters.chapter_path("hyperparameters/trainer").read_text()
    start, end = map(
        int, re.search(r":pyobject: TrainingArguments\n:lines: (\d+)-(\d+)", page).groups()
    )
    shown = inspect.getsource(TrainingArguments).splitlines()[start - 1 : end]
    names = [line.split(":")[0].strip() for line in shown]
    assert names == [f.name for f in dataclasses.fields(TrainingArguments)]


#: listing -> the lines its excerpt must keep (the ideas the prose around it names)
EXCERPTS = {
    "scaling_study_record": (
        "def scaling_study_record(",
        "widths_by_sqrt2(",
        "lr_of_width=",
        "outward = ",
    ),
    "Trainer.setup": ("def setup(", "args = self.args", "build_optimizer(", "LambdaLR("),
    "Trainer.training_step": (
        "def training_step(",
        "self.model.train()",
        "loss.backward()",
        "return loss.detach()",
    ),
    "evaluate": (
        "@torch.inference_mode()",
        "def evaluate(",
        "model.eval()",
        "model.train(was_training)",
    ),
    "Trainer.train": (
        "def train(",
        "eval_every = ",
        "next_log = ",
        "for batch in self.train_loader:",
        "self.examples_seen >= next_eval",
        "self._evaluate_and_log(",
    ),
}


@pytest.mark.parametrize("name", sorted(EXCERPTS))
def test_excerpted_listings_show_the_lines_that_carry_the_idea(name: str) -> None:
    """Each ``:lines:`` excerpt starts at the signature and keeps what the prose explains.

    Sphinx applies ``:lines:`` to the ``:pyobject:``'s source from its decorator, as
    ``inspect.getsource`` gives it; an edit of the code that shifts the lines fails here.
    """
    import inspect
    import re

    from trainfast import loop
    from trainfast.training.benchmarks import scaling_study_record
    from trainfast.training.trainer import Trainer

    page = "\n".join(
        chapters.chapter_path(p).read_text() for p in chapters.pages_of("hyperparameters")
    )
    spec = re.search(rf":pyobject: {re.escape(name)}\n:lines: ([\d,-]+)\n", page).group(1)
    functions = {"evaluate": loop.evaluate, "scaling_study_record": scaling_study_record}
    obj = functions.get(name) or getattr(Trainer, name.split(".")[1])
    source = inspect.getsource(obj).splitlines()
    shown = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        shown += source[int(first) - 1 : int(last or first)]
    assert shown[0] == source[0]
    assert '"""' not in "\n".join(shown), f"{name}: the excerpt shows a docstring"
    for line in EXCERPTS[name]:
        assert any(line in s for s in shown), f"{name}: the excerpt lacks {line!r}"


@pytest.mark.parametrize(
    "name",
    [
        "start_run",
        "run_on_wandb",
        "run_locally",
        "lr_multiplier",
        "gradient_noise_scale",
        "training_flops",
        "random_states",
        "train_digits",
    ],
)
def test_listings_without_docstrings_show_the_rest_of_the_object(name: str) -> None:
    """These listings leave out the docstring (the prose says it; the API reference has it) and
    nothing else; an edit that shifts the lines fails here."""
    import chapters
    from trainfast.sweeps import engine
    from trainfast.training import (
        digits_sweep,
        noise_scale,
        random_state,
        scaling,
        schedules,
        tracking,
    )

    objects = {
        "start_run": tracking.start_run,
        "run_on_wandb": engine.run_on_wandb,
        "run_locally": engine.run_locally,
        "lr_multiplier": schedules.lr_multiplier,
        "gradient_noise_scale": noise_scale.gradient_noise_scale,
        "training_flops": scaling.training_flops,
        "random_states": random_state.random_states,
        "train_digits": digits_sweep.train_digits,
    }
    assert chapters.listing_lines("hyperparameters", name) == chapters.docstring_free_lines(
        objects[name]
    )


# ------------------------------------------------------------------------ the gradient noise scale


def test_exact_noise_scale_is_what_one_backward_per_example_gives():
    from trainfast.training.noise_scale import exact_noise_scale

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    inputs, targets = torch.randn(12, 5), torch.randint(0, 3, (12,))
    grads = []
    for x, y in zip(inputs, targets, strict=True):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[None]), y[None]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).double())
    flat = torch.stack(grads)
    g2, trace = exact_noise_scale(model, inputs, targets)
    assert g2 == pytest.approx(flat.mean(0).square().sum().item(), rel=1e-6)
    assert trace == pytest.approx(flat.var(0, unbiased=False).sum().item(), rel=1e-6)


def _standard_error_of_gradient_norm_sq(estimate) -> float:
    """The |G|² estimate is a fixed linear combination of the two mean norms: its standard
    error is that of the per-pair combination."""
    from trainfast.training.noise_scale import _u

    u_small, u_big = _u(estimate.small, estimate.population), _u(estimate.big, estimate.population)
    weight = u_big / (u_small - u_big)
    per_pair = [
        (1 + weight) * big - weight * small
        for small, big in zip(estimate.small_norms_sq, estimate.big_norms_sq, strict=True)
    ]
    return float(np.std(per_pair, ddof=1) / math.sqrt(len(per_pair)))


def test_the_noise_scale_estimate_meets_the_exact_per_example_value():
    """Batches drawn without replacement from a finite set: the corrected estimator is centred on
    the exact |G|² and B_simple of the per-example gradients; McCandlish et al.'s uncorrected
    formulas, on the very same norms, are many standard errors off (|G|² low, B_simple high)."""
    from trainfast.training.noise_scale import NoiseScale, exact_noise_scale, gradient_noise_scale

    inputs, targets = load_images("digits").train.tensors
    inputs, targets = inputs[:240].flatten(1), targets[:240]  # N = 240, big = half of it
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))
    exact_g2, exact_trace = exact_noise_scale(model, inputs, targets)
    dataset = TensorDataset(inputs, targets)
    estimate = gradient_noise_scale(model, dataset, small=4, big=120, batches=600)
    assert estimate.population == 240
    z_g2 = (estimate.gradient_norm_sq - exact_g2) / _standard_error_of_gradient_norm_sq(estimate)
    z_simple = (estimate.simple - exact_trace / exact_g2) / estimate.simple_stderr
    assert abs(z_g2) < 4 and abs(z_simple) < 4, (z_g2, z_simple)
    uncorrected = NoiseScale(4, 120, None, estimate.small_norms_sq, estimate.big_norms_sq)
    z_g2 = (uncorrected.gradient_norm_sq - exact_g2) / _standard_error_of_gradient_norm_sq(
        uncorrected
    )
    z_simple = (uncorrected.simple - exact_trace / exact_g2) / uncorrected.simple_stderr
    assert z_g2 < -6 and z_simple > 3, (z_g2, z_simple)
    # independent draws need no correction: the uncorrected formulas are then the right ones
    independent = gradient_noise_scale(
        model, dataset, small=4, big=120, batches=600, replacement=True, seed=1
    )
    assert independent.population is None
    z_simple = (independent.simple - exact_trace / exact_g2) / independent.simple_stderr
    assert abs(z_simple) < 4, z_simple


def test_the_noise_scale_reports_its_precision_and_the_pairs_a_precision_needs():
    from trainfast.training.noise_scale import noise_scale_from_norms

    generator = np.random.default_rng(0)
    small = 1.0 + generator.normal(0, 0.2, 400)  # |G_8|² about 1.0, |G_256|² about 0.1
    big = 0.1 + generator.normal(0, 0.01, 400)
    full = noise_scale_from_norms(small, big, small=8, big=256, population=None)
    quarter = noise_scale_from_norms(small[:100], big[:100], small=8, big=256, population=None)
    assert full.simple_stderr < quarter.simple_stderr  # more pairs, a smaller error
    low, high = full.interval()
    assert low < full.simple < high and high - low == pytest.approx(2 * 1.96 * full.simple_stderr)
    needed = quarter.pairs_for(quarter.relative_error / 2)  # half the error: four times the pairs
    assert needed == pytest.approx(4 * 100, rel=0.01)
    with pytest.raises(ValueError, match="relative_error"):
        full.pairs_for(0.0)


def test_a_noise_scale_without_a_positive_gradient_norm_is_reported_not_returned():
    from trainfast.training.noise_scale import noise_scale_from_norms

    with pytest.warns(RuntimeWarning, match=r"\|G\|\^2 estimate is -.* <= 0 after 2 batch pairs"):
        estimate = noise_scale_from_norms(
            [100.0, 100.0], [1.0, 1.0], small=8, big=256, population=None
        )
    assert not estimate.resolved and estimate.gradient_norm_sq < 0
    with pytest.raises(ValueError, match=r"No B_simple: the \|G\|\^2 estimate is -"):
        _ = estimate.simple
    with pytest.raises(ValueError, match="small=8, big=8"):
        noise_scale_from_norms([1.0], [1.0], small=8, big=8, population=None)
    with pytest.raises(ValueError, match="big=256: the data set has only 100"):
        noise_scale_from_norms([1.0], [1.0], small=8, big=256, population=100)


# ------------------------------------------------------------------------ quasi-random search


def test_quasi_random_configs_respect_the_ranges_and_spread_more_evenly_than_random():
    from scipy.stats import qmc

    config = {
        "method": "random",
        "parameters": {
            "lr": {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-1},
            "other": {"min": 0.0, "max": 1.0},
            "layers": {"min": 1, "max": 4},
            "schedule": {"values": ["a", "b"], "probabilities": [0.25, 0.75]},
            "epochs": {"value": 2},
        },
    }
    configs = sweeps.quasi_random(config, 64, seed=0)
    assert len(configs) == 64 and all(c["epochs"] == 2 for c in configs)
    assert all(1e-4 <= c["lr"] <= 1e-1 and 0 <= c["other"] < 1 for c in configs)
    assert {c["layers"] for c in configs} == {1, 2, 3, 4}  # int_uniform, inferred from int bounds
    assert abs(sum(c["schedule"] == "b" for c in configs) - 48) <= 2  # 3/4 of 64, as weighted
    unit = np.array([[(math.log10(c["lr"]) + 4) / 3, c["other"]] for c in configs])
    pseudo = np.array(
        [
            [(math.log10(c["lr"]) + 4) / 3, c["other"]]
            for c in sweeps.sample(
                {
                    "method": "random",
                    "parameters": {k: config["parameters"][k] for k in ("lr", "other")},
                },
                64,
            )
        ]
    )
    assert qmc.discrepancy(unit) < qmc.discrepancy(pseudo) / 2
    assert sweeps.quasi_random(config, 8, seed=1) != sweeps.quasi_random(config, 8, seed=2)
    with pytest.raises(ValueError, match="Invalid count: 0"):
        sweeps.quasi_random(config, 0)
    with pytest.raises(sweeps.SweepConfigError, match="q_uniform"):
        sweeps.quasi_random(
            {
                "method": "random",
                "parameters": {"x": {"distribution": "q_uniform", "min": 0, "max": 1, "q": 0.5}},
            },
            4,
        )


def test_parallel_coordinates_names_and_legend_stay_apart():
    """The legend below the slanted axis names ran into "warmup_fraction" on the search page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [
        sweeps.SweepResult(
            {"warmup_fraction": 0.1 * i, "schedule": ["cosine", "constant"][i % 2]},
            {"loss": 1.0 / (i + 1)},
        )
        for i in range(4)
    ]
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    sweeps.parallel_coordinates(results, "loss", ax=ax)
    fig.tight_layout()
    fig.canvas.draw()
    names = [text.get_window_extent() for text in ax.get_xticklabels()]
    legend = ax.get_legend().get_window_extent()
    assert all(legend.y1 <= name.y0 for name in names)
    plt.close(fig)
