"""The parallelism chapter's advanced half: all-to-all, experts, sequence and context parallelism.

Every distributed check runs real gloo processes through ``trainfast.distributed.spawn`` and
compares with one process (or with ``torch.distributed``); several cases share one launch.
"""

from __future__ import annotations

import pytest
import torch
from trainfast.distributed import SpawnError, spawn
from trainfast.distributed.context_parallel import ring_attention_worker, ring_block_kind
from trainfast.distributed.exchange_parity import all_to_all_sizes, exchange_parity_worker

WORLD_SIZES = [1, 2, 3, 4]


# ---------------------------------------------------------------------------- collectives
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gather_scatter_all_to_all_match_torch(world_size):
    lengths = [1, 7, 2 * world_size + 1]
    results = spawn(exchange_parity_worker, world_size, lengths, 11, timeout=120)
    for rank, rank_results in enumerate(results):
        names = set(rank_results)
        assert {f"all_to_all n={n}" for n in lengths} <= names
        assert {f"scatter n={n} root={r}" for n in lengths for r in range(world_size)} <= names
        assert (f"gather n=7 root={rank}" in names) and (
            world_size == 1 or f"gather n=7 root={(rank + 1) % world_size}" not in names
        )
        for name, (ours, theirs) in rank_results.items():
            assert ours.shape == theirs.shape and torch.equal(ours, theirs), f"rank {rank}, {name}"


def test_all_to_all_blocks_are_uneven_and_some_empty():
    sizes = [[all_to_all_sizes(s, r, 7) for r in range(4)] for s in range(4)]
    assert len({size for row in sizes for size in row}) > 2
    assert min(size for row in sizes for size in row) == 0


# ---------------------------------------------------------------------- context parallelism
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_attention_matches_full_attention(world_size):
    results = spawn(ring_attention_worker, world_size, (2, 3, 24, 8), world_size, timeout=120)
    for rank, pairs in enumerate(results):
        assert len(pairs) == 8  # output, dq, dk, dv for causal and not
        for name, (ours, theirs) in pairs.items():
            assert ours.shape == (2, 3, 24 // world_size, 8), name
            torch.testing.assert_close(
                ours, theirs, rtol=1e-10, atol=1e-12, msg=f"rank {rank} {name}"
            )


def test_ring_attention_causal_schedule_skips_future_blocks():
    for world_size in (1, 2, 4):
        for rank in range(world_size):
            kinds = [ring_block_kind(rank, s, world_size, True) for s in range(world_size)]
            assert kinds.count("diagonal") == 1 and kinds.count("full") == rank
            assert all(
                ring_block_kind(rank, s, world_size, False) == "full" for s in range(world_size)
            )


def test_ring_attention_rejects_uneven_sequence():
    with pytest.raises(SpawnError, match=r"Invalid seq: 10"):
        spawn(ring_attention_worker, 3, (1, 1, 10, 4), timeout=60)
