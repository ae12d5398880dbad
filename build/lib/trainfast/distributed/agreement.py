"""Before a collective: which ranks take part, and do they all make the same call?

:func:`rank_and_world_size` and :func:`global_rank` number ranks within a process group (default:
every rank), which is how each axis of a layout talks among its own ranks
(:mod:`trainfast.distributed.mesh`). :func:`check_same_tensor_meta` is what every collective of
:mod:`trainfast.distributed.collectives` runs first with ``check=True``: ranks that disagree on a
shape, a root or an operator would otherwise hang or silently compute garbage.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["OPS", "check_same_tensor_meta", "global_rank", "rank_and_world_size"]

#: The reduction operators the collectives understand.
OPS = ("sum", "mean", "max", "min")

_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
]
_MAX_DIMS = 8
#: The collectives :func:`check_same_tensor_meta` can tell apart.
_COLLECTIVES = (
    "",
    "broadcast",
    "reduce",
    "all_reduce",
    "ring_all_reduce",
    "all_gather",
    "reduce_scatter",
)


# ----------------------------------------------------------------------------- small pieces
def rank_and_world_size(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """``(rank, world_size)`` within ``group`` (default: all ranks); a clear error outside one.

    Every collective and parallel layer of this package starts here, so code run outside
    :func:`~trainfast.distributed.spawn` or torchrun fails with a message that says what to do,
    not with torch's "Default process group has not been initialized".
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "trainfast.distributed collectives need an initialised process group: "
            "run them inside trainfast.distributed.spawn(...) or under torchrun"
        )
    if group is not None and dist.get_rank(group) < 0:
        raise ValueError(f"Invalid group: rank {dist.get_rank()} is not a member of it")
    return dist.get_rank(group), dist.get_world_size(group)


def global_rank(group: dist.ProcessGroup | None, rank: int) -> int:
    """The global rank of ``group``'s rank ``rank`` (send and recv address global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)


_UNSET, _INVALID = -1, -2  # an argument slot not used by this call; a value that is not valid


def _argument_code(value: object, choices: tuple[str, ...] | None = None) -> int:
    """An int for a root rank or an op, the same on every rank that passed the same value."""
    if value is None:
        return _UNSET
    if choices is not None:
        return choices.index(value) if value in choices else _INVALID
    return value if isinstance(value, int) and not isinstance(value, bool) else _INVALID


def _signature(
    tensor: torch.Tensor, collective: str = "", root: object = None, op: object = None
) -> torch.Tensor:
    """(dtype index, ndim, shape padded with -1, collective, root, op) as int64, the same length
    for every call, so ranks that called different collectives still exchange one message."""
    if tensor.dtype not in _DTYPES:
        raise ValueError(f"Unsupported dtype: {tensor.dtype} (expected one of {_DTYPES})")
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"Unsupported ndim: {tensor.dim()} (at most {_MAX_DIMS} dimensions)")
    shape = list(tensor.shape) + [-1] * (_MAX_DIMS - tensor.dim())
    values = [_DTYPES.index(tensor.dtype), tensor.dim(), *shape]
    values += [_COLLECTIVES.index(collective), _argument_code(root), _argument_code(op, OPS)]
    return torch.tensor(values, dtype=torch.int64, device=tensor.device)


def _describe(signature: list[int], root_name: str) -> tuple[str, str, str, str]:
    """How one rank's call differs, read from its signature (the first difference decides)."""
    collective, root, op = signature[-3:]
    dtype, shape = _DTYPES[signature[0]], signature[2 : 2 + signature[1]]
    root_text = "an invalid rank" if root == _INVALID else str(root)
    op_text = "an unknown op" if op == _INVALID else repr(OPS[op]) if op >= 0 else "no op"
    return (
        f"has shape {tuple(shape)} and dtype {dtype}",
        f"called {_COLLECTIVES[collective] or 'a collective'}",
        f"has {root_name}={root_text}",
        f"has op={op_text}",
    )


def check_same_tensor_meta(
    tensor: torch.Tensor,
    what: str = "tensor",
    *,
    collective: str = "",
    root: tuple[str, object] | None = None,
    op: str | None = None,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Raise ``ValueError`` on every rank unless all ranks (of ``group``) agree on the call.

    All ranks' ``tensor`` must share shape and dtype and, where given, every rank must call the
    same ``collective`` with the same ``root`` (``("src", 0)``) and ``op``. Ranks that disagree
    on a root would hang until gloo's timeout, and on ``op`` would all get the same wrong
    answer, silently. Rank 0 gathers every rank's signature with ``recv``, compares, and sends
    the verdict back, so all ranks raise the same error together, naming the first rank that
    differs from rank 0 and both values.
    """
    rank, world_size = rank_and_world_size(group)
    root_name, root_value = root if root is not None else ("root", None)
    signature = _signature(tensor, collective, root_value, op)
    if world_size == 1:
        return
    verdict = torch.full((1 + 2 * signature.numel(),), -1, dtype=torch.int64, device=tensor.device)
    if rank == 0:
        for other in range(1, world_size):
            theirs = torch.empty_like(signature)
            dist.recv(theirs, src=global_rank(group, other), group=group)
            if verdict[0] < 0 and not torch.equal(theirs, signature):
                verdict.copy_(
                    torch.cat([torch.tensor([other], device=tensor.device), signature, theirs])
                )
        requests = [
            dist.isend(verdict, dst=global_rank(group, other), group=group)
            for other in range(1, world_size)
        ]
        for request in requests:
            request.wait()
    else:
        dist.send(signature, dst=global_rank(group, 0), group=group)
        dist.recv(verdict, src=global_rank(group, 0), group=group)
    if verdict[0] >= 0:
        values, half = verdict.tolist(), signature.numel()
        ours, theirs = values[1 : 1 + half], values[1 + half :]
        mine, other = _describe(ours, root_name), _describe(theirs, root_name)
        parts = [ours[: half - 3] != theirs[: half - 3]] + [
            ours[i] != theirs[i] for i in range(half - 3, half)
        ]
        first = parts.index(True)
        kind = [what, "collectives", f"arguments of {collective}", f"arguments of {collective}"]
        raise ValueError(
            f"Mismatched {kind[first]} across ranks: rank {values[0]} {other[first]}, "
            f"but rank 0 {mine[first]}"
        )
