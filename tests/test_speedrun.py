"""The speedrun's harness and data pipeline (issue: the capstone chapter).

The data: the tokenizer round-trips the corpus, the memmaps hold the text's tokens in order,
the splits share no file, and a token stream never repeats a token. The harness: a run stops
at the target (and not before), stops at the step budget with a message when the target is
out of reach, and refuses bad configurations naming the value.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers", reason="the speedrun's tokenizer is a book extra (tokenizers)")
from trainfast.speedrun import (  # noqa: E402
    RunResult,
    SpeedrunConfig,
    Target,
    TokenStream,
    compare,
    prepare,
    run_to_target,
)
from trainfast.speedrun.data import SPLITS, corpus_files, split_of, torch_sources
from trainfast.transformer import PRESET_SHAPES, Transformer

SMALL_CORPUS = 600_000  # bytes of torch's sources: enough for every split, fast to tokenize


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("speedrun"), max_bytes=SMALL_CORPUS, vocab_size=512)


def _config(**changes) -> SpeedrunConfig:
    shape = replace(PRESET_SHAPES["tiny-modern"], vocab_size=512, seq_len=32, batch_size=8)
    return SpeedrunConfig(**{"name": "test", "shape": shape, "lr": 3e-3, **changes})


def test_the_tokenizer_round_trips_the_text_and_the_memmaps_hold_it_in_order(data):
    tokenizer = data.tokenizer()
    root = torch_sources()
    validation = corpus_files(root, SMALL_CORPUS)["validation"]
    assert all(split_of(p.relative_to(root).as_posix()) == "validation" for p in validation)
    text = validation[0].read_text()
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text
    stored = data.tokens_of("validation")
    assert list(stored[: len(ids)]) == ids  # the first validation file, first in its memmap
    assert stored.dtype == np.uint16 and int(stored.max()) < data.vocab_size
    assert sum(data.tokens.values()) == sum(len(data.tokens_of(s)) for s in SPLITS)


def test_the_splits_share_no_file_and_are_stable():
    paths = [f"torch/{i}.py" for i in range(2_000)]
    splits = [split_of(p) for p in paths]
    assert splits == [split_of(p) for p in paths]  # no per-process hash seed
    shares = {s: splits.count(s) / len(paths) for s in SPLITS}
    assert 0.01 < shares["validation"] < 0.03 and 0.01 < shares["tune"] < 0.03


def test_prepare_is_done_once_per_corpus(data):
    before = data.path("train").stat().st_mtime_ns
    again = prepare(data.folder, max_bytes=SMALL_CORPUS, vocab_size=512)
    assert again.corpus_sha256 == data.corpus_sha256
    assert data.path("train").stat().st_mtime_ns == before


def test_a_token_stream_never_repeats_a_token_and_says_when_it_is_used_up():
    tokens = np.arange(101, dtype=np.uint16)
    stream = TokenStream(tokens, batch=2, seq_len=10)
    seen = []
    for _ in range(5):
        inputs, targets = stream.next_batch()
        assert torch.equal(targets[:, :-1], inputs[:, 1:])
        assert torch.equal(targets[:, -1], inputs[:, -1] + 1)  # each row is a window of the text
        assert all(int(row[0]) % 10 == 0 for row in inputs)  # on the grid of windows
        seen.extend(inputs.flatten().tolist())
    assert sorted(seen) == list(range(100))  # every input token once
    assert seen != list(range(100))  # in a shuffled order of windows...
    again = TokenStream(tokens, batch=2, seq_len=10)
    assert torch.equal(again.next_batch()[0], torch.tensor([seen[:10], seen[10:20]]))  # ...fixed
    with pytest.raises(RuntimeError, match="used up: 100 tokens"):
        stream.next_batch()
    with pytest.raises(ValueError, match="seq_len: 200"):
        TokenStream(tokens, batch=1, seq_len=200)


def test_a_run_stops_at_the_first_evaluation_at_or_below_the_target(data):
    lines = []
    target = Target(loss=5.5, eval_every=5, eval_tokens=2_048, max_steps=200)
    result = run_to_target(_config(), data, target, progress=lines.append)
    assert result.reached and result.final_loss <= 5.5
    assert [loss <= 5.5 for _, loss in result.history] == [False] * (len(result.history) - 1) + [
        True
    ]
    assert result.steps == result.history[-1][0] and result.steps % 5 == 0
    assert result.tokens == result.steps * 8 * 32
    assert result.train_seconds > 0 and result.eval_seconds > 0
    assert "validation loss" in lines[-1] and "(target 5.5)" in lines[-1]


def test_a_run_can_be_judged_on_the_tuning_split_instead(data):
    target = Target(loss=0.0, eval_every=5, eval_tokens=2_048, max_steps=5)
    judged = {
        split: run_to_target(_config(), data, target, split=split, progress=None).final_loss
        for split in ("validation", "tune")
    }
    # the same model after the same 5 steps, evaluated on two different texts
    assert judged["validation"] != judged["tune"], judged
    with pytest.raises(ValueError, match="Invalid split: 'train'"):
        run_to_target(_config(), data, target, split="train", progress=None)


def test_a_run_that_cannot_reach_the_target_stops_at_the_budget(data):
    lines = []
    target = Target(loss=0.01, eval_every=2, eval_tokens=1_024, max_steps=4)
    result = run_to_target(_config(), data, target, progress=lines.append)
    assert not result.reached and result.steps == 4
    assert "did not reach the target 0.01 in 4 steps" in result.message == lines[-1]


def test_muon_bf16_and_a_schedule_run(data):
    config = _config(
        optimizer="muon", muon_ns_dtype="float32", precision="bf16", schedule="wsd", warmup_steps=2
    )
    result = run_to_target(config, data, Target(loss=0.01, eval_every=3, max_steps=3))
    assert math.isfinite(result.final_loss)
    assert [config.lr_factor(s) for s in (0, 1)] == [0.5, 1.0]


def test_data_parallel_trains_the_same_model_over_two_processes(data):
    """Two gloo ranks, each with half of every batch, averaged by the book's DDP: the same
    tokens and, up to the order of additions, the same losses as one process."""
    target = Target(loss=0.0, eval_every=3, eval_tokens=1_024, max_steps=6)
    config = _config(optimizer="muon", muon_ns_dtype="float32")
    one = run_to_target(config, data, target, progress=None)
    two = run_to_target(replace(config, data_parallel=2), data, target, progress=None)
    assert (two.steps, two.tokens) == (one.steps, one.tokens) == (6, 6 * 8 * 32)
    assert [s for s, _ in two.history] == [s for s, _ in one.history] == [3, 6]
    for (_, a), (_, b) in zip(one.history, two.history, strict=True):
        assert abs(a - b) < 1e-4, (one.history, two.history)
    # a rank that averaged nothing would train on half the batch: its losses drift apart
    half = run_to_target(
        replace(config, shape=replace(config.shape, batch_size=4)), data, target, progress=None
    )
    assert abs(half.history[-1][1] - one.history[-1][1]) > 1e-3


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_embedding_lr_moves_the_embedding_alone(optimizer):
    """With ``embedding_lr`` the token table is in a group of its own at that lr, under AdamW
    and under Muon (on AdamW's side); every other parameter keeps its group and lr."""
    from trainfast.speedrun.harness import _optimizer

    config = _config(optimizer=optimizer, muon_ns_dtype="float32")
    model = Transformer(config.shape)
    before = _optimizer(config, model).param_groups
    after = _optimizer(replace(config, embedding_lr=0.5), model).param_groups
    embedding = model.token_embedding.weight

    def lr_of(groups):
        return {id(p): (g["lr"], g.get("use_muon", False)) for g in groups for p in g["params"]}

    old, new = lr_of(before), lr_of(after)
    assert new.keys() == old.keys() == {id(p) for p in model.parameters()}
    assert new.pop(id(embedding)) == (0.5, False) != old.pop(id(embedding))
    assert new == old


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"optimizer": "lion"}, "optimizer: 'lion'"),
        ({"lr": float("inf")}, "lr: inf"),
        ({"lr": 0}, "lr: 0"),
        ({"embedding_lr": -1e-2}, "embedding_lr: -0.01"),
        ({"embedding_lr": 0}, "embedding_lr: 0"),
        ({"precision": "fp8"}, "precision: 'fp8'"),
        ({"warmup_steps": 1.5}, "warmup_steps: 1.5"),
        ({"schedule": "cosine", "warmup_steps": 10, "schedule_steps": 5}, "warmup_steps: 10"),
        ({"betas": (0.9, 1.0)}, "betas: 1.0"),
        ({"compile": "yes"}, "compile: 'yes'"),
        ({"muon_ns_dtype": "fp8"}, "muon_ns_dtype: 'fp8'"),
        ({"data_parallel": 0}, "data_parallel: 0"),
        ({"data_parallel": 3}, "data_parallel: 3 (the batch of 8 sequences"),
    ],
)
def test_bad_configurations_name_the_value(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        _config(**changes)


def test_bad_targets_name_the_value():
    with pytest.raises(ValueError, match="loss: nan"):
        Target(loss=float("nan"))
    with pytest.raises(ValueError, match="max_steps: 0"):
        Target(loss=1.0, max_steps=0)


def test_compare_counts_only_gains_beyond_the_noise():
    def runs(times, reached=True):
        return [RunResult("x", i, reached, t, 0.0, 1, 1, 1.0) for i, t in enumerate(times)]

    clear = compare(runs([10.0, 11.0, 12.0, 10.5, 11.5]), runs([5.0, 5.5, 6.0, 5.2, 5.8]))
    assert clear.beats_noise and clear.speedup == pytest.approx(11.0 / 5.5)
    mixed = compare(runs([10.0, 11.0, 12.0]), runs([10.5, 11.5, 9.5]))
    assert not mixed.beats_noise
    never = compare(runs([10.0, 11.0, 12.0, 10.5, 11.5]), runs([1.0] * 5, reached=False))
    assert not never.beats_noise  # runs that never reach the target are not faster


def test_an_interrupted_preparation_is_not_taken_for_a_finished_one(data, tmp_path):
    folder = tmp_path / "prepared"
    first = prepare(folder, max_bytes=SMALL_CORPUS, vocab_size=512)
    (folder / "train.bin").unlink()  # as if killed while writing the splits
    again = prepare(folder, max_bytes=SMALL_CORPUS, vocab_size=512)
    assert again.path("train").exists() and again.tokens == first.tokens


# ------------------------------------------------------------- the log, the study, the CLI
from trainfast.speedrun import changes as log_module  # noqa: E402
from trainfast.speedrun.study import (  # noqa: E402
    RECORD_NAME,
    run_log,
    run_study,
    summarize,
    summary_table,
)


def test_the_log_applies_each_change_to_the_entry_before_it():
    chosen = log_module.preset("cpu")
    chain = [e for e in log_module.log(chosen) if e.part == "log"]
    assert chain[0].name == "baseline" and chain[0].compared_to is None
    base = chain[0].config
    assert (base.optimizer, base.precision, base.attention, base.compile) == (
        "adamw",
        "fp32",
        "manual",
        False,
    )
    assert (base.shape.norm, base.shape.positions, base.shape.mlp) == (
        "layernorm",
        "learned",
        "gelu",
    )
    assert [e.name for e in chain[1:]] == [c.name for c in log_module.LOG]
    for before, after, change in zip(chain[:-1], chain[1:], log_module.LOG, strict=True):
        assert after.compared_to == before.name
        assert after.config == change.apply(before.config)  # one change, nothing else
    final = chain[-1].config
    tried = [e for e in log_module.log(chosen) if e.part == "tried"]
    assert [e.compared_to for e in tried] == [final.name] * len(log_module.TRIED)
    ablation = log_module.ablation(chosen)
    assert len(ablation) == len(log_module.LOG)
    without_rope = next(e for e in ablation if e.name == "without RoPE")
    assert without_rope.config.shape.positions == "learned"
    assert without_rope.config.shape.mlp == final.shape.mlp  # only RoPE is taken out


def test_the_batch_changes_halve_the_entry_they_apply_to_and_never_run_on_the_gpu_preset():
    cpu = log_module.preset("cpu")
    sizes = {e.name: e.config.shape.batch_size for e in log_module.entries(cpu)}
    kept = sizes["data parallel"]  # the final entry when every change is kept
    assert sizes["WSD decay"] == cpu.shape.batch_size and kept == cpu.shape.batch_size // 2
    assert (sizes["half the batch"], sizes["double the batch"]) == (kept // 2, kept * 2)
    # with the smaller batch dropped, the tried batches are half and double the preset's
    dropped = log_module.entries(cpu, dropped={"smaller batch"})
    sizes = {e.name: e.config.shape.batch_size for e in dropped}
    assert (sizes["half the batch"], sizes["double the batch"]) == (
        cpu.shape.batch_size // 2,
        cpu.shape.batch_size * 2,
    )
    h100 = log_module.preset("h100")
    assert {
        e.config.shape.batch_size for e in log_module.entries(h100, parts=("log", "ablation"))
    } == {h100.shape.batch_size}


def test_the_gpu_preset_runs_every_change_of_the_log_with_the_tried_ones_on_top():
    # the chapter says so: every change, whether the CPU log kept it or not (its `never` aside)
    h100 = log_module.preset("h100")
    baseline, every = log_module.entries(h100)
    assert baseline.name == "baseline" and every.name.startswith("every change + ")
    config = every.config
    applied = [c for c in (*log_module.LOG, *log_module.TRIED) if c.name not in h100.never]
    for i, change in enumerate(applied):  # each setting, unless a later change sets it again
        later = {key for other in applied[i + 1 :] for key in other.settings}
        own = {k: v for k, v in change.settings.items() if k not in later}
        assert own, change.name
        for key, value in own.items():
            holder = config.shape if hasattr(config.shape, key) else config
            assert getattr(holder, key) == value, (change.name, key)
    for name in h100.never:  # and none of those it never applies
        change = next(c for c in (*log_module.LOG, *log_module.TRIED) if c.name == name)
        assert change.apply(config, name=every.name) != config, name


def test_a_change_that_is_not_kept_is_left_out_of_every_entry_after_it():
    chosen = log_module.preset("cpu")
    dropped = {"RMSNorm", "QK-norm"}
    chain = {e.name: e for e in log_module.log(chosen, dropped) if e.part == "log"}
    # each change is measured on the last kept entry, and a dropped one is skipped after it
    assert chain["RMSNorm"].compared_to == "zero-init projections"
    assert chain["ReLU²"].compared_to == "zero-init projections"
    assert chain["Muon"].compared_to == "ReLU²"
    final = chain[log_module.final_entry(chosen, dropped)].config
    assert final.shape.norm == "layernorm" and not final.shape.qk_norm
    assert final.shape.mlp == "relu2" and final.data_parallel == 2
    tried = [e for e in log_module.log(chosen, dropped) if e.part == "tried"]
    assert {e.config.shape.qk_norm for e in tried} == {False}
    ablation = log_module.ablation(chosen, dropped)
    assert {e.name for e in ablation} == {
        f"without {c.name}" for c in log_module.LOG if c.name not in dropped
    }
    assert all(e.config.shape.norm == "layernorm" for e in ablation)
    with pytest.raises(ValueError, match=r"Invalid dropped: \['Adam-X'\]"):
        log_module.log(chosen, {"Adam-X"})


def test_the_study_keeps_only_the_changes_that_beat_the_noise(monkeypatch):
    """run_log on a planted harness: a change that beats the entry it was measured on is kept,
    in time or in tokens (with a time not slower beyond the noise), one within the noise or
    slower is dropped, one that trained alike (the same final loss on every seed) is dropped
    however fast, and later entries build on the kept ones."""
    from trainfast.speedrun import study as study_module

    chosen = log_module.preset("tiny")
    gains = {"RoPE": 0.5, "untied head": 1.0, "RMSNorm": 0.7, "Muon": 1.5, "SDPA": 0.9}
    fewer_tokens = {"zero-init projections": 0.5, "QK-norm": 0.5}  # QK-norm: but slower
    gains["QK-norm"] = 1.2
    gains["WSD decay"] = 0.5  # faster (the load fell), but it trained alike
    alike = {"WSD decay"}

    def planted(config, data, target, *, seed, device=None, progress=None):
        seconds, tokens, loss = 10.0, 2560.0, 5.9
        for change in log_module.LOG:  # the product of the kept changes' factors
            if change.apply(config, name=config.name) == config:
                seconds *= gains.get(change.name, 1.0)
                tokens *= fewer_tokens.get(change.name, 1.0)
                loss -= 0.0 if change.name in alike else 0.01
        return RunResult(config.name, seed, True, seconds + 0.01 * seed, 0.1, 10, tokens, loss)

    monkeypatch.setattr(study_module, "run_to_target", planted)
    record = study_module.run_log(chosen, seeds=3, progress=None)
    kept = {"RoPE", "zero-init projections", "RMSNorm", "SDPA"}
    assert study_module.dropped_changes(record) == {c.name for c in log_module.LOG} - kept
    wsd = next(s for s in study_module.summarize(record) if s.entry == "WSD decay")
    assert wsd.verdict == "beats the noise" and wsd.trained_alike and not wsd.kept
    rows = {(r["entry"], r["seed"]): r for r in record.rows}
    assert rows[("untied head", 0)]["compared_to"] == "RoPE"
    assert rows[("zero-init projections", 0)]["compared_to"] == "RoPE"  # untied head: dropped
    assert rows[("SDPA", 0)]["train_seconds"] == pytest.approx(10 * 0.5 * 0.7 * 0.9)
    assert rows[("SDPA", 0)]["tokens"] == 2560 * 0.5  # zero-init projections kept, QK-norm not
    final = log_module.final_entry(chosen, study_module.dropped_changes(record))
    assert final == "SDPA" and rows[("without RoPE", 0)]["compared_to"] == "SDPA"
    assert {r["entry"] for r in record.rows if r["part"] == "ablation"} == {
        f"without {name}" for name in kept
    }
    assert all(r["complete"] for r in record.rows)


def test_bad_names_and_settings_name_the_value():
    with pytest.raises(ValueError, match="Unknown preset: 'gpu9'"):
        log_module.preset("gpu9")
    with pytest.raises(ValueError, match=r"Unknown entries: \['Adam-X'\]"):
        log_module.entries(log_module.preset("tiny"), ["Adam-X"])
    with pytest.raises(ValueError, match=r"unknown settings \['colour'\]"):
        log_module.Change("x", "y", {"colour": 1})
    with pytest.raises(ValueError, match="seeds: 0"):
        run_study(log_module.preset("tiny"), log_module.entries(log_module.preset("tiny")), seeds=0)
    with pytest.raises(ValueError, match="seeds: 2 \\(the log needs at least 3"):
        run_log(log_module.preset("tiny"), seeds=2, progress=None)


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    import os

    folder = tmp_path_factory.mktemp("cache")
    old = os.environ.get("TRAINFAST_CACHE")
    os.environ["TRAINFAST_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("TRAINFAST_CACHE")
    else:
        os.environ["TRAINFAST_CACHE"] = old


def test_the_command_line_runs_a_tiny_preset_and_writes_its_record(tiny_cache, tmp_path, capsys):
    from trainfast.records import load_records
    from trainfast.speedrun.__main__ import main

    argv = ["--preset", "tiny", "--entry", "baseline", "RMSNorm", "--seeds", "2"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "validation loss" in out and "training tokens/s" in out
    assert "| baseline | " in out and "| RMSNorm | " in out
    (record,) = load_records(tmp_path, RECORD_NAME)
    assert [(r["entry"], r["seed"]) for r in record.rows] == [
        ("baseline", 0),
        ("baseline", 1),
        ("RMSNorm", 0),
        ("RMSNorm", 1),
    ]
    for row in record.rows:
        assert row["complete"] and row["preset"] == "tiny" and len(row["corpus_sha256"]) == 64
        assert row["train_seconds"] > 0 and row["eval_seconds"] > 0
        assert row["load_before"] >= 0 and row["load_after"] >= 0
        assert row["steps"] * 8 * 32 == row["tokens"]
    assert main([*argv[:4], "--seeds", "1", "--compare-to", str(next(tmp_path.iterdir()))]) == 0
    assert "book's median (s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "gpu9"], "Unknown preset: 'gpu9'"),
        (["--preset", "tiny", "--entry", "nope"], "Unknown entries: ['nope']"),
        (["--seeds", "0"], "invalid value '0'"),
        (["--preset", "tiny", "--compare-to", "/no/such.json"], "no such record file"),
        (["--preset", "tiny", "--seeds", "2"], "--seeds 2: the whole log needs at least 3"),
    ],
)
def test_the_command_line_names_a_bad_value(argv, message, capsys):
    from trainfast.speedrun.__main__ import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def _record(times: dict[str, list[float]], compared: dict[str, str]):
    from trainfast.records import make_record

    rows = [
        {
            "part": "log",
            "entry": name,
            "compared_to": compared.get(name, ""),
            "seed": seed,
            "reached": t < 100,
            "train_seconds": t,
            "eval_seconds": 1.0,
            "steps": 10,
            "tokens": 100,
            "final_loss": 1.0,
            "target_loss": 1.0,
            "preset": "tiny",
            "load_before": 1.0,
            "load_after": 1.0,
            "corpus_sha256": "0" * 64,
            "complete": True,
        }
        for name, ts in times.items()
        for seed, t in enumerate(ts)
    ]
    return make_record(RECORD_NAME, "test", rows, device="cpu")


def test_the_summary_judges_each_change_against_the_one_before():
    record = _record(
        {"a": [10.0, 11.0, 12.0], "b": [5.0, 5.5, 6.0], "c": [5.2, 5.4, 6.2], "d": [9, 8, 7.0]},
        {"b": "a", "c": "b", "d": "c"},
    )
    verdicts = {s.entry: (s.verdict, s.reached) for s in summarize(record)}
    assert verdicts == {
        "a": ("–", 3),
        "b": ("beats the noise", 3),
        "c": ("within noise", 3),
        "d": ("did not pay", 3),
    }
    b = next(s for s in summarize(record) if s.entry == "b")
    assert b.median_seconds == 5.5 and b.spread_seconds == 1.0 and b.ratio == pytest.approx(2.0)
    assert "| b | 3/3 | 5.5 | 1.0 | 100 | 2.00x vs a | beats the noise |" in summary_table(record)


def test_the_ablation_is_read_backwards_against_the_final_entry():
    from trainfast.speedrun.study import Summary, read_ablation

    def summary(part, entry, verdict):
        return Summary(part, entry, "x", 3, 3, 1.0, 0.1, 100.0, 1.0, 0.05, verdict)

    reading = read_ablation(
        [
            summary("log", "warmup", "did not pay"),  # added at a loss ...
            summary("log", "rope", "beats the noise"),
            summary("log", "qk-norm", "within noise"),
            summary("ablation", "without warmup", "did not pay"),  # ... yet needed at the end
            summary("ablation", "without rope", "did not pay"),
            summary("ablation", "without qk-norm", "beats the noise"),  # faster without it
            summary("ablation", "without sdpa", "within noise"),
            summary("tried", "without nothing", "did not pay"),  # not an ablation entry
        ]
    )
    assert reading.still_pays == ("warmup", "rope")
    assert reading.turned == ("warmup",)
    assert reading.costs == ("qk-norm",)
    assert reading.within_noise == ("sdpa",)


# ------------------------------------------------------------------ the chapter's exercises
from trainfast.speedrun import exercises  # noqa: E402


@pytest.mark.parametrize(
    ("check", "wrong"),
    [
        (exercises.check_time_to_target, lambda n, r, f: n / r),  # forgets the one-off cost
        (exercises.check_next_change, lambda b, c, m: max(b, key=b.get)),  # a part, not a change
        (
            exercises.check_next_change,  # ignores the memory left
            lambda b, c, m: max(c, key=lambda n: b[c[n][0]] * (1 - 1 / c[n][1])),
        ),
        (exercises.check_bf16_pays, lambda w, t, f32, b16, bw: b16 > f32),  # peak FLOPs only
        (
            exercises.check_verdict,
            lambda b, a, alpha: "beats the noise" if a < b else "did not pay",
        ),
    ],
)
def test_each_exercise_check_fails_on_a_wrong_answer(check, wrong, capsys):
    with pytest.raises(AssertionError, match="cases failed; first: "):
        check(wrong)
    assert "FAILED: " in capsys.readouterr().out


def test_the_chapter_listings_resolve():
    import chapters

    assert chapters.listing_problems("speedrun") == []


@pytest.mark.chapter
def test_the_chapter_executes_and_renders_the_record():
    import chapters

    notebook = chapters.executed_notebook("speedrun")
    assert chapters.cell_errors(notebook) == []
    text = "".join(
        str(o.get("text", "")) + "".join(str(v) for v in o.get("data", {}).values())
        for cell in notebook.cells
        if cell.cell_type == "code"
        for o in cell.outputs
    )
    assert "| baseline |" in text and "median time to target (s)" in text
    assert "Predicted (book's model)" in text
    assert "/work/" not in text and "/home/" not in text  # no machine paths


def test_the_books_record_has_the_schema_the_chapter_reads():
    from trainfast.records import records_for

    (record,) = [r for r in records_for(RECORD_NAME, "cpu") if r.rows[0]["preset"] == "cpu"]
    assert record.columns == [
        "part", "entry", "compared_to", "seed", "reached", "train_seconds", "eval_seconds",
        "steps", "tokens", "final_loss", "target_loss", "preset", "load_before", "load_after",
        "corpus_sha256", "complete",
    ]  # fmt: skip
    assert record.rows[0]["entry"] == "baseline" and record.rows[0]["part"] == "log"
    assert {row["target_loss"] for row in record.rows} == {log_module.preset("cpu").target.loss}
    assert len({row["corpus_sha256"] for row in record.rows}) == 1
    assert "/" not in record.command.split("--out")[0]  # no machine path in the command
    known = {
        e.name for e in log_module.entries(log_module.preset("cpu"), parts=("log", "ablation"))
    }
    assert {row["entry"] for row in record.rows} <= known


def test_two_studies_of_one_preset_merge_into_one_record():
    from dataclasses import replace as copy

    from trainfast.speedrun.study import merge_records

    a = _record({"a": [10.0, 11.0, 12.0]}, {})
    b = _record({"a": [1.0, 1.0, 1.0], "b": [5.0, 5.5, 6.0]}, {"b": "a"})
    merged = merge_records(a, b)
    assert [r["entry"] for r in merged.rows] == ["a"] * 3 + ["b"] * 3  # the first's "a" wins
    assert merged.rows[0]["train_seconds"] == 10.0
    assert " & " in merged.command and merged.description.endswith("first: b.")
    assert {s.entry: s.verdict for s in summarize(merged)}["b"] == "beats the noise"
    c = _record({"b": [9.0, 9.0, 9.0], "c": [4.0, 4.0, 4.5]}, {"c": "b"})
    three = merge_records(a, b, c)  # the third process's "b" loses to the second's
    assert [r["entry"] for r in three.rows] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert three.description.endswith("each run beside another: (2) b; (3) c.")
    other = copy(b, rows=[{**r, "corpus_sha256": "1" * 64} for r in b.rows])
    with pytest.raises(ValueError, match="different corpus_sha256"):
        merge_records(a, other)


def test_the_chapter_trains_on_the_device_it_printed():
    # on the H100 the chapter printed "device: cpu" and its live study, given no device, picked
    # CUDA, where the final entry's two data-parallel processes need two GPUs
    import ast

    from chapters import read_chapter

    calls = []
    for cell in read_chapter("speedrun").cells:
        if cell.cell_type == "code":
            for node in ast.walk(ast.parse(cell.source)):
                name = getattr(getattr(node, "func", None), "id", None)
                if name in {"run_study", "run_log", "run_to_target"}:
                    calls.append((name, {k.arg for k in node.keywords}))
    assert calls, "the chapter trains nothing live"
    assert all("device" in keywords for _, keywords in calls), calls


def test_the_benchmark_keeps_the_entries_it_finished_when_stopped(
    tiny_cache, tmp_path, monkeypatch
):
    # on the H100 the speedrun benchmark was killed at its time limit after the baseline's two
    # seeds and wrote nothing: measure's --out now receives each entry as it finishes
    from trainfast import measure
    from trainfast.records import load_records
    from trainfast.speedrun import harness, study

    finished = []

    def run_then_stop(config, *args, **kwargs):
        if finished and config.name != finished[0]:
            raise KeyboardInterrupt  # the time limit, at the second entry
        finished.append(config.name)
        return run_to_target(config, *args, **kwargs)

    run_to_target = harness.run_to_target
    monkeypatch.setattr(study, "run_to_target", run_then_stop)
    with pytest.raises(KeyboardInterrupt):
        measure.main(["--out", str(tmp_path), "--only", "speedrun", "--quick", "--device", "cpu"])
    (record,) = load_records(tmp_path, RECORD_NAME)
    assert [r["entry"] for r in record.rows] == ["baseline"]
    assert not record.rows[0]["complete"]


def test_load_drift_undoes_the_verdicts_within_a_configurations_two_times():
    """Two entries of one configuration (names aside) set the drift; a later row with a verdict
    nearer the final entry than that is not decided, one just beyond it is at the edge."""
    from dataclasses import dataclass, replace

    from trainfast.speedrun.drift import load_drift
    from trainfast.speedrun.study import Summary

    @dataclass(frozen=True)
    class Config:
        name: str
        batch: int

    def row(part: str, entry: str, seconds: float, verdict: str) -> Summary:
        return Summary(part, entry, "final", 3, 3, seconds, 0.1, 1e4, 1.0, 0.1, verdict)

    summaries = {
        "final": row("log", "final", 2.00, "beats the noise"),
        "smaller batch": row("log", "smaller batch", 2.50, "beats the noise"),
        "without data parallel": row("ablation", "without data parallel", 2.75, "did not pay"),
        "near": row("tried", "near", 2.15, "did not pay"),  # 1.075 < drift 1.10
        "edge": row("tried", "edge", 2.205, "did not pay"),  # 1.1025: within 0.01 beyond
        "far": row("ablation", "far", 3.00, "did not pay"),
        "quiet": row("tried", "quiet", 2.01, "within noise"),
    }
    configs = {name: Config(name, i) for i, name in enumerate(summaries)}
    configs["without data parallel"] = replace(
        configs["smaller batch"], name="without data parallel"
    )
    drift = load_drift(summaries, configs, "final")
    assert drift.twins == [("smaller batch", "without data parallel")]
    assert drift.drift == pytest.approx(1.1)
    assert drift.undecided == {"near"}
    assert drift.at_edge == ["edge"] and drift.closest == "edge"
    assert drift.verdict(summaries["near"]) == "not decided"
    assert drift.verdict(summaries["far"]) == "did not pay"
    # without the final entry, or without twins, nothing is undone
    assert load_drift(summaries, configs, None).undecided == frozenset()
    configs["without data parallel"] = Config("without data parallel", 99)
    assert load_drift(summaries, configs, "final").undecided == frozenset()
    with pytest.raises(ValueError, match="Unknown entries: \\['final'\\]"):
        load_drift(summaries, {k: v for k, v in configs.items() if k != "final"}, "final")
    with pytest.raises(ValueError, match="edge"):
        load_drift(summaries, configs, "final", edge=-1.0)


def test_doubling_band_names_a_band_only_when_the_whole_interval_lies_in_it():
    """The record's reading: 17,920 tokens at 8 sequences, 25,600 at 16, evaluations every
    5 steps of 64-token sequences: the ratio lies in (1.14, 1.67], which decides nothing."""
    from trainfast.speedrun.batch import doubling_band

    record = doubling_band(17_920, 25_600, 8, 16, 5 * 64)
    assert (round(record.low, 2), round(record.high, 2), record.band) == (1.14, 1.67, "undecided")
    # counted often enough (one token apart), the same counts decide "near" (ratio 1.43)
    assert doubling_band(17_920, 25_600, 8, 16, 1).band == "near"
    assert doubling_band(10_000, 20_000, 8, 16, 1).band == "at or above"
    assert doubling_band(10_000, 10_500, 8, 16, 1).band == "below"
    # the smaller batch's count within one evaluation of zero: no upper bound
    assert doubling_band(100, 150, 8, 16, 20).high == float("inf")
    with pytest.raises(ValueError, match="tokens"):
        doubling_band(0, 150, 8, 16, 20)
    with pytest.raises(ValueError, match="batch"):
        doubling_band(100, 150, 0, 16, 20)


def test_the_gpu_preset_is_named_for_what_it_is_and_sized_from_the_device(monkeypatch):
    """It ran as ``h100`` on any GPU; now ``gpu`` (the old name an alias while pages use it),
    with its steps cut where the device's predicted float32 step would not fit the study's
    time: unchanged on an H100 or an H200, fewer on an A100."""
    import trainfast.gpus as gpus_module
    from trainfast.gpus import GPUS
    from trainfast.speedrun.changes import gpu_preset

    gpu = log_module.preset("gpu")
    assert gpu.name == "gpu" and log_module.preset("h100") is gpu
    assert "h100" not in log_module.PRESETS
    for name, steps in [
        ("H100 SXM 80GB", 800),
        ("H200 SXM 141GB", 800),
        ("H200 NVL 141GB", 725),  # 0.18 s a step: 0.75 x 360 s / (2 x 0.18 s) = 748, and
        ("A100 SXM 80GB", 225),  # 0.56 s: 243, each down to a multiple of eval_every (25)
    ]:
        monkeypatch.setattr(gpus_module, "gpu_for_device", lambda device, spec=GPUS[name]: spec)
        sized = gpu_preset("cuda")
        assert sized.target.max_steps == steps, name
        assert (sized.name, sized.shape, sized.target.loss) == ("gpu", gpu.shape, gpu.target.loss)
    monkeypatch.setattr(gpus_module, "gpu_for_device", lambda device: None)  # a GPU with no row
    assert gpu_preset("cuda") is gpu
