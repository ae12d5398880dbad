"""The latency-bandwidth (alpha-beta) cost model of an all-reduce, and a fit of it to timings.

Sending ``n`` bytes over one link takes ``alpha + n * beta``: ``alpha`` seconds of latency per
message (software, synchronisation, the wire's delay) and ``beta`` seconds per byte (the inverse
of the bandwidth). A link carries one message at a time, and reducing arithmetic is free (the
``gamma`` term of Thakur, Rabenseifner and Gropp, 2005, is left out). For ``N`` ranks and an
``n``-byte tensor, with our two algorithms (:mod:`trainfast.distributed.collectives`):

* naive (reduce to rank 0, then broadcast): rank 0 receives ``N - 1`` tensors at once, then sends
  ``N - 1``; each phase costs one latency but ``(N - 1) n`` bytes through its link:
  ``T = 2 alpha + 2 (N - 1) n beta``.
* ring: ``2 (N - 1)`` steps, each sending ``n / N`` bytes to the next rank, all links busy at once:
  ``T = 2 (N - 1) alpha + 2 (N - 1) (n / N) beta``.

The ring's bandwidth term barely grows with ``N`` (it tends to ``2 n beta``), the naive one grows
linearly, so large tensors go round the ring; its latency term grows with ``N``, so small ones do
not. Real libraries switch algorithm by size for exactly that reason (NCCL's trees, for one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ALGORITHMS",
    "Link",
    "all_reduce_time",
    "bytes_sent_per_rank",
    "crossover_bytes",
    "fit_link",
]

#: The all-reduce algorithms the model knows.
ALGORITHMS = ("naive", "ring")


@dataclass(frozen=True)
class Link:
    """One link's cost: ``alpha`` seconds per message plus ``beta`` seconds per byte."""

    alpha: float  # latency, s
    beta: float  # inverse bandwidth, s/byte

    @property
    def bandwidth(self) -> float:
        """Bytes per second (``1 / beta``)."""
        return float("inf") if self.beta == 0 else 1.0 / self.beta


def _check(algorithm: str, world_size: int) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"Unknown algorithm: {algorithm!r} (expected one of {ALGORITHMS})")
    if world_size < 1:
        raise ValueError(f"Invalid world_size: {world_size!r} (expected >= 1)")


def _terms(algorithm: str, n_bytes: float, world_size: int) -> tuple[float, float]:
    """(number of alphas, number of bytes times beta) in the time of one all-reduce."""
    _check(algorithm, world_size)
    n = world_size
    if n == 1:
        return 0.0, 0.0
    if algorithm == "naive":
        return 2.0, 2.0 * (n - 1) * n_bytes
    return 2.0 * (n - 1), 2.0 * (n - 1) * n_bytes / n


def all_reduce_time(algorithm: str, n_bytes: float, world_size: int, link: Link) -> float:
    """Predicted seconds for one all-reduce of ``n_bytes`` over ``world_size`` ranks."""
    latencies, volume = _terms(algorithm, n_bytes, world_size)
    return latencies * link.alpha + volume * link.beta


def bytes_sent_per_rank(algorithm: str, n_bytes: float, world_size: int) -> float:
    """Bytes the busiest rank sends: ``(N - 1) n`` for naive (rank 0), ``2 (N - 1) n / N`` for ring."""
    _check(algorithm, world_size)
    n = world_size
    return (n - 1) * n_bytes if algorithm == "naive" else 2 * (n - 1) * n_bytes / n


def crossover_bytes(world_size: int, link: Link) -> float:
    """Tensor size above which the ring beats the naive all-reduce in this model.

    Equating the two times gives ``n* = N (N - 2) alpha / ((N - 1)^2 beta)``; for ``N = 2`` the
    ring is never slower (``n* = 0``).
    """
    n = world_size
    if n < 2:
        raise ValueError(f"Invalid world_size: {world_size!r} (a crossover needs >= 2 ranks)")
    return n * (n - 2) * link.alpha / ((n - 1) ** 2 * link.beta)


def fit_link(rows: Iterable[Mapping[str, float | int | str]]) -> Link:
    """Least-squares ``alpha`` and ``beta`` from measured all-reduce times.

    ``rows`` have ``algorithm`` (naive or ring; others are ignored), ``world_size``, ``bytes``
    and ``seconds``. Each row gives one equation ``seconds = a * alpha + b * beta``; dividing
    it by ``seconds`` fits relative error, so microsecond and second timings count alike.
    """
    equations, targets = [], []
    for row in rows:
        if row["algorithm"] not in ALGORITHMS or int(row["world_size"]) < 2:
            continue
        latencies, volume = _terms(
            str(row["algorithm"]), float(row["bytes"]), int(row["world_size"])
        )
        seconds = float(row["seconds"])
        equations.append([latencies / seconds, volume / seconds])
        targets.append(1.0)
    if len(equations) < 2:
        raise ValueError(
            f"fit_link needs at least 2 naive or ring rows with world_size >= 2, got {len(equations)}"
        )
    (alpha, beta), *_ = np.linalg.lstsq(np.array(equations), np.array(targets), rcond=None)
    return Link(alpha=max(float(alpha), 0.0), beta=max(float(beta), 0.0))
