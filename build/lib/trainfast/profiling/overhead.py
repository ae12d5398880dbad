"""The overhead regime: when the time goes into *starting* operations, not doing them.

Every PyTorch operation pays a fixed cost before any arithmetic: the Python call, argument
parsing, the dispatcher choosing a kernel, autograd bookkeeping, allocating the output and, on a
GPU, launching the kernel (a few microseconds each). For large tensors this is noise; for small
ones it is everything, and the device sits idle between kernels. :func:`time_per_op` measures the
floor, :func:`dispatch_rate` how many operations per second PyTorch can start at all.

Three cures remove the per-operation cost, and :func:`launch_overhead` times them on
:func:`small_kernels`, a chain of tiny elementwise operations:

* ``torch.compile`` fuses the chain into one generated kernel (one launch instead of many);
* a CUDA graph records the kernels once and replays the whole recording with one launch
  (:func:`cuda_graph`, PyTorch's documented capture recipe), though each kernel still runs;
* ``torch.compile(mode="reduce-overhead")`` does both: fused kernels, replayed as a graph.

When not to use CUDA graphs: shapes that change (one graph per shape), code that must run on
the host between kernels (``.item()``, data-dependent branching), or memory that must be freed
between steps (a graph keeps its memory pool alive).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainfast.timing import benchmark, benchmark_side_by_side
from trainfast.validation import check_int

__all__ = [
    "CompileVerdict",
    "autocast_matmul_ratio",
    "compile_speedup_by_width",
    "compile_verdict",
    "cuda_graph",
    "mlp_block",
    "dispatch_rate",
    "launch_overhead",
    "small_kernels",
    "time_per_op",
]


def small_kernels(x: torch.Tensor, layers: int = 32) -> torch.Tensor:
    """``layers`` rounds of ``tanh(x * 1.01 + 0.01)``: three tiny kernels per round in eager."""
    for _ in range(layers):
        x = torch.tanh(x * 1.01 + 0.01)
    return x


def dispatch_rate(
    device: torch.device | str = "cpu", number: int = 1000, repeats: int = 7
) -> float:
    """Operations per second that PyTorch starts for an in-place add on a one-element tensor."""
    x = torch.zeros(1, device=device)
    timing = benchmark(
        lambda: x.add_(1.0), warmup=100, repeats=repeats, number=number, device=device
    )
    return 1.0 / timing.median


def time_per_op(
    sizes: list[int], device: torch.device | str = "cpu", repeats: int = 7
) -> list[dict[str, float]]:
    """Median seconds of ``x.mul_(1.0)`` for each ``numel`` in ``sizes`` (float32).

    Small sizes sit on the overhead floor; large ones grow with the bytes moved.
    """
    rows = []
    for numel in sizes:
        x = torch.ones(numel, device=device)
        number = max(1, min(1000, 2**22 // max(numel, 1)))  # about 4M elements per sample
        timing = benchmark(
            lambda x=x: x.mul_(1.0), warmup=3, repeats=repeats, number=number, device=device
        )
        rows.append(
            {"elements": numel, "seconds": timing.median, "bytes_per_s": 8 * numel / timing.median}
        )
    return rows


def autocast_matmul_ratio(
    widths: list[int], device: torch.device | str = "cpu", tokens: int = 256, repeats: int = 7
) -> list[dict[str, float]]:
    """bf16 autocast against float32 for one linear layer, ``(tokens, width) @ (width, width)``.

    Autocast does not only multiply in bfloat16: it casts the layer's input and weight to
    bfloat16 on every call, two more operations, each with its fixed cost and a pass over its
    data. A wide layer repays them with a faster product (bfloat16 units: tensor cores, or on a
    CPU the ``avx512_bf16``/AMX instructions that oneDNN uses); a narrow one is in the overhead
    regime, where three operations cost more than one. Returns one row per width, timed side by
    side: ``fp32_us``, ``bf16_us`` (median per call) and ``ratio`` (bf16 over float32: below 1,
    bf16 is faster).
    """
    device_type = torch.device(device).type
    rows = []
    for width in widths:
        check_int("width", width, minimum=1)
        x = torch.randn(tokens, width, device=device)
        weight = torch.randn(width, width, device=device)

        def fp32(x: torch.Tensor = x, weight: torch.Tensor = weight) -> torch.Tensor:
            return torch.nn.functional.linear(x, weight)

        def bf16(x: torch.Tensor = x, weight: torch.Tensor = weight) -> torch.Tensor:
            with torch.autocast(device_type, dtype=torch.bfloat16):
                return torch.nn.functional.linear(x, weight)

        timings = benchmark_side_by_side(
            {"fp32": fp32, "bf16": bf16},
            warmup=3,
            repeats=repeats,
            number=max(1, 4096 // width),
            device=device,
        )
        fp32_s, bf16_s = timings["fp32"].median, timings["bf16"].median
        row = {
            "width": width,
            "fp32_us": fp32_s * 1e6,
            "bf16_us": bf16_s * 1e6,
            "ratio": bf16_s / fp32_s,
        }
        rows.append(row)
    return rows


def mlp_block(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    """A transformer's feed-forward block: x + gelu(layer_norm(x) @ w_in.T) @ w_out.T.

    Two matmuls and three cheap operations around them (the norm, GELU, the residual add).
    There is little for torch.compile to fuse: Inductor (torch 2.14, on a CPU; see
    torch._inductor.utils.run_and_get_code) keeps the norm and GELU as kernels of their own
    and folds only the residual add into the second matmul (an addmm), four kernels to
    eager's five. Timed compiled against eager, the block weighs a compiled call's fixed cost
    against one saved kernel and its pass over memory.
    """
    h = torch.nn.functional.layer_norm(x, x.shape[-1:])  # (tokens, width)
    h = torch.nn.functional.gelu(torch.nn.functional.linear(h, w_in))  # (tokens, 4 * width)
    return x + torch.nn.functional.linear(h, w_out)  # (tokens, width)


def compile_speedup_by_width(
    widths: list[int],
    device: torch.device | str = "cpu",
    tokens: int = 256,
    repeats: int = 7,
    backend: str = "inductor",
) -> list[dict[str, float]]:
    """:func:`mlp_block` eager against ``torch.compile`` for each width, timed side by side.

    The ``torch.compile`` counterpart of :func:`autocast_matmul_ratio`: fusion saves the fixed
    cost and the memory pass of each small operation it folds into another (in this block only
    the residual add, see :func:`mlp_block`), and a compiled call pays a fixed cost of its own
    (the guards that check the inputs still match the compiled graph), so what it saves depends
    on the width. Each width compiles once
    (``dynamic=False``: one specialised graph per shape, as training with a fixed shape does);
    ``backend`` is ``torch.compile``'s (``"eager"`` checks the code path without compiling).
    Returns one row per width: ``eager_us``, ``compiled_us`` (median per call), their
    interquartile ranges ``eager_iqr_us`` and ``compiled_iqr_us``, ``ratio`` (compiled over
    eager: below 1, compiling pays) and ``compile_s`` (the first call).
    """
    rows = []
    for width in widths:
        check_int("width", width, minimum=1)
        generator = torch.Generator().manual_seed(width)
        x = torch.randn(tokens, width, generator=generator).to(device)
        w_in = (torch.randn(4 * width, width, generator=generator) / width**0.5).to(device)
        w_out = (torch.randn(width, 4 * width, generator=generator) / width**0.5).to(device)
        args = (x, w_in, w_out)
        compiled = torch.compile(mlp_block, dynamic=False, backend=backend)

        def eager_call(args: tuple[torch.Tensor, ...] = args) -> torch.Tensor:
            return mlp_block(*args)

        def compiled_call(
            args: tuple[torch.Tensor, ...] = args, compiled: Callable[..., Any] = compiled
        ) -> torch.Tensor:
            return compiled(*args)

        first = benchmark(compiled_call, warmup=0, repeats=1, device=device)
        timings = benchmark_side_by_side(
            {"eager": eager_call, "compiled": compiled_call},
            warmup=3,
            repeats=repeats,
            number=max(1, 2048 // width),
            device=device,
        )
        eager_s, compiled_s = timings["eager"].median, timings["compiled"].median
        rows.append(
            {
                "width": width,
                "eager_us": eager_s * 1e6,
                "compiled_us": compiled_s * 1e6,
                "eager_iqr_us": timings["eager"].iqr * 1e6,
                "compiled_iqr_us": timings["compiled"].iqr * 1e6,
                "ratio": compiled_s / eager_s,
                "compile_s": first.median,
            }
        )
    return rows


@dataclass(frozen=True)
class CompileVerdict:
    """What a ``compile-by-width`` record says (:func:`compile_verdict`): each width's compiled
    over eager time, the width from which compiling was faster at every larger one (None if
    none), and the widths where the two times differ by more than either's interquartile range
    (not noise)."""

    widths: tuple[int, ...]
    ratios: tuple[float, ...]
    faster_from: int | None
    clear: tuple[int, ...]

    def sentence(self) -> str:
        """The verdict in words: faster from a width on, slower at every width (by up to the
        largest ratio, at its width), or mixed; then where the difference is beyond the spread."""
        if self.faster_from is not None:
            verdict = f"faster from a width of {self.faster_from} on"
        elif all(r > 1 for r in self.ratios):
            worst = max(range(len(self.ratios)), key=self.ratios.__getitem__)
            verdict = (
                f"slower at every width, by up to {self.ratios[worst]:.2f} times at a width of "
                f"{self.widths[worst]}"
            )
        else:
            verdict = "faster at some widths and slower at others, never from a width on"
        clear = ", ".join(map(str, self.clear)) if self.clear else "none"
        return f"{verdict} (differences beyond the spread at widths {clear})"


def compile_verdict(rows: list[dict[str, Any]]) -> CompileVerdict:
    """Read the rows of :func:`compile_speedup_by_width` (a ``compile-by-width`` record): from
    which width compiling paid at every larger width, and where the difference is larger than
    both interquartile ranges. ``ValueError`` for no rows."""
    if not rows:
        raise ValueError("Invalid rows: a compile-by-width record with no rows")
    faster = [r["width"] for r in rows if r["ratio"] < 1]
    faster_from = next(
        (w for w in faster if all(r["ratio"] < 1 for r in rows if r["width"] >= w)), None
    )
    clear = tuple(
        int(r["width"])
        for r in rows
        if abs(r["eager_us"] - r["compiled_us"]) > max(r["eager_iqr_us"], r["compiled_iqr_us"])
    )
    widths = tuple(int(r["width"]) for r in rows)
    return CompileVerdict(widths, tuple(float(r["ratio"]) for r in rows), faster_from, clear)


def cuda_graph(
    fn: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Capture fn(example) into a CUDA graph; return a function that replays it.

    The recipe of PyTorch's CUDA-graph documentation: warm up on a side stream (so that lazy
    initialisation is not captured), capture into static input and output tensors, then replay.
    The returned function copies its argument into the static input, replays, and returns the
    static output (the same tensor every call: clone it to keep a result).
    """
    if example.device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA tensor, got one on {example.device}")
    static_input = example.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(static_input)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_output = fn(static_input)

    def replay(x: torch.Tensor) -> torch.Tensor:
        static_input.copy_(x)
        graph.replay()
        return static_output

    return replay


def launch_overhead(
    device: torch.device,
    *,
    numel: int = 1024,
    layers: int = 32,
    repeats: int = 20,
    number: int = 20,
    compiled: bool = True,
) -> list[dict[str, Any]]:
    """:func:`small_kernels` eager, compiled and (on CUDA) as CUDA graphs: time per call.

    ``first_call_s`` is the first call's time (compilation or capture included);
    ``speedup`` is eager's median over this one's. ``compiled=False`` leaves out the modes
    that compile (seconds to minutes on a CPU).
    """
    x = torch.randn(numel, device=device)
    modes: dict[str, Callable[[], Any]] = {"eager": lambda: small_kernels(x, layers)}
    if compiled:
        default = torch.compile(small_kernels)
        modes["torch.compile"] = lambda: default(x, layers)
    if device.type == "cuda":
        captured: list[Callable[[torch.Tensor], torch.Tensor]] = []

        def by_hand() -> torch.Tensor:  # the first call captures, later calls replay
            if not captured:
                captured.append(cuda_graph(lambda t: small_kernels(t, layers), x))
            return captured[0](x)

        modes["CUDA graph (by hand)"] = by_hand
        if compiled:
            overhead = torch.compile(small_kernels, mode="reduce-overhead")

            def reduce_overhead() -> torch.Tensor:
                torch.compiler.cudagraph_mark_step_begin()  # the last output may be overwritten
                return overhead(x, layers)

            modes['torch.compile(mode="reduce-overhead")'] = reduce_overhead
    rows = []
    for mode, call in modes.items():
        first = benchmark(call, warmup=0, repeats=1, device=device)
        timing = benchmark(call, warmup=3, repeats=repeats, number=number, device=device)
        row = {
            "mode": mode,
            "per_call_us": timing.median * 1e6,
            "iqr_us": timing.iqr * 1e6,
            "first_call_s": first.median,
        }
        rows.append(row)
    for row in rows:
        row["speedup"] = rows[0]["per_call_us"] / row["per_call_us"]
    return rows
