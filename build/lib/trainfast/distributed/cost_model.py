"""The latency-bandwidth (alpha-beta) cost model of collectives, and a fit of it to timings.

Sending ``n`` bytes over one link takes ``alpha + n * beta`` (Hockney, 1994): ``alpha`` seconds
of latency per message (software, synchronisation, the wire's delay) and ``beta`` seconds per
byte (the inverse of the bandwidth). Every rank has its own link, which sends one message and
receives one at a time; reducing costs ``gamma`` seconds per byte (zero unless given). For ``N``
ranks and an ``n``-byte tensor the standard costs (Thakur, Rabenseifner and Gropp, 2005,
"Optimization of Collective Communication Operations in MPICH") are:

* flat ("naive": reduce to rank 0, then broadcast from it). The root's link takes the ``N - 1``
  messages one after another, then sends ``N - 1``: ``T = 2 (N - 1)(alpha + n beta) + (N - 1) n
  gamma``.
* binomial tree: ``ceil(log2 N)`` rounds up and as many down, a whole tensor per round:
  ``T = 2 ceil(log2 N)(alpha + n beta) + ceil(log2 N) n gamma``.
* ring: a reduce-scatter and an all-gather of ``N - 1`` steps each, ``n / N`` bytes per step,
  all links busy at once: ``T = 2 (N - 1) alpha + 2 ((N - 1) / N) n beta + ((N - 1) / N) n gamma``.

The ring's bandwidth term tends to ``2 n beta`` however many ranks join (it is optimal); its
latency term grows linearly, the tree's only logarithmically. So small tensors go up a tree and
large ones round a ring; NCCL's choices by size include rings and a pipelined double binary tree.
Rabenseifner's algorithm (in Thakur et al.) reaches the ring's bandwidth term with ``2 log2 N``
latencies. The ring all-reduce is Patarasuk and Yuan's (2009, "Bandwidth optimal all-reduce
algorithms for clusters of workstations"). The
flat algorithm is never better than the ring in this model: the same latencies, ``N`` times the
bytes through the root.

The ring's halves on their own (``reduce_scatter_time``, ``all_gather_time``) cost half the ring
all-reduce each; they are what ZeRO and FSDP pay (:mod:`trainfast.distributed.layout` uses them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from trainfast.validation import check_choice, check_instance, check_int, check_number

__all__ = [
    "ALGORITHMS",
    "INFINIBAND_NDR",
    "Link",
    "NVLINK4",
    "all_gather_time",
    "all_reduce_time",
    "bytes_sent_per_rank",
    "crossover_bytes",
    "fit_link",
    "reduce_scatter_time",
]

#: The all-reduce algorithms the model knows ("naive" is the flat reduce + broadcast).
ALGORITHMS = ("naive", "tree", "ring")


@dataclass(frozen=True)
class Link:
    """A link's cost: ``alpha`` s per message, ``beta`` s per byte, ``gamma`` s per byte reduced."""

    alpha: float  # latency, s
    beta: float  # inverse bandwidth, s/byte
    gamma: float = 0.0  # reduction, s/byte

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "gamma"):
            check_number(name, getattr(self, name), minimum=0.0)

    @property
    def bandwidth(self) -> float:
        """Bytes per second (``1 / beta``)."""
        return float("inf") if self.beta == 0 else 1.0 / self.beta


#: NVLink 4 (H100 SXM): 900 GB/s per GPU in both directions together, 450 GB/s each way
#: (NVIDIA H100 Tensor Core GPU datasheet). The latency is an assumption of a few microseconds
#: for one NCCL step, not a datasheet figure.
NVLINK4 = Link(alpha=5e-6, beta=1 / 450e9)
#: InfiniBand NDR: 400 Gb/s = 50 GB/s per port and direction, one port per GPU (NVIDIA
#: ConnectX-7 / Quantum-2 product briefs). Latency assumed ~10 us per NCCL step across nodes.
INFINIBAND_NDR = Link(alpha=10e-6, beta=1 / 50e9)


def _check(algorithm: str, world_size: int, n_bytes: float = 0.0, link: Link | None = None) -> None:
    """The arguments of every cost here: a known algorithm, ranks, a size and a :class:`Link`."""
    check_choice("algorithm", algorithm, ALGORITHMS)
    check_int("world_size", world_size, minimum=1)
    check_number("n_bytes", n_bytes, minimum=0.0)
    if link is not None:
        check_instance("link", link, Link)


def _terms(algorithm: str, n_bytes: float, world_size: int) -> tuple[float, float, float]:
    """(number of alphas, bytes times beta, bytes times gamma) in one all-reduce."""
    _check(algorithm, world_size, n_bytes)
    n = world_size
    if n == 1:
        return 0.0, 0.0, 0.0
    if algorithm == "naive":
        return 2.0 * (n - 1), 2.0 * (n - 1) * n_bytes, (n - 1) * n_bytes
    if algorithm == "tree":
        levels = math.ceil(math.log2(n))
        return 2.0 * levels, 2.0 * levels * n_bytes, levels * n_bytes
    return 2.0 * (n - 1), 2.0 * (n - 1) * n_bytes / n, (n - 1) * n_bytes / n


def all_reduce_time(algorithm: str, n_bytes: float, world_size: int, link: Link) -> float:
    """Predicted seconds for one all-reduce of ``n_bytes`` over ``world_size`` ranks."""
    _check(algorithm, world_size, n_bytes, link)
    latencies, volume, reduced = _terms(algorithm, n_bytes, world_size)
    return latencies * link.alpha + volume * link.beta + reduced * link.gamma


def reduce_scatter_time(n_bytes: float, world_size: int, link: Link) -> float:
    """Ring reduce-scatter of ``n_bytes``: ``(N-1) alpha + ((N-1)/N) n (beta + gamma)``."""
    _check("ring", world_size, n_bytes, link)
    n = world_size
    return (n - 1) * link.alpha + (n - 1) / n * n_bytes * (link.beta + link.gamma)


def all_gather_time(n_bytes: float, world_size: int, link: Link) -> float:
    """Ring all-gather into an ``n_bytes`` tensor: ``(N-1) alpha + ((N-1)/N) n beta``."""
    _check("ring", world_size, n_bytes, link)
    n = world_size
    return (n - 1) * link.alpha + (n - 1) / n * n_bytes * link.beta


def bytes_sent_per_rank(algorithm: str, n_bytes: float, world_size: int) -> float:
    """Bytes the busiest rank sends: ``(N-1) n`` (naive's root), ``ceil(log2 N) n`` (tree's
    root, one tensor per level down) or ``2 (N-1) n / N`` (ring, every rank)."""
    _check(algorithm, world_size, n_bytes)
    n = world_size
    if algorithm == "naive":
        return (n - 1) * n_bytes
    if algorithm == "tree":
        return math.ceil(math.log2(n)) * n_bytes if n > 1 else 0.0
    return 2 * (n - 1) * n_bytes / n


def crossover_bytes(world_size: int, link: Link) -> float:
    """Tensor size above which the ring beats the binomial tree in this model.

    With ``L = ceil(log2 N)``, equating the two times gives
    ``n* = (N - 1 - L) alpha / ((L - (N - 1) / N) beta + (L - (N - 1) / N) gamma / 2)``. For
    ``N = 2`` the two send as many messages and the ring fewer bytes, so ``n* = 0``.
    """
    n = check_int("world_size", world_size, minimum=2)  # a crossover needs two ranks
    check_instance("link", link, Link)
    levels = math.ceil(math.log2(n))
    extra_bytes = levels - (n - 1) / n  # per byte of tensor, the tree's extra beta (x2) and gamma
    return max(0.0, (n - 1 - levels) * link.alpha) / (extra_bytes * (link.beta + link.gamma / 2))


def fit_link(rows: Iterable[Mapping[str, float | int | str]]) -> Link:
    """Least-squares ``alpha`` and ``beta`` (``gamma`` folded into ``beta``) from timings.

    ``rows`` have ``algorithm`` (naive, tree or ring; others are ignored), ``world_size``,
    ``bytes`` and ``seconds``. Each row gives one equation ``seconds = a * alpha + b * beta``;
    dividing it by ``seconds`` fits relative error, so microsecond and second timings count alike.
    """
    equations, targets = [], []
    for row in rows:
        if row["algorithm"] not in ALGORITHMS or int(row["world_size"]) < 2:
            continue
        latencies, volume, _ = _terms(
            str(row["algorithm"]), float(row["bytes"]), int(row["world_size"])
        )
        seconds = float(row["seconds"])
        equations.append([latencies / seconds, volume / seconds])
        targets.append(1.0)
    if len(equations) < 2:
        raise ValueError(
            f"fit_link needs at least 2 naive, tree or ring rows with world_size >= 2, "
            f"got {len(equations)}"
        )
    (alpha, beta), *_ = np.linalg.lstsq(np.array(equations), np.array(targets), rcond=None)
    return Link(alpha=max(float(alpha), 0.0), beta=max(float(beta), 0.0))
