"""A whole transformer block in tensor parallelism (attention heads too), and sequence parallelism.

:class:`ParallelTransformerBlock` shards the book's :class:`~trainfast.transformer.TransformerBlock`
the Megatron-LM way (Shoeybi et al., 2019):

* **attention, by heads**: the fused QKV projection is column-parallel by *heads* (rank ``r``
  keeps the rows of its heads' queries, keys and values), every head attends on its own rank,
  and the output projection is row-parallel (its columns for those heads), a partial sum;
* **the MLP**: column-parallel then row-parallel, as in
  :mod:`~trainfast.distributed.tensor_parallel`.

What the two communicate is behind two helpers, :meth:`ParallelTransformerBlock.enter` and
:meth:`~ParallelTransformerBlock.leave`, and that is all ``sequence_parallel`` changes:

* ``sequence_parallel=False`` (plain tensor parallelism): every rank holds the whole sequence;
  ``enter`` is Megatron's ``f`` (identity forward, all-reduce backward) and ``leave`` its ``g``
  (all-reduce forward). LayerNorm, dropout and the residual run on every rank, on every token.
* ``sequence_parallel=True`` (Korthikanti et al., 2022): between the parallel regions each rank
  holds only its ``1/N`` of the tokens, so LayerNorm, dropout and the residual run on ``1/N`` of
  them; ``enter`` all-gathers the sequence (reduce-scatter backward) and ``leave``
  reduce-scatters it (all-gather backward). An all-reduce *is* a reduce-scatter plus an
  all-gather, so the forward traffic is the same. As in Megatron-LM, ``enter`` fuses the
  all-gather with the column-parallel matmul and keeps only this rank's shard for backward,
  where it all-gathers it again: one more all-gather per region, and every activation of the
  layer shrinks ``N``-fold (Korthikanti et al.'s count).

Under sequence parallelism the gradients of the LayerNorms and of the row-parallel biases are
partial sums over each rank's tokens:
:meth:`~ParallelTransformerBlock.finish_gradient_synchronization` all-reduces them (Megatron does
the same). Dropout masks are drawn per rank; Megatron keeps separate random streams for replicated
and sharded regions, which this module does not, so its parity checks run with dropout 0. The
sequence must divide evenly over the ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from trainfast.distributed.agreement import rank_and_world_size
from trainfast.distributed.collectives import all_gather, reduce_scatter, ring_all_reduce
from trainfast.distributed.launch import rank_device
from trainfast.distributed.tensor_parallel import (
    copy_to_tensor_parallel,
    reduce_from_tensor_parallel,
    shard_range,
)
from trainfast.transformer import TransformerBlock, TransformerShape

__all__ = [
    "ParallelTransformerBlock",
    "gather_from_sequence_parallel",
    "reduce_scatter_to_sequence_parallel",
    "saved_activation_bytes",
    "sequence_parallel_worker",
]

_SEQ = 1  # the sequence dimension of (batch, seq, d_model)


def _all_gather_seq(x: Tensor) -> Tensor:
    _, world_size = rank_and_world_size()
    blocks = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(world_size)]
    all_gather(blocks, x.contiguous(), check=False)
    return torch.cat(blocks, dim=_SEQ)  # (batch, seq, d)


def _reduce_scatter_seq(x: Tensor) -> Tensor:
    rank, world_size = rank_and_world_size()
    if x.shape[_SEQ] % world_size:
        raise ValueError(
            f"Invalid sequence length: {x.shape[_SEQ]} (sequence parallelism needs a multiple "
            f"of the world size, {world_size})"
        )
    output = torch.empty_like(
        x.chunk(world_size, dim=_SEQ)[rank], memory_format=torch.contiguous_format
    )
    reduce_scatter(
        output, [block.contiguous() for block in x.chunk(world_size, dim=_SEQ)], check=False
    )
    return output  # (batch, seq / N, d)


class _GatherFromSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return _all_gather_seq(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return _reduce_scatter_seq(grad)


class _ReduceScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return _reduce_scatter_seq(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return _all_gather_seq(grad)


class _GatherThenLinear(torch.autograd.Function):
    """Megatron-LM's sequence-parallel column-parallel matmul: all-gather the sequence and
    multiply, but keep only this rank's shard for backward and all-gather it again there."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)  # the shard (batch, seq / N, d), not the gathered input
        ctx.has_bias = bias is not None
        return F.linear(_all_gather_seq(x), weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        x, weight = ctx.saved_tensors
        full = _all_gather_seq(x)  # again, (batch, seq, d)
        grad_x = _reduce_scatter_seq(grad @ weight)  # (batch, seq / N, d)
        flat_grad = grad.reshape(-1, grad.shape[-1])
        grad_weight = flat_grad.T @ full.reshape(-1, full.shape[-1])
        return grad_x, grad_weight, flat_grad.sum(0) if ctx.has_bias else None


def gather_from_sequence_parallel(x: Tensor) -> Tensor:
    """All-gather (batch, seq / N, d) shards into (batch, seq, d); reduce-scatter backward."""
    return _GatherFromSequenceParallel.apply(x)


def reduce_scatter_to_sequence_parallel(x: Tensor) -> Tensor:
    """Reduce-scatter partial sums (batch, seq, d) into (batch, seq / N, d); all-gather backward."""
    return _ReduceScatterToSequenceParallel.apply(x)


def _param(t: Tensor) -> nn.Parameter:
    return nn.Parameter(t.detach().clone())


class ParallelTransformerBlock(nn.Module):
    """A pre-LayerNorm transformer block sharded over ranks, by heads and MLP units.

    Built from a dense :class:`~trainfast.transformer.TransformerBlock` (this rank keeps its
    slices). ``forward`` takes the whole sequence (batch, seq, d_model) in plain
    tensor parallelism, and this rank's (batch, seq / N, d_model) with ``sequence_parallel``.
    """

    def __init__(
        self,
        block: TransformerBlock,
        rank: int,
        world_size: int,
        *,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__()
        attn, mlp = block.attn, block.mlp
        d_model, self.n_heads = attn.qkv.in_features, attn.n_heads
        self.head_dim = d_model // attn.n_heads
        self.sequence_parallel = sequence_parallel
        heads = shard_range(attn.n_heads, rank, world_size)  # this rank's heads
        self.local_heads = heads.stop - heads.start
        features = slice(heads.start * self.head_dim, heads.stop * self.head_dim)
        rows = torch.arange(3 * d_model).view(3, d_model)[:, features].reshape(-1)  # q, k, v rows
        self.ln1, self.ln2 = _copy(block.ln1), _copy(block.ln2)
        self.qkv_weight = _param(attn.qkv.weight[rows])  # (3 · local_heads · head_dim, d_model)
        self.qkv_bias = _param(attn.qkv.bias[rows])
        self.attn_proj_weight = _param(attn.proj.weight[:, features])  # (d_model, local features)
        self.attn_proj_bias = _param(attn.proj.bias)  # added once, after the sum
        units = shard_range(mlp.fc.out_features, rank, world_size)
        self.fc_weight, self.fc_bias = _param(mlp.fc.weight[units]), _param(mlp.fc.bias[units])
        self.mlp_proj_weight = _param(mlp.proj.weight[:, units])
        self.mlp_proj_bias = _param(mlp.proj.bias)
        self.dropout = nn.Dropout(attn.dropout)

    def enter(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """Into a parallel region through its column-parallel matmul, on the whole sequence."""
        if self.sequence_parallel:  # all-gather; backward gathers again, reduce-scatters
            return _GatherThenLinear.apply(x, weight, bias)
        return F.linear(copy_to_tensor_parallel(x), weight, bias)

    def leave(self, partial: Tensor) -> Tensor:
        """Out of a parallel region: sum the ranks' partial outputs (this rank's tokens with SP)."""
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel(partial)
        return reduce_from_tensor_parallel(partial)

    def attention(self, h: Tensor) -> Tensor:
        """Causal attention of this rank's heads: normalised input -> partial (batch, seq, d)."""
        local = self.local_heads * self.head_dim
        qkv = self.enter(h, self.qkv_weight, self.qkv_bias)  # (batch, seq, 3 local)
        batch, seq, _ = qkv.shape
        q, k, v = qkv.split(local, dim=2)  # 3 x (batch, seq, local)
        q, k, v = (
            t.view(batch, seq, self.local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v)
        )
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True
        )  # (batch, local heads, seq, head_dim)
        y = y.transpose(1, 2).reshape(batch, seq, local)
        return F.linear(y, self.attn_proj_weight)  # a partial sum: this rank's heads only

    def mlp(self, h: Tensor) -> Tensor:
        """This rank's MLP units: normalised input -> partial (batch, seq, d_model)."""
        return F.linear(F.gelu(self.enter(h, self.fc_weight, self.fc_bias)), self.mlp_proj_weight)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.dropout(self.leave(self.attention(self.ln1(x))) + self.attn_proj_bias)
        return x + self.dropout(self.leave(self.mlp(self.ln2(x))) + self.mlp_proj_bias)

    def finish_gradient_synchronization(self) -> None:
        """Under sequence parallelism, sum the token-wise parameters' gradients over ranks."""
        if not self.sequence_parallel:
            return
        for p in (
            *self.ln1.parameters(),
            *self.ln2.parameters(),
            self.attn_proj_bias,
            self.mlp_proj_bias,
        ):
            if p.grad is not None:
                ring_all_reduce(p.grad)


def _copy(layer_norm: nn.LayerNorm) -> nn.LayerNorm:
    copy = nn.LayerNorm(layer_norm.normalized_shape, eps=layer_norm.eps).to(
        layer_norm.weight.device
    )
    copy.load_state_dict(layer_norm.state_dict())
    return copy


@contextmanager
def _counting_activation_sends(counter: list[int]) -> Iterator[None]:
    """Count the bytes of floating-point tensors this process sends (not the int64 shape checks)."""
    isend = dist.isend

    def counted(tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
        if tensor.is_floating_point():
            counter[0] += tensor.numel() * tensor.element_size()
        return isend(tensor, *args, **kwargs)

    dist.isend = counted  # every collective here sends with isend
    try:
        yield
    finally:
        dist.isend = isend


def saved_activation_bytes(run: Any, exclude: list[Tensor]) -> int:
    """Bytes of the distinct tensors autograd saves for backward while ``run()`` executes.

    Tensors in ``exclude`` (the parameters) do not count; a tensor saved twice counts once.
    """
    skip = {t.data_ptr() for t in exclude}
    seen: dict[tuple[int, int], int] = {}

    def pack(t: Tensor) -> Tensor:
        if t.data_ptr() not in skip:
            seen[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def sequence_parallel_worker(
    rank: int, world_size: int, shape: TransformerShape, seed: int = 0
) -> dict[str, Any]:
    """One dense block against its tensor-parallel and sequence-parallel shards.

    Returns, for ``"tp"`` and ``"sp"``: ``pairs`` (name -> (parallel, dense slice)) for the
    output, the input gradient and every parameter gradient; ``saved_bytes``, the activations
    autograd saved on this rank; ``sent_bytes``, the activation bytes this rank sent forward
    and backward (not the gradient synchronisation of the LayerNorms and biases).
    """
    torch.manual_seed(seed)
    device = rank_device()
    dense = TransformerBlock(shape, "sdpa", dropout=0.0).to(device)
    x = torch.randn(shape.batch_size, shape.seq_len, shape.d_model, device=device)
    upstream = torch.randn_like(x)
    if shape.seq_len % world_size:
        raise ValueError(
            f"Invalid seq_len: {shape.seq_len} (must divide evenly over {world_size} ranks)"
        )
    x_dense = x.clone().requires_grad_()
    dense(x_dense).backward(upstream)
    tokens = slice(rank * shape.seq_len // world_size, (rank + 1) * shape.seq_len // world_size)

    results = {}
    for mode in ("tp", "sp"):
        block = ParallelTransformerBlock(dense, rank, world_size, sequence_parallel=mode == "sp")
        mine = x[:, tokens] if mode == "sp" else x
        x_par = mine.clone().requires_grad_()
        outputs, sent = [], [0]

        def forward(
            block: nn.Module = block, x_par: Tensor = x_par, outputs: list = outputs
        ) -> None:
            outputs.append(block(x_par))

        with _counting_activation_sends(sent):
            saved = saved_activation_bytes(forward, list(block.parameters()))
            outputs[0].backward(upstream[:, tokens] if mode == "sp" else upstream)
        block.finish_gradient_synchronization()
        want = (lambda t: t[:, tokens]) if mode == "sp" else (lambda t: t)
        pairs = {
            "output": (outputs[0], want(dense(x))),
            "input grad": (x_par.grad, want(x_dense.grad)),
        }
        pairs |= _dense_grads(block, dense, rank, world_size)
        results[mode] = {
            "pairs": {name: (a.detach().cpu(), b.detach().cpu()) for name, (a, b) in pairs.items()},
            "saved_bytes": saved,
            "sent_bytes": sent[0],
        }
    dense.zero_grad()
    saved_dense = saved_activation_bytes(
        lambda: dense(x.clone().requires_grad_()), list(dense.parameters())
    )
    results["dense"] = {"saved_bytes": saved_dense}
    return results


def _dense_grads(
    block: ParallelTransformerBlock, dense: TransformerBlock, rank: int, world_size: int
) -> dict:
    """(parallel, dense) gradient pairs: each sharded gradient and its slice of the dense one."""
    attn, mlp = dense.attn, dense.mlp
    d_model = attn.qkv.in_features
    heads = shard_range(attn.n_heads, rank, world_size)
    features = slice(heads.start * block.head_dim, heads.stop * block.head_dim)
    rows = torch.arange(3 * d_model).view(3, d_model)[:, features].reshape(-1)
    units = shard_range(mlp.fc.out_features, rank, world_size)
    return {
        "ln1 grads": (
            torch.cat([p.grad for p in block.ln1.parameters()]),
            torch.cat([p.grad for p in dense.ln1.parameters()]),
        ),
        "ln2 grads": (
            torch.cat([p.grad for p in block.ln2.parameters()]),
            torch.cat([p.grad for p in dense.ln2.parameters()]),
        ),
        "qkv.weight grad": (block.qkv_weight.grad, attn.qkv.weight.grad[rows]),
        "qkv.bias grad": (block.qkv_bias.grad, attn.qkv.bias.grad[rows]),
        "attn proj.weight grad": (block.attn_proj_weight.grad, attn.proj.weight.grad[:, features]),
        "attn proj.bias grad": (block.attn_proj_bias.grad, attn.proj.bias.grad),
        "fc.weight grad": (block.fc_weight.grad, mlp.fc.weight.grad[units]),
        "fc.bias grad": (block.fc_bias.grad, mlp.fc.bias.grad[units]),
        "mlp proj.weight grad": (block.mlp_proj_weight.grad, mlp.proj.weight.grad[:, units]),
        "mlp proj.bias grad": (block.mlp_proj_bias.grad, mlp.proj.bias.grad),
    }
