"""Checks for the profiling chapter's exercises.

Each check runs the reader's function on several cases, compares it with what the package (or
PyTorch itself) says is right, prints one line per case through :func:`trainfast.checks.report`
and raises ``AssertionError`` naming the first case that failed.

1. :func:`check_bottleneck`: read an operator table: which operator costs the most *self* time?
2. :func:`check_no_graph_break`: rewrite a function so that ``torch.compile`` captures it whole.
3. :func:`check_bucketing`: pad inputs to a few shapes so that a compiled function stops
   recompiling.
4. :func:`check_fewer_dispatches`: do the work of a Python loop of small operations in a
   handful of operations.
5. :func:`check_find_sync`: find, in a trace, the part of a step that makes the host wait for
   the device.
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
from collections.abc import Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainfast.checks import Case, report
from trainfast.profiling.compilation import CountingBackend
from trainfast.profiling.traces import StepProfile, profile_steps
from trainfast.validation import plural

__all__ = [
    "SYNC_STEP_PARTS",
    "check_bottleneck",
    "check_bucketing",
    "check_fewer_dispatches",
    "check_find_sync",
    "check_no_graph_break",
    "clip_by_norm_with_break",
    "count_dispatches",
    "planted_sync_step",
]


# --- 1. reading an operator table ------------------------------------------------------------


def _workloads() -> dict[str, Callable[[], object]]:
    """Four small steps, each dominated by a different kind of operator.

    In the fourth, a named range (``record_function``) around a pure-Python loop holds more self
    time than any operator, as ``forward`` does in the chapter's profile: an answer that does
    not keep to ``aten::`` rows returns the range.
    """
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(256, 256, generator=generator)
    v = torch.randn(2**20, generator=generator)
    s = torch.randn(64, 4096, generator=generator)

    def python_loop_in_a_range() -> object:
        with torch.profiler.record_function("python loop"):
            total = sum(i * i for i in range(200_000))  # host time in no operator
            return torch.full((8,), float(total)).sin()

    return {
        "matmuls": lambda: [a @ a for _ in range(4)],
        "cumulative sums": lambda: [v.cumsum(0) for _ in range(4)],
        "sorts": lambda: [s.sort(dim=1) for _ in range(4)],
        "a Python loop in a named range": python_loop_in_a_range,
    }


def _reference_bottleneck(profile: StepProfile) -> str:
    operators = [row for row in profile.operators if row.name.startswith("aten::")]
    return max(operators, key=lambda row: row.self_cpu_s).name


def _shuffled(profile: StepProfile, expected: str, seed: int) -> StepProfile:
    """``profile`` with its rows in a random order (seeded) in which ``expected`` is neither the
    first nor the last ``aten::`` row. ``profile_steps`` sorts the rows by self CPU time, so
    an answer that reads the order, or a column that is zero on a CPU (``max`` of zeros returns
    the first row), would otherwise pass: the answer must read the times."""
    rows = list(profile.operators)
    for attempt in range(100):
        random.Random(seed + attempt).shuffle(rows)
        names = [row.name for row in rows if row.name.startswith("aten::")]
        if len(names) < 3 or expected not in (names[0], names[-1]):
            break
    return dataclasses.replace(profile, operators=rows)


def check_bottleneck(find_bottleneck: Callable[[StepProfile], str]) -> None:
    """Check ``find_bottleneck(profile) -> name``: the ``aten::`` operator with most self CPU time.

    Profiles four small steps (matmuls, cumulative sums, sorts, and a Python loop inside a
    named range, which is not an operator) with
    :func:`~trainfast.profiling.profile_steps` and compares the answer with the table's. The
    reader's function gets the rows shuffled (:func:`_shuffled`), so that it must read the self
    CPU times: the table's order, or the self device times (all zero on a CPU), are not enough.
    """
    results: list[Case] = []
    with tempfile.TemporaryDirectory() as out_dir:
        for seed, (name, step) in enumerate(_workloads().items()):
            profile = profile_steps(step, wait=0, warmup=1, active=2, out_dir=out_dir)
            expected = _reference_bottleneck(profile)
            answer = find_bottleneck(_shuffled(profile, expected, seed))
            problem = (
                None if answer == expected else f"answered {answer!r}, the table says {expected!r}"
            )
            results.append((f"a step of {name}", problem))
    report(results)


# --- 2. graph breaks -------------------------------------------------------------------------


def clip_by_norm_with_break(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale ``x`` down to norm ``max_norm`` if it is longer; ``.item()`` breaks the graph."""
    norm = x.norm()
    if norm.item() > max_norm:  # the host needs the value: Dynamo splits the graph here
        x = x * (max_norm / norm)
    return x


def check_no_graph_break(clip: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
    """Check ``clip(x, max_norm)``: same values as :func:`clip_by_norm_with_break`, one graph.

    Uses ``torch._dynamo.explain``, which traces the function the way ``torch.compile`` does
    and reports how many graphs it took and why each break happened.
    """
    results: list[Case] = []
    generator = torch.Generator().manual_seed(0)
    for scale, max_norm in [(0.1, 1.0), (10.0, 1.0), (3.0, 50.0)]:
        x = torch.randn(100, generator=generator) * scale
        case = f"norm {x.norm().item():.2f}, max_norm {max_norm}"
        got, expected = clip(x.clone(), max_norm), clip_by_norm_with_break(x.clone(), max_norm)
        problem = None
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
            problem = f"values differ by up to {(got - expected).abs().max().item():.2e}"
        results.append((case, problem))
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(clip)(torch.randn(100, generator=generator), 1.0)
    problem = None
    if explanation.graph_break_count:
        reasons = "; ".join(str(r.reason).splitlines()[0] for r in explanation.break_reasons)
        problem = f"{plural(explanation.graph_break_count, 'graph break')}: {reasons}"
    results.append(("torch.compile captures it as one graph", problem))
    report(results)


# --- 3. recompiles ---------------------------------------------------------------------------


def _embed_and_pool(tokens: torch.Tensor) -> torch.Tensor:
    """A stand-in for a model: a fixed embedding of the token ids, averaged."""
    return torch.sin(tokens.float()[:, None] * torch.arange(1, 9)).mean(dim=0)


def check_bucketing(
    pad_to_bucket: Callable[[torch.Tensor, Sequence[int]], torch.Tensor],
    buckets: Sequence[int] = (16, 32, 64),
) -> None:
    """Check ``pad_to_bucket(tokens, buckets)``: pad a 1-D sequence with zeros to the smallest
    bucket that holds it, so a compiled model sees ``len(buckets)`` shapes, not one per length.

    Feeds every length from 1 to ``max(buckets)`` through ``torch.compile`` (static shapes,
    :class:`~trainfast.profiling.compilation.CountingBackend`) and counts the compiles.
    """
    results: list[Case] = []
    bad_shapes = []
    for length in range(1, max(buckets) + 1):
        tokens = torch.arange(1, length + 1)
        padded = pad_to_bucket(tokens, buckets)
        size = min(b for b in buckets if b >= length)
        if (
            padded.shape != (size,)
            or not torch.equal(padded[:length], tokens)
            or padded[length:].any()
        ):
            bad_shapes.append(length)
    problem = None if not bad_shapes else f"wrong padding for lengths {bad_shapes[:5]}"
    results.append(
        (f"lengths 1..{max(buckets)} padded with zeros to buckets {list(buckets)}", problem)
    )
    torch._dynamo.reset()  # forget graphs compiled by earlier attempts
    counter = CountingBackend()
    model = torch.compile(_embed_and_pool, backend=counter, dynamic=False)
    for length in range(1, max(buckets) + 1):
        model(pad_to_bucket(torch.arange(1, length + 1), buckets))
    problem = None
    if counter.compiles > len(buckets):
        problem = f"{counter.compiles} compiles for {len(buckets)} buckets"
    results.append((f"at most {len(buckets)} compiles", problem))
    report(results)


# --- 4. the overhead regime ------------------------------------------------------------------


class _DispatchCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def count_dispatches(fn: Callable[[], object]) -> list[str]:
    """The ATen operators ``fn()`` dispatches, in order (each is at least one kernel launch)."""
    with _DispatchCounter() as counter:
        fn()
    return counter.ops


def check_fewer_dispatches(
    scale_all: Callable[[list[torch.Tensor], list[float]], list[torch.Tensor]],
    n_tensors: int = 64,
    max_ops: int = 4,
) -> None:
    """Check ``scale_all(tensors, factors)``: returns ``[t * f for t, f in ...]`` in at most
    ``max_ops`` ATen operations for ``n_tensors`` tensors of different shapes (the loop takes
    ``n_tensors``)."""
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(1 + i % 5, 3 + i % 7, generator=generator) for i in range(n_tensors)]
    factors = [0.5 + 0.01 * i for i in range(n_tensors)]
    expected = [t * f for t, f in zip(tensors, factors, strict=True)]
    result: list[list[torch.Tensor]] = []
    ops = count_dispatches(lambda: result.append(scale_all(tensors, factors)))
    (got,) = result
    problem = None
    if len(got) != n_tensors or any(
        g.shape != e.shape or not torch.allclose(g, e) for g, e in zip(got, expected, strict=False)
    ):
        problem = "the results differ from t * f"
    results: list[Case] = [(f"{n_tensors} tensors scaled correctly", problem)]
    problem = None if len(ops) <= max_ops else f"{len(ops)} operations, e.g. {ops[:3]}"
    results.append((f"at most {max_ops} ATen operations", problem))
    report(results)


# --- 5. a hidden synchronisation -------------------------------------------------------------

#: The named parts of every step :func:`planted_sync_step` builds.
SYNC_STEP_PARTS = ("prepare", "compute", "log")

#: Ways the planted step reads a value from the device, each a synchronisation on a GPU.
_SYNCS: dict[str, Callable[[torch.Tensor], object]] = {
    ".item()": lambda x: x.sum().item(),
    "boolean-mask indexing": lambda x: x[x > 0],
    "if tensor:": lambda x: bool(x.sum() > 0),
}


def planted_sync_step(
    part: str, how: str, device: torch.device | str = "cpu"
) -> Callable[[], None]:
    """A step of three named parts (:data:`SYNC_STEP_PARTS`), with a host-device sync planted in
    ``part``: ``how`` is ``".item()"``, ``"boolean-mask indexing"`` or ``"if tensor:"``.

    Every part does some matrix products, ``compute`` the most, so the part with the most time
    is not necessarily the one with the sync; on a GPU the sync is where the host waits.
    """
    from trainfast.profiling.traces import annotate

    if part not in SYNC_STEP_PARTS:
        raise ValueError(f"Invalid part: {part!r} (one of {SYNC_STEP_PARTS})")
    if how not in _SYNCS:
        raise ValueError(f"Invalid how: {how!r} (one of {sorted(_SYNCS)})")
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(128, 128, generator=generator).to(device)
    work = {"prepare": 2, "compute": 6, "log": 1}  # matrix products per part

    def step() -> None:
        for name in SYNC_STEP_PARTS:
            with annotate(name):
                x = a
                for _ in range(work[name]):
                    x = torch.tanh(x @ a)
                if name == part:
                    _SYNCS[how](x)

    return step


def check_find_sync(
    find_sync: Callable[[StepProfile], str], device: torch.device | str = "cpu"
) -> None:
    """Check ``find_sync(profile) -> part``: the named part of a profiled step (one of
    :data:`SYNC_STEP_PARTS`) in which the host waits for the device.

    Profiles :func:`planted_sync_step` with the sync planted in each part in turn, by each of
    three ways of reading a device value, and compares the answer with the part it was planted
    in.
    """
    results: list[Case] = []
    cases = [
        ("log", ".item()"),
        ("prepare", "boolean-mask indexing"),
        ("compute", "if tensor:"),
        ("prepare", ".item()"),
    ]
    with tempfile.TemporaryDirectory() as out_dir:
        for part, how in cases:
            profile = profile_steps(
                planted_sync_step(part, how, device),
                wait=0,
                warmup=1,
                active=1,
                out_dir=out_dir,
                device=device,
            )
            answer = find_sync(profile)
            problem = None if answer == part else f"answered {answer!r}"
            results.append((f"{how} planted in {part!r}", problem))
    report(results)
