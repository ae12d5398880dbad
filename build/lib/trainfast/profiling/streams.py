"""Copy the next batch to the GPU while the current one computes: CUDA streams.

A GPU runs the work of one CUDA stream in order, and the work of different streams
concurrently where it can. Its copy engines move host memory to the device independently of
its compute units, so a host-to-device copy queued on a *side* stream can run while kernels
of the current stream compute. Three conditions, all from the "CUDA semantics" notes of
PyTorch's documentation:

* the host tensor is **pinned** (page-locked): a copy from pageable memory first goes through
  a staging buffer and returns only when the host side is done;
* the copy is **non-blocking** (``.to(device, non_blocking=True)``), so the host queues it and
  moves on;
* the streams are **ordered by hand** where they meet: the current stream waits for the side
  stream (``wait_stream``) before it uses the batch, and ``record_stream`` tells the caching
  allocator that the batch, allocated on the side stream, is used on the current one (else its
  memory could be handed out again while the current stream still reads it).

:class:`CudaPrefetcher` does exactly that; :func:`copy_compute_overlap` times a step with the
copy in line and with it prefetched, :func:`host_to_device_seconds` predicts the copy time and
:func:`prefetch_saving_seconds` how much of it the benchmark's prefetching can hide (at the
bandwidth a ``host-transfers`` record measured, :func:`pinned_bandwidth`). When not
to bother: when a batch is small (token ids: kilobytes) the copy is microseconds, far below a
step, and there is nothing to hide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from trainfast.gpus import GPUSpec
from trainfast.records import Record
from trainfast.timing import benchmark_side_by_side
from trainfast.validation import check_instance, check_int, check_positive_number

__all__ = [
    "CudaPrefetcher",
    "OverlapTiming",
    "copy_compute_overlap",
    "host_to_device_seconds",
    "pinned_bandwidth",
    "prefetch_saving_seconds",
]


def host_to_device_seconds(nbytes: int, gpu: GPUSpec, *, bytes_per_s: float | None = None) -> float:
    """Predicted seconds to copy ``nbytes`` from pinned host memory to ``gpu``.

    At ``bytes_per_s`` where given (a measured one-way bandwidth: :func:`pinned_bandwidth` of a
    ``host-transfers`` record); else at the datasheet's PCIe figure, which counts both
    directions together, so one copy gets half of it (as
    :func:`trainfast.kernels.benchmarks.host_transfer_prediction` does). A real copy runs
    slower than the datasheet's bandwidth, so the datasheet's time is the shortest a copy
    can take, not the time it takes.
    """
    check_int("nbytes", nbytes, minimum=0)
    check_instance("gpu", gpu, GPUSpec, hint="trainfast.gpus.GPUS holds one per GPU")
    if bytes_per_s is not None:
        check_positive_number("bytes_per_s", bytes_per_s)
        return nbytes / bytes_per_s
    return nbytes / (gpu.pcie_bytes_per_s / 2)


def prefetch_saving_seconds(
    nbytes: int, gpu: GPUSpec, steps: int, *, bytes_per_s: float | None = None
) -> float:
    """Predicted time per step that prefetching saves in :func:`copy_compute_overlap`.

    Each timed sample of ``steps`` steps builds a new :class:`CudaPrefetcher` on an idle GPU, so
    its first copy overlaps nothing; each of the other ``steps - 1`` copies can hide behind the
    previous step's compute, when that is at least as long. So ``(steps - 1) / steps`` of
    :func:`host_to_device_seconds`, at ``bytes_per_s`` where given. That is a bound only at the
    bandwidth the copy really runs at: at the datasheet's (the default) the copy is predicted
    shorter than it is, and a measured saving can exceed the prediction.
    """
    check_int("steps", steps, minimum=1)
    return (steps - 1) / steps * host_to_device_seconds(nbytes, gpu, bytes_per_s=bytes_per_s)


def pinned_bandwidth(record: Record) -> float:
    """Bytes per second a ``host-transfers`` record measured for a pinned host-to-device copy;
    ``ValueError`` naming the record if it has no such row."""
    for row in record.rows:
        if row.get("operation") == "host to device, pinned" and row.get("gb_per_s"):
            return float(row["gb_per_s"]) * 1e9
    raise ValueError(f"Record {record.name!r} has no 'host to device, pinned' row")


class CudaPrefetcher:
    """Iterate over device copies of ``batches``, each copied on a side stream one step ahead.

    ``batches`` yields pinned host tensors (``torch.Tensor.pin_memory``, or a DataLoader
    with ``pin_memory=True``). While the caller computes on batch ``i``, batch ``i + 1`` is
    already on its way. The pattern of NVIDIA's Apex ``data_prefetcher`` and of PyTorch's CUDA
    semantics notes on streams.
    """

    def __init__(self, batches: Iterable[torch.Tensor], device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"CudaPrefetcher needs a CUDA device, got {device}")
        self._batches = iter(batches)
        self._device = device
        self._stream = torch.cuda.Stream(device)
        self._next = self._copy_next()

    def _copy_next(self) -> torch.Tensor | None:
        host = next(self._batches, None)
        if host is None:
            return None
        if not host.is_pinned():
            raise ValueError("CudaPrefetcher needs pinned host batches (call .pin_memory())")
        with torch.cuda.stream(self._stream):  # queued on the side stream; returns at once
            return host.to(self._device, non_blocking=True)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        if self._next is None:
            raise StopIteration
        current = torch.cuda.current_stream(self._device)
        current.wait_stream(self._stream)  # compute on this batch starts after its copy
        batch = self._next
        batch.record_stream(current)  # its memory is in use on `current` too
        self._next = self._copy_next()  # the next copy overlaps the caller's compute
        return batch


@dataclass(frozen=True)
class OverlapTiming:
    """One way of feeding the GPU, timed: median and spread of a step, in milliseconds."""

    mode: str
    step_ms: float
    iqr_ms: float
    speedup: float  # over the first mode's median


def copy_compute_overlap(
    device: torch.device,
    *,
    batch_shape: tuple[int, int] = (8192, 1024),
    layers: int = 8,
    steps: int = 8,
    repeats: int = 7,
    compute: Callable[[torch.Tensor, list[torch.Tensor]], torch.Tensor] | None = None,
) -> list[OverlapTiming]:
    """Time ``steps`` steps of copy-then-compute three ways, side by side.

    A step copies one float32 batch of ``batch_shape`` to the GPU and runs ``layers`` matmuls
    with tanh on it (``compute(x, weights)`` replaces that). The modes: ``pageable, in line``
    (``.to(device)`` from ordinary memory), ``pinned, in line`` (pinned and non-blocking, but on
    the same stream, so the copy still waits for the previous step's compute) and ``pinned,
    prefetched`` (:class:`CudaPrefetcher`: the next copy overlaps this step's compute). Each
    sample runs all ``steps``; ``step_ms`` is per step. GPU only: ``ValueError`` elsewhere.
    """
    if device.type != "cuda":
        raise ValueError(f"copy_compute_overlap needs a CUDA device, got {device}")
    if steps < 2 or layers < 1:
        raise ValueError(f"Invalid steps/layers: {steps}/{layers} (need steps >= 2, layers >= 1)")
    tokens, width = batch_shape
    generator = torch.Generator().manual_seed(0)
    pageable = [torch.randn(tokens, width, generator=generator) for _ in range(steps)]
    pinned = [batch.pin_memory() for batch in pageable]
    weights = [
        (torch.randn(width, width, generator=generator) / width**0.5).to(device)
        for _ in range(layers)
    ]

    def matmuls(x: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
        for weight in weights:
            x = torch.tanh(x @ weight)
        return x

    step = compute or matmuls

    def in_line(batches: list[torch.Tensor], non_blocking: bool) -> None:
        for host in batches:
            step(host.to(device, non_blocking=non_blocking), weights)

    def prefetched() -> None:
        for batch in CudaPrefetcher(pinned, device):
            step(batch, weights)

    timings = benchmark_side_by_side(
        {
            "pageable, in line": lambda: in_line(pageable, non_blocking=False),
            "pinned, in line": lambda: in_line(pinned, non_blocking=True),
            "pinned, prefetched": prefetched,
        },
        warmup=2,
        repeats=repeats,
        device=device,
    )
    first = next(iter(timings.values())).median
    return [
        OverlapTiming(
            mode=mode,
            step_ms=timing.median / steps * 1e3,
            iqr_ms=timing.iqr / steps * 1e3,
            speedup=first / timing.median,
        )
        for mode, timing in timings.items()
    ]
