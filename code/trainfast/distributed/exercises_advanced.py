"""Checks for the exercises of the parallelism chapter's second half (experts, rings of keys).

Each check runs the reader's function beside the package's reference on a set of cases, prints
one line per case through :func:`trainfast.checks.report`, and raises ``AssertionError`` naming
the first case that differs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from trainfast.checks import Case, report
from trainfast.distributed.context_parallel import ring_block_kind
from trainfast.distributed.moe import capacity_mask

__all__ = ["check_capacity_mask", "check_causal_ring_work"]


def check_capacity_mask(mask: Callable[[Tensor, int, int], Tensor]) -> None:
    """Check ``mask(experts, n_experts, capacity)``: which (token, choice) assignments fit.

    ``experts`` is (tokens, k); first choices queue before second ones, earlier tokens before
    later ones, and each expert takes the first ``capacity`` in its queue.
    """
    results: list[Case] = []
    generator = torch.Generator().manual_seed(0)
    for tokens, n_experts, k, capacity in [
        (4, 3, 2, 2),
        (8, 4, 1, 2),
        (16, 4, 2, 5),
        (12, 8, 2, 3),
        (6, 2, 1, 6),
    ]:
        experts = torch.stack(
            [torch.randperm(n_experts, generator=generator)[:k] for _ in range(tokens)]
        )
        expected = capacity_mask(experts, n_experts, capacity)
        got = mask(experts.clone(), n_experts, capacity)
        case = f"{tokens} tokens, {n_experts} experts, top-{k}, capacity {capacity}: {int((~expected).sum())} dropped"
        if not isinstance(got, Tensor) or got.shape != expected.shape:
            problem = f"got {got!r}, expected a bool tensor of shape {tuple(expected.shape)}"
        else:
            wrong = (got.bool() != expected).nonzero().tolist()
            problem = None if not wrong else f"wrong at (token, choice) {wrong[0]}"
        results.append((case, problem))
    report(results)


def check_causal_ring_work(work: Callable[[int, int], int]) -> None:
    """Check ``work(rank, world_size)``: key blocks rank ``rank`` attends to in causal ring attention."""
    results: list[Case] = []
    for world_size in (1, 2, 4, 8):
        for rank in sorted({0, world_size // 2, world_size - 1}):
            kinds = [ring_block_kind(rank, step, world_size, True) for step in range(world_size)]
            expected = sum(kind != "skip" for kind in kinds)
            got = work(rank, world_size)
            case = f"rank {rank} of {world_size}: {expected} blocks"
            results.append((case, None if got == expected else f"got {got!r}"))
    report(results)
