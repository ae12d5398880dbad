"""Checks for the exercises of the chapter "Where time and memory go".

Each check runs the reader's function beside the package's reference on a set of cases, prints
one line per case through :func:`trainfast.checks.report`, and raises ``AssertionError`` naming
the first case that differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


def check_triton_axpb(axpb: Callable[[Tensor, float, float, Tensor], object]) -> None:
    """Check ``axpb(x, a, b, out)``: it must write ``a * x + b`` into ``out`` and nothing past it.

    The exercise asks for a Triton kernel, but the check sees only what lands in ``out`` and in
    the memory after it: a PyTorch expression that writes the right values passes too. Sizes
    that are not multiples of any block size (the mask), one element, float16 and float32; on a
    CPU the kernel runs in Triton's interpreter. ``x`` and ``out`` are the first ``n``
    elements of larger buffers, so a kernel that forgets its mask reads and writes memory that
    exists (instead of corrupting the process) and the check sees what it wrote past the end.
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
    for n, dtype in sizes:
        case = f"{n} elements of {dtype}"
        x = torch.randn(n + guard, generator=torch.Generator().manual_seed(n)).to(device, dtype)[:n]
        buffer = torch.full((n + guard,), float("nan"), device=device, dtype=dtype)
        out = buffer[:n]
        expected = (2.5 * x.float() - 1.0).to(dtype)
        try:
            axpb(x, 2.5, -1.0, out)
        except Exception as error:  # noqa: BLE001 - the reader's code: report, do not crash
            results.append((case, f"raised {type(error).__name__}: {str(error)[:120]}"))
            continue
        written_past_end = int((~torch.isnan(buffer[n:])).sum())
        worst = (out.float() - expected.float()).abs().nan_to_num(float("inf")).max().item()
        if written_past_end:
            problem = f"wrote {written_past_end} values past the end of out (a missing mask?)"
        elif not torch.allclose(out.float(), expected.float(), rtol=1e-3, atol=1e-3):
            problem = f"differs by up to {worst:.3g}"
        else:
            problem = None
        results.append((case, problem))
    report(results)


def visible_key_tiles(q_start: int, block_q: int, n_keys: int, block_k: int) -> list[int]:
    """The reference: starts of the key tiles that queries ``q_start .. q_start + block_q - 1``
    see under ``scaled_dot_product_attention``'s causal mask (key ``j`` visible to query
    ``i`` when ``j <= i``), in order."""
    last_query = q_start + block_q - 1
    return [start for start in range(0, n_keys, block_k) if start <= last_query]


def check_causal_key_tiles(tiles: Callable[[int, int, int, int], list[int]]) -> None:
    """Check ``tiles(q_start, block_q, n_keys, block_k)``: key tiles a causal query tile visits."""
    results: list[Case] = []
    layouts = [  # (q_start, block_q, n_keys, block_k)
        (0, 64, 256, 64),
        (128, 64, 256, 64),
        (64, 64, 40, 16),
        (0, 16, 100, 32),
        (96, 32, 1000, 64),
        (192, 64, 128, 32),
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
