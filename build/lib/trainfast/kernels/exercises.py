"""Checks for the exercises of the chapter "Where time and memory go".

Each check runs the reader's function beside the package's reference on a set of cases, prints
one line per case through :func:`trainfast.checks.report`, and raises ``AssertionError`` naming
the first case that differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from trainfast.checks import Case, report
from trainfast.kernels.allocator import segment_bytes
from trainfast.kernels.roofline import matmul_cost
from trainfast.kernels.softmax import merge_softmax_stats, softmax_stats

__all__ = [
    "check_causal_key_tiles",
    "check_matmul_intensity",
    "check_segment_bytes",
    "check_softmax_merge",
    "check_triton_axpb",
    "visible_key_tiles",
]


def check_matmul_intensity(intensity: Callable[[int, int, int, int], float]) -> None:
    """Check ``intensity(m, k, n, element_bytes)``: FLOPs per byte of an ``(m, k) @ (k, n)``
    product that reads A and B once and writes C once."""
    results: list[Case] = []
    shapes = [  # (m, k, n, element_bytes)
        (4096, 4096, 4096, 2),
        (4096, 4096, 4096, 4),
        (1, 4096, 4096, 2),
        (8192, 128, 8192, 2),
        (16, 16, 16, 4),
    ]
    for m, k, n, element_bytes in shapes:
        expected = matmul_cost(m, k, n, element_bytes=element_bytes).intensity
        got = intensity(m, k, n, element_bytes)
        case = f"({m}, {k}) @ ({k}, {n}), {element_bytes}-byte elements: {expected:.2f} FLOPs/byte"
        problem = None if math.isclose(got, expected, rel_tol=1e-9) else f"got {got!r}"
        results.append((case, problem))
    report(results)


def check_softmax_merge(
    merge: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]],
) -> None:
    """Check ``merge(max_a, sum_a, max_b, sum_b) -> (max, sum)``, the online-softmax step.

    Cases: two halves of random rows, parts whose maxima differ by a thousand (a naive ``exp``
    overflows), an empty part, ``(-inf, 0)``, which must leave the other unchanged, and two empty
    parts (as for a row whose keys so far are all masked), which must give ``(-inf, 0)``, not NaN
    (``-inf - -inf`` is NaN without a guard).
    """
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, generator=generator, dtype=torch.float64)
    no_max = torch.full((6,), float("-inf"), dtype=torch.float64)
    empty = (no_max, torch.zeros(6, dtype=torch.float64))
    cases = {
        "two halves of random rows": (softmax_stats(x[:, :20]), softmax_stats(x[:, 20:])),
        "maxima 1000 apart": (softmax_stats(x[:, :20] + 1000), softmax_stats(x[:, 20:])),
        "the first part empty": (empty, softmax_stats(x)),
        "the second part empty": (softmax_stats(x), empty),
        "both parts empty": (empty, empty),
    }
    results: list[Case] = []
    for case, (a, b) in cases.items():
        expected = merge_softmax_stats(*a, *b)
        try:
            got = merge(*a, *b)
        except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
            results.append((case, f"raised {error!r}"))
            continue
        problem = None
        for name, value, reference in zip(("max", "sum"), got, expected, strict=True):
            if not torch.allclose(value, reference, rtol=1e-9, atol=0, equal_nan=False):
                problem = (
                    f"{name} differs: {value.tolist()[:3]} ... "
                    f"expected {reference.tolist()[:3]} ..."
                )
                break
        results.append((case, problem))
    report(results)


@contextmanager
def _watched_loads(allowed: list[Tensor]) -> Iterator[list[int] | None]:
    """Count, while the block runs, the elements Triton's interpreter loads outside ``allowed``.

    Yields a list that receives one count per load with lanes outside every allowed tensor, or
    None where loads cannot be watched: a compiled kernel (on a GPU a read past the end of an
    allocation neither faults nor shows in the output reliably; ``compute-sanitizer`` finds it),
    or an interpreter without ``InterpreterBuilder.create_masked_load`` (Triton 3.0 to 3.8 have
    it). Every ``tl.load`` of an interpreted kernel passes through that method, an unmasked one
    with a mask of all lanes, with the host addresses of its lanes: CPU tensors are used in place.
    """
    from trainfast.kernels.triton_runtime import interpreting

    try:
        from triton.runtime.interpreter import InterpreterBuilder
    except ImportError:
        InterpreterBuilder = None  # noqa: N806 - Triton's class name
    original = getattr(InterpreterBuilder, "create_masked_load", None)
    if not interpreting() or original is None:
        yield None
        return
    ranges = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in allowed]
    outside: list[int] = []

    def watched(self: object, ptrs: object, mask: object, other: object, *args: object) -> object:
        import numpy as np

        addresses = np.asarray(ptrs.data, dtype=np.uint64)  # type: ignore[attr-defined]
        enabled = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)  # type: ignore[attr-defined]
        size = ptrs.get_element_ty().primitive_bitwidth // 8  # type: ignore[attr-defined]
        inside = np.zeros(addresses.shape, dtype=bool)
        for start, end in ranges:
            inside |= (addresses >= start) & (addresses + size <= end)
        count = int((enabled & ~inside).sum())
        if count:
            outside.append(count)
        return original(self, ptrs, mask, other, *args)

    InterpreterBuilder.create_masked_load = watched  # type: ignore[method-assign]
    try:
        yield outside
    finally:
        InterpreterBuilder.create_masked_load = original  # type: ignore[method-assign]


def check_triton_axpb(axpb: Callable[[Tensor, float, float, Tensor], object]) -> None:
    """Check ``axpb(x, a, b, out)``: it must write ``a * x + b`` into ``out``, nothing past it,
    and read nothing past the end of ``x``.

    The exercise asks for a Triton kernel, but the check sees only what lands in ``out``, the
    memory after it, and (interpreted, on a CPU) the addresses the kernel loads: a PyTorch
    expression that writes the right values passes too. Sizes that are not multiples of any
    block size (the mask), one element, float16 and float32. ``x`` and ``out`` are the first
    ``n`` elements of larger buffers, so a kernel that forgets a mask reads and writes memory
    that exists (instead of corrupting the process): a store past ``out`` shows in the buffer
    after it, and a load past ``x`` in the interpreter's addresses (:func:`_watched_loads`). A
    value loaded past the end and then dropped by a masked store leaves no other trace, so
    without the interpreter (a compiled kernel) a missing load mask goes unseen, and the check
    says so.
    """
    from trainfast.device import pick_device

    device = pick_device()
    guard = 8192  # elements past the end: more than any block a kernel is likely to use
    results: list[Case] = []
    sizes = [
        (1, torch.float32),
        (1000, torch.float32),
        (4097, torch.float32),
        (3000, torch.float16),
    ]
    watched = True
    for n, dtype in sizes:
        case = f"{n} elements of {dtype}"
        x = torch.randn(n + guard, generator=torch.Generator().manual_seed(n)).to(device, dtype)[:n]
        buffer = torch.full((n + guard,), float("nan"), device=device, dtype=dtype)
        out = buffer[:n]
        expected = (2.5 * x.float() - 1.0).to(dtype)
        with _watched_loads([x, out]) as outside:
            try:
                axpb(x, 2.5, -1.0, out)
            except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
                results.append((case, f"raised {type(error).__name__}: {str(error)[:120]}"))
                continue
        watched = watched and outside is not None
        written_past_end = int((~torch.isnan(buffer[n:])).sum())
        worst = (out.float() - expected.float()).abs().nan_to_num(float("inf")).max().item()
        if written_past_end:
            problem = f"wrote {written_past_end} values past the end of out (a missing mask?)"
        elif outside:
            problem = f"read {sum(outside)} values past the end of x (a load without a mask?)"
        elif not torch.allclose(out.float(), expected.float(), rtol=1e-3, atol=1e-3):
            problem = f"differs by up to {worst:.3g}"
        else:
            problem = None
        results.append((case, problem))
    if not watched:
        print("(compiled kernels: the loads were not watched, so a load without a mask passes)")
    report(results)


def visible_key_tiles(q_start: int, block_q: int, n_keys: int, block_k: int) -> list[int]:
    """The reference: starts of the key tiles that queries ``q_start .. q_start + block_q - 1``
    see under ``scaled_dot_product_attention``'s causal mask (key ``j`` visible to query
    ``i`` when ``j <= i``), in order."""
    last_query = q_start + block_q - 1
    return [start for start in range(0, n_keys, block_k) if start <= last_query]


def check_causal_key_tiles(tiles: Callable[[int, int, int, int], list[int]]) -> None:
    """Check ``tiles(q_start, block_q, n_keys, block_k)``: key tiles a causal query tile visits.

    The layouts include key tiles narrower than query tiles (the forward kernel's 128 × 64, and
    128 × 32), where the tile's later queries see key tiles that start after ``q_start``: an
    answer that stops at the first query's keys (``range(0, min(n_keys, q_start + 1),
    block_k)``, nearly the kernels' ``unmasked_stop``) drops them. Key tiles of one key catch
    an answer one query short (``q_start + block_q - 1`` as the end of the range).
    """
    results: list[Case] = []
    layouts = [  # (q_start, block_q, n_keys, block_k)
        (0, 64, 256, 64),
        (128, 64, 256, 64),
        (64, 64, 40, 16),
        (0, 16, 100, 32),
        (96, 32, 1000, 64),
        (192, 64, 128, 32),
        (0, 128, 4096, 64),  # the forward's 128 queries × 64 keys: tiles 0 and 64
        (128, 128, 4096, 32),
        (3, 4, 100, 1),  # one key per tile: keys 0 to 6
    ]
    for q_start, block_q, n_keys, block_k in layouts:
        expected = visible_key_tiles(q_start, block_q, n_keys, block_k)
        got = list(tiles(q_start, block_q, n_keys, block_k))
        queries = f"queries {q_start}..{q_start + block_q - 1}"
        case = f"{queries}, {n_keys} keys in tiles of {block_k}: {expected}"
        results.append((case, None if got == expected else f"got {got}"))
    report(results)


def check_segment_bytes(reserve: Callable[[int], int]) -> None:
    """Check ``reserve(nbytes)``: the segment a fresh caching allocator takes from CUDA.

    ``(10 << 20) - 100`` bytes round up to 10 MiB, which gets a segment of its own size; an answer
    that skips the rounding to 512 bytes sees it under 10 MiB and reserves 20 MiB.
    """
    results: list[Case] = []
    sizes = [1, 4096, 1 << 20, (1 << 20) + 1, 6 << 20, (10 << 20) - 100, 10 << 20, (10 << 20) + 1]
    for nbytes in [*sizes, 100_000_000]:
        expected = segment_bytes(nbytes)
        got = reserve(nbytes)
        case = f"{nbytes:,} bytes requested: {expected:,} bytes reserved"
        results.append((case, None if got == expected else f"got {got:,}"))
    report(results)
