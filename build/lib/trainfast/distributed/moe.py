"""Mixture of experts: a top-k router, its auxiliary losses, capacity, and expert parallelism.

A mixture-of-experts (MoE) layer replaces one MLP by ``E`` of them, the *experts*, and a
*router* that sends each token to ``k`` of them (Shazeer et al., 2017; GShard, Lepikhin et al.,
2020; Switch Transformer, Fedus et al., 2021). Parameters grow ``E``-fold; the compute per token
grows only ``k``-fold. The pieces, each a pure function here:

* :func:`route`: softmax over the router's logits, keep the ``k`` most probable experts. The
  gate of a chosen expert is its probability (not renormalised over the ``k``, as in Switch).
* :func:`load_balancing_loss`: Switch/GShard's ``E · Σ_i f_i P_i``, where ``f_i`` is the
  fraction of token assignments that chose expert ``i`` and ``P_i`` the mean router probability
  of ``i``. It is 1 when the load is uniform and grows as the router favours a few experts;
  only ``P`` carries a gradient.
* :func:`router_z_loss`: ST-MoE's (Zoph et al., 2022) mean of ``logsumexp(logits)²``, which
  keeps the logits small so the router's softmax stays numerically tame.
* :func:`capacity_mask`: an expert processes at most ``C = ceil(factor · tokens · k / E)``
  tokens; further assignments are *dropped* (the token gets nothing from that expert, and the
  residual connection around the layer carries it). First choices take precedence over second
  ones, then earlier tokens over later ones, as in GShard.

:class:`MoE` is the single-process layer. :class:`ExpertParallelMoE` shards its experts over
ranks: every rank routes its own tokens, an all-to-all sends each token to the rank that holds
its expert, the experts run, and a second all-to-all brings the results back (GShard's
"dispatch" and "combine"). Both all-to-alls are :func:`~trainfast.distributed.all_to_all`
from send/recv, wrapped in autograd (:func:`all_to_all_rows`; its backward is the reverse
exchange). Capacity is counted per rank, over that rank's tokens, as GShard's groups do, so
the expert-parallel layer computes exactly what :class:`MoE` computes on each rank's batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainfast.distributed.agreement import rank_and_world_size
from trainfast.distributed.collectives import all_to_all, ring_all_reduce
from trainfast.distributed.launch import rank_device
from trainfast.training.arguments import build_optimizer
from trainfast.validation import check_int, check_number

__all__ = [
    "ExpertParallelMoE",
    "MoE",
    "MoEConfig",
    "MoEOutput",
    "Routing",
    "all_to_all_rows",
    "capacity_mask",
    "expert_capacity",
    "expert_load_run",
    "expert_parallel_worker",
    "load_balancing_loss",
    "route",
    "router_z_loss",
]


@dataclass(frozen=True)
class MoEConfig:
    """Sizes and knobs of a mixture-of-experts layer.

    ``capacity_factor=None`` drops nothing (every expert takes every token sent to it).
    """

    d_model: int = 16
    d_hidden: int = 32
    n_experts: int = 4
    top_k: int = 2
    capacity_factor: float | None = 1.25

    def __post_init__(self) -> None:
        for name in ("d_model", "d_hidden", "n_experts"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("top_k", self.top_k, minimum=1, maximum=self.n_experts)
        if self.capacity_factor is not None:
            check_number("capacity_factor", self.capacity_factor, above=0.0)


@dataclass
class Routing:
    """Where each token goes: ``experts`` and ``gates`` (tokens, k), ``kept`` after capacity."""

    experts: Tensor  # (tokens, k) int64
    gates: Tensor  # (tokens, k) router probabilities of the chosen experts
    kept: Tensor  # (tokens, k) bool: False where the expert was full
    probs: Tensor  # (tokens, n_experts)


@dataclass
class MoEOutput:
    """The layer's output (tokens, d_model), its two auxiliary losses, and the routing."""

    output: Tensor
    aux_loss: Tensor
    z_loss: Tensor
    routing: Routing


def expert_capacity(
    n_tokens: int, n_experts: int, top_k: int, capacity_factor: float | None
) -> int:
    """Tokens an expert may take: ``ceil(factor · tokens · k / E)`` (all of them for ``None``)."""
    check_int("n_tokens", n_tokens, minimum=0)
    check_int("n_experts", n_experts, minimum=1)
    check_int("top_k", top_k, minimum=1, maximum=n_experts)
    if capacity_factor is not None:
        check_number("capacity_factor", capacity_factor, above=0.0)
    if capacity_factor is None:
        return n_tokens
    return math.ceil(capacity_factor * n_tokens * top_k / n_experts)


def capacity_mask(experts: Tensor, n_experts: int, capacity: int) -> Tensor:
    """``kept[t, j]``: whether assignment ``j`` of token ``t`` fits in its expert's capacity.

    Assignments are queued choice by choice (all first choices, in token order, then all second
    choices, ...); an expert accepts the first ``capacity`` in its queue.
    """
    by_choice = experts.t().reshape(-1)  # (k * tokens,): first choices first
    one_hot = F.one_hot(by_choice, n_experts)  # (k * tokens, E)
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=1) - 1  # place in its expert's queue
    return (position < capacity).reshape(experts.shape[1], -1).t()  # (tokens, k)


def load_balancing_loss(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """Switch/GShard's ``E · Σ_i f_i · P_i``: 1 for a uniform router, up to ``E`` for collapse."""
    fraction = F.one_hot(experts, n_experts).float().mean(dim=(0, 1))  # f_i, no gradient
    mean_prob = probs.mean(dim=0)  # P_i
    return n_experts * (fraction * mean_prob).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's router z-loss: ``mean over tokens of logsumexp(logits)²``."""
    return torch.logsumexp(logits, dim=-1).square().mean()


def route(logits: Tensor, top_k: int, capacity: int) -> Routing:
    """Top-``k`` routing of (tokens, E) logits with capacity ``capacity`` per expert."""
    probs = torch.softmax(logits, dim=-1)  # (tokens, E)
    gates, experts = probs.topk(top_k, dim=-1)  # (tokens, k) each
    return Routing(experts, gates, capacity_mask(experts, logits.shape[-1], capacity), probs)


def _expert(config: MoEConfig) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(config.d_model, config.d_hidden),
        nn.GELU(),
        nn.Linear(config.d_hidden, config.d_model),
    )


class MoE(nn.Module):
    """A mixture-of-experts MLP on one process: router, ``E`` expert MLPs, capacity."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(_expert(config) for _ in range(config.n_experts))

    def forward(self, x: Tensor) -> MoEOutput:  # x: (tokens, d_model)
        config = self.config
        logits = self.router(x)  # (tokens, E)
        capacity = expert_capacity(len(x), config.n_experts, config.top_k, config.capacity_factor)
        routing = route(logits, config.top_k, capacity)
        output = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, choice = torch.where((routing.experts == e) & routing.kept)
            if len(token):
                weighted = routing.gates[token, choice, None] * expert(x[token])
                output = output.index_add(0, token, weighted)
        aux = load_balancing_loss(routing.probs, routing.experts, config.n_experts)
        return MoEOutput(output, aux, router_z_loss(logits), routing)


class _AllToAllRows(torch.autograd.Function):
    """Rows of ``x`` in blocks of ``send_sizes`` to each rank; backward sends gradients back."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, send_sizes: list[int], recv_sizes: list[int]) -> Tensor:
        ctx.sizes = send_sizes, recv_sizes
        received = [x.new_empty(size, *x.shape[1:]) for size in recv_sizes]
        all_to_all(received, list(x.split(send_sizes)))
        return torch.cat(received)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        send_sizes, recv_sizes = ctx.sizes
        return _AllToAllRows.apply(grad.contiguous(), recv_sizes, send_sizes), None, None


def all_to_all_rows(x: Tensor, send_sizes: list[int], recv_sizes: list[int]) -> Tensor:
    """Differentiable all-to-all of rows: ``send_sizes[s]`` rows of ``x`` go to rank ``s``.

    Returns the rows received, ``recv_sizes[s]`` from rank ``s``, in rank order.
    """
    return _AllToAllRows.apply(x, send_sizes, recv_sizes)


def _exchange_counts(send_sizes: list[int], device: torch.device) -> list[int]:
    """How many rows each rank sends me, given how many I send each (an all-to-all of counts)."""
    _, world_size = rank_and_world_size()
    counts = [torch.tensor([size], device=device) for size in send_sizes]
    received = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(world_size)]
    all_to_all(received, counts)
    return [int(count) for count in received]


class ExpertParallelMoE(nn.Module):
    """:class:`MoE` with its experts sharded over ranks: rank ``r`` holds ``E / N`` of them.

    The router is replicated (its gradient is then averaged or summed like any data-parallel
    parameter); each rank passes its own tokens. ``E`` must be a multiple of the world size.
    """

    def __init__(self, config: MoEConfig, rank: int, world_size: int) -> None:
        super().__init__()
        if config.n_experts % world_size:
            raise ValueError(
                f"Invalid n_experts: {config.n_experts} "
                f"(must be a multiple of the world size {world_size})"
            )
        self.config, self.rank, self.world_size = config, rank, world_size
        self.per_rank = config.n_experts // world_size
        self.first = rank * self.per_rank  # global index of this rank's first expert
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(_expert(config) for _ in range(self.per_rank))

    @classmethod
    def from_dense(cls, moe: MoE, rank: int, world_size: int) -> ExpertParallelMoE:
        """Shard a :class:`MoE`: copy the router, keep this rank's experts."""
        layer = cls(moe.config, rank, world_size).to(moe.router.weight.device)
        layer.router.load_state_dict(moe.router.state_dict())
        for mine, theirs in zip(
            layer.experts, moe.experts[layer.first : layer.first + layer.per_rank], strict=True
        ):
            mine.load_state_dict(theirs.state_dict())
        return layer

    def forward(self, x: Tensor) -> MoEOutput:  # x: this rank's tokens, (tokens, d_model)
        config = self.config
        logits = self.router(x)
        capacity = expert_capacity(len(x), config.n_experts, config.top_k, config.capacity_factor)
        routing = route(logits, config.top_k, capacity)
        # the kept assignments, ordered by the rank that holds their expert
        token, choice = torch.where(routing.kept)
        expert = routing.experts[token, choice]
        order = torch.argsort(expert // self.per_rank, stable=True)
        token, choice, expert = token[order], choice[order], expert[order]
        send_sizes = torch.bincount(expert // self.per_rank, minlength=self.world_size).tolist()
        recv_sizes = _exchange_counts(send_sizes, x.device)

        # dispatch: tokens (and which of my experts they want) to the expert's rank
        inbox = all_to_all_rows(x[token], send_sizes, recv_sizes)  # (received, d_model)
        wanted = torch.empty(sum(recv_sizes), dtype=torch.int64, device=x.device)
        all_to_all(list(wanted.split(recv_sizes)), list((expert % self.per_rank).split(send_sizes)))
        processed = torch.zeros_like(inbox)
        for e, module in enumerate(self.experts):
            rows = torch.where(wanted == e)[0]
            if len(rows):
                processed = processed.index_copy(0, rows, module(inbox[rows]))
        # combine: results back to the tokens' ranks, weighted by the gates, summed per token
        returned = all_to_all_rows(processed, recv_sizes, send_sizes)  # same order as sent
        weighted = routing.gates[token, choice, None] * returned
        output = torch.zeros_like(x).index_add(0, token, weighted)
        aux = load_balancing_loss(routing.probs, routing.experts, config.n_experts)
        return MoEOutput(output, aux, router_z_loss(logits), routing)


def _moe_loss(result: MoEOutput, upstream: Tensor) -> Tensor:
    return (result.output * upstream).sum() + 0.01 * result.aux_loss + 0.001 * result.z_loss


def expert_parallel_worker(
    rank: int, world_size: int, config: MoEConfig, tokens: int = 24, seed: int = 0
) -> dict[str, tuple[Tensor, Tensor]]:
    """Expert-parallel MoE on this rank's tokens against :class:`MoE` on one process.

    Every rank builds the same dense layer and the same ``world_size`` batches; rank ``r``
    passes batch ``r`` through the sharded layer. The reference runs the dense layer on every
    batch and sums the losses (output·upstream + 0.01 aux + 0.001 z), which is what the ranks
    compute together. Returns ``name -> (expert parallel, reference)``: this rank's output and
    losses, the router's gradient summed over ranks, and this rank's experts' gradients.
    """
    device = rank_device()
    torch.manual_seed(seed)
    dense = MoE(config).to(device)
    batches = [torch.randn(tokens, config.d_model).to(device) for _ in range(world_size)]
    upstreams = [torch.randn(tokens, config.d_model).to(device) for _ in range(world_size)]
    sharded = ExpertParallelMoE.from_dense(dense, rank, world_size)

    reference = [dense(batch) for batch in batches]
    sum(_moe_loss(result, g) for result, g in zip(reference, upstreams, strict=True)).backward()
    ours = sharded(batches[rank])
    _moe_loss(ours, upstreams[rank]).backward()
    router_grad = sharded.router.weight.grad.clone()
    ring_all_reduce(router_grad)  # the router is data parallel: sum its gradient over ranks

    mine = reference[rank]
    pairs = {
        "output": (ours.output, mine.output),
        "aux loss": (ours.aux_loss, mine.aux_loss),
        "z loss": (ours.z_loss, mine.z_loss),
        "kept": (ours.routing.kept, mine.routing.kept),
        "router grad": (router_grad, dense.router.weight.grad),
    }
    for e, expert in enumerate(sharded.experts):
        theirs = dense.experts[sharded.first + e]
        for (name, p), q in zip(expert.named_parameters(), theirs.parameters(), strict=True):
            pairs[f"expert {sharded.first + e} {name} grad"] = (p.grad, q.grad)
    return {name: (a.detach().cpu(), b.detach().cpu()) for name, (a, b) in pairs.items()}


def expert_load_run(
    aux_loss_weight: float,
    steps: int = 100,
    tokens: int = 128,
    config: MoEConfig | None = None,
    seed: int = 0,
) -> Tensor:
    """Train a small MoE on a toy regression; return each step's load (steps, E) per expert.

    The load is the fraction of token assignments routed to each expert. The task: tokens from
    a mixture of Gaussian clusters, target a fixed random MLP of them, loss = MSE +
    ``aux_loss_weight`` · load-balancing loss. With weight 0 a few experts tend to take
    everything; the balancing loss spreads the tokens.
    """
    config = config or MoEConfig(
        d_model=16, d_hidden=32, n_experts=8, top_k=1, capacity_factor=None
    )
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    moe = MoE(config)
    teacher = _expert(config)
    centres = 3 * torch.randn(8, config.d_model, generator=generator)
    optimizer = build_optimizer("adam", moe.parameters(), lr=3e-3)
    loads = []
    for _ in range(steps):
        which = torch.randint(0, len(centres), (tokens,), generator=generator)
        x = centres[which] + torch.randn(tokens, config.d_model, generator=generator)
        with torch.no_grad():
            target = teacher(x)
        result = moe(x)
        loss = F.mse_loss(result.output, target) + aux_loss_weight * result.aux_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        counts = torch.bincount(result.routing.experts.reshape(-1), minlength=config.n_experts)
        loads.append(counts.float() / counts.sum())
    return torch.stack(loads)
