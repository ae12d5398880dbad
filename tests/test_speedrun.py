"""The speedrun's data, harness, statistics, study, GPU log and exercises (issues 38 and 50).

The data: the tokenizer round-trips the corpus, the memmaps hold the text's tokens in order,
the splits share no file, a token stream never repeats a token, random windows draw from the
whole memmap, and the evaluation windows spread over the whole split. The reference losses are
the count models' on exactly those windows. The harness: a run stops at the target (and not
before), stops at the step budget with a message when the target is out of reach, varies
initialisation and data order with the seed, resumes from a checkpoint bit for bit, and refuses
bad configurations naming the value. The statistics are tested on planted studies: a drift that
interleaving cancels and a blocked order does not, the keep rule's false-keep rate, the
bootstrap interval's coverage of a known ratio.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers", reason="the speedrun's tokenizer is a book extra (tokenizers)")
from trainfast.speedrun import (  # noqa: E402
    Checkpointing,
    RandomWindows,
    RunResult,
    SpeedrunConfig,
    Target,
    TokenStream,
    compare,
    prepare,
    run_to_target,
)
from trainfast.speedrun.data import (  # noqa: E402
    SPLITS,
    batches,
    corpus_files,
    evaluation_windows,
    split_of,
    torch_sources,
)
from trainfast.transformer import PRESET_SHAPES, Transformer  # noqa: E402

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
    return SpeedrunConfig(**{"name": "test", "shape": shape, "lr": 3e-3, "threads": 1, **changes})


# ------------------------------------------------------------------------------- the data
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
    other = TokenStream(tokens, batch=2, seq_len=10, order_seed=1)
    assert not torch.equal(other.next_batch()[0], torch.tensor([seen[:10], seen[10:20]]))
    with pytest.raises(RuntimeError, match="used up: 100 tokens"):
        stream.next_batch()
    with pytest.raises(ValueError, match="seq_len: 200"):
        TokenStream(tokens, batch=1, seq_len=200)


def test_random_windows_draw_from_the_whole_memmap_as_nanogpt_get_batch_does():
    tokens = np.arange(1_001, dtype=np.uint16)
    windows = RandomWindows(tokens, batch=4, seq_len=10, order_seed=0)
    starts = []
    for _ in range(500):
        inputs, targets = windows.next_batch()
        assert torch.equal(targets[:, :-1], inputs[:, 1:])
        assert torch.equal(targets[:, -1], inputs[:, -1] + 1)
        starts.extend(inputs[:, 0].tolist())
    # any start from 0 to len - seq_len - 1, as torch.randint(len(data) - block_size, ...)
    assert min(starts) == 0 and max(starts) == len(tokens) - 10 - 1
    assert len(set(starts)) > 800 and windows.used == 500 * 4 * 10  # overlaps allowed, counted
    state = windows.state_dict()
    ahead = windows.next_batch()[0]
    windows.load_state_dict(state)
    assert torch.equal(windows.next_batch()[0], ahead)  # the generator's state restores
    with pytest.raises(ValueError, match="Invalid batch order: 'shuffled'"):
        batches("shuffled", tokens, 4, 10)


def test_the_evaluation_windows_spread_over_the_whole_split():
    tokens = np.arange(10_001, dtype=np.uint16)
    windows = evaluation_windows(tokens, seq_len=16, eval_tokens=16 * 50)
    assert windows.shape == (50, 17)
    starts = windows[:, 0].tolist()
    assert starts[0] == 0 and starts[-1] == len(tokens) - 17  # first window to last that fits
    assert min(b - a for a, b in zip(starts, starts[1:], strict=False)) >= 16  # no shared target
    assert torch.equal(windows[:, 1:] - windows[:, :-1], torch.ones(50, 16, dtype=torch.int64))
    with pytest.raises(ValueError, match="do not fit"):
        evaluation_windows(tokens, seq_len=16, eval_tokens=16 * 700)
    with pytest.raises(ValueError, match="fewer than one window"):
        evaluation_windows(tokens, seq_len=16, eval_tokens=8)


# -------------------------------------------------------------------------- the references
def test_the_count_models_losses_are_the_formulas():
    from trainfast.speedrun.references import bigram_loss, unigram_loss

    train = np.array([0, 0, 1, 2, 0, 1])
    k, vocab = 0.5, 4
    # unigram: counts 3, 2, 1, 0 of 6 tokens
    expected = -np.mean(np.log((np.array([3, 2]) + k) / (6 + k * vocab)))
    assert unigram_loss(train, [0, 1], vocab, k) == pytest.approx(expected)
    # bigram: pairs (0,0) (0,1) (1,2) (2,0) (0,1): after 0, one 0 and two 1s of 3; 3 is never
    # a context, so every token after it has the smoothing alone, k / (k * vocab)
    expected = -np.mean(np.log([(2 + k) / (3 + k * vocab), k / (0 + k * vocab)]))
    assert bigram_loss(train, [0, 3], [1, 1], vocab, k) == pytest.approx(expected)
    # a text that is a cycle: the bigram model knows the next token, the unigram model does not
    cycle = np.tile(np.arange(3), 1_000)
    assert bigram_loss(cycle, cycle[:-1], cycle[1:], 3, 1e-3) < 1e-3
    assert unigram_loss(cycle, cycle[1:], 3, 1e-3) == pytest.approx(math.log(3), rel=1e-4)
    for call, message in (
        (lambda: unigram_loss(train, [5], 4), "vocab_size: 4"),
        (lambda: unigram_loss(train, [0], 4, k=0.0), "k"),
        (lambda: bigram_loss(train, [0, 1], [1], 4), "contexts: 2 tokens for 1"),
        (lambda: unigram_loss([], [0], 4), "train: no tokens"),
    ):
        with pytest.raises(ValueError, match=message):
            call()


def test_the_reference_losses_score_exactly_the_harness_windows(data):
    from trainfast.speedrun.references import bigram_loss, reference_losses, unigram_loss

    refs = reference_losses(data, seq_len=32, eval_tokens=2_048, split="tune")
    windows = evaluation_windows(data.tokens_of("tune"), 32, 2_048)  # the harness's windows
    train = np.asarray(data.tokens_of("train"))
    assert refs.unigram == unigram_loss(train, windows[:, 1:], data.vocab_size)
    assert refs.bigram == bigram_loss(train, windows[:, :-1], windows[:, 1:], data.vocab_size)
    assert refs.bigram < refs.unigram and refs.eval_tokens == 2_048
    assert refs.between(0.5) == pytest.approx((refs.unigram + refs.bigram) / 2)
    assert refs.fraction_of(refs.between(0.75)) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="split: 'train'"):
        reference_losses(data, 32, 2_048, split="train")


# ----------------------------------------------------------------------------- the harness
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
    assert result.tokens_per_second == result.tokens / result.train_seconds
    assert result.threads == 1 and result.split == "validation"
    assert "validation loss" in lines[-1] and "(target 5.5)" in lines[-1]


def test_near_the_target_every_step_is_evaluated(data):
    coarse = Target(loss=5.5, eval_every=10, eval_tokens=2_048, max_steps=200)
    dense = replace(coarse, dense_within=0.3)
    a = run_to_target(_config(), data, coarse, progress=None)
    b = run_to_target(_config(), data, dense, progress=None)
    assert b.reached and b.steps <= a.steps  # never later, often a few steps sooner
    steps = [s for s, _ in b.history]
    first_near = next(i for i, (_, loss) in enumerate(b.history) if loss - 5.5 <= 0.3)
    assert all(s % 10 == 0 for s in steps[: first_near + 1])  # far away: every 10 steps
    assert b.history[: first_near + 1] == a.history[: first_near + 1]  # the same run so far
    assert steps[first_near:] == list(range(steps[first_near], b.steps + 1))  # then every step


def test_the_seed_varies_both_the_initialisation_and_the_data_order(data):
    target = Target(loss=0.0, eval_every=1, eval_tokens=1_024, max_steps=1)
    first_batch = {}
    for seed in (0, 1):
        source = batches("stream", data.tokens_of("train"), 8, 32, seed)
        first_batch[seed] = source.next_batch()[0]
    assert not torch.equal(first_batch[0], first_batch[1])  # another data order
    losses = {s: run_to_target(_config(), data, target, seed=s, progress=None) for s in (0, 1)}
    assert losses[0].final_loss != losses[1].final_loss
    # the initialisation alone also differs: two seeds' models before any step
    torch.manual_seed(0)
    a = Transformer(_config().shape).token_embedding.weight
    torch.manual_seed(1)
    assert not torch.equal(a, Transformer(_config().shape).token_embedding.weight)


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


def test_the_threads_are_pytorchs_default_unless_set_and_are_restored(data):
    from trainfast.speedrun.harness import default_threads

    target = Target(loss=0.0, eval_every=2, eval_tokens=1_024, max_steps=2)
    result = run_to_target(_config(threads=None), data, target, progress=None)
    assert result.threads == default_threads() and torch.get_num_threads() == 1
    assert run_to_target(_config(threads=2), data, target, progress=None).threads == 2


def test_the_systems_settings_leave_the_arithmetic_alone(data):
    """Prefetching, one wait per evaluation and random windows change where batches come from
    and when the clock waits, not what a step computes: the same losses, bit for bit; the
    foreach optimizer adds in another order (close, not equal)."""
    target = Target(loss=0.0, eval_every=3, eval_tokens=1_024, max_steps=6)
    for optimizer in ("adamw", "muon"):
        base = _config(optimizer=optimizer, muon_ns_dtype="float32")
        plain = run_to_target(base, data, target, progress=None).history
        for changes in ({"prefetch": True}, {"sync_each_step": False}):
            assert run_to_target(replace(base, **changes), data, target, progress=None).history == (
                plain
            ), changes
        foreach = run_to_target(replace(base, foreach=True), data, target, progress=None).history
        assert [s for s, _ in foreach] == [s for s, _ in plain]
        for (_, a), (_, b) in zip(foreach, plain, strict=True):
            assert abs(a - b) < 1e-4
    random = run_to_target(_config(batch_order="random"), data, target, progress=None)
    assert random.history != plain and random.tokens == 6 * 8 * 32


def _final_state(path):
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"optimizer": "muon", "muon_ns_dtype": "float32", "prefetch": True},
        {"batch_order": "random", "foreach": True, "schedule": "wsd", "warmup_steps": 2},
    ],
)
def test_a_run_stopped_and_resumed_matches_an_uninterrupted_run_bit_for_bit(
    data, tmp_path, changes
):
    config = _config(schedule_steps=12, **changes)
    target = Target(loss=0.0, eval_every=4, eval_tokens=1_024, max_steps=12)
    whole = Checkpointing(tmp_path / "whole.pt", every=12)
    uninterrupted = run_to_target(config, data, target, seed=3, progress=None, checkpoint=whole)
    parts = Checkpointing(tmp_path / "parts.pt", every=12, stop_after=6)
    stopped = run_to_target(config, data, target, seed=3, progress=None, checkpoint=parts)
    assert stopped.stopped and stopped.steps == 6 and not stopped.reached
    resumed = run_to_target(
        config, data, target, seed=3, progress=None, checkpoint=parts, resume=parts.path
    )
    assert resumed.history == uninterrupted.history and resumed.tokens == uninterrupted.tokens
    a, b = _final_state(whole.path), _final_state(parts.path)
    assert a["steps_done"] == b["steps_done"] == 12
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for (i, sa), (j, sb) in zip(
        a["optimizer"]["state"].items(), b["optimizer"]["state"].items(), strict=True
    ):
        assert i == j and sa.keys() == sb.keys()
        for name in sa:
            assert torch.equal(torch.as_tensor(sa[name]), torch.as_tensor(sb[name])), name
    assert a["batches"] == b["batches"] or str(a["batches"]) == str(b["batches"])
    assert torch.equal(a["random"]["torch"], b["random"]["torch"])


def test_a_checkpoint_of_another_run_is_refused_naming_what_differs(data, tmp_path):
    target = Target(loss=0.0, eval_every=2, eval_tokens=1_024, max_steps=4)
    saved = Checkpointing(tmp_path / "run.pt", every=2, stop_after=2)
    run_to_target(_config(), data, target, seed=0, progress=None, checkpoint=saved)
    with pytest.raises(ValueError, match="another seed"):
        run_to_target(_config(), data, target, seed=1, progress=None, resume=saved.path)
    with pytest.raises(ValueError, match="another config"):
        run_to_target(_config(lr=1e-3), data, target, seed=0, progress=None, resume=saved.path)
    with pytest.raises(ValueError, match="no such checkpoint"):
        run_to_target(_config(), data, target, progress=None, resume=tmp_path / "none.pt")
    with pytest.raises(ValueError, match="every"):
        Checkpointing(tmp_path / "x.pt", every=0)


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
    from trainfast.speedrun.harness import make_optimizer

    config = _config(optimizer=optimizer, muon_ns_dtype="float32")
    model = Transformer(config.shape)
    before = make_optimizer(config, model).param_groups
    after = make_optimizer(replace(config, embedding_lr=0.5), model).param_groups
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
        ({"threads": 0}, "threads: 0"),
        ({"prefetch": 1}, "prefetch: 1"),
        ({"batch_order": "shuffled"}, "batch_order: 'shuffled'"),
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
    with pytest.raises(ValueError, match="dense_within: -1"):
        Target(loss=1.0, dense_within=-1)


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


def test_the_cpu_is_named_with_its_bf16_flags():
    from trainfast.speedrun.machine import describe_cpu, parse_cpuinfo

    amd = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f\n"
    intel = amd.replace("AMD EPYC", "Intel(R) Xeon(R) Processor").replace(
        "avx512f", "avx512f avx512_bf16 amx_tile amx_bf16"
    )
    assert parse_cpuinfo(amd) == ("AMD EPYC", ())
    assert parse_cpuinfo(intel) == ("Intel(R) Xeon(R) Processor", ("avx512_bf16", "amx_bf16"))
    described = describe_cpu(intel)
    assert described.has_bf16 and "amx_bf16" in described.text()
    assert not describe_cpu(amd).has_bf16 and "no bf16 instructions" in describe_cpu(amd).text()
    assert describe_cpu("/no/such/cpuinfo").model == "unknown"


# ---------------------------------------------------------------------- the statistics
from trainfast.speedrun.gains import gain, median_throughput  # noqa: E402
from trainfast.speedrun.headline import (  # noqa: E402
    Headline,
    bootstrap_ratio_interval,
    headline,
    ratio_of_medians,
    supported_decimals,
)
from trainfast.speedrun.protocol import KeepRule, blocked, interleaved  # noqa: E402


def test_interleaved_runs_the_compared_entries_round_by_round():
    assert interleaved(["A", "B"], 3) == [
        ("A", 0),
        ("B", 0),
        ("A", 1),
        ("B", 1),
        ("A", 2),
        ("B", 2),
    ]
    assert blocked(["A", "B"], 2) == [("A", 0), ("A", 1), ("B", 0), ("B", 1)]
    with pytest.raises(ValueError, match="distinct"):
        interleaved(["A", "A"], 2)
    with pytest.raises(ValueError, match="seeds"):
        interleaved(["A"], 0)


def _planted_times(order, seconds, drift, noise, rng):
    """Each run's time in ``order``: the entry's true time, slowed by a load that rises by
    ``drift`` per run, with multiplicative noise."""
    times: dict[str, list[float]] = {}
    for i, (name, _) in enumerate(order):
        load = 1 + drift * i
        times.setdefault(name, []).append(seconds[name] * load * math.exp(rng.normal(0, noise)))
    return times


def test_a_planted_drift_keeps_a_change_that_does_nothing_unless_the_runs_are_interleaved():
    """A and B are the same configuration; the machine's load rises through the study. Run all
    of A then all of B, and B looks slower than A on every seed, and A looks faster than B:
    the keep rule keeps "A instead of B" nearly always. Interleaved, the drift hits both alike
    and the false keeps fall to about the rule's level."""
    rng = np.random.default_rng(0)
    rule = KeepRule(alpha=0.05)
    seconds = {"B": 10.0, "A": 10.0}
    keeps = {"blocked": 0, "interleaved": 0}
    studies = 400
    for _ in range(studies):
        for kind, order in (("blocked", blocked), ("interleaved", interleaved)):
            times = _planted_times(order(["A", "B"], 5), seconds, 0.02, 0.02, rng)
            # is A (measured first) a faster change than B?
            keeps[kind] += rule.decide(times["B"], times["A"]).kept
    assert keeps["blocked"] / studies > 0.9
    assert keeps["interleaved"] / studies < 0.1


def test_the_keep_rule_decides_on_time_at_its_level_and_reports_tokens():
    rule = KeepRule(alpha=0.05)
    rng = np.random.default_rng(1)
    null = faster = 0
    studies = 2_000
    for _ in range(studies):
        before = list(10 * np.exp(rng.normal(0, 0.05, 5)))
        same = list(10 * np.exp(rng.normal(0, 0.05, 5)))
        better = list(9 * np.exp(rng.normal(0, 0.05, 5)))  # 10 % faster, 5 % noise
        null += rule.decide(before, same).kept
        faster += rule.decide(before, better).kept
    assert null / studies <= 0.06  # at most alpha (exact test: a little below)
    assert faster / studies >= 0.8
    # fewer tokens do not keep a slower change; more tokens do not drop a faster one
    slow = rule.decide([10, 11, 12, 10.5, 11.5], [13, 14, 15, 13.5, 14.5], [9] * 5, [5] * 5)
    assert not slow.kept and slow.token_ratio == pytest.approx(1.8)
    quick = rule.decide([10, 11, 12, 10.5, 11.5], [5, 6, 5.5, 5.2, 5.8], [5] * 5, [9] * 5)
    assert quick.kept and quick.p_value == pytest.approx(1 / 252)
    # a run that never reached the target counts as infinitely slow
    assert rule.decide([10, 11, 12, 13, math.inf], [5, 6, 7, 8, 9]).kept
    with pytest.raises(ValueError, match="at least 5 per side"):
        rule.decide([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="alpha"):
        KeepRule(alpha=0.0)
    with pytest.raises(ValueError, match="metric: 'tokens'"):
        KeepRule(metric="tokens")  # type: ignore[arg-type]


def test_the_one_sided_rank_sum_test_is_exact():
    from trainfast.timing import rank_sum_one_sided, rank_sum_test

    assert rank_sum_one_sided([10, 11, 12, 13, 14], [1, 2, 3, 4, 5]) == (1.0, 1 / 252)
    assert rank_sum_one_sided([1, 2, 3], [10, 11, 12]) == (0.0, 1.0)
    share, p = rank_sum_one_sided([10, 11, 12], [1, 2, 3])
    assert (share, p) == (1.0, 0.05) and rank_sum_test([10, 11, 12], [1, 2, 3])[1] == 0.1
    # one U away from complete separation: 2 of the 252 splittings at least as lopsided
    assert rank_sum_one_sided([10, 11, 12, 13, 4.5], [1, 2, 3, 4, 5])[1] == pytest.approx(2 / 252)


def test_the_bootstrap_interval_covers_a_known_ratio_at_about_its_level():
    """Planted studies: baseline times 10 s and final 2 s (a ratio of 5), each with 10 %
    multiplicative noise, 5 seeds each. The 95 % interval covers 5 in about 95 % of studies
    (a little more: the median of 5 resampled values is coarse); with 3 seeds it covers less."""
    rng = np.random.default_rng(2)
    coverage = {}
    for seeds in (3, 5):
        hits, studies = 0, 300
        for study in range(studies):
            before = 10 * np.exp(rng.normal(0, 0.1, seeds))
            after = 2 * np.exp(rng.normal(0, 0.1, seeds))
            low, high = bootstrap_ratio_interval(before, after, resamples=2_000, seed=study)
            hits += low <= 5 <= high
        coverage[seeds] = hits / studies
    assert 0.92 <= coverage[5] <= 0.995, coverage
    assert coverage[3] < coverage[5], coverage


def test_the_headline_is_rounded_to_what_its_interval_supports():
    assert supported_decimals(4.8, 8.0) == 0  # half-width 1.6: "6x"
    assert supported_decimals(5.5, 6.0) == 1  # half-width 0.25: "5.7x"
    assert supported_decimals(5.70, 5.78) == 2  # 0.04: "5.74x"
    assert supported_decimals(3.0, math.inf) == 0
    assert Headline(5.736, 4.8, 8.0, 0.95, 0).text() == "6x (95 % interval 5-8x)"
    assert Headline(5.736, 5.5, 6.0, 0.95, 1).text() == "5.7x (95 % interval 5.5-6.0x)"
    # the record's baseline and final seeds (2026-11-26): "5.74" was more than they support
    first = headline([12.2, 18.87, 14.04], [2.54, 2.35, 2.45])
    assert first.ratio == pytest.approx(14.04 / 2.45) and first.decimals == 0
    assert ratio_of_medians([10, 12, 11], [2, 3, 2.5]) == pytest.approx(11 / 2.5)
    tight = headline([10.0, 10.01, 10.02, 9.99, 10.0], [2.0, 2.001, 2.0, 1.999, 2.0])
    assert tight.decimals >= 2 and tight.low <= tight.ratio <= tight.high
    with pytest.raises(ValueError, match="before"):
        ratio_of_medians([], [1.0])
    with pytest.raises(ValueError, match="after"):
        ratio_of_medians([1.0], [-1.0])


def test_the_gain_splits_into_tokens_and_tokens_per_second_exactly():
    # a learning change: half the tokens at the same rate; a systems change: same tokens, faster
    learning = gain([10, 11, 12], [1000, 1100, 1200], [5, 5.5, 6], [500, 550, 600])
    assert learning.time_ratio == pytest.approx(2) and learning.token_ratio == pytest.approx(2)
    assert learning.throughput_ratio == pytest.approx(1) and learning.learning_share == 1
    systems = gain([10, 11, 12], [1000] * 3, [8, 8.8, 9.6], [1000] * 3)
    assert systems.token_ratio == 1 and systems.throughput_ratio == pytest.approx(1.25)
    both = gain([12.0, 14.0, 13.0], [900, 1100, 1000], [4.0, 3.0, 3.5], [400, 600, 500])
    assert both.time_ratio == pytest.approx(both.token_ratio * both.throughput_ratio)
    assert median_throughput([2.0, 4.0, 5.0], [100, 100, 500]) == 50
    with pytest.raises(ValueError, match="no runs"):
        gain([], [], [1.0], [1.0])


# ------------------------------------------------------------- the log, the study, the CLI
from trainfast.speedrun import changes as log_module  # noqa: E402
from trainfast.speedrun.study import (  # noqa: E402
    RECORD_NAME,
    blocks,
    check_comparable,
    dropped_changes,
    headline_of,
    run_log,
    run_study,
    summary_table,
)


def test_the_log_applies_each_change_to_the_entry_before_it():
    chosen = log_module.preset("cpu")
    chain = log_module.log(chosen)
    assert chain[0].name == "baseline" and chain[0].compared_to is None
    base = chain[0].config
    assert (base.optimizer, base.precision, base.attention, base.compile) == (
        "adamw",
        "fp32",
        "manual",
        False,
    )
    assert base.threads is None  # PyTorch's default, so a second core is not a free gain
    assert (base.shape.norm, base.shape.positions, base.shape.mlp) == (
        "layernorm",
        "learned",
        "gelu",
    )
    assert [e.name for e in chain[1:]] == [c.name for c in log_module.LOG]
    for before, after, change in zip(chain[:-1], chain[1:], log_module.LOG, strict=True):
        assert after.compared_to == before.name and after.kind == change.kind
        assert after.config == change.apply(before.config)  # one change, nothing else
    kinds = [e.kind for e in chain[1:]]
    assert kinds == sorted(kinds)  # the learning changes first, then the systems ones
    final = chain[-1].config
    assert final.data_parallel == 2 and final.threads == 1 and final.compile
    ablation = log_module.ablation(chosen)
    assert [e.name for e in ablation] == [f"without {c.name}" for c in log_module.LEARNING]
    without_rope = next(e for e in ablation if e.name == "without RoPE")
    assert without_rope.config.shape.positions == "learned"
    assert without_rope.config.shape.mlp == final.shape.mlp  # only RoPE is taken out
    assert without_rope.compared_to == "data parallel"


def test_the_smaller_batch_halves_the_batch_and_keeps_the_wsd_horizon_in_tokens():
    chosen = log_module.preset("cpu")
    by_name = {e.name: e.config for e in log_module.log(chosen)}
    wsd, smaller = by_name["WSD decay"], by_name["smaller batch"]
    assert smaller.shape.batch_size * 2 == wsd.shape.batch_size == chosen.shape.batch_size
    assert smaller.schedule_steps == 2 * wsd.schedule_steps == 2 * chosen.horizon


def test_a_change_that_is_not_kept_is_left_out_of_every_entry_after_it():
    chosen = log_module.preset("cpu")
    dropped = {"RMSNorm", "QK-norm", "Muon"}
    chain = {e.name: e for e in log_module.log(chosen, dropped)}
    # each change is measured on the last kept entry, and a dropped one is skipped after it
    assert chain["RMSNorm"].compared_to == "zero-init projections"
    assert chain["ReLU²"].compared_to == "zero-init projections"
    assert chain["Muon"].compared_to == "ReLU²"
    assert "Newton-Schulz in bf16" not in chain  # without Muon it would change nothing
    final = chain[log_module.final_entry(chosen, dropped)].config
    assert final.shape.norm == "layernorm" and not final.shape.qk_norm
    assert final.shape.mlp == "relu2" and final.data_parallel == 2
    ablation = log_module.ablation(chosen, dropped)
    assert {e.name for e in ablation} == {
        f"without {c.name}" for c in log_module.LEARNING if c.name not in dropped
    }
    assert all(e.config.shape.norm == "layernorm" for e in ablation)
    skipped = {e.name for e in log_module.log(chosen, skip=log_module.NEEDS_BF16)}
    assert not skipped & set(log_module.NEEDS_BF16)
    with pytest.raises(ValueError, match=r"Invalid dropped: \['Adam-X'\]"):
        log_module.log(chosen, {"Adam-X"})


#: planted factors on the time and the tokens to the target of each change (1: none)
_TIME = {"RoPE": 0.8, "untied head": 1.1, "Muon": 0.7, "SDPA": 1.05, "torch.compile": 0.8}
_TOKENS = {"RoPE": 0.8, "Muon": 0.5, "untied head": 1.0}


def _planted(calls, times=None, token_factors=None):
    times = _TIME if times is None else times
    token_factors = _TOKENS if token_factors is None else token_factors

    def run(config, data, target, *, seed, device=None, progress=None, split="validation"):
        calls.append((config.name, seed, split))
        seconds, tokens = 10.0, 10_000.0
        for change in log_module.LOG:  # the product of the factors of the changes it holds
            if change.apply(config, name=config.name) == config:
                seconds *= times.get(change.name, 1.0)
                tokens *= token_factors.get(change.name, 1.0)
        seconds *= 1 + 0.01 * ((seed * 7) % 5)  # a little noise, the same for every entry
        result = RunResult(config.name, seed, True, seconds, 0.1, 10, int(tokens), 5.0)
        result.split, result.threads = split, 1
        return result

    return run


def test_the_study_decides_on_tune_then_measures_the_headline_afresh_on_validation(monkeypatch):
    from trainfast.speedrun import study as study_module

    calls = []
    monkeypatch.setattr(study_module, "run_to_target", _planted(calls))
    chosen = log_module.preset("tiny")
    record = run_log(chosen, progress=None, skip=())
    # its untimed warm-up, then seed 0 of its own block and of the next (data parallel on it)
    assert calls.count(("torch.compile", 0, "tune")) == 3
    kept = {"RoPE", "Muon", "torch.compile"}
    changes = {c.name for c in log_module.LOG}
    assert dropped_changes(record) == changes - kept  # each measured, the others not kept
    # every block is interleaved: seed s of each entry before seed s + 1 of either
    for block in {r["block"] for r in record.rows}:
        rows = [r for r in record.rows if r["block"] == block]
        assert [r["seed"] for r in rows] == sorted(r["seed"] for r in rows)
    log_rows = [r for r in record.rows if r["part"] == "log"]
    assert {r["split"] for r in log_rows} == {"tune"}
    last = [r for r in record.rows if r["part"] in ("validation", "ablation")]
    assert {r["split"] for r in last} == {"validation"} and len({r["block"] for r in last}) == 1
    final = log_module.final_entry(chosen, dropped_changes(record))
    assert final == "torch.compile"  # the last kept change; data parallel gained nothing
    names = list(dict.fromkeys(r["entry"] for r in last))
    assert names == ["baseline", final, "without RoPE", "without Muon"]
    # the headline comes from the validation block alone
    hl = headline_of(record)
    assert hl.ratio == pytest.approx(1 / (0.8 * 0.7 * 0.8))
    # each change's gain splits into its tokens and its tokens/s
    readings = {b.after.entry: b for b in blocks(record) if b.after.part == "log"}
    muon = readings["Muon"]
    assert muon.verdict == "kept" and muon.gain.token_ratio == pytest.approx(2.0)
    assert muon.gain.throughput_ratio == pytest.approx((1 / 0.7) / 2.0)  # its steps cost more
    compiled = readings["torch.compile"].gain
    assert compiled.token_ratio == 1 and compiled.throughput_ratio == pytest.approx(1.25)
    assert readings["untied head"].verdict == "not kept"
    ablations = {b.after.entry: b.verdict for b in blocks(record) if b.after.part == "ablation"}
    assert ablations == {"without RoPE": "slower without it", "without Muon": "slower without it"}
    row = record.rows[0]
    assert row["unigram_loss"] > row["bigram_loss"] > 0 and row["tokens_per_second"] > 0
    assert "A change is kept when" in record.description and "tune split" in record.description
    assert all(r["complete"] for r in record.rows)
    assert "| Muon | tune | 5/5 |" in summary_table(record)


def test_the_study_refuses_too_few_seeds_and_a_target_a_unigram_model_reaches(monkeypatch):
    from trainfast.speedrun import study as study_module

    monkeypatch.setattr(study_module, "run_to_target", _planted([]))
    chosen = log_module.preset("tiny")
    with pytest.raises(ValueError, match="seeds: 3 \\(the keep rule needs at least 5"):
        run_log(chosen, seeds=3, progress=None)
    # a target above the unigram loss: no model has to learn anything to reach it
    easy = replace(chosen, min_fraction=0.5, target=replace(chosen.target, loss=7.0))
    with pytest.raises(ValueError, match="Invalid target: 7.0 .* less than the preset's 0.5"):
        run_log(easy, progress=None)


def test_records_compare_only_on_the_same_corpus_and_target(monkeypatch):
    from trainfast.speedrun import study as study_module

    monkeypatch.setattr(study_module, "run_to_target", _planted([]))
    tiny = log_module.preset("tiny")
    record = run_study(tiny, log_module.entries(tiny, ["baseline", "RoPE"]), seeds=2)
    check_comparable(record, record)
    for key, value in (("corpus_sha256", "0" * 64), ("target_loss", 9.9), ("preset", "cpu")):
        other = replace(record, rows=[{**r, key: value} for r in record.rows])
        with pytest.raises(ValueError, match=f"its {key} is"):
            check_comparable(record, other)
        with pytest.raises(ValueError, match=f"its {key} is"):
            summary_table(record, other)


def test_the_summary_table_shows_the_columns_asked_for(monkeypatch):
    from trainfast.speedrun import study as study_module

    monkeypatch.setattr(study_module, "run_to_target", _planted([]))
    tiny = log_module.preset("tiny")
    record = run_study(tiny, log_module.entries(tiny, ["baseline", "RoPE"]), seeds=2)
    every = summary_table(record).splitlines()
    assert every[0].startswith("| block | entry | split | reached |")
    some = summary_table(record, columns=["entry", "time ratio", "verdict"]).splitlines()
    assert some[0] == "| entry | time ratio | verdict |" and some[1] == "|---|---|---|"
    for full, short in zip(every[2:], some[2:], strict=True):  # the same cells, those asked for
        cells = [c.strip() for c in full.strip("|").split("|")]
        assert short == f"| {cells[1]} | {cells[8]} | {cells[11]} |"
    with pytest.raises(ValueError, match="no column 'colour'"):
        summary_table(record, columns=["entry", "colour"])


def test_bad_names_and_settings_name_the_value():
    with pytest.raises(ValueError, match="Unknown preset: 'gpu9'"):
        log_module.preset("gpu9")
    with pytest.raises(ValueError, match=r"Unknown entries: \['Adam-X'\]"):
        log_module.entries(log_module.preset("tiny"), ["Adam-X"])
    with pytest.raises(ValueError, match=r"unknown settings \['colour'\]"):
        log_module.Change("x", "y", {"colour": 1})
    with pytest.raises(ValueError, match="seeds: 0"):
        run_study(log_module.preset("tiny"), log_module.entries(log_module.preset("tiny")), seeds=0)


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
    assert "| baseline | validation |" in out and "| RMSNorm | validation |" in out
    (record,) = load_records(tmp_path, RECORD_NAME)
    assert [(r["entry"], r["seed"]) for r in record.rows] == [
        ("baseline", 0),
        ("RMSNorm", 0),
        ("baseline", 1),
        ("RMSNorm", 1),
    ]  # interleaved
    for row in record.rows:
        assert row["complete"] and row["preset"] == "tiny" and len(row["corpus_sha256"]) == 64
        assert row["train_seconds"] > 0 and row["eval_seconds"] > 0 and row["split"] == "validation"
        assert row["load_before"] >= 0 and row["load_after"] >= 0
        assert row["steps"] * 8 * 32 == row["tokens"]
        assert row["cpu"]  # the CPU named, with its bf16 flags
    assert main([*argv[:4], "--seeds", "1", "--compare-to", str(next(tmp_path.iterdir()))]) == 0
    assert "book's median (s)" in capsys.readouterr().out


def test_ablation_alone_runs_the_final_entry_every_row_is_compared_with(tiny_cache, monkeypatch):
    """The chapter says to add --ablation: that runs the baseline, the final entry and every
    "without" row, so no ablation row lacks the entry it is compared with."""
    from trainfast.speedrun import __main__ as cli

    planned = {}

    def capture(chosen, entries, **kwargs):
        planned["entries"] = entries
        raise SystemExit(0)

    monkeypatch.setattr(cli, "run_study", capture)
    with pytest.raises(SystemExit):
        cli.main(["--preset", "tiny", "--ablation", "--quiet"])
    names = [e.name for e in planned["entries"]]
    final = log_module.final_entry(log_module.preset("tiny"))
    assert names[:2] == ["baseline", final]
    ablation = [e for e in planned["entries"] if e.part == "ablation"]
    assert ablation and {e.compared_to for e in ablation} == {final}


def test_compare_to_refuses_another_corpus_before_running(tiny_cache, tmp_path, capsys):
    from trainfast.records import make_record, write_record
    from trainfast.speedrun.__main__ import main

    rows = [
        {"part": "validation", "block": 0, "entry": "baseline", "compared_to": "", "seed": 0,
         "split": "validation", "preset": "tiny", "corpus_sha256": "0" * 64, "target_loss": 6.0}
    ]  # fmt: skip
    path = write_record(make_record(RECORD_NAME, "other text", rows, device="cpu"), tmp_path)
    with pytest.raises(SystemExit):
        main(["--preset", "tiny", "--entry", "baseline", "--compare-to", str(path)])
    assert "its corpus_sha256 is" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "gpu9"], "Unknown preset: 'gpu9'"),
        (["--preset", "tiny", "--entry", "nope"], "Unknown entries: ['nope']"),
        (["--seeds", "0"], "invalid value '0'"),
        (["--preset", "tiny", "--compare-to", "/no/such.json"], "no such record file"),
        (["--preset", "tiny", "--seeds", "2"], "seeds: 2 (the keep rule needs at least 5"),
    ],
)
def test_the_command_line_names_a_bad_value(tiny_cache, argv, message, capsys):
    from trainfast.speedrun.__main__ import main

    with pytest.raises(SystemExit):
        main([*argv, "--quiet"])
    assert message in capsys.readouterr().err


def test_two_studies_of_one_preset_merge_with_their_blocks_apart(monkeypatch):
    from trainfast.speedrun import study as study_module
    from trainfast.speedrun.study import merge_records

    monkeypatch.setattr(study_module, "run_to_target", _planted([]))
    tiny = log_module.preset("tiny")
    a = run_study(tiny, log_module.entries(tiny, ["baseline", "RoPE"]), seeds=2)
    b = run_study(tiny, log_module.entries(tiny, ["baseline", "RoPE"]), seeds=2)
    merged = merge_records(a, b)
    assert [r["block"] for r in merged.rows] == [0] * 4 + [1] * 4
    assert " & " in merged.command
    other = replace(b, rows=[{**r, "corpus_sha256": "1" * 64} for r in b.rows])
    with pytest.raises(ValueError, match="its corpus_sha256 is"):
        merge_records(a, other)


def test_the_benchmark_keeps_the_runs_it_finished_when_stopped(tiny_cache, tmp_path, monkeypatch):
    # on the H100 the speedrun benchmark was killed at its time limit after the baseline's two
    # seeds and wrote nothing: measure's --out now receives each run as it finishes
    from trainfast import measure
    from trainfast.records import load_records
    from trainfast.speedrun import harness, study

    finished = []

    def run_then_stop(config, *args, **kwargs):
        if finished:
            raise KeyboardInterrupt  # the time limit, at the second run
        finished.append(config.name)
        return run_to_target(config, *args, **kwargs)

    run_to_target = harness.run_to_target
    monkeypatch.setattr(study, "run_to_target", run_then_stop)
    with pytest.raises(KeyboardInterrupt):
        measure.main(["--out", str(tmp_path), "--only", "speedrun", "--quick", "--device", "cpu"])
    (record,) = load_records(tmp_path, RECORD_NAME)
    assert [r["entry"] for r in record.rows] == ["baseline"]
    assert not record.rows[0]["complete"]


# ---------------------------------------------------------------------------- the GPU log
from trainfast.speedrun import gpu as gpu_log  # noqa: E402


def test_newton_schulz_costs_28_percent_of_a_gpt2_small_step_and_matches_what_it_runs():
    from torch.utils.flop_counter import FlopCounterMode
    from trainfast.accounting.flops import training_flops
    from trainfast.optim.muon import zeropower_via_newtonschulz5
    from trainfast.transformer import TransformerShape

    gpt2 = TransformerShape.gpt_like(
        d_model=768, n_layers=12, n_heads=12, seq_len=1_024, vocab_size=8_192, batch_size=8
    )
    ratio = gpu_log.newton_schulz_flops(gpt2) / training_flops(gpt2)
    assert 0.27 < ratio < 0.29  # the review's 1.52 of 5.41 TFLOP
    # the count is what the iteration multiplies: one layer of a small model, counted
    small = TransformerShape.gpt_like(
        d_model=16, n_layers=1, n_heads=2, seq_len=8, vocab_size=32, batch_size=1
    )
    model = Transformer(small)
    hidden = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)][:-1]
    with FlopCounterMode(display=False) as counter:
        for weight in hidden:
            zeropower_via_newtonschulz5(weight.detach(), steps=5)
    assert counter.get_total_flops() == gpu_log.newton_schulz_flops(small)


def test_the_gpu_preset_is_sized_from_the_device_to_fit_its_slot():
    from trainfast.gpus import GPUS

    h200 = gpu_log.gpu_preset("H200 SXM 141GB")
    a100 = gpu_log.gpu_preset(GPUS["A100 SXM 80GB"])
    assert h200.shape.d_model > a100.shape.d_model  # the faster GPU gets the larger model
    for chosen, spec in ((h200, "H200 SXM 141GB"), (a100, "A100 SXM 80GB")):
        planned = gpu_log.planned_seconds(chosen, spec)
        assert 0.9 * gpu_log.GPU_SLOT_SECONDS < planned <= gpu_log.GPU_SLOT_SECONDS
        assert chosen.seeds == 3 and chosen.target.loss == gpu_log.GPU_TARGET
        assert chosen.min_fraction == 1.0  # the target at or below the bigram loss
    with pytest.raises(ValueError, match="slot: 1"):
        gpu_log.gpu_preset("H200 SXM 141GB", slot=1)


def test_the_gpu_log_has_every_systems_change_alone_and_all_together():
    chosen = gpu_log.gpu_preset("H100 SXM 80GB")
    rows = gpu_log.gpu_rows(chosen)
    names = [e.name for e in rows]
    assert names == [
        "baseline",
        "learning changes",
        "bf16 autocast",
        "SDPA",
        "foreach optimizer",
        "torch.compile",
        "Muon",
        "all together",
    ]
    learned = rows[1].config
    assert learned.shape.positions == "rope" and learned.embedding_lr is not None
    assert learned.optimizer == "adamw" and learned.shape.batch_size == chosen.shape.batch_size
    for entry in rows[2:-1]:  # one change each, on the learning entry
        assert entry.compared_to == "learning changes"
        differs = {k for k in vars(learned) if getattr(entry.config, k) != getattr(learned, k)} - {
            "name"
        }
        assert len(differs) <= 3, (entry.name, differs)  # Muon sets three fields
    together = rows[-1].config
    assert (together.precision, together.attention, together.optimizer) == ("bf16", "sdpa", "muon")
    assert together.compile and together.foreach and together.muon_ns_dtype == "bfloat16"


def test_each_gpu_row_carries_the_books_labelled_prediction():
    chosen = gpu_log.gpu_preset("H100 SXM 80GB")
    rows = {e.name: e.config for e in gpu_log.gpu_rows(chosen)}
    base = gpu_log.predict(rows["baseline"], "H100 SXM 80GB")
    bf16 = gpu_log.predict(rows["bf16 autocast"], "H100 SXM 80GB")
    muon = gpu_log.predict(rows["Muon"], "H100 SXM 80GB")
    calibrated = gpu_log.predict(rows["bf16 autocast"], "H100 SXM 80GB", bf16_calibration=0.4)
    assert base.label == "step-time model, fp32" and bf16.tokens_per_second > base.tokens_per_second
    assert muon.step_seconds > base.step_seconds and "Newton-Schulz in bf16" in muon.label
    assert calibrated.tokens_per_second == pytest.approx(0.4 * bf16.tokens_per_second)
    assert "0.40" in calibrated.label
    # the fp32 rows the model cannot tell apart are predicted alike: SDPA, foreach and compile
    # change no FLOP count, which is what the measured rows can show the model leaves out
    assert gpu_log.predict(rows["SDPA"], "H100 SXM 80GB") == base


def test_the_gpu_log_passes_a_dry_run_on_the_cpu_at_a_tiny_size(tiny_cache, tmp_path):
    from trainfast.records import load_records

    tiny = log_module.preset("tiny")
    chosen = gpu_log.dry_run_preset(tiny.shape, tiny.corpus_bytes, tiny.vocab_size)
    record = gpu_log.run_gpu_log(
        device=torch.device("cpu"), chosen=chosen, out=tmp_path, progress=None,
        spec="H200 SXM 141GB", compile=False,  # a first compile on this CPU takes minutes
    )  # fmt: skip
    (written,) = load_records(tmp_path, RECORD_NAME)
    assert written.rows == record.rows
    names = list(dict.fromkeys(r["entry"] for r in record.rows))
    assert names == [e.name for e in gpu_log.gpu_rows(chosen)]
    for row in record.rows:
        assert row["complete"] and row["steps"] == 2 and row["split"] == "validation"
        assert row["predicted_tokens_per_second"] > 0 and row["prediction"].startswith("step-time")
    assert "H200 SXM 141GB" in record.description and "uncompiled" in record.description


# ------------------------------------------------------------------ the chapter's exercises
from trainfast.speedrun import exercises  # noqa: E402


def _next_change_by(saving, fits=lambda need, left: need <= left):
    def next_change(breakdown, candidates, memory_left):
        fitting = {n: c for n, c in candidates.items() if fits(c[2], memory_left)}
        return max(fitting, key=lambda n: saving(breakdown[fitting[n][0]], fitting[n][1]))

    return next_change


def _bf16_model(value_bytes=2, cast_bytes=6, activations=2, combine=max):
    """The exercise's roofline with one of its parts changed (the defaults are right)."""

    def bf16_pays(width, tokens, fp32_flops, bf16_flops, bandwidth):
        flops = 2 * tokens * width * width
        values = activations * tokens * width + width * width
        fp32 = combine(flops / fp32_flops, 4 * values / bandwidth)
        bf16 = combine(flops / bf16_flops, value_bytes * values / bandwidth)
        return bf16 + cast_bytes * width * width / bandwidth < fp32

    return bf16_pays


@pytest.mark.parametrize(
    ("check", "wrong"),
    [
        (exercises.check_time_to_target, lambda n, r, f: n / r),  # forgets the one-off cost
        (exercises.check_next_change, lambda b, c, m: max(b, key=b.get)),  # a part, not a change
        (
            exercises.check_next_change,  # ignores the memory left
            lambda b, c, m: max(c, key=lambda n: b[c[n][0]] * (1 - 1 / c[n][1])),
        ),
        (exercises.check_next_change, _next_change_by(lambda t, s: t * s)),  # not Amdahl
        (exercises.check_next_change, _next_change_by(lambda t, s: t * (s - 1))),  # not Amdahl
        (  # a change needing exactly the memory left does fit
            exercises.check_next_change,
            _next_change_by(lambda t, s: t * (1 - 1 / s), lambda need, left: need < left),
        ),
        (exercises.check_bf16_pays, lambda w, t, f32, b16, bw: b16 > f32),  # peak FLOPs only
        (exercises.check_bf16_pays, _bf16_model(value_bytes=4)),  # bf16 moves fp32's 4 bytes
        (exercises.check_bf16_pays, _bf16_model(cast_bytes=4)),  # the cast as 4 bytes a weight
        (exercises.check_bf16_pays, _bf16_model(cast_bytes=12)),  # ... or as 12
        (exercises.check_bf16_pays, _bf16_model(activations=1)),  # activations counted once
        (exercises.check_bf16_pays, _bf16_model(combine=lambda a, b: a + b)),  # times summed
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


def test_each_exercise_check_passes_the_right_answer(capsys):
    exercises.check_next_change(_next_change_by(lambda t, s: t * (1 - 1 / s)))
    exercises.check_bf16_pays(_bf16_model())
    assert "FAILED" not in capsys.readouterr().out


# ------------------------------------------------------------ reading a record, the profile
def _study_record(monkeypatch, times=None, tokens=None):
    """A planted study of the ``tiny`` preset, through the real ``run_log``."""
    from trainfast.speedrun import study as study_module

    monkeypatch.setattr(study_module, "run_to_target", _planted([], times, tokens))
    return run_log(log_module.preset("tiny"), progress=None, skip=())


def test_the_chapter_finds_this_editions_record_and_says_how_to_make_one(monkeypatch, tmp_path):
    from trainfast.records import records_for, write_record
    from trainfast.speedrun.reading import RECORDS_VARIABLE, find_study_record, study_record

    with pytest.raises(ValueError, match="make measure ONLY=speedrun"):
        study_record(tmp_path)
    assert find_study_record(tmp_path) is None  # a page then says what will be measured
    first_edition = [r for r in records_for(RECORD_NAME, "cpu") if "block" not in r.columns]
    for record in first_edition:  # a first edition's record is not this edition's
        write_record(record, tmp_path)
    with pytest.raises(ValueError, match=RECORDS_VARIABLE):
        study_record(tmp_path)
    record = _study_record(monkeypatch)
    other = tmp_path / "other"
    write_record(record, other)
    assert study_record(other).rows == record.rows == find_study_record(other).rows
    monkeypatch.setenv(RECORDS_VARIABLE, str(other))
    assert study_record().rows == record.rows  # the variable points the chapter elsewhere


def test_the_waterfall_multiplies_the_kept_changes_factors_from_the_baseline(monkeypatch):
    from trainfast.speedrun.reading import log_readings, waterfall

    record = _study_record(monkeypatch)
    readings = log_readings(record)
    steps = waterfall(record)
    kept = [b for b in readings if b.decision.kept]
    assert [s.name for s in steps] == [b.after.entry for b in kept] == [
        "RoPE", "Muon", "torch.compile"
    ]  # fmt: skip
    assert steps[0].before_seconds == readings[0].before.median_seconds  # the baseline's
    for before, after in zip(steps, steps[1:], strict=False):
        assert after.before_seconds == pytest.approx(before.after_seconds)
    muon = steps[1]
    assert muon.kind == "learning" and muon.token_ratio == pytest.approx(2.0)
    assert muon.after_tokens_seconds == pytest.approx(muon.before_seconds / 2.0)
    assert steps[2].kind == "systems" and steps[2].token_ratio == 1
    product = math.prod(s.token_ratio * s.throughput_ratio for s in steps)
    assert steps[-1].after_seconds == pytest.approx(steps[0].before_seconds / product)


def test_the_first_editions_waterfall_chains_its_kept_changes_to_its_final_entry(monkeypatch):
    """Until this edition's record is committed, the chapter's opening figure draws the first
    edition's: its kept changes' factors multiply from the baseline's median to the final's."""
    from trainfast.records import records_for
    from trainfast.speedrun.first_edition import summarize
    from trainfast.speedrun.reading import first_edition_waterfall

    (record,) = [r for r in records_for(RECORD_NAME, "cpu") if "block" not in r.columns]
    summaries = {s.entry: s for s in summarize(record)}
    steps = first_edition_waterfall(record)
    kept = [s.entry for s in summaries.values() if s.part == "log" and s.kept]
    assert [s.name for s in steps] == kept and kept[-1] == "data parallel"
    assert steps[0].before_seconds == summaries["baseline"].median_seconds
    assert steps[-1].after_seconds == pytest.approx(summaries["data parallel"].median_seconds)
    rope = steps[0]  # 102,400 tokens to the target, then 61,440 with RoPE
    assert rope.kind == "learning" and rope.token_ratio == pytest.approx(102_400 / 61_440)
    assert steps[-1].kind == "systems" and steps[-1].token_ratio == 1
    with pytest.raises(ValueError, match="of this edition"):
        first_edition_waterfall(_study_record(monkeypatch))


def test_the_headline_is_read_seed_by_seed_from_the_validation_block(monkeypatch):
    from trainfast.speedrun.reading import (
        ablation_readings,
        references_of,
        seed_ratios,
        validation_reading,
    )

    record = _study_record(monkeypatch)
    final = validation_reading(record)
    assert (final.before.entry, final.after.entry) == ("baseline", "torch.compile")
    times = {
        (r["entry"], r["seed"]): r["train_seconds"]
        for r in record.rows
        if r["part"] == "validation"
    }
    expected = [times["baseline", s] / times["torch.compile", s] for s in range(5)]
    assert seed_ratios(record) == pytest.approx(expected)
    assert [b.after.entry for b in ablation_readings(record)] == ["without RoPE", "without Muon"]
    refs = references_of(record, "validation")
    row = next(r for r in record.rows if r["split"] == "validation")
    assert (refs.unigram, refs.bigram, refs.target) == (
        row["unigram_loss"], row["bigram_loss"], row["target_loss"]
    )  # fmt: skip
    assert refs.fraction == pytest.approx(
        (row["unigram_loss"] - row["target_loss"]) / (row["unigram_loss"] - row["bigram_loss"])
    )
    with pytest.raises(ValueError, match="Invalid split: 'test'"):
        references_of(record, "test")


def test_a_log_that_kept_nothing_has_no_headline_and_no_waterfall(monkeypatch):
    from trainfast.speedrun.reading import seed_ratios, validation_reading, waterfall

    record = _study_record(monkeypatch, times={}, tokens={})  # every change does nothing
    assert not any(r["kept"] for r in record.rows)
    assert validation_reading(record) is None and seed_ratios(record) == []
    assert waterfall(record) == []
    with pytest.raises(ValueError, match="no validation block"):
        headline_of(record)


def test_a_drifting_load_fakes_gains_in_a_blocked_order_and_not_in_an_interleaved_one():
    from trainfast.speedrun.protocol import planted_false_keeps

    rule = KeepRule()
    assert planted_false_keeps(blocked, drift=0.0, studies=300, rule=rule) <= 0.1
    falling_blocked = planted_false_keeps(blocked, drift=-0.01, studies=300, rule=rule)
    falling_interleaved = planted_false_keeps(interleaved, drift=-0.01, studies=300, rule=rule)
    assert falling_blocked > 0.5 and falling_interleaved < 0.1
    assert planted_false_keeps(blocked, drift=0.01, studies=300, rule=rule) == 0  # rising: drops
    with pytest.raises(ValueError, match="drift"):
        planted_false_keeps(blocked, drift=-0.5)


def test_the_evaluation_starts_are_where_the_windows_start():
    from trainfast.speedrun.data import evaluation_starts

    tokens = np.arange(5_001, dtype=np.uint16)
    starts = evaluation_starts(len(tokens), 16, 16 * 40)
    windows = evaluation_windows(tokens, 16, 16 * 40)
    assert windows[:, 0].tolist() == starts.tolist()
    with pytest.raises(ValueError, match="do not fit"):
        evaluation_starts(100, 16, 16 * 40)


def test_the_step_profile_splits_a_step_into_parts_and_kinds_of_operator():
    from torch.utils.flop_counter import FlopCounterMode
    from trainfast.speedrun.step_profile import (
        KINDS,
        PARTS,
        StepBreakdown,
        operator_kind,
        profile_step,
    )

    config = _config(attention="manual")
    breakdown = profile_step(config, steps=2)
    assert set(breakdown.parts) == set(PARTS) and set(breakdown.kinds) == set(KINDS)
    assert sum(breakdown.part_share(p) for p in PARTS) == pytest.approx(1)
    assert sum(breakdown.kind_share(k) for k in KINDS) == pytest.approx(1)
    assert all(breakdown.kinds[k] > 0 for k in KINDS) and breakdown.parts["optimizer"] > 0
    # the dense layers' FLOPs are what torch counts for mm and addmm in a forward and backward
    model = Transformer(config.shape)
    tokens = torch.randint(0, config.shape.vocab_size, (config.shape.batch_size, 33))
    with FlopCounterMode(display=False) as counter:
        model.loss(tokens[:, :-1], tokens[:, 1:]).backward()
    by_op = counter.get_flop_counts()["Global"]
    dense = sum(v for op, v in by_op.items() if str(op).split(".")[1] in ("mm", "addmm"))
    assert breakdown.linear_flops == dense
    assert operator_kind("aten::addmm") == "linear" and operator_kind("aten::bmm") == "attention"
    assert operator_kind("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert operator_kind("aten::native_layer_norm") == "other" and operator_kind("forward") is None
    assert StepBreakdown.amdahl(0.5) == 2 and StepBreakdown.amdahl(0.5, 2) == pytest.approx(4 / 3)
    assert StepBreakdown.amdahl(0.0) == 1 and StepBreakdown.amdahl(1.0) == math.inf
    with pytest.raises(ValueError, match="share"):
        StepBreakdown.amdahl(1.5)
    with pytest.raises(ValueError, match="Unknown part: 'data'"):
        breakdown.part_share("data")
    with pytest.raises(ValueError, match="Invalid config"):
        profile_step("baseline")


def test_the_bf16_calibration_is_the_models_own_line_against_a_measured_step():
    from trainfast.records import records_for
    from trainfast.speedrun.gpu import bf16_calibration

    (record,) = [r for r in records_for("precision-step-time", "cuda") if "H100" in r.device_name]
    measured = next(r["tokens_per_s"] for r in record.rows if r["recipe"] == "bf16 autocast")
    from trainfast.distributed.step_time import TrainingSetup, estimate
    from trainfast.precision.benchmarks import gpu_step_shape

    shape = gpu_step_shape(False)
    step = estimate(TrainingSetup(shape=shape, recipe="bf16 autocast", global_batch=8)).step_s
    assert bf16_calibration(record) == pytest.approx(measured / (shape.tokens / step))
    assert 0.2 < bf16_calibration(record) < 0.6  # the model is optimistic for bf16
    no_bf16 = replace(record, rows=[r for r in record.rows if r["recipe"] != "bf16 autocast"])
    with pytest.raises(ValueError, match="no 'bf16 autocast' row"):
        bf16_calibration(no_bf16)


def test_a_gpu_log_is_read_row_by_row_beside_its_own_gpus_prediction():
    from trainfast.records import Record
    from trainfast.speedrun.gpu import gpu_preset, gpu_rows, predict, read_gpu_log

    spec = "H200 SXM 141GB"
    planned = gpu_rows(gpu_preset(spec))
    rows = []
    for seed in range(3):
        for i, entry in enumerate(planned):
            seconds = 100.0 / (1 + 0.1 * i) * (1 + 0.01 * seed)
            rows.append({
                "part": "gpu", "block": 0, "entry": entry.name,
                "compared_to": entry.compared_to or "", "kind": entry.kind, "seed": seed,
                "split": "validation", "reached": True, "train_seconds": seconds,
                "tokens": 1_000_000, "kept": None,
            })  # fmt: skip
    record = Record("speedrun", "", list(rows[0]), rows, {"device": "cuda"}, "", "")
    readings = {r.entry: r for r in read_gpu_log(record, spec)}
    assert list(readings) == [e.name for e in planned]
    for entry in planned:
        reading = readings[entry.name]
        assert reading.predicted == predict(entry.config, spec)
        assert reading.measured_tokens_per_second == pytest.approx(1e6 / reading.median_seconds)
    assert math.isnan(readings["baseline"].time_ratio)
    compiled = readings["torch.compile"]  # row 5, built on row 1: every seed faster
    assert compiled.time_ratio == pytest.approx(1.5 / 1.1) and compiled.p_value == 0.05
    bad = replace(record, rows=[{**r, "entry": "x" if r["entry"] == "SDPA" else r["entry"]}
                                for r in rows])  # fmt: skip
    with pytest.raises(ValueError, match="'x' is not a row of the GPU log"):
        read_gpu_log(bad, spec)


# ------------------------------------------------- the chapter and the first edition's record
#: the chapter's section pages, in reading order
PAGES = ["target", "harness", "rules", "log", "systems", "ablation", "gpu", "run_it"]


def test_the_chapter_listings_resolve():
    import book_site
    import chapters

    assert chapters.listing_problems("speedrun") == []
    assert book_site.chapter_pages("speedrun") == [
        "speedrun/index",
        *(f"speedrun/{p}" for p in PAGES),
    ]


def _outputs(notebook) -> str:
    """Everything the executed page shows or glues, as text."""
    return "".join(
        str(o.get("text", ""))
        + "".join(str(v) for k, v in o.get("data", {}).items() if "image" not in k)  # fmt: skip
        for cell in notebook.cells
        if cell.cell_type == "code"
        for o in cell.get("outputs", [])
    )


@pytest.mark.chapter
@pytest.mark.parametrize("page", PAGES)
def test_each_page_executes_without_machine_paths(page):
    import chapters

    notebook = chapters.executed_notebook(f"speedrun/{page}")
    assert chapters.cell_errors(notebook) == []
    text = _outputs(notebook)
    assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text


#: what a page says in place of the study's results until its record is committed
NOT_YET = "not in the book yet"


@pytest.mark.chapter
def test_the_log_page_renders_the_records_headline_and_every_block():
    import chapters
    from trainfast.speedrun.reading import find_study_record, log_readings, validation_reading

    record = find_study_record()
    text = _outputs(chapters.executed_notebook("speedrun/log"))
    if record is None:  # the plan, and the first edition's waterfall as the opening figure
        assert NOT_YET in text and "the first edition's log" in text
        assert "| baseline |" not in text  # no table of a record that is not there
        return
    for reading in log_readings(record):
        assert f"| {reading.after.entry} | {reading.after.kind} |" in text
    if validation_reading(record) is not None:
        assert headline_of(record).text() in text  # the headline as its interval rounds it
    else:
        assert "no headline" in text
    assert "log_waterfall" in text or "Figure" in text


@pytest.mark.chapter
def test_the_target_page_places_the_records_target_between_its_count_models():
    import chapters
    from trainfast.speedrun.reading import find_study_record, references_of

    record = find_study_record()
    text = _outputs(chapters.executed_notebook("speedrun/target"))
    if record is None:
        assert NOT_YET in text and "nats/token) |" not in text
        return
    refs = references_of(record)
    assert f"| validation split | {refs.unigram:.3f} | {refs.bigram:.3f} |" in text
    assert f"{refs.fraction:.2f} |" in text


@pytest.mark.chapter
def test_the_systems_page_names_the_records_cpu_and_its_own():
    import chapters
    from trainfast.speedrun.machine import describe_cpu
    from trainfast.speedrun.reading import find_study_record

    record = find_study_record()
    text = _outputs(chapters.executed_notebook("speedrun/systems"))
    assert describe_cpu().text() in text
    assert "| change | speeds up | its share here | the profile allows |" in text
    if record is None:
        assert NOT_YET in text and "ratio in the record" not in text
    else:
        assert record.rows[0]["cpu"] in text and "ratio in the record" in text


@pytest.mark.chapter
def test_the_ablation_page_reads_every_ablation_row():
    import chapters
    from trainfast.speedrun.reading import ablation_readings, find_study_record

    record = find_study_record()
    text = _outputs(chapters.executed_notebook("speedrun/ablation"))
    if record is None:
        assert NOT_YET in text
        return
    for reading in ablation_readings(record):
        assert reading.after.entry.removeprefix("without ") in text


@pytest.mark.chapter
def test_the_gpu_page_labels_every_prediction_and_sizes_the_log_for_its_slot():
    import chapters
    from trainfast.speedrun.gpu import GPU_SLOT_SECONDS, gpu_preset, planned_seconds

    text = _outputs(chapters.executed_notebook("speedrun/gpu"))
    assert "predicted tokens/s (book's model)" in text and "step-time model" in text
    for name in ("H200 SXM 141GB", "H100 SXM 80GB"):
        assert f"| {name} |" in text
        assert planned_seconds(gpu_preset(name), name) <= GPU_SLOT_SECONDS


def test_the_chapter_trains_on_the_device_it_printed():
    # on the H100 the chapter printed "device: cpu" and its live study, given no device, picked
    # CUDA, where the final entry's two data-parallel processes need two GPUs
    import ast

    from chapters import read_chapter

    calls = []
    for page in PAGES:
        for cell in read_chapter(f"speedrun/{page}").cells:
            if cell.cell_type == "code":
                for node in ast.walk(ast.parse(cell.source)):
                    name = getattr(getattr(node, "func", None), "id", None)
                    if name in {"run_study", "run_log", "run_to_target"}:
                        calls.append((page, name, {k.arg for k in node.keywords}))
    assert calls, "the chapter trains nothing live"
    assert all("device" in keywords for _, _, keywords in calls), calls


def test_the_first_editions_record_still_reads_as_its_reader_reads_it():
    """The first edition's record of 2026-11-26 stays in book/records until this edition's
    replaces it; its reader (trainfast.speedrun.first_edition) must still read it."""
    from trainfast.records import records_for
    from trainfast.speedrun import first_edition

    (record,) = [
        r
        for r in records_for(RECORD_NAME, "cpu")
        if r.rows[0]["preset"] == "cpu" and "block" not in r.columns
    ]
    assert record.columns == [
        "part", "entry", "compared_to", "seed", "reached", "train_seconds", "eval_seconds",
        "steps", "tokens", "final_loss", "target_loss", "preset", "load_before", "load_after",
        "corpus_sha256", "complete",
    ]  # fmt: skip
    assert {row["target_loss"] for row in record.rows} == {first_edition.preset("cpu").target.loss}
    assert "/" not in record.command.split("--out")[0]  # no machine path in the command
    cpu = first_edition.preset("cpu")
    dropped = first_edition.dropped_changes(record)
    known = {e.name for e in first_edition.entries(cpu, parts=("log", "ablation"), dropped=dropped)}
    assert {row["entry"] for row in record.rows} <= known
    final = first_edition.final_entry(cpu, dropped)
    summaries = {s.entry: s for s in first_edition.summarize(record)}
    # the review's reading of it: 14.04 s against 2.45 s
    assert summaries["baseline"].median_seconds == pytest.approx(14.04, abs=0.01)
    assert summaries[final].median_seconds == pytest.approx(2.45, abs=0.01)


def test_the_ablation_is_read_backwards_against_the_final_entry():
    from trainfast.speedrun.first_edition import Summary, read_ablation

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


def test_load_drift_undoes_the_verdicts_within_a_configurations_two_times():
    """Two entries of one configuration (names aside) set the drift; a later row with a verdict
    nearer the final entry than that is not decided, one just beyond it is at the edge."""
    from dataclasses import dataclass, replace

    from trainfast.speedrun.drift import load_drift
    from trainfast.speedrun.first_edition import Summary

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
