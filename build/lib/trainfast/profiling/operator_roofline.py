"""A training step's time predicted operator by operator: the roofline applied to a traced step.

The step-time model of :mod:`trainfast.distributed.step_time` prices a step by its matmul FLOPs
alone, at ``matmul_efficiency`` of the peak. On one GPU that leaves out what the profiling
chapter's fixes change: the passes over memory of the element-wise operations around the
matmuls, the attention scores, the optimizer's update, the format of each operand, and the
host's time to launch it all. This module counts them from the implementation itself:

* :func:`trace_step` runs one training step of the book's
  :class:`~trainfast.transformer.Transformer` (forward, backward, ``AdamW.step``) on the
  ``meta`` device, which has shapes and dtypes but no data, so a model of any size traces in a
  second on a CPU. A ``TorchDispatchMode`` records every ATen operator that would launch a
  kernel: its matmul FLOPs (2 per multiply-add) and the bytes it reads and writes (each operand
  and result once; views move nothing). With ``bf16`` a ``TorchFunctionMode`` casts operands as
  CUDA's autocast does (the op lists of PyTorch's AMP documentation, "CUDA Ops that can
  autocast to float32" and "to float16"), so the trace has the same 2- and 4-byte tensors and
  the same cast kernels a GPU would run; with ``sdpa`` the attention core is one fused kernel
  (:class:`_FusedAttentionCost`), as FlashAttention computes it, in place of the written-out
  softmax attention that ``meta`` would decompose it into.
* :func:`predict_step` prices each traced operator on the GPU's datasheet roofline
  (:func:`~trainfast.kernels.roofline.datasheet_roofline`): a matmul takes the longer of its
  FLOPs at ``matmul_efficiency`` of the peak of its operands' format and its bytes at the
  memory bandwidth; every other operator its bytes at the bandwidth. ``fused_optimizer`` prices
  AdamW's fused kernel from the bytes it must move; ``compile`` fuses each run of
  element-wise operators between two matmuls into one kernel that moves only what enters or
  leaves the run (:func:`fused_runs`), the best Inductor's fusion can do. The host's time is
  the kernels it launches times a launch cost; the step takes the longer of the two, since the
  host queues work while the GPU runs earlier work.

Assumptions, each a field of :class:`OperatorAssumptions` with its source: the matmul efficiency
is the step-time model's; a 16-bit matmul with a dimension that is not a multiple of 8
elements (16 bytes, NVIDIA's alignment rule for tensor cores) runs ``misaligned_slowdown``
times longer, a figure a page takes from the ``matmul-throughput`` record
(:func:`misaligned_slowdown`); a causal fused kernel skips the blocks above the diagonal, half
the scores (FlashAttention-2, Dao 2023, Section 3.1), and its backward does 2.5 times the
forward's FLOPs, since it recomputes the scores (ibid.). Memory-bound kernels reach the
datasheet's bandwidth. Not modelled: kernels overlapping each other, caches (an operand read
twice is read twice), Inductor's recomputation of cheap values in backward.

When not to use it: as a measurement. It is a prediction with named assumptions, for the
record that tests it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from trainfast.distributed.training_setup import StepAssumptions
from trainfast.gpus import GPUSpec
from trainfast.kernels.roofline import datasheet_roofline
from trainfast.transformer import Transformer, TransformerShape
from trainfast.validation import check_number, check_positive_number

__all__ = [
    "OPTIMIZERS",
    "OperatorAssumptions",
    "StepPrediction",
    "StepTrace",
    "TracedOp",
    "fused_runs",
    "misaligned_slowdown",
    "predict_step",
    "trace_step",
]

#: How AdamW updates: ``"single-tensor"`` (a handful of kernels per parameter, ``foreach=False``),
#: ``"foreach"`` (a few multi-tensor kernels for all parameters, the default on CUDA),
#: ``"fused"`` (``fused=True``: one kernel per group of tensors).
OPTIMIZERS = ("single-tensor", "foreach", "fused")

#: The matmuls, by ATen name.
_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
#: Operators that allocate without launching a kernel (``empty``), or alias (views).
_NO_KERNEL = {"empty", "empty_like", "new_empty", "empty_strided", "lift_fresh", "detach", "alias"}
_NO_KERNEL |= {"_unsafe_view", "set_", "resize_", "to"}

#: CUDA autocast's lists (PyTorch's AMP documentation, "Autocast Op Reference", CUDA), by the
#: name of the Python function a model calls: lower precision, float32, widest input type.
_AUTOCAST_LOWER = {"linear", "matmul", "__matmul__", "mm", "bmm", "addmm", "baddbmm"}
_AUTOCAST_LOWER |= {"scaled_dot_product_attention"}
_AUTOCAST_FLOAT32 = {"softmax", "log_softmax", "cross_entropy", "nll_loss", "pow", "__pow__"}
_AUTOCAST_FLOAT32 |= {"rsqrt", "exp", "log", "sum", "cumsum", "layer_norm", "group_norm", "norm"}
_AUTOCAST_FLOAT32 |= {"mse_loss", "prod", "softplus", "reciprocal", "log1p", "expm1"}
_AUTOCAST_PROMOTE = {"stack", "cat", "addcmul", "addcdiv"}

#: Tensors in each multi-tensor launch of AdamW's fused kernel (four lists: parameters,
#: gradients and the two moments): ``depth_to_max_tensors[3]`` of PyTorch's
#: ``aten/src/ATen/native/cuda/MultiTensorApply.cuh``.
_FUSED_TENSORS_PER_LAUNCH = 36


@dataclass(frozen=True)
class TracedOp:
    """One operator of a traced step that launches a kernel.

    ``kind``: ``"matmul"``, ``"attention"`` (a fused attention kernel) or ``"memory"`` (all the
    rest: element-wise, reductions, copies, the optimizer's update). ``phase``: ``"forward"``,
    ``"backward"`` or ``"optimizer"``. ``bytes`` counts every tensor operand and result once (a
    view at its own extent, a broadcast one at its storage's). ``reads`` and ``writes`` name
    the tensors (by node number, with their bytes in ``StepTrace.sizes``), for
    :func:`fused_runs`. ``dims`` is a matmul's ``(m, k, n)``; ``dtype_bytes`` its operands'
    element size.
    """

    name: str
    kind: str
    phase: str
    flops: float
    bytes: float
    reads: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()
    dims: tuple[int, ...] = ()
    dtype_bytes: int = 4

    @property
    def misaligned(self) -> bool:
        """A 16-bit matmul with a dimension that is not a multiple of 8 elements (16 bytes)."""
        return self.kind == "matmul" and self.dtype_bytes == 2 and any(d % 8 for d in self.dims)


@dataclass(frozen=True)
class StepTrace:
    """The operators one training step launches (:func:`trace_step`) and its tensors' sizes."""

    shape: TransformerShape
    bf16: bool
    sdpa: bool
    optimizer: str
    ops: tuple[TracedOp, ...]
    sizes: dict[int, float] = field(hash=False)  # node -> bytes
    parameters: int = 0  # parameter values the optimizer updates
    parameter_tensors: int = 0

    @property
    def flops(self) -> float:
        """The step's matmul and attention FLOPs as the kernels do them (a fused causal
        kernel's skipped blocks and recomputation included)."""
        return sum(op.flops for op in self.ops)

    def phase(self, phase: str) -> list[TracedOp]:
        return [op for op in self.ops if op.phase == phase]


def _dtype_bytes(t: torch.Tensor) -> int:
    return t.element_size()


def _extent(t: torch.Tensor) -> float:
    """Bytes a kernel touches in ``t``: its elements, or its storage if that is smaller (a
    broadcast view reads its storage once, from cache)."""
    own = t.numel() * t.element_size()
    try:
        return float(min(own, t.untyped_storage().nbytes()))
    except (RuntimeError, NotImplementedError):  # no storage (a wrapper subclass)
        return float(own)


class _Tracer(TorchDispatchMode):
    """Records the kernels of the operators dispatched on ``meta`` tensors (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[TracedOp] = []
        self.sizes: dict[int, float] = {}
        self.phase = "forward"
        self._nodes: dict[int, int] = {}  # id(tensor) -> node
        self._alive: list[torch.Tensor] = []  # keeps ids unique while tracing

    def node(self, t: torch.Tensor) -> int:
        key = id(t)
        if key not in self._nodes:
            self._nodes[key] = len(self.sizes)
            self.sizes[self._nodes[key]] = _extent(t)
            self._alive.append(t)
        return self._nodes[key]

    def alias(self, view: torch.Tensor, base: torch.Tensor) -> None:
        self._nodes[id(view)] = self.node(base)
        self._alive.append(view)

    def fresh(self, t: torch.Tensor) -> int:
        """A new node for a result (an in-place result keeps its operand's node)."""
        if id(t) in self._nodes:
            return self._nodes[id(t)]
        return self.node(t)

    def record(
        self,
        name: str,
        kind: str,
        flops: float,
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor],
        dims: tuple[int, ...] = (),
        dtype_bytes: int = 4,
        extra_bytes: float = 0.0,
    ) -> None:
        reads = tuple(self.node(t) for t in inputs)
        writes = tuple(self.fresh(t) for t in outputs)
        moved = sum(_extent(t) for t in inputs) + sum(_extent(t) for t in outputs) + extra_bytes
        self.ops.append(
            TracedOp(name, kind, self.phase, flops, moved, reads, writes, dims, dtype_bytes)
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        on_device = [t for t in inputs + outputs if t.device.type == "meta"]
        if not on_device:  # the optimizer's step counters live on the host
            return out
        if getattr(func, "is_view", False) or name in _NO_KERNEL:
            for t in outputs:
                if inputs:
                    self.alias(t, inputs[0])
            return out
        inputs = [t for t in inputs if t.device.type == "meta"]
        if name in _MATMULS:
            a, b = (inputs[-2], inputs[-1])  # addmm(bias, a, b), mm(a, b), bmm(a, b)
            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            batch = a.shape[0] if a.dim() == 3 else 1
            self.record(
                name, "matmul", 2.0 * batch * m * k * n, inputs, outputs, (m, k, n), _dtype_bytes(a)
            )
        elif name == "embedding":  # a gather: the rows it reads, not the whole table
            weight, indices = inputs[0], inputs[1]
            self.node(weight)
            self.record(name, "memory", 0.0, [indices], outputs, extra_bytes=_extent(outputs[0]))
        else:
            self.record(name, "memory", 0.0, inputs, outputs)
        return out


class _FusedAttentionCost(torch.autograd.Function):
    """A fused causal attention kernel (FlashAttention) in the trace: one operator forward, one
    backward, with the FLOPs the kernel does and the bytes it moves (Q, K, V and the output,
    and a float32 log-sum-exp per head and query), never the ``seq x seq`` scores."""

    @staticmethod
    def forward(ctx, q, k, v, tracer):  # noqa: ANN001, ANN205
        batch, heads, seq, head_dim = q.shape  # (batch, heads, seq, head_dim)
        out = torch.empty_like(q)
        lse = q.new_empty((batch, heads, seq), dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.tracer = tracer
        ctx.flops = 0.5 * 4.0 * batch * heads * seq * seq * head_dim  # causal: half the blocks
        tracer.record(
            "fused_attention",
            "attention",
            ctx.flops,
            [q, k, v],
            [out, lse],
            dtype_bytes=q.element_size(),
        )
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ctx.tracer.record(
            "fused_attention_backward",
            "attention",
            2.5 * ctx.flops,  # recomputes the scores: 5 matmuls against the forward's 2
            [q, k, v, out, grad, lse],
            [dq, dk, dv],
            dtype_bytes=q.element_size(),
        )
        return dq, dk, dv, None


class _CudaAutocast(TorchFunctionMode):
    """CUDA's autocast to bfloat16 on tensors of any device (the ``meta`` device has no
    autocast of its own): operands of the lower-precision list cast to bf16, of the float32
    list to float32, of the widest-type list to the widest; everything else runs in its inputs'
    dtype. ``sdpa`` replaces the attention core by :class:`_FusedAttentionCost`."""

    def __init__(self, tracer: _Tracer, bf16: bool, sdpa: bool) -> None:
        super().__init__()
        self.tracer, self.bf16, self.sdpa = tracer, bf16, sdpa

    @staticmethod
    def _cast(args: Any, dtype: torch.dtype) -> Any:
        def cast(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
                return x.to(dtype)
            if isinstance(x, (list, tuple)):
                return type(x)(cast(y) for y in x)
            return x

        return cast(args)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.sdpa and func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            if self.bf16:
                q, k, v = self._cast((q, k, v), torch.bfloat16)
            return _FusedAttentionCost.apply(q, k, v, self.tracer)
        if self.bf16:
            if name in _AUTOCAST_LOWER:
                args, kwargs = self._cast((args, kwargs), torch.bfloat16)
            elif name in _AUTOCAST_FLOAT32:
                args, kwargs = self._cast((args, kwargs), torch.float32)
            elif name in _AUTOCAST_PROMOTE:
                floats = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
                if any(t.dtype == torch.float32 for t in floats if t.is_floating_point()):
                    args = self._cast(args, torch.float32)
        return func(*args, **kwargs)


def _meta_model(shape: TransformerShape, sdpa: bool) -> Transformer:
    with torch.device("meta"):
        model = Transformer(shape, attention="sdpa" if sdpa else "manual")
    return model.to("meta")  # and the rotary angles, which nn.Module.to recomputes there


def trace_step(
    shape: TransformerShape,
    *,
    bf16: bool = False,
    sdpa: bool = False,
    optimizer: str = "foreach",
) -> StepTrace:
    """The kernels of one training step of the book's transformer at ``shape``: forward and
    loss (under CUDA's autocast to bf16 with ``bf16``), backward, and ``AdamW.step`` (the
    ``optimizer`` path of :data:`OPTIMIZERS`; ``"fused"`` is traced as ``"foreach"`` and priced
    by :func:`predict_step`, since the fused kernel has no ``meta`` implementation). A first
    step's creation of the optimizer's moments is left out, so the trace is a step of training,
    not the first one. Runs on the ``meta`` device: seconds on a CPU at any size.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"Invalid optimizer: {optimizer!r} (expected one of {OPTIMIZERS})")
    model = _meta_model(shape, sdpa)
    params = [p for p in model.parameters() if p.requires_grad]
    adamw = torch.optim.AdamW(params, foreach=optimizer != "single-tensor")
    tokens = torch.zeros((shape.batch_size, shape.seq_len), dtype=torch.long, device="meta")
    tracer = _Tracer()

    with tracer:
        tracer.phase = "forward"
        with _CudaAutocast(tracer, bf16, sdpa):
            value = model.loss(tokens, tokens)
        tracer.phase = "backward"
        value.backward()
        tracer.phase = "optimizer"
        adamw.step()
    # the first step also creates the moments (zeros_like): not a kernel of later steps
    ops = [op for op in tracer.ops if not (op.phase == "optimizer" and op.name == "zeros_like")]
    return StepTrace(
        shape,
        bf16,
        sdpa,
        optimizer,
        tuple(ops),
        dict(tracer.sizes),
        sum(p.numel() for p in params),
        len(params),
    )


def fused_runs(ops: Sequence[TracedOp], sizes: dict[int, float]) -> list[TracedOp]:
    """``ops`` with each run of consecutive ``"memory"`` operators (between two matmuls or
    attention kernels) fused into one kernel, as a compiler at its best would: the fused kernel
    reads each tensor it needs that an earlier kernel wrote (or a parameter), once, and writes
    each tensor a later kernel reads, once; what lives and dies inside the run never reaches
    memory. Matmuls and attention kernels stay as they are (Inductor hands matmuls to cuBLAS)."""
    readers: dict[int, list[int]] = {}
    for index, op in enumerate(ops):
        for node in op.reads:
            readers.setdefault(node, []).append(index)
    fused: list[TracedOp] = []

    def close(run: list[int]) -> None:
        if not run:
            return
        first, last = run[0], run[-1]
        written = {node for i in run for node in ops[i].writes}
        needed = {node for i in run for node in ops[i].reads if node not in written}
        kept = {
            node
            for node in written
            if any(r > last or r < first for r in readers.get(node, ()))
            or not readers.get(node)  # nothing reads it in the step: an output (the loss, a grad)
        }
        moved = sum(sizes[node] for node in needed | kept)
        phase = ops[first].phase
        fused.append(TracedOp(f"fused {len(run)} ops", "memory", phase, 0.0, moved))

    run: list[int] = []
    for index, op in enumerate(ops):
        if op.kind == "memory" and (not run or ops[run[-1]].phase == op.phase):
            run.append(index)
            continue
        close(run)
        run = [index] if op.kind == "memory" else []
        if op.kind != "memory":
            fused.append(op)
    close(run)
    return fused


@dataclass(frozen=True)
class OperatorAssumptions:
    """What :func:`predict_step` cannot derive, each with where it comes from.

    ``matmul_efficiency``: the fraction of the peak a matmul reaches while it runs, the step-time
    model's (:class:`~trainfast.distributed.step_time.StepAssumptions`: the book's assumption,
    from no measurement). ``misaligned_slowdown``: how many times longer a 16-bit matmul with a
    dimension that is not a multiple of 8 takes (1: no penalty; a page takes the
    ``matmul-throughput`` record's, :func:`misaligned_slowdown`). ``launch_s``: host seconds per
    kernel launched (dispatch and launch; a page takes the ``launch-overhead`` record's, its
    eager chain's time per kernel). ``memory_efficiency``: the fraction of the datasheet's
    bandwidth a memory-bound kernel reaches (1: the datasheet's, an upper bound).
    """

    matmul_efficiency: float = StepAssumptions().matmul_efficiency
    misaligned_slowdown: float = 1.0
    launch_s: float = 0.0
    memory_efficiency: float = 1.0

    def __post_init__(self) -> None:
        check_number("matmul_efficiency", self.matmul_efficiency, above=0.0, maximum=1.0)
        check_number("misaligned_slowdown", self.misaligned_slowdown, minimum=1.0)
        check_number("launch_s", self.launch_s, minimum=0.0)
        check_number("memory_efficiency", self.memory_efficiency, above=0.0, maximum=1.0)


@dataclass(frozen=True)
class StepPrediction:
    """A step's predicted time on one GPU, by part (seconds), and the kernels it launches."""

    matmul_s: float  # matmuls, at the roofline of their operands' format
    attention_s: float  # fused attention kernels (0 without sdpa: its matmuls are matmuls)
    memory_s: float  # every other kernel of forward and backward, at the memory bandwidth
    optimizer_s: float  # the optimizer's update
    kernels: int  # kernels launched per step
    host_s: float  # kernels x launch_s: the host's time to queue them
    flops: float  # FLOPs the kernels do

    @property
    def device_s(self) -> float:
        return self.matmul_s + self.attention_s + self.memory_s + self.optimizer_s

    @property
    def step_s(self) -> float:
        """The longer of the GPU's work and the host's: the host queues while the GPU runs."""
        return max(self.device_s, self.host_s)

    @property
    def bound(self) -> str:
        """``"device"`` where the GPU's work sets the step time, ``"host"`` where launching it
        does (the overhead regime)."""
        return "device" if self.device_s >= self.host_s else "host"


def _op_seconds(op: TracedOp, spec: GPUSpec, a: OperatorAssumptions) -> float:
    roof = datasheet_roofline(spec, "bf16" if op.dtype_bytes == 2 else "fp32")
    memory = op.bytes / (roof.bytes_per_s * a.memory_efficiency)
    if op.kind == "memory":
        return memory
    compute = op.flops / (roof.peak_flops * a.matmul_efficiency)
    seconds = max(compute, memory)
    return seconds * a.misaligned_slowdown if op.misaligned else seconds


def _fused_optimizer(trace: StepTrace) -> list[TracedOp]:
    """AdamW's fused kernels: each parameter's value, gradient and two moments read, the value
    and moments written, float32 (28 bytes a parameter), in launches of
    ``_FUSED_TENSORS_PER_LAUNCH`` tensors."""
    launches = math.ceil(trace.parameter_tensors / _FUSED_TENSORS_PER_LAUNCH)
    moved = 28.0 * trace.parameters / launches
    return [TracedOp("_fused_adamw_", "memory", "optimizer", 0.0, moved)] * launches


def predict_step(
    trace: StepTrace,
    spec: GPUSpec,
    assumptions: OperatorAssumptions | None = None,
    *,
    fused_optimizer: bool = False,
    compile: bool = False,
) -> StepPrediction:
    """The predicted time of the traced step on ``spec``'s datasheet roofline (module doc):
    with ``fused_optimizer`` the optimizer's kernels replaced by AdamW's fused ones, with
    ``compile`` the forward's and backward's element-wise runs fused (:func:`fused_runs`)."""
    a = assumptions or OperatorAssumptions()
    work = [op for op in trace.ops if op.phase != "optimizer"]
    if compile:
        work = fused_runs(work, trace.sizes)
    update = _fused_optimizer(trace) if fused_optimizer else trace.phase("optimizer")
    parts = {"matmul": 0.0, "attention": 0.0, "memory": 0.0}
    for op in work:
        parts[op.kind] += _op_seconds(op, spec, a)
    optimizer_s = sum(_op_seconds(op, spec, a) for op in update)
    kernels = len(work) + len(update)
    return StepPrediction(
        matmul_s=parts["matmul"],
        attention_s=parts["attention"],
        memory_s=parts["memory"],
        optimizer_s=optimizer_s,
        kernels=kernels,
        host_s=kernels * a.launch_s,
        flops=sum(op.flops for op in work),
    )


def misaligned_slowdown(record: Any, dtype: str = "bf16") -> float:
    """How many times longer per FLOP a misaligned 16-bit matmul took than an aligned one, in a
    ``matmul-throughput`` record: its LM head of GPT-2's 50,257 columns against the padded
    50,304 (the same product, aligned), in ``dtype``. ``ValueError`` naming what is missing."""
    rows = {row["shape"]: row for row in record.rows if row["dtype"] == dtype}
    odd, even = rows.get("LM head, vocab 50257"), rows.get("LM head, vocab 50304")
    if odd is None or even is None:
        raise ValueError(
            f"Record {record.name!r} has no {dtype} LM-head rows (vocab 50257 and 50304)"
        )
    check_positive_number("tflops", odd["tflops"])
    return float(even["tflops"]) / float(odd["tflops"])
