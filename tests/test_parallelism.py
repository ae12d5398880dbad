"""The parallelism chapter: its listings, and every collective and trainer against torch.

Each distributed check runs real gloo processes through ``trainfast.distributed.spawn``; many
cases share one launch, so the module stays fast on a two-core machine.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import chapters
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from trainfast.accounting import zero_memory
from trainfast.distributed import OPS, SpawnError, ring_chunks, spawn
from trainfast.distributed.cost_model import (
    Link,
    all_gather_time,
    all_reduce_time,
    bytes_sent_per_rank,
    crossover_bytes,
    fit_link,
    reduce_scatter_time,
)
from trainfast.distributed.data_parallel import (
    DataParallelConfig,
    TorchDDP,
    train_data_parallel,
    train_single_process,
)
from trainfast.distributed.ddp import DDP
from trainfast.distributed.exercises import (
    check_all_reduce,
    check_broadcast,
    check_distributed_evaluation,
    check_peak_activations_1f1b,
    check_ring_chunks,
    check_tree_all_reduce_time,
    check_zero_memory,
)
from trainfast.distributed.launch import DEFAULT_PRELOAD, default_backend
from trainfast.distributed.measurements.ddp_overlap import DDPTimelineConfig, ddp_timeline_worker
from trainfast.distributed.measurements.fsdp_timeline import fsdp_timeline_worker
from trainfast.distributed.parity.collectives import (
    COLLECTIVES,
    Case,
    error_worker,
    parity_worker,
    traffic_worker,
)
from trainfast.distributed.parity.strategies import (
    StrategyConfig,
    TiedModel,
    strategy_worker,
    train_reference,
    zero_owners_worker,
    zero_resume_worker,
)
from trainfast.distributed.pipeline import (
    PipelineConfig,
    bubble_fraction,
    gpipe_schedule,
    interleaved_schedule,
    make_pipeline_model,
    one_f_one_b_schedule,
    peak_activations,
    pipeline_batch,
    pipeline_sweep_worker,
    simulate,
)
from trainfast.distributed.point_to_point import deadlock_worker, ping_pong_worker, swap_worker
from trainfast.distributed.strategy import (
    FSDP_ON_CPU,
    STRATEGIES,
    DDPStrategy,
    FSDPStrategy,
    make_strategy,
    train_sharded,
)
from trainfast.distributed.tensor_parallel import tensor_parallel_worker
from trainfast.distributed.torch_apis import torch_fully_shard
from trainfast.distributed.training_loop import OptimizerConfig, Strategy, train_with_strategy
from trainfast.distributed.zero import Zero2Optimizer, ZeroOptimizer, largest_share

WORLD_SIZES = [1, 2, 3, 4]


@pytest.fixture(scope="module", autouse=True)
def _preload_the_data_sets():
    """Start the forkserver with scikit-learn's data sets imported, so no rank imports them."""
    preload = (*DEFAULT_PRELOAD, "sklearn.datasets")
    spawn(ping_pong_worker, 2, [1], 1, preload=preload, timeout=120)


ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ the chapter
def test_listings_resolve():
    assert chapters.listing_problems("parallelism") == []


#: The longest listing the chapter may show (house rule: the lines that carry the idea).
MAX_LISTING_LINES = 26


def test_listings_show_a_few_lines_and_their_markers_exist():
    """Every listing reads with Sphinx's own reader (so each :start-at:/:end-before: marker is
    found inside its object, as the build's -W would demand), dedents only whitespace, and
    shows at most MAX_LISTING_LINES lines."""
    from sphinx.config import Config
    from sphinx.directives.code import LiteralIncludeReader

    config = Config({}, {})
    for page in chapters.pages_of("parallelism"):
        path = chapters.chapter_path(page)
        for block in chapters.blocks(path.read_text()):
            if block.directive != "literalinclude":
                continue
            options = dict(block.options)
            dedent = int(options.pop("dedent", 0))
            where = f"{page}.md:{block.line} {options.get('pyobject')}"
            text, n_lines = LiteralIncludeReader(
                str((path.parent / block.argument).resolve()), options, config
            ).read()
            lines = [line for line in text.splitlines() if line.strip()]
            assert all(line[:dedent].isspace() for line in lines if dedent), where
            assert n_lines <= MAX_LISTING_LINES, f"{where}: {n_lines} lines"


#: Constants the parallelism chapter's pages may type (tests/chapters.py, PROSE_CONSTANTS); every
#: other number in their prose is glued.
#: - Names and counting: rank 0 and 1, bucket 0, layer 0 and 1, ZeRO stages 0-3, Llama 3,
#:   exercises 1 to 4, dropout 0, 2 stages of 2 blocks, 4 ranks, 2 of 8 experts, 8 experts and 8
#:   clusters (the MoE module's defaults, stated as the inputs), 16 experts with top-1, the
#:   ZeRO-1 imbalance at 64 and 256 ranks (inputs).
#: - Definitions: bytes per parameter of mixed-precision Adam as the ZeRO paper counts them
#:   (Rajbhandari et al. 2020, Section 3.1: 2 + 2 + 12 = 16), of fp32 (4) and AdamW state
#:   (K = 8); 16-bit values; Korthikanti et al.'s 34 sbh per layer (Eq. 1).
#: - Published: an H100's 80 GB; torch's DDP default bucket_cap_mb of 25 MiB; ZeRO-3's 1.5 times
#:   the traffic of DP (ZeRO, Section 7.2); eight devices per NVLink node; Switch's balancing
#:   weight 0.01; Narayanan et al. 2021 (Table 1, Eq. 3, Section 2.2.2; Section 5: eight 200
#:   Gb/s HDR InfiniBand adapters a Selene node, 25 GB/s a GPU): 2,304 sequences of 2,048 tokens
#:   at 148 teraFLOP/s; Llama 3 (Dubey et al. 2024, Table 4, Section 3.3.2): 8,192-token
#:   sequences at 400 teraFLOP/s, 41 % MFU, p = 16; Korthikanti et al. Section 4.2.3.


# ---------------------------------------------------------------------------- collectives
def _cases(world_size: int) -> list[Case]:
    """Every collective x lengths (1, odd, indivisible by N, 2-D non-contiguous) x dtypes x ops."""
    shapes = [(1,), (7,), (2 * world_size + 1,), (3, 5)]
    dtypes = [torch.float32, torch.float64, torch.int64, torch.int32]
    cases = []
    for collective in COLLECTIVES:
        ops = ["sum"] if collective in ("broadcast", "all_gather") else list(OPS)
        for shape in shapes:
            for dtype in dtypes:
                for op in ops:
                    root = len(cases) % world_size
                    cases.append(
                        Case(collective, shape, dtype, op, root, transpose=len(shape) == 2)
                    )
    return cases


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_collectives_match_torch(world_size):
    cases = _cases(world_size)
    results = spawn(parity_worker, world_size, cases, 1234, timeout=300)
    assert len(results) == world_size
    for rank, rank_results in enumerate(results):
        assert len(rank_results) == len(cases)
        for case, (ours, theirs) in zip(cases, rank_results, strict=True):
            where = f"rank {rank}, {case}"
            assert ours.dtype == case.dtype, where
            if case.collective == "reduce" and rank != case.root:
                continue  # only the root's result is defined
            if case.dtype.is_floating_point:
                tolerance = 1e-6 if case.dtype == torch.float32 else 1e-12
                torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance, msg=where)
            else:
                assert torch.equal(ours, theirs), f"{where}: {ours} != {theirs}"


def test_integer_mean_rounds_toward_zero():
    cases = [
        Case("ring_all_reduce", (9,), torch.int64, "mean"),
        Case("all_reduce", (9,), torch.int64, "mean"),
    ]
    for ours, theirs in spawn(parity_worker, 3, cases, 5)[0]:
        assert torch.equal(ours, theirs)
        assert (ours.abs() < 50).all()  # inputs are in [-50, 50): a mean stays in range


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_sends_2_n_minus_1_over_n_of_the_data(world_size):
    numel = 12 * 7  # divisible by 2, 3 and 4
    counted = spawn(traffic_worker, world_size, numel, timeout=120)
    for rank, sent in enumerate(counted):
        assert sent["ring"] == 4 * 2 * (world_size - 1) * numel // world_size
        assert sent["ring"] == bytes_sent_per_rank("ring", 4 * numel, world_size)
        assert sent["naive"] == 4 * numel * ((world_size - 1) if rank == 0 else 1)
    assert counted[0]["naive"] == bytes_sent_per_rank("naive", 4 * numel, world_size)


def test_ring_traffic_for_lengths_not_divisible_by_world_size():
    numel, world_size = 10, 4
    counted = spawn(traffic_worker, world_size, numel, timeout=120)
    sizes = [len(c) for c in torch.arange(numel).tensor_split(world_size)]
    for rank, sent in enumerate(counted):
        # everything but my own chunk (reduce-scatter) and my right neighbour's (all-gather)
        assert sent["ring"] == 4 * (2 * numel - sizes[rank] - sizes[(rank + 1) % world_size])


# ------------------------------------------------------------------------------ failures
@pytest.mark.parametrize(
    "kind, message",
    [
        ("shape", r"rank 2 has shape \(5,\) and dtype torch.float32, but rank 0 has shape \(4,\)"),
        ("dtype", r"rank 2 has shape \(4,\) and dtype torch.int64, but rank 0 .* torch.float32"),
        ("op", r"Unknown op: 'prod'"),
        ("raise", r"rank 2 of 3 raised RuntimeError: rank 2 fails on purpose"),
        ("exit", r"rank 2 of 3 died with exit code 3"),
    ],
)
@pytest.mark.parametrize("collective", ["ring_all_reduce", "all_reduce"])
def test_failures_are_clear_and_prompt(kind, message, collective):
    start = time.perf_counter()
    with pytest.raises(SpawnError, match=message) as caught:
        spawn(error_worker, 3, kind, collective, timeout=120)
    seconds = time.perf_counter() - start
    assert seconds < 20, (
        f"spawn took {seconds:.1f} s to report the failure (collective timeout is 60 s)"
    )
    if kind in ("shape", "dtype", "op"):
        assert caught.value.error_type == "ValueError"
        assert isinstance(caught.value.__cause__, ValueError)
    if kind == "raise":
        assert caught.value.rank == 2
        assert "error_worker" in caught.value.rank_traceback  # the failing rank's own traceback
        assert "Traceback from rank 2" in str(caught.value)


def _forkserver_children() -> list[int]:
    """Live (non-zombie) children of the forkserver this test process started."""
    commands, parents, states = {}, {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            commands[entry.name] = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        states[entry.name], parents[entry.name] = stat[0], stat[1]
    servers = {
        pid
        for pid, command in commands.items()
        if b"multiprocessing.forkserver" in command and parents.get(pid) == str(os.getpid())
    }
    return [int(pid) for pid in commands if parents.get(pid) in servers and states[pid] != "Z"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_process_left_behind():
    before = set(_forkserver_children())
    with pytest.raises(SpawnError):
        spawn(error_worker, 4, "raise", timeout=120)  # three ranks wait in the ring when it fails
    deadline = time.monotonic() + 5
    while set(_forkserver_children()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(_forkserver_children()) - before == set()


def test_deadlock_ends_in_an_error_not_a_hang():
    start = time.perf_counter()
    with pytest.raises(SpawnError, match="Timed out"):
        spawn(deadlock_worker, 2, collective_timeout=2)
    with pytest.raises(TimeoutError, match="did not finish within 1 s"):
        spawn(deadlock_worker, 2, timeout=1)
    assert time.perf_counter() - start < 30
    for non_blocking in (True, False):
        received = spawn(swap_worker, 2, non_blocking)
        assert [t.tolist() for t in received] == [[1.0] * 4, [0.0] * 4]


def hang_in_teardown_worker(rank: int, world_size: int) -> int:
    dist.all_reduce(torch.ones(1))
    # in this process only: leaving the group never returns, as torch 2.4's gloo can hang there
    dist.destroy_process_group = lambda *args, **kwargs: time.sleep(3600)
    return rank


def test_a_rank_hanging_in_teardown_after_returning_does_not_hang_the_launch():
    start = time.perf_counter()
    assert spawn(hang_in_teardown_worker, 2, timeout=120) == [0, 1]
    assert time.perf_counter() - start < 60


def affinity_worker(rank: int, world_size: int) -> list[int]:
    return sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="core affinity is Linux-only")
def test_spawn_can_pin_each_rank_to_a_core():
    cores = sorted(os.sched_getaffinity(0))
    pinned = spawn(affinity_worker, 2, pin_cores=True, timeout=120)
    assert pinned == [[cores[0]], [cores[1 % len(cores)]]]
    assert spawn(affinity_worker, 2, timeout=120) == [cores, cores]  # by default, every core


def test_spawn_rejects_bad_arguments():
    with pytest.raises(ValueError, match="world_size: 0"):
        spawn(swap_worker, 0)
    with pytest.raises(ValueError, match="backend: 'smoke-signals'"):
        spawn(swap_worker, 2, backend="smoke-signals")


_CONCURRENT = """
import torch
import torch.distributed as dist
from torch import nn
from trainfast.distributed import spawn
from trainfast.distributed.parity.collectives import Case, parity_worker
cases = [Case("ring_all_reduce", (100,), torch.float32, "sum")] * 20
print("launching", flush=True)
for ours, theirs in spawn(parity_worker, 3, cases, 0, timeout=120)[0]:
    torch.testing.assert_close(ours, theirs)
print("ok")
"""


def test_two_launches_at_once_do_not_collide():
    """A second build on the same machine (another process) launches while this one does."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    other = subprocess.Popen(
        [sys.executable, "-c", _CONCURRENT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    cases = [Case("ring_all_reduce", (100,), torch.float32, "sum")] * 20
    # from when the other has imported torch and is about to launch (before, there is nothing to
    # collide with: launching then cost CPU the other's imports needed) until it is done
    started = other.stdout.readline().strip()
    launches = 0
    while other.poll() is None or launches == 0:
        for ours, theirs in spawn(parity_worker, 3, cases, launches, timeout=120)[0]:
            torch.testing.assert_close(ours, theirs)
        launches += 1
    out, err = other.communicate(timeout=240)
    assert other.returncode == 0 and (started, out.strip()) == ("launching", "ok"), err[-2000:]


# ------------------------------------------------------------------------- data parallel
def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def sgd_reference():
    return train_single_process(DataParallelConfig(steps=8))


@pytest.fixture(scope="module")
def tied_reference():
    return train_reference(StrategyConfig())


@pytest.fixture(scope="module")
def adamw_reference():
    return train_single_process(DataParallelConfig(steps=8, optimizer="adamw", lr=0.01))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("wrapper", ["manual", "ddp"])
def test_data_parallel_matches_single_process(world_size, wrapper, sgd_reference):
    config = DataParallelConfig(steps=8)
    results = spawn(train_data_parallel, world_size, config, wrapper, timeout=300)
    for result in results:  # every rank ends with the single process's parameters
        assert _max_difference(result.parameters, sgd_reference.parameters) < 1e-5
        assert result.losses == pytest.approx(sgd_reference.losses, rel=1e-5)
    assert sgd_reference.losses[-1] < sgd_reference.losses[0]  # it did train


def test_ddp_reports_its_buckets():
    config = DataParallelConfig(steps=3, bucket_cap_mb=0.001)  # ~1 kB buckets: one per layer
    result = spawn(train_data_parallel, 2, config, "ddp", timeout=120)[0]
    numel = sum(p.numel() for p in result.parameters.values())
    assert len(result.buckets) > 1
    assert [index for index, _ in result.buckets] == list(range(len(result.buckets)))
    assert sum(size for _, size in result.buckets) == numel


def test_data_parallel_rejects_indivisible_batch():
    with pytest.raises(SpawnError, match="global_batch_size: 10 is not divisible by world_size 4"):
        spawn(train_data_parallel, 4, DataParallelConfig(global_batch_size=10), timeout=120)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sharded_training_matches_unsharded_adamw(world_size, strategy, adamw_reference):
    if strategy == "torch-fsdp" and default_backend(world_size) == "gloo" and not FSDP_ON_CPU:
        pytest.skip("FSDP on CPU needs torch >= 2.9")
    config = DataParallelConfig(steps=8, optimizer="adamw", lr=0.01)
    results = spawn(train_sharded, world_size, config, strategy, timeout=300)
    reference = adamw_reference.parameters
    total = sum(p.numel() for p in reference.values())
    for result in results:
        assert _max_difference(result.parameters, reference) < 1e-5
        assert result.losses == pytest.approx(adamw_reference.losses, rel=1e-5)
    state = [r.held.optimizer_state // 4 for r in results]  # fp32 elements, no step counts
    slices = sum(math.ceil(v.numel() / world_size) for v in reference.values())
    matrices = sum(math.ceil(v.numel() / world_size) for v in reference.values() if v.dim() == 2)
    vectors = sum(v.numel() for v in reference.values() if v.dim() != 2)
    if strategy == "ddp":  # everything whole on every rank
        assert state == [2 * total] * world_size
        assert all(r.parameter_numel == total for r in results)
        assert all(r.held.gradients == 4 * total for r in results)
    elif strategy == "zero1":  # whole parameters, each on one rank
        assert sum(state) == 2 * total
        assert all(r.parameter_numel == total for r in results)  # stage 1 keeps whole parameters
        assert all(r.held.gradients == 4 * total for r in results)  # and whole gradients
    elif strategy == "zero2":  # a 1/N slice of every parameter, and of its gradient
        assert state == [2 * slices] * world_size
        assert all(r.held.gradients == 4 * slices for r in results)
        assert all(r.parameter_numel == total for r in results)
    elif strategy == "fsdp":  # 2-D weights sharded, 1-D parameters whole
        assert state == [2 * (matrices + vectors)] * world_size
        assert all(r.parameter_numel == matrices + vectors for r in results)
        assert all(r.held.parameters == 4 * (matrices + vectors) for r in results)
    else:  # torch's FSDP2 cuts every parameter along its first dimension
        rows = {k: v.shape[0] for k, v in reference.items()}
        largest = sum(
            math.ceil(n / world_size) * v[0].numel()
            for (k, n), v in zip(rows.items(), reference.values(), strict=True)
        )
        assert max(state) == 2 * largest
        assert sum(r.parameter_numel for r in results) == total  # stage 3 shards them


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "fsdp"])  # torch's: the MLP
def test_strategies_match_one_process_with_tied_frozen_and_unused_parameters(
    world_size, strategy, tied_reference
):
    results = spawn(strategy_worker, world_size, strategy, StrategyConfig(), timeout=300)
    for result in results:
        assert result.parameters.keys() == tied_reference.parameters.keys()
        assert _max_difference(result.parameters, tied_reference.parameters) < 1e-6
        assert result.losses == pytest.approx(tied_reference.losses, rel=1e-6)
    torch.manual_seed(0)  # what rank 0 started from, and broadcast
    start = dict(TiedModel(StrategyConfig()).named_parameters())
    for name in ("frozen.weight", "unused.weight", "unused.bias"):  # never updated
        assert torch.equal(results[-1].parameters[name], start[name].detach())
    assert not torch.equal(results[-1].parameters["embed.weight"], start["embed.weight"].detach())


@pytest.mark.parametrize("bucket_cap_mb", [1e-4, 1e-3, 25.0])
def test_ddp_buckets_match_one_process(bucket_cap_mb, tied_reference):
    strategy = DDPStrategy(bucket_cap_mb=bucket_cap_mb)
    results = spawn(strategy_worker, 3, strategy, StrategyConfig(), timeout=300)
    assert _max_difference(results[0].parameters, tied_reference.parameters) < 1e-6


#: Gradient accumulation: 3 micro-batches per step on 2 ranks, against one process on the whole
#: batch. Our DDP with many buckets and with one per parameter, torch's DDP (which must find the
#: unused layer), and the strategies that reduce-scatter in every backward.
ACCUMULATING = {
    "our DDP, 1e-4 MiB buckets": DDPStrategy(bucket_cap_mb=1e-4),
    "our DDP, a bucket per parameter": DDPStrategy(bucket_cap_mb=None),
    "torch's DDP": TorchDDP(bucket_cap_mb=1e-4, find_unused_parameters=True),
    "our ZeRO-2": "zero2",
    "our FSDP": "fsdp",
}


@pytest.mark.parametrize("no_sync", [False, True])
@pytest.mark.parametrize("name", ACCUMULATING)
def test_gradient_accumulation_matches_one_process(name, no_sync, tied_reference):
    """Three backward passes before each step: without the switch every backward all-reduces
    (the next forward finishes the previous synchronisation, as torch's reducer does when a
    backward ends); under no_sync the gradients add up locally and the last backward sends them.
    Before the fix our DDP relaunched full buckets early on the second backward (an error of
    28 with small buckets); torch's DDP was right."""
    strategy = ACCUMULATING[name]
    results = spawn(strategy_worker, 2, strategy, StrategyConfig(), 3, no_sync, timeout=300)
    for result in results:
        assert _max_difference(result.parameters, tied_reference.parameters) < 1e-6, name
        assert result.losses == pytest.approx(tied_reference.losses, rel=1e-6)


def test_ddp_refuses_a_second_backward_before_the_first_is_synchronised(one_rank_gloo_group):
    """Two backward passes of one forward: the second would relaunch buckets whose all-reduce
    from the first is in flight, so our DDP says so instead of averaging the wrong sum."""
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(3, 2))
    loss = ddp(torch.randn(4, 3)).square().mean()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward reached bucket 0"):
        loss.backward()


def test_ddp_no_sync_accumulates_locally_and_sends_once(one_rank_gloo_group):
    """Under no_sync no bucket leaves; the first backward after it sends every bucket once."""
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)))  # a bucket per parameter: 4
    sent = []
    ddp.register_comm_hook(
        lambda index, buffer: sent.append(index) or dist.all_reduce(buffer, async_op=True)
    )
    x = torch.randn(6, 3)
    with ddp.no_sync():
        ddp(x[:3]).sum().backward()
        ddp(x[3:5]).sum().backward()
    assert sent == []
    ddp(x[5:]).sum().backward()
    ddp.finish_gradient_synchronization()
    assert sorted(sent) == [0, 1, 2, 3]
    reference = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    reference.load_state_dict(ddp.module.state_dict())
    reference(x).sum().backward()
    for ours, theirs in zip(ddp.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad)


def test_ddp_buckets_follow_reverse_registration_order():
    layers = [nn.Linear(10, 10) for _ in range(4)]  # 110 parameters (440 bytes) each
    params = [p for layer in layers for p in layer.parameters()][::-1]
    each = DDP._make_buckets(params, None)
    assert [b.params for b in each] == [[p] for p in params]
    cap = 440 / 2**20  # a bucket closes once it holds 440 bytes or more
    buckets = DDP._make_buckets(params, cap)
    assert [p for b in buckets for p in b.params] == params  # every parameter once, in order
    assert all(
        sum(p.numel() * 4 for p in b.params) - b.params[-1].numel() * 4 < 440 for b in buckets
    )
    assert [len(b.params) for b in buckets] == [2, 2, 2, 2]  # bias (40 B) + weight (400 B) each
    assert all(b.buffer.numel() == sum(p.numel() for p in b.params) for b in buckets)


def test_ddp_overlaps_communication_with_backward():
    results = spawn(ddp_timeline_worker, 2, DDPTimelineConfig(steps=2), timeout=300)
    for result in results:
        for step in result:
            first = min(t.launched for t in step.buckets)
            assert step.backward_end > first  # a bucket was on the wire before backward ended
            assert [t.index for t in step.buckets] == sorted(t.index for t in step.buckets)


def test_fsdp_timeline_is_recorded_in_the_algorithm_order():
    events = spawn(fsdp_timeline_worker, 2, 32, 3, False, timeout=300)[0]
    kinds = ["all-gather", "compute", "free", "all-gather", "compute", "reduce-scatter"]
    for layer in ("0.weight", "1.weight", "2.weight"):
        mine = [e for e in events if e.weight == layer]
        assert [e.kind for e in mine] == kinds  # forward, then backward
        assert [e.phase for e in mine] == ["forward"] * 3 + ["backward"] * 3
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:], strict=False))
    backward = [e.weight for e in events if e.kind == "reduce-scatter"]
    assert backward == ["2.weight", "1.weight", "0.weight"]  # layers in reverse


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="strategy: 'zero4'"):
        make_strategy("zero4")
    assert set(STRATEGIES) == {"ddp", "zero1", "zero2", "fsdp", "torch-fsdp"}


@pytest.fixture
def one_rank_gloo_group(tmp_path):
    """A gloo process group of this process alone, as a spawn rank sees it (rank_device(): CPU)."""
    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.skipif(not FSDP_ON_CPU, reason="FSDP on CPU needs torch >= 2.9")
def test_torch_fully_shard_builds_its_mesh_on_the_rank_device(monkeypatch, one_rank_gloo_group):
    """Without a mesh, fully_shard builds one on the machine's accelerator and moves the
    parameters there: on one H100, four gloo ranks got parameters on cuda:0 and targets on the
    CPU. Every call must get a mesh on rank_device()."""
    import torch.distributed.fsdp as torch_fsdp

    real, meshes = torch_fsdp.fully_shard, []

    def spy(module, **options):
        meshes.append(options.get("mesh"))
        return real(module, **options)

    monkeypatch.setattr(torch_fsdp, "fully_shard", spy)
    model = torch_fully_shard(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)))
    assert len(meshes) == 3  # each linear, then the whole model
    assert [getattr(mesh, "device_type", None) for mesh in meshes] == ["cpu"] * 3
    assert {p.device for p in model.parameters()} == {torch.device("cpu")}


@dataclass(frozen=True)
class _MovesTheModel(Strategy):
    """A strategy that moves the model off the rank's device, as fully_shard without a mesh did."""

    name: ClassVar[str] = "moves-the-model"

    def wrap(self, model, optimizer):
        model = model.to("meta")
        return model, optimizer.build(model.parameters())


def test_training_loop_refuses_a_strategy_that_moves_the_model():
    batches = [(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))]
    with pytest.raises(RuntimeError, match="'moves-the-model' moved parameter 'weight' to meta"):
        train_with_strategy(
            nn.Linear(3, 2), _MovesTheModel(), OptimizerConfig("sgd"), batches, F.cross_entropy
        )


@pytest.mark.parametrize("dtype, tolerance", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_fsdp_mixed_precision_within_tolerance(dtype, tolerance, tied_reference):
    strategy = FSDPStrategy(compute_dtype=dtype)
    results = spawn(strategy_worker, 2, strategy, StrategyConfig(), timeout=300)
    for result in results:
        assert all(p.dtype == torch.float32 for p in result.parameters.values())  # fp32 masters
        gap = _max_difference(result.parameters, tied_reference.parameters)
        assert 0 < gap < tolerance  # not exact: the compute really ran in 16 bits


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero_optimizers_resume_from_their_shards(strategy, tied_reference):
    results = spawn(zero_resume_worker, 3, strategy, StrategyConfig(), 2, timeout=300)
    for result in results:
        assert _max_difference(result.parameters, tied_reference.parameters) < 1e-6


def test_zero1_owners_are_torchs_sorted_greedy_split():
    """Our ZeRO-1 gives each tensor the owner torch's ZeroRedundancyOptimizer gives it: largest
    first, to the rank owning the fewest elements (before, in registration order)."""
    numels = [[3, 50, 7, 50, 1, 20], [9, 40, 2]]  # two groups: the running totals are shared
    for result in spawn(zero_owners_worker, 3, numels, timeout=120):
        assert result["ours"] == result["torch"]


def test_a_whole_tensor_split_is_uneven_when_one_tensor_is_large():
    """The busiest owner holds at least the largest tensor: GPT-7B's 206M-element embedding is
    about 2 times the mean share at 64 ranks and 8 at 256; equal small tensors split evenly."""
    from trainfast.transformer import Transformer, TransformerShape

    shape = TransformerShape.gpt_like(n_layers=32, d_model=4096, n_heads=32, seq_len=4096)
    with torch.device("meta"):
        numels = [p.numel() for p in Transformer(shape).parameters()]
    assert largest_share(numels, 8) < 1.01
    assert largest_share(numels, 64) == pytest.approx(64 * max(numels) / sum(numels))
    assert 1.9 < largest_share(numels, 64) < 2.0
    assert 7.8 < largest_share(numels, 256) < 8.0
    assert largest_share([10] * 64, 64) == 1.0


def test_zero_optimizer_is_a_torch_optimizer():
    assert issubclass(ZeroOptimizer, torch.optim.Optimizer)
    assert issubclass(Zero2Optimizer, torch.optim.Optimizer)


def test_zero_memory_matches_the_paper():
    # ZeRO paper, figure 1: 7.5B parameters, 64 GPUs, mixed-precision Adam (K = 12)
    gigabytes = [zero_memory(7.5e9, 64, stage).total / 1e9 for stage in range(4)]
    assert gigabytes == pytest.approx([120, 31.4, 16.6, 1.9], abs=0.05)
    with pytest.raises(ValueError, match="stage: 4"):
        zero_memory(1e9, 8, 4)


# ----------------------------------------------------------------------- tensor parallel
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_tensor_parallel_mlp_matches_dense(world_size):
    results = spawn(tensor_parallel_worker, world_size, 16, 42, 8, 3, timeout=120)  # 42 % 4 != 0
    for rank, pairs in enumerate(results):
        assert set(pairs) == {
            "output",
            "input grad",
            "fc1.weight grad",
            "fc1.bias grad",
            "fc2.weight grad",
            "fc2.bias grad",
        }
        for name, (parallel, dense) in pairs.items():
            torch.testing.assert_close(
                parallel, dense, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}"
            )
    hidden = sum(pairs["fc1.bias grad"][0].numel() for pairs in results)
    assert hidden == 42  # the shards cover the hidden layer exactly once


# ------------------------------------------------------------------------------ pipeline
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_pipeline_gradients_match_the_unsplit_model(world_size):
    base = PipelineConfig(width=32, layers_per_stage=2, batch_size=24, n_micro=4)
    configs = [replace(base, schedule=s, n_micro=m) for s in ("gpipe", "1f1b") for m in (1, 3, 4)]
    results = spawn(pipeline_sweep_worker, world_size, configs, timeout=300)
    for index, config in enumerate(configs):
        model = make_pipeline_model(config, world_size)
        x, y = pipeline_batch(config)
        (model(x) - y).pow(2).mean().backward()
        for stage in range(world_size):
            measured = results[stage][index]
            for name, p in model[stage].named_parameters():
                torch.testing.assert_close(measured.grads[name], p.grad, rtol=1e-5, atol=1e-7)
        expected = peak_activations(
            (gpipe_schedule if config.schedule == "gpipe" else one_f_one_b_schedule)(
                world_size, config.n_micro
            )
        )
        assert [results[s][index].peak_activations for s in range(world_size)] == expected


@pytest.mark.parametrize("world_size", [2, 4])
def test_interleaved_pipeline_gradients_match_the_unsplit_model(world_size):
    config = PipelineConfig(
        width=16,
        layers_per_stage=1,
        batch_size=24,
        n_micro=2 * world_size,
        schedule="interleaved",
        n_chunks=2,
    )
    config = replace(config, batch_size=config.n_micro * 3)
    results = spawn(pipeline_sweep_worker, world_size, [config], timeout=300)
    model = make_pipeline_model(config, 2 * world_size)  # virtual stage c p + r on rank r
    x, y = pipeline_batch(config)
    (model(x) - y).pow(2).mean().backward()
    for rank in range(world_size):
        measured = results[rank][0]
        for chunk in range(2):
            for name, p in model[chunk * world_size + rank].named_parameters():
                got = measured.grads[f"{chunk}.{name}"]
                torch.testing.assert_close(got, p.grad, rtol=1e-5, atol=1e-7)
    expected = peak_activations(interleaved_schedule(world_size, config.n_micro, 2))
    assert [results[r][0].peak_activations for r in range(world_size)] == expected


def test_interleaved_schedule_runs_each_forward_before_its_backward_and_shrinks_the_bubble():
    for p in (1, 2, 3, 4):
        for v in (1, 2, 3):
            for m in (p, 2 * p, 3 * p):
                schedule = interleaved_schedule(p, m, v)
                for ops in schedule:  # every (micro, chunk) once each way, F first
                    assert sorted(ops) == sorted(
                        [(k, i, c) for k in "FB" for i in range(m) for c in range(v)]
                    )
                    assert all(
                        ops.index(("F", i, c)) < ops.index(("B", i, c))
                        for i in range(m)
                        for c in range(v)
                    )
                for backward in (1.0, 2.0):  # a chunk is 1/v of a stage
                    slots = simulate(schedule, forward=1 / v, backward=backward / v)
                    ideal = m * (1 + backward)
                    bubble = (max(s.end for s in slots) - ideal) / ideal
                    assert bubble == pytest.approx((p - 1) / (v * m), abs=1e-12)
                    assert bubble == pytest.approx(bubble_fraction(p, m) * (m + p - 1) / (v * m))
                    done = {(s.kind, s.chunk * p + s.stage, s.micro): s for s in slots}
                    for (kind, stage, i), slot in done.items():  # dependencies respected
                        if kind == "F" and stage > 0:
                            assert done[("F", stage - 1, i)].end <= slot.start
                        if kind == "B" and stage < p * v - 1:
                            assert done[("B", stage + 1, i)].end <= slot.start
    # Korthikanti et al. 2022, Section 4.2.3: the first rank holds 1 + (p - 1) / (p v) times 1F1B's
    peak = peak_activations(interleaved_schedule(4, 8, 2))[0] / 2
    assert peak / peak_activations(one_f_one_b_schedule(4, 8))[0] == 1 + 3 / 8
    with pytest.raises(ValueError, match="Invalid n_micro: 6 .expected a multiple of n_stages, 4"):
        interleaved_schedule(4, 6, 2)


@pytest.mark.parametrize("backward", [1.0, 2.0])
def test_simulated_bubble_matches_the_formula(backward):
    for p in range(1, 6):
        for m in range(1, 10):
            for schedule in (gpipe_schedule(p, m), one_f_one_b_schedule(p, m)):
                slots = simulate(schedule, forward=1.0, backward=backward)
                makespan = max(s.end for s in slots)
                busy = sum(s.end - s.start for s in slots)
                assert 1 - busy / (p * makespan) == pytest.approx(bubble_fraction(p, m))


def test_1f1b_keeps_fewer_activations_than_gpipe():
    assert peak_activations(gpipe_schedule(4, 8)) == [8, 8, 8, 8]
    assert peak_activations(one_f_one_b_schedule(4, 8)) == [4, 3, 2, 1]
    with pytest.raises(ValueError, match="deadlocks"):
        simulate([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])


# ------------------------------------------------------------------ cost model and layout
def test_cost_model():
    link = Link(alpha=1e-5, beta=1e-9)
    # the textbook formulas (Thakur, Rabenseifner and Gropp 2005), term by term
    n, size = 8, 1e6
    assert all_reduce_time("naive", size, n, link) == pytest.approx(2 * 7 * (1e-5 + size * 1e-9))
    assert all_reduce_time("tree", size, n, link) == pytest.approx(2 * 3 * (1e-5 + size * 1e-9))
    assert all_reduce_time("ring", size, n, link) == pytest.approx(
        2 * 7 * 1e-5 + 2 * 7 / 8 * size * 1e-9
    )
    with_gamma = Link(alpha=1e-5, beta=1e-9, gamma=5e-10)
    assert all_reduce_time("ring", size, n, with_gamma) - all_reduce_time(
        "ring", size, n, link
    ) == pytest.approx(7 / 8 * size * 5e-10)
    for world in (2, 3, 4, 8, 64):  # the ring is never slower than reduce + broadcast
        for b in (4, 4096, 1e9):
            assert all_reduce_time("ring", b, world, link) <= all_reduce_time(
                "naive", b, world, link
            )
    assert all_reduce_time("tree", 4, 64, link) < all_reduce_time("ring", 4, 64, link)
    assert all_reduce_time("ring", 1e9, 64, link) < all_reduce_time("tree", 1e9, 64, link)
    for world in (4, 8, 64):  # the tree-ring crossover is where the two times meet
        n_star = crossover_bytes(world, link)
        assert all_reduce_time("tree", n_star, world, link) == pytest.approx(
            all_reduce_time("ring", n_star, world, link)
        )
    assert crossover_bytes(2, link) == 0
    assert reduce_scatter_time(size, n, link) + all_gather_time(size, n, link) == pytest.approx(
        all_reduce_time("ring", size, n, link)
    )
    rows = [
        {"algorithm": a, "world_size": n, "bytes": b, "seconds": all_reduce_time(a, b, n, link)}
        for a in ("naive", "ring")
        for n in (2, 3, 4)
        for b in (4, 4096, 2**22)
    ]
    fitted = fit_link(rows + [{"algorithm": "torch", "world_size": 2, "bytes": 4, "seconds": 1.0}])
    assert fitted.alpha == pytest.approx(link.alpha, rel=1e-6, abs=0)
    assert fitted.beta == pytest.approx(link.beta, rel=1e-6, abs=0)
    with pytest.raises(ValueError, match="algorithm: 'butterfly'"):
        all_reduce_time("butterfly", 4, 2, link)
    with pytest.raises(ValueError, match="alpha: -1"):
        Link(alpha=-1, beta=0)


def test_exercise_checks_accept_right_and_reject_wrong_answers(capsys):
    check_ring_chunks(ring_chunks)
    with pytest.raises(AssertionError, match="ring_chunks"):
        check_ring_chunks(lambda rank, step, n, phase: (rank, step))
    check_tree_all_reduce_time(lambda n, N, a, b: 2 * math.ceil(math.log2(N)) * (a + n * b))
    with pytest.raises(AssertionError, match="tree_all_reduce_time"):
        check_tree_all_reduce_time(lambda n, N, a, b: 2 * (N - 1) * (a + n * b))
    check_zero_memory(lambda n, N, s: zero_memory(n, N, s).total)
    with pytest.raises(AssertionError, match="zero_bytes_per_rank"):
        check_zero_memory(lambda n, N, s: 16 * n / N)
    check_peak_activations_1f1b(lambda p, m: [min(p - s, m) for s in range(p)])
    with pytest.raises(AssertionError, match="peak_activations_1f1b"):
        check_peak_activations_1f1b(lambda p, m: [m] * p)
    assert "FAILED" in capsys.readouterr().out


def right_broadcast(tensor, src):
    if dist.get_rank() == src:
        for other in range(dist.get_world_size()):
            if other != src:
                dist.send(tensor, other)
    else:
        dist.recv(tensor, src)


def root_only_broadcast(tensor, src):  # forgets to receive: ranks keep their own tensor
    pass


def right_all_reduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for other in range(1, world):
            dist.recv(incoming, other)
            tensor += incoming
    else:
        dist.send(tensor, 0)
    if rank == 0:  # self-contained: the check sends only this function's source to the ranks
        for other in range(1, world):
            dist.send(tensor, other)
    else:
        dist.recv(tensor, 0)


def reduce_only_all_reduce(tensor):  # forgets the broadcast: only rank 0 has the sum
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for other in range(1, world):
            dist.recv(incoming, other)
            tensor += incoming
    else:
        dist.send(tensor, 0)


def right_evaluation(model, dataset, rank, world_size):
    x, y = dataset[rank::world_size]
    counts = torch.tensor([(model(x).argmax(-1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    return counts.tolist()


def collective_broadcast(tensor, src):  # right result, but not from send and recv
    dist.broadcast(tensor, src)


def collective_all_reduce(tensor):  # right result, but not from send and recv
    torch.distributed.all_reduce(tensor)


def everything_everywhere_evaluation(model, dataset, rank, world_size):  # not distributed
    x, y = dataset[:]
    return [(model(x).argmax(-1) == y).sum().item(), len(y)]


def unreduced_evaluation(model, dataset, rank, world_size):  # forgets to sum over ranks
    x, y = dataset[rank::world_size]
    counts = torch.tensor([(model(x).argmax(-1) == y).sum().item(), len(y)])
    return counts.tolist()


def averaged_accuracy_evaluation(model, dataset, rank, world_size):  # the exercise's mistake
    x, y = dataset[rank::world_size]  # every world_size-th example
    accuracy = torch.tensor([(model(x).argmax(-1) == y).float().mean().item()])
    total = torch.tensor([len(y)])
    dist.all_reduce(accuracy)
    dist.all_reduce(total)
    return [round(accuracy.item() / world_size * total.item()), total.item()]


def averaged_block_accuracy_evaluation(model, dataset, rank, world_size):  # contiguous shares
    x, y = (t.tensor_split(world_size)[rank] for t in dataset[:])
    accuracy = torch.tensor([(model(x).argmax(-1) == y).float().mean().item()])
    total = torch.tensor([len(y)])
    dist.all_reduce(accuracy)
    dist.all_reduce(total)
    return [round(accuracy.item() / world_size * total.item()), total.item()]


@pytest.mark.parametrize(
    "check, right, wrong",
    [
        (check_broadcast, right_broadcast, root_only_broadcast),
        (check_all_reduce, right_all_reduce, reduce_only_all_reduce),
        (check_distributed_evaluation, right_evaluation, unreduced_evaluation),
        (check_distributed_evaluation, right_evaluation, averaged_accuracy_evaluation),
        (check_distributed_evaluation, right_evaluation, averaged_block_accuracy_evaluation),
        (check_broadcast, right_broadcast, collective_broadcast),
        (check_all_reduce, right_all_reduce, collective_all_reduce),
        (check_distributed_evaluation, right_evaluation, everything_everywhere_evaluation),
    ],
)
def test_distributed_exercise_checks(check, right, wrong, capsys):
    check(right)
    with pytest.raises(AssertionError, match="ranks"):
        check(wrong)
    assert "FAILED" in capsys.readouterr().out


# --------------------------------------------------------------- measurement and torchrun
def test_all_reduce_benchmark_record():
    from trainfast.distributed.measurements.all_reduce import all_reduce_record
    from trainfast.measure import BENCHMARKS, run_benchmark

    assert BENCHMARKS["all-reduce-time"] is all_reduce_record
    # asked for on a GPU when there is no GPU per rank (here none; on the first GPU pass, one),
    # the ranks are gloo processes on the CPU, and the record must say CPU, not the GPU's name
    asked = torch.device("cuda" if torch.cuda.device_count() < 2 else "cpu")
    record = run_benchmark("all-reduce-time", asked, quick=True)
    assert record.device == "cpu"
    assert {row["algorithm"] for row in record.rows} == {"naive", "ring", "torch"}
    assert {row["world_size"] for row in record.rows} == {2, 4}
    assert all(row["seconds"] > 0 and row["backend"] == "gloo" for row in record.rows)


def test_trainer_runs_unchanged_under_torchrun():
    steps = 4
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "trainfast.distributed.data_parallel",
        "--steps",
        str(steps),
    ]
    run = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    reference = train_single_process(DataParallelConfig(steps=steps))
    checksum = sum(float(p.double().sum()) for p in reference.parameters.values())
    line = next(line for line in run.stdout.splitlines() if line.startswith("2 ranks"))
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(checksum, abs=1e-4)


# ------------------------------------------------------------------------------ GPUs (NCCL)
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank (>= 2)")
def test_collectives_and_data_parallel_on_nccl():
    world_size = min(torch.cuda.device_count(), 4)
    cases = _cases(world_size)  # on NCCL the reference for "mean" is ReduceOp.AVG itself
    for rank_results in spawn(parity_worker, world_size, cases, 7, timeout=300):
        for case, (ours, theirs) in zip(cases, rank_results, strict=True):
            if case.collective == "reduce" and ours.numel() == 0:
                continue
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5, msg=str(case))
    config = DataParallelConfig(steps=4)
    reference = train_single_process(config)
    for result in spawn(train_data_parallel, world_size, config, "ddp", timeout=300):
        assert _max_difference(result.parameters, reference.parameters) < 1e-4
