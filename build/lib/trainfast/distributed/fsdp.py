"""Our own fully sharded data parallelism (ZeRO stage 3): every weight matrix lives in pieces.

ZeRO-1 and ZeRO-2 (:mod:`trainfast.distributed.zero`) still keep every parameter whole on every
rank. :class:`FSDP` keeps only ``1/N`` of each weight matrix and gathers a layer's full weight
just while the layer needs it (Zhao et al., 2023, "PyTorch FSDP: Experiences on Scaling Fully
Sharded Data Parallel"):

* **Sharding.** Every 2-D parameter (the weight of a ``Linear``, an ``Embedding``, any module
  whose weight is 2-D) is flattened, padded to a multiple of ``N`` and cut into ``N`` slices;
  rank ``r`` keeps slice ``r`` as an fp32 ``nn.Parameter``. 1-D parameters (biases, norm gains)
  are small, stay whole on every rank, and their gradients are all-reduced.
* **Forward.** A forward pre-hook all-gathers the module's full weight; a forward hook frees it
  (its storage is resized to zero, so the tensor autograd saved stays valid but empty).
* **Backward.** A hook on the module's output fires just before the module's backward: it
  gathers the weight again. When the full weight's gradient is complete
  (``register_post_accumulate_grad_hook``), it is reduce-scattered (the mean over ranks), each
  rank keeps its slice's gradient on its shard, and the full weight and gradient are freed.
* **Prefetching** (``prefetch=True``): while a layer computes, the next layer's all-gather
  (forward order in the forward pass, reverse order in backward) is already on the wire.
* **Mixed precision** (``compute_dtype``): the shards are cast for the all-gather and the
  compute; gradients are reduce-scattered in that dtype and handed to the optimizer in fp32 on
  the fp32 master shards, so optimizer state is fp32. Replicated parameters stay fp32 (cast for
  the compute), and floating-point inputs of every module are cast to ``compute_dtype``.

Use it like this: ``fsdp = FSDP(model)``; ``optimizer = torch.optim.AdamW(fsdp.parameters())``;
each step ``loss.backward()``, ``fsdp.finish_gradient_synchronization()``, ``optimizer.step()``.
:meth:`FSDP.full_state_dict` gathers every parameter under the wrapped module's own names.

A teaching implementation: one module's weight is one unit (torch groups modules into units and
flattens them together), collectives run on the default stream, and every rank must run the
same modules in the same order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["FSDP"]


def _all_gather(output: torch.Tensor, mine: torch.Tensor, async_op: bool = False) -> Any:
    """Every rank's ``mine`` concatenated into ``output`` (torch >= 2.14 calls it ``_single``)."""
    single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return single(output, mine, async_op=async_op)


def _reduce_scatter(output: torch.Tensor, flat: torch.Tensor) -> None:
    """Sum over ranks of ``flat``, rank ``r`` keeping block ``r`` (gloo has no AVG)."""
    single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    single(output, flat)


class _ShardedWeight:
    """A 2-D parameter: my fp32 slice, and a full-size tensor whose storage comes and goes."""

    def __init__(
        self, name: str, param: nn.Parameter, compute_dtype: torch.dtype, rank: int, world: int
    ) -> None:
        self.name, self.shape, self.numel = name, param.shape, param.numel()
        self.world_size = world
        flat = param.detach().reshape(-1).float()
        flat = nn.functional.pad(flat, (0, -flat.numel() % world))  # (N * shard_numel,)
        self.shard = nn.Parameter(flat.chunk(world)[rank].clone(), param.requires_grad)
        self.padded = torch.empty(flat.numel(), dtype=compute_dtype, device=param.device)
        # `.data`: an alias with its own version counter, so refilling `padded` between forward
        # and backward does not look like an in-place change to autograd
        self.full = self.padded[: self.numel].view(self.shape).data
        self.full.requires_grad_(param.requires_grad)
        self.nbytes = self.padded.numel() * self.padded.element_size()
        self.work: Any = None  # a pending asynchronous all-gather
        self._sending: torch.Tensor | None = None  # kept alive until the all-gather is done
        self.free()

    @property
    def gathered(self) -> bool:
        return self.padded.untyped_storage().size() > 0

    def start_gather(self) -> None:
        """Allocate the full weight and start all-gathering it from everyone's slices."""
        if self.gathered or self.work is not None:
            return
        self.padded.untyped_storage().resize_(self.nbytes)
        self._sending = self.shard.detach().to(self.padded.dtype)
        self.work = _all_gather(self.padded, self._sending, async_op=True)

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work, self._sending = None, None

    def free(self) -> None:
        self.padded.untyped_storage().resize_(0)


class FSDP(nn.Module):
    """Fully sharded data parallelism (ZeRO-3) built from all-gather and reduce-scatter.

    ``.module`` is the wrapped model (its parameters move into this wrapper: ``parameters()``
    yields the fp32 shards of 2-D weights and the whole 1-D parameters). Rank 0's parameters are
    broadcast first, so all ranks start equal. The chapter's timeline of what it does is
    recorded from outside, by module and tensor hooks
    (:mod:`trainfast.distributed.measurements.fsdp_timeline`).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        compute_dtype: torch.dtype | None = None,
        prefetch: bool = False,
    ) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("FSDP needs an initialised process group (run under spawn)")
        if compute_dtype is not None and not compute_dtype.is_floating_point:
            raise ValueError(f"Invalid compute_dtype: {compute_dtype!r} (expected a float dtype)")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.compute_dtype = compute_dtype
        self.prefetch = prefetch
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=0)
        names = {id(p): name for name, p in module.named_parameters()}  # tied: the first name
        self.shards = nn.ParameterDict()
        self.replicated = nn.ParameterDict()
        self._sharded: dict[int, _ShardedWeight] = {}
        self._uses: dict[nn.Module, list[tuple[str, Any]]] = {}
        for owner in module.modules():
            for attr, p in list(owner.named_parameters(recurse=False)):
                key = names[id(p)].replace(".", "/")
                if p.dim() == 2 and id(p) not in self._sharded:
                    dtype = compute_dtype or p.dtype
                    weight = _ShardedWeight(names[id(p)], p, dtype, self.rank, self.world_size)
                    if p.requires_grad:
                        hook = self._make_grad_hook(weight)
                        weight.full.register_post_accumulate_grad_hook(hook)
                    self._sharded[id(p)] = weight
                    self.shards[key] = weight.shard
                elif p.dim() != 2 and key not in self.replicated:
                    self.replicated[key] = p
                entry = self._sharded[id(p)] if p.dim() == 2 else self.replicated[key]
                del owner._parameters[attr]
                self._uses.setdefault(owner, []).append((attr, entry))
        self.module = module
        self._names = names
        self._order: list[_ShardedWeight] = []  # sharded weights in first-forward order
        for owner in self._uses:
            owner.register_forward_pre_hook(self._before_forward)
            owner.register_forward_hook(self._after_forward)

    # ------------------------------------------------------------------ gathering and freeing
    def _gather(self, weight: _ShardedWeight) -> None:
        weight.start_gather()  # nothing to do if a prefetch started it
        weight.wait()

    def _prefetch_after(self, weight: _ShardedWeight, step: int) -> None:
        """Start the all-gather of the weight after (step=1) or before (-1) this one."""
        if not self.prefetch or weight not in self._order:
            return
        index = self._order.index(weight) + step
        if 0 <= index < len(self._order):
            self._order[index].start_gather()

    def _before_forward(self, owner: nn.Module, args: tuple) -> tuple:
        for attr, entry in self._uses[owner]:
            if isinstance(entry, _ShardedWeight):
                if torch.is_grad_enabled() and entry not in self._order:
                    self._order.append(entry)
                self._gather(entry)
                self._prefetch_after(entry, +1)
                object.__setattr__(owner, attr, entry.full)
            else:  # replicated: a differentiable view (cast), never a registered Parameter
                value = entry.to(self.compute_dtype) if self.compute_dtype else entry.view_as(entry)
                object.__setattr__(owner, attr, value)
        if self.compute_dtype is None:
            return args
        return tuple(
            a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point() else a
            for a in args
        )

    def _after_forward(self, owner: nn.Module, args: tuple, output: Any) -> Any:
        weights = [e for _, e in self._uses[owner] if isinstance(e, _ShardedWeight)]
        for weight in weights:
            weight.free()
        if weights and torch.is_tensor(output) and output.requires_grad:
            output.register_hook(lambda grad: self._before_backward(weights, grad))
        return output

    def _before_backward(self, weights: list[_ShardedWeight], grad: torch.Tensor) -> None:
        for weight in weights:  # autograd saved the full tensor; give it its data back
            self._gather(weight)
            self._prefetch_after(weight, -1)

    def _make_grad_hook(self, weight: _ShardedWeight) -> Any:
        def reduce_gradient(full: torch.Tensor) -> None:
            flat = torch.zeros(weight.padded.numel(), dtype=full.grad.dtype, device=full.device)
            flat[: weight.numel] = full.grad.reshape(-1)
            mine = torch.empty(weight.shard.numel(), dtype=flat.dtype, device=flat.device)
            _reduce_scatter(mine, flat)
            mine = mine.float().div_(self.world_size)  # the mean, in fp32 for the optimizer
            shard = weight.shard
            shard.grad = mine if shard.grad is None else shard.grad.add_(mine)
            full.grad = None
            weight.free()

        return reduce_gradient

    # ---------------------------------------------------------------------------- interface
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        """After backward: average the replicated parameters' gradients over ranks, and free
        the frozen weights that backward gathered (no gradient hook frees those)."""
        for weight in self._sharded.values():
            if weight.gathered:
                weight.free()
        for p in self.replicated.values():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(self.world_size)

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter in full (fp32 for sharded ones), under the wrapped module's names."""
        result = {}
        for key, p in self.replicated.items():
            result[key.replace("/", ".")] = p.detach().clone()
        for weight in self._sharded.values():
            gathered = torch.empty(
                weight.shard.numel() * self.world_size, device=weight.shard.device
            )
            _all_gather(gathered, weight.shard.detach())
            result[weight.name] = gathered[: weight.numel].view(weight.shape).clone()
        order = list(self._names.values())
        return {name: result[name] for name in order}
