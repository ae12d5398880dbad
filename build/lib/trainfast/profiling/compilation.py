"""``torch.compile`` in practice: where its cache lives, what compiling costs, how often it happens.

``torch.compile`` has three stages, and each has a cost that pays back only over many calls:

1. **Dynamo** runs the Python function once symbolically (by rewriting its bytecode) and
   records the tensor operations into an FX graph, with *guards*: the assumptions (shapes,
   dtypes, Python values) under which the graph is valid. Code it cannot trace causes a
   *graph break*: the function is split, and the untraceable part runs in plain Python.
2. **AOTAutograd** traces the backward pass ahead of time, so training steps compile too.
3. **Inductor** fuses the operations and generates code: Triton kernels on a GPU, C++/OpenMP
   on a CPU, which a C++ compiler then builds. This is the slow part (tens of seconds).

Inductor keeps what it builds in an on-disk cache (``TORCHINDUCTOR_CACHE_DIR``, by default
``/tmp/torchinductor_<user>``), and its FX graph cache and AOTAutograd cache let a new process
skip stages 2 and 3 for a graph it has compiled before: :func:`use_compile_cache` points the
cache at a folder of your choice (the book keeps it in ``_build/``), :func:`cache_counters`
says whether the last compile hit it, and :func:`compile_time_in_fresh_process` measures a
cold and a cached compile, each in a new Python process, as a rebuild would see it.

:class:`CountingBackend` is a ``torch.compile`` backend that runs each graph unchanged (no
Inductor) and counts them: the cheapest way to watch graph breaks and recompiles.

:func:`cudagraph_skip_reasons` says why ``mode="reduce-overhead"`` (or the ``"cudagraphs"``
backend) ran a graph *without* CUDA graphs: it skips them silently, apart from a log line.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CountingBackend",
    "CudagraphSkip",
    "cache_counters",
    "compile_time_in_fresh_process",
    "cudagraph_skip_reasons",
    "use_compile_cache",
]


@dataclass(frozen=True)
class CudagraphSkip:
    """Why ``torch.compile`` ran one graph without CUDA graphs, and the line of code that did it.

    ``reason`` is torch's message without its stack trace (``"mutated inputs (1 instances)"``);
    ``code`` is the source line torch points at (``"x.mul_(2.0)"``), empty when it names none.
    """

    reason: str
    code: str = ""

    def __str__(self) -> str:
        return f"{self.reason}, at `{self.code}`" if self.code else self.reason


#: Functions of ``torch._inductor.cudagraph_utils`` that warn in its log without a skip.
_NOT_SKIPS = ("maybe_warning_due_to_dynamic_shape",)


def _skip_from_message(message: str) -> CudagraphSkip:
    """A :class:`CudagraphSkip` from torch's log message: the reason, then an optional
    ``Found from :`` and a stack trace whose last line is the offending code."""
    while prefix := re.match(r"skipping cudagraphs? due to ", message):  # torch repeats it
        message = message[prefix.end() :]
    reason, _, trace = message.partition("Found from")
    reason = reason.strip().removesuffix(".").strip()
    lines = [line.strip() for line in trace.splitlines()]
    code = [line for line in lines if line and line != ":" and not line.startswith("File ")]
    return CudagraphSkip(reason, _without_comment(code[-1]) if code else "")


def _without_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` inside a string stays)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError):
        return line
    comment = next((t for t in tokens if t.type == tokenize.COMMENT), None)
    return line[: comment.start[1]].rstrip() if comment else line


def cudagraph_skip_reasons(call: Callable[[], object]) -> list[CudagraphSkip]:
    """Run ``call`` (the first, compiling call of a function compiled with CUDA graphs) and
    return why ``torch.compile`` ran graphs without them, [] if it did not.

    CUDA graphs replay fixed kernels on fixed memory, so ``torch.compile`` checks each graph
    first. With Inductor's graph partitions (``torch._inductor.config.graph_partition``, on by
    default in torch 2.14), CPU work and operators that cannot be captured are split off to run
    outside the graphs; a rule broken by the whole graph (an input it mutates that it does not
    own, or a CPU tensor under the ``"cudagraphs"`` backend, which does not partition) runs
    that graph without CUDA graphs. A new input shape is not such a rule by
    default: it records one more graph for that shape (and warns past
    ``torch._inductor.config.triton.cudagraph_dynamic_shape_warn_limit``, 8), unless
    ``cudagraph_skip_dynamic_graphs`` is set. A skip does not raise: it writes a warning,
    ``skipping cudagraphs due to ...``, to the ``cudagraphs`` log (in torch 2.4 the perf-hints
    log; stderr, easy to miss in a job's output) and adds one to
    ``torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]``.
    This collects those warnings while ``call`` runs, and not the log's other records (the
    warning about many shapes, or what ``TORCH_LOGS="cudagraphs"`` adds).
    ``torch._inductor.config.triton.cudagraph_or_error = True`` turns them into errors.
    """
    from torch._inductor import cudagraph_utils

    skips: list[CudagraphSkip] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # a skip is a warning; the one warning that is not says that many shapes were seen
            if record.levelno >= logging.WARNING and record.funcName not in _NOT_SKIPS:
                skips.append(_skip_from_message(record.getMessage()))

    handler = Collect()
    # older torch (2.4) wrote the skips to the perf-hints log; there is no cudagraphs log there
    log = getattr(cudagraph_utils, "cudagraphs_log", None) or cudagraph_utils.perf_hint_log
    log.addHandler(handler)
    try:
        call()
    finally:
        log.removeHandler(handler)
    return skips


def use_compile_cache(directory: str | Path) -> Path:
    """Keep Inductor's compiled artefacts in ``directory`` from now on; returns it (absolute).

    Sets ``TORCHINDUCTOR_CACHE_DIR``, which Inductor reads each time it looks up or stores an
    artefact; PyTorch fills the variable in with its default (``/tmp/torchinductor_<user>``)
    the first time it needs it, so this overrides whatever is there. Graphs compiled before the
    call keep their artefacts where they were.
    """
    path = Path(directory).resolve()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


def cache_counters() -> dict[str, int]:
    """How often this process's compiles hit or missed the FX graph and AOTAutograd caches."""
    from torch._dynamo.utils import counters

    return {
        "fx_graph_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fx_graph_misses": int(counters["inductor"]["fxgraph_cache_miss"]),
        "aot_autograd_hits": int(counters["aot_autograd"]["autograd_cache_hit"]),
        "aot_autograd_misses": int(counters["aot_autograd"]["autograd_cache_miss"]),
    }


class CountingBackend:
    """A torch.compile backend that runs every captured graph as is and keeps them.

    torch.compile(fn, backend=counter): each graph Dynamo hands over (one per graph-break
    fragment, and one more per recompile) is appended to graphs; len(counter.graphs) is
    how many times Dynamo compiled. No Inductor, so it costs milliseconds, not seconds.
    """

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(
        self, graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]
    ) -> Callable[..., Any]:
        self.graphs.append(graph)
        return graph.forward

    @property
    def compiles(self) -> int:
        return len(self.graphs)

    def operators(self) -> list[str]:
        """The ops of every graph kept, in order (call_function and call_method nodes)."""
        return [
            str(getattr(node.target, "__name__", node.target))
            for graph in self.graphs
            for node in graph.graph.nodes
            if node.op in ("call_function", "call_method")
        ]


def _first_compiled_step(device: str) -> dict[str, Any]:
    """In this process: build the case study with every fix up to ``compile``; time step one."""
    from trainfast.profiling.case_study import CaseStudy, CaseStudyConfig, Fixes
    from trainfast.timing import benchmark

    device_ = torch.device(device)
    if device_.type == "cpu":
        torch.set_num_threads(1)
    fixes = Fixes(fused_optimizer=True, sdpa=True, compile=True, no_item=True)
    study = CaseStudy(fixes, CaseStudyConfig.for_device(device_), device_)
    first = benchmark(lambda: study.run(1), warmup=0, repeats=1, device=device_).median
    step = benchmark(lambda: study.run(1), warmup=2, repeats=10, device=device_).median
    return {"first_step_s": first, "step_s": step, **cache_counters()}


def compile_time_in_fresh_process(
    device: torch.device | str = "cpu", cache_dir: str | Path | None = None, timeout: float = 600
) -> dict[str, Any]:
    """The first compiled step of the case study in a new process: cold, then cached.

    Runs ``python -m trainfast.profiling.compilation`` twice with ``TORCHINDUCTOR_CACHE_DIR`` set
    to ``cache_dir`` (default: a new empty temporary folder, so the first run is cold and the
    second finds what the first stored). Returns ``cold_first_step_s``, ``cached_first_step_s``,
    the steady ``step_s`` and the cache counters of each run.
    """
    with tempfile.TemporaryDirectory(prefix="trainfast-inductor-") as scratch:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir or scratch)}
        runs = []
        for _ in range(2):
            result = subprocess.run(
                [sys.executable, "-m", "trainfast.profiling.compilation", "--device", str(device)],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            if result.returncode != 0:
                raise RuntimeError(f"compile-time run failed:\n{result.stderr[-3000:]}")
            runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    cold, cached = runs
    return {
        "cold_first_step_s": cold["first_step_s"],
        "cached_first_step_s": cached["first_step_s"],
        "step_s": cached["step_s"],
        "cold": cold,
        "cached": cached,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Time the case study's first compiled step.")
    parser.add_argument("--device", default="cpu")
    print(json.dumps(_first_compiled_step(parser.parse_args().device)))
