"""PyTorch's CUDA caching allocator: its rounding rules, and snapshots of what it did.

``cudaMalloc`` and ``cudaFree`` are slow and synchronise the device, so PyTorch asks CUDA for
large *segments* and carves them into *blocks* itself, keeping freed blocks cached for the next
request of a similar size. Hence two numbers: ``torch.cuda.memory_allocated()`` (bytes in
blocks that tensors use) and ``torch.cuda.memory_reserved()`` (bytes in segments held from
CUDA). The gap is the cache, plus *fragmentation*: free pieces too small, or in the wrong
place, for the next request. ``torch.cuda.empty_cache()`` returns unused segments to CUDA
(for other processes; it does not make this process's memory go further).

The rules, from ``c10/cuda/CUDACachingAllocator.cpp`` (``round_size``, ``get_allocation_size``
and ``should_split`` there; the constants are in ``c10/core/AllocatorConfig.h`` in recent
versions, where 20 MiB is the default of ``large_segment_size_mb``), are
:func:`rounded_bytes`, :func:`segment_bytes`, :func:`cached_block_use` and :func:`block_bytes`:

* every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``);
* requests up to 1 MiB (``kSmallSize``) come from 2 MiB segments of a *small* pool, larger ones
  from the *large* pool; when no cached block fits, a request under 10 MiB (``kMinLargeAlloc``)
  gets a 20 MiB segment (``kLargeBuffer``), a larger one a segment of its own, rounded up to
  2 MiB (``kRoundLarge``);
* a request takes the smallest cached block of its pool (and stream) that is large enough:
  *best fit*, with no upper limit by default. :func:`cached_block_use` says what it occupies:
  the block is *split* only if the rest is worth keeping (at least 512 bytes in the small pool,
  more than 1 MiB in the large one); otherwise the request takes the whole block. A new segment
  is such a block too, so a request of its own segment takes all of it when at most 1 MiB would
  be left: 50,000,000 bytes occupy the whole 48 MiB segment (:func:`block_bytes`);
* ``max_split_size_mb`` (``PYTORCH_CUDA_ALLOC_CONF``; unlimited by default) stops that for big
  blocks: a block at least that large is never split and serves only requests at least that
  large and within 20 MiB of its size (``max_non_split_rounding_mb``).

With ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` the allocator instead maps more
physical memory into one growing virtual segment per stream, which removes most of the
fragmentation that varying tensor sizes cause.

:func:`record_snapshot` records the allocator's history with
``torch.cuda.memory._record_memory_history`` (a private but documented debugging API) while a
workload runs, and keeps a small JSON-friendly copy (:func:`trim_snapshot`) for the book's
records; :func:`segment_summary` renders it with ``torch.cuda._memory_viz`` and
:func:`plot_memory_timeline` draws allocated and reserved memory over the recorded events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainfast.records import Record, make_record
from trainfast.validation import check_choice, check_counts, check_int

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "MIN_SPLIT_SETTING_BYTES",
    "allocator_rounding_record",
    "allocator_snapshot_record",
    "block_bytes",
    "cached_block_use",
    "memory_timeline",
    "plot_memory_timeline",
    "record_snapshot",
    "rounded_bytes",
    "segment_bytes",
    "segment_summary",
    "trim_snapshot",
]

K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 << 20  # largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 << 20  # "small" allocations are packed in 2 MiB segments
K_MIN_LARGE_ALLOC = 10 << 20  # allocations between 1 and 10 MiB may use a 20 MiB segment
K_LARGE_BUFFER = 20 << 20  # the segment for them
K_ROUND_LARGE = 2 << 20  # larger allocations are rounded up to 2 MiB
#: the least ``max_split_size_mb`` and ``max_non_split_rounding_mb`` PyTorch accepts (kLargeBuffer)
MIN_SPLIT_SETTING_BYTES = K_LARGE_BUFFER


def rounded_bytes(nbytes: int) -> int:
    """A request of ``nbytes`` rounded up to a multiple of 512 bytes (``round_size``), the least
    block it can occupy (0 for an empty tensor)."""
    check_int("nbytes", nbytes, minimum=0)
    if nbytes == 0:
        return 0
    return K_MIN_BLOCK_SIZE * -(-nbytes // K_MIN_BLOCK_SIZE)


def _pool(size: int) -> str:
    """The pool a request of ``size`` rounded bytes comes from (``get_pool``)."""
    return "small" if size <= K_SMALL_SIZE else "large"


def block_bytes(nbytes: int) -> int:
    """The block a request of ``nbytes`` occupies when no cached block fits it, with the default
    settings: what ``torch.cuda.memory_allocated()`` grows by on an empty cache.

    The request gets a new segment (:func:`segment_bytes`) and splits it as it would a cached
    block (:func:`cached_block_use`): it occupies :func:`rounded_bytes`, unless the rest of a
    large-pool segment would be 1 MiB or less, when it occupies the whole segment (50,000,000
    bytes: 48 MiB, not 50,000,384 bytes). 0 for an empty tensor.
    """
    size = rounded_bytes(nbytes)
    if size == 0:
        return 0
    return cached_block_use(nbytes, segment_bytes(nbytes), pool=_pool(size))


def segment_bytes(nbytes: int) -> int:
    """The segment ``cudaMalloc``'d when no cached block fits a request of ``nbytes``.

    This is what ``torch.cuda.memory_reserved()`` grows by when the cache is empty.
    """
    size = rounded_bytes(nbytes)
    if size == 0:
        return 0
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-size // K_ROUND_LARGE)


def cached_block_use(
    nbytes: int,
    free_block_bytes: int,
    *,
    pool: str,
    max_split_size_bytes: int | None = None,
    max_non_split_rounding_bytes: int = K_LARGE_BUFFER,
) -> int | None:
    """The bytes a request of ``nbytes`` occupies when served from a cached free block, or None
    if that block cannot serve it (``get_free_block`` and ``should_split`` in
    ``CUDACachingAllocator.cpp``).

    ``pool`` is the block's pool (``"small"``: blocks of 2 MiB segments, ``"large"``: the rest);
    a request uses only the pool of its own size. If the block is split, the request occupies
    its rounded size (:func:`rounded_bytes`) and the rest stays free; if not, the whole block.
    ``max_split_size_bytes`` is ``max_split_size_mb`` in bytes (None: unlimited, the default)
    and ``max_non_split_rounding_bytes`` ``max_non_split_rounding_mb`` in bytes. PyTorch refuses
    either below 20 MiB (``parseMaxSplitSize`` and ``parseMaxNonSplitRoundingSize`` in
    ``c10/core/AllocatorConfig.cpp``: "CachingAllocator option max_split_size_mb too small, must
    be >= 20"), so this raises ``ValueError`` for them too: a prediction for a setting that no
    process can have would describe nothing.
    """
    check_choice("pool", pool, ("small", "large"))
    check_counts(nbytes=nbytes, free_block_bytes=free_block_bytes)
    check_counts(max_non_split_rounding_bytes=max_non_split_rounding_bytes)
    if max_split_size_bytes is not None:
        check_int("max_split_size_bytes", max_split_size_bytes, minimum=1)
    for name, value in (
        ("max_split_size_mb", max_split_size_bytes),
        ("max_non_split_rounding_mb", max_non_split_rounding_bytes),
    ):
        if value is not None and value < MIN_SPLIT_SETTING_BYTES:
            raise ValueError(
                f"Invalid {name}: {value / 2**20:g} MiB ({value:,} bytes); PyTorch requires at "
                f"least {MIN_SPLIT_SETTING_BYTES >> 20} MiB"
            )
    size = rounded_bytes(nbytes)
    if _pool(size) != pool or free_block_bytes < size:
        return None
    limit = max_split_size_bytes if max_split_size_bytes is not None else float("inf")
    if size < limit <= free_block_bytes:  # do not hand an oversized block to a smaller request
        return None
    if size >= limit and free_block_bytes >= size + max_non_split_rounding_bytes:
        return None
    remaining = free_block_bytes - size
    split = (
        remaining >= K_MIN_BLOCK_SIZE
        if pool == "small"
        else (size < limit and remaining > K_SMALL_SIZE)
    )
    return size if split else free_block_bytes


# --- snapshots ---------------------------------------------------------------------------------


def _frames(frames: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    python = [f for f in frames if f.get("filename", "").endswith(".py")]
    kept = []
    for f in python[:keep]:
        file = f["filename"].split("/")[-1]
        kept.append({"filename": file, "line": f["line"], "name": f["name"]})
    return kept


#: What :func:`trim_snapshot` keeps of each segment (besides its blocks).
_SEGMENT_KEYS = (
    "device",
    "address",
    "total_size",
    "stream",
    "segment_type",
    "allocated_size",
    "active_size",
)


def trim_snapshot(snapshot: dict[str, Any], *, keep_frames: int = 1) -> dict[str, Any]:
    """A small copy of ``torch.cuda.memory._snapshot()``'s result that ``_memory_viz`` still reads.

    Keeps every segment with its blocks and every trace event, with at most ``keep_frames``
    Python frames each (file name without its directory, line, function): the full stacks are
    most of a snapshot's size. Plain dicts, lists, ints and strings: it serialises to JSON.
    """
    segments = []
    for seg in snapshot.get("segments", []):
        blocks = []
        for b in seg["blocks"]:
            block = {
                "address": b.get("address", 0),
                "size": b["size"],
                "requested_size": b.get("requested_size", b["size"]),
                "state": b["state"],
                "frames": _frames(b.get("frames", []), keep_frames),
            }
            blocks.append(block)
        segment = {key: seg[key] for key in _SEGMENT_KEYS if key in seg}
        segments.append(segment | {"blocks": blocks})
    traces = []
    for device in snapshot.get("device_traces", []):
        events = []
        for e in device:
            event = {
                "action": e["action"],
                "addr": e["addr"],
                "size": e["size"],
                "stream": e.get("stream", 0),
                "time_us": e.get("time_us", 0),
                "frames": _frames(e.get("frames", []), keep_frames),
            }
            events.append(event)
        traces.append(events)
    return {"segments": segments, "device_traces": traces}


def record_snapshot(
    workload: Callable[[], object], *, device: torch.device, max_entries: int = 20_000
) -> dict[str, Any]:
    """Run ``workload()`` while the allocator records its history; return the trimmed snapshot.

    The snapshot is taken while ``workload``'s return value (e.g. the model and optimizer) is
    still alive, so its blocks show as allocated. CUDA only (``ValueError`` otherwise). History
    recording has a cost: do not time inside it.
    """
    if device.type != "cuda":
        raise ValueError(f"The caching allocator's snapshots need a CUDA device, got {device}")
    from torch.cuda import memory

    memory._record_memory_history(max_entries=max_entries)
    try:
        alive = workload()
        torch.cuda.synchronize(device)
        snapshot = memory._snapshot()
        del alive
    finally:
        memory._record_memory_history(enabled=None)
    return trim_snapshot(snapshot)


def segment_summary(snapshot: dict[str, Any]) -> str:
    """``torch.cuda._memory_viz.segsum``: each segment drawn as a row of characters, with its free
    memory split into *internal* (rounding inside blocks) and *external* (gaps between blocks)."""
    from torch.cuda import _memory_viz

    return _memory_viz.segsum(snapshot)


def memory_timeline(snapshot: dict[str, Any], device_index: int = 0) -> dict[str, list[int]]:
    """Allocated and reserved bytes after each recorded event, counted from the recording's start.

    Allocations are ``alloc`` events (their rounded block size) minus ``free_completed``;
    reserved memory is ``segment_alloc``/``segment_map`` minus ``segment_free``/``segment_unmap``.
    Memory allocated before recording began is not in the trace.
    """
    allocated = reserved = 0
    timeline: dict[str, list[int]] = {"event": [], "allocated": [], "reserved": []}
    traces = snapshot.get("device_traces", [])
    for i, event in enumerate(traces[device_index] if device_index < len(traces) else []):
        action, size = event["action"], event["size"]
        if action == "alloc":
            allocated += size
        elif action == "free_completed":
            allocated -= size
        elif action in ("segment_alloc", "segment_map"):
            reserved += size
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
        else:
            continue
        timeline["event"].append(i)
        timeline["allocated"].append(allocated)
        timeline["reserved"].append(reserved)
    return timeline


def plot_memory_timeline(snapshot: dict[str, Any], *, ax: Any = None, title: str = "") -> Any:
    """Draw :func:`memory_timeline` (MiB against event number); returns the matplotlib axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4))
    timeline = memory_timeline(snapshot)
    mib = 1 << 20
    events = timeline["event"]
    reserved = [b / mib for b in timeline["reserved"]]
    allocated = [b / mib for b in timeline["allocated"]]
    ax.step(events, reserved, where="post", label="reserved (segments from cudaMalloc)")
    ax.step(events, allocated, where="post", label="allocated (blocks in use by tensors)")
    ax.set(
        xlabel="allocator event (number in the recorded trace)",
        ylabel="memory (MiB)",
        title=title or "The caching allocator during the workload",
    )
    ax.legend()
    return ax


# --- measurements (python -m trainfast.measure) -------------------------------------------------

_REQUESTS = [
    *(1, 511, 512, 513, 100_000),  # small requests, around the 512-byte rounding
    *(1 << 20, (1 << 20) + 1, 5 << 20),  # either side of the small pool's 1 MiB
    *((10 << 20) - 1, 10 << 20, (10 << 20) + 1, 50_000_000),  # either side of 10 MiB, and beyond
]


def allocator_rounding_record(device: torch.device, quick: bool) -> Record:
    """Each request size with the block and segment the rules predict and, on CUDA, measured.

    On CUDA, each request is made on a stream of its own (the allocator keeps separate pools per
    stream, so no cached block of other work can serve it) after ``empty_cache``, so
    ``memory_reserved`` grows by exactly the new segment. On other devices the measured columns
    are None: there is no caching allocator to ask.
    """
    rows = []
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    for nbytes in _REQUESTS:
        row: dict[str, Any] = {
            "requested_bytes": nbytes,
            "predicted_block_bytes": block_bytes(nbytes),
            "predicted_segment_bytes": segment_bytes(nbytes),
            "allocated_bytes": None,
            "reserved_bytes": None,
        }
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            allocated, reserved = (
                torch.cuda.memory_allocated(device),
                torch.cuda.memory_reserved(device),
            )
            with torch.cuda.stream(stream):
                tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
            row["allocated_bytes"] = torch.cuda.memory_allocated(device) - allocated
            row["reserved_bytes"] = torch.cuda.memory_reserved(device) - reserved
            del tensor
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
        rows.append(row)
    measured = "measured on the device" if device.type == "cuda" else "not measured: no CUDA device"
    return make_record(
        "caching-allocator",
        f"Bytes allocated and reserved for one request, predicted by the caching allocator's "
        f"rounding rules and {measured}.",
        rows,
        units={c: "bytes" for c in rows[0] if c.endswith("_bytes")},
        device=device,
    )


def _variable_batch_workload(device: torch.device, steps: int, width: int) -> Callable[[], object]:
    """Train a 3-layer MLP with Adam on batches of varying size: activations of changing sizes.

    The workload returns the model and optimizer, so that a snapshot sees them allocated."""

    def run() -> object:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width),
            torch.nn.GELU(),
            torch.nn.Linear(4 * width, width),
            torch.nn.GELU(),
            torch.nn.Linear(width, width),
        ).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for step in range(steps):
            batch = 1024 + 384 * (step % 3) + 128 * step  # 1024, 1536, 2048, 1408, ...
            x = torch.randn(batch, width, device=device)
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return model, optimizer

    return run


def allocator_snapshot_record(device: torch.device, quick: bool) -> Record:
    """A snapshot of the caching allocator during a few training steps, with and without
    expandable segments; on CUDA only (elsewhere the record says that nothing was recorded).

    Each row: the setting, peak allocated and reserved bytes, the reserved bytes left unused at
    the peak, and the trimmed snapshot (a dict; ``None`` off CUDA).
    """
    steps, width = (3, 256) if quick else (6, 1024)
    rows = []
    settings = [False, True] if device.type == "cuda" else [False]
    for expandable in settings:
        row: dict[str, Any] = {
            "expandable_segments": expandable,
            "peak_allocated_bytes": None,
            "peak_reserved_bytes": None,
            "unused_reserved_at_peak": None,
            "snapshot": None,
        }
        if device.type == "cuda":
            _set_expandable_segments(expandable)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            snapshot = record_snapshot(
                _variable_batch_workload(device, steps, width), device=device
            )
            stats = torch.cuda.memory_stats(device)
            row["peak_allocated_bytes"] = stats["allocated_bytes.all.peak"]
            row["peak_reserved_bytes"] = stats["reserved_bytes.all.peak"]
            row["unused_reserved_at_peak"] = (
                row["peak_reserved_bytes"] - row["peak_allocated_bytes"]
            )
            row["snapshot"] = snapshot
        rows.append(row)
    if device.type == "cuda":
        _set_expandable_segments(False)
        torch.cuda.empty_cache()
        what = (
            f"{steps} Adam steps of a {width}-wide MLP on batches of varying size, recorded "
            "with torch.cuda.memory._record_memory_history (frames trimmed to one)."
        )
    else:
        what = "Nothing recorded: the caching allocator exists on CUDA devices only."
    units = {c: "bytes" for c in rows[0] if c.endswith(("_bytes", "_at_peak"))}
    return make_record("allocator-snapshot", what, rows, units=units, device=device)


def _set_expandable_segments(enabled: bool) -> None:
    """Switch ``expandable_segments`` in this process (a private setter; the public way is the
    ``PYTORCH_CUDA_ALLOC_CONF`` environment variable, read at the first CUDA allocation).

    ``torch._C._accelerator_setAllocatorSettings`` where torch has it (2.11 and 2.14 do, and
    there ``torch.cuda.memory._set_allocator_settings`` only calls it, with a ``FutureWarning``),
    else the older ``torch.cuda.memory._set_allocator_settings``."""
    setting = f"expandable_segments:{'True' if enabled else 'False'}"
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or getattr(
        torch.cuda.memory, "_set_allocator_settings", None
    )
    if setter is None:  # pragma: no cover - torch without the setter
        raise ValueError(f"This torch ({torch.__version__}) cannot change {setting} at run time")
    setter(setting)
