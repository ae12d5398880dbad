"""Start several processes that form a process group, and bring their results home.

:func:`spawn` is the one-machine launcher the chapter uses for every algorithm: it runs
``fn(rank, world_size, *args)`` in ``world_size`` processes, each already inside an initialised
default process group (gloo on CPU; NCCL when there is one GPU per rank), and returns the ranks'
return values in rank order.

It is a thin layer over PyTorch's own ``torch.multiprocessing.start_processes`` (forkserver
start method), which starts the processes, notices the first one that fails, terminates the
others and kills the children if the parent dies. The ``launcher-failure`` benchmark
(:mod:`trainfast.distributed.measurements.launchers`) measured that it fails as fast as the
hand-written launcher this module used to hold, blames the same rank and leaves no process
behind, so that one is gone. What ``spawn`` adds:

* **A process group per rank, and no ports to collide.** Ranks meet through a ``file://`` store
  in a fresh temporary folder, so two builds on one machine never fight over ``MASTER_PORT``.
* **Results and errors come home.** Each rank's return value (pickled) and, on failure, its
  exception and traceback; a failure is a :class:`SpawnError` naming the rank. ``start_processes``
  names the first process it sees fail, which may be a consequence (a peer whose connection
  dropped), so the others get a second to report and the root cause is the one raised.
* **Nothing hangs.** Set-up and every collective time out (``collective_timeout``); the whole
  launch may have a deadline too (``timeout``).
* **Fast.** The forkserver imports ``preload`` once, so a launch costs a fraction of a second.
  It keeps those modules (this package included) for the life of the launching process: after
  editing the package, restart the notebook kernel.

``fn`` must be importable by name (defined in a module, not in a notebook cell): the child
processes look it up by its module and name. Under ``torchrun`` the process group already exists;
the package's workers only use the default group, so they run unchanged (see :func:`init_from_env`).
"""

from __future__ import annotations

import datetime
import inspect
import multiprocessing as mp
import os
import pickle
import shutil
import socket
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from trainfast.validation import check_int, check_number

__all__ = [
    "DEFAULT_PRELOAD",
    "FailureKind",
    "SpawnError",
    "default_backend",
    "init_from_env",
    "rank_device",
    "spawn",
]

#: Modules the forkserver imports once, so that no rank pays for them: torch, what torch.optim
#: imports lazily on its first step (torch._dynamo), and this package. Pass ``preload`` to
#: :func:`spawn` to add what your workers import (a data set's module, say).
DEFAULT_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "trainfast.distributed")


#: Seconds the other ranks get to report after the first failure, to find the root cause.
_GRACE_S = 1.0
#: Seconds a rank may take to leave once every rank has returned its result; then it is stopped.
_TEARDOWN_S = 5.0
#: Error messages that only say a peer went away: consequences of another rank's failure.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


class FailureKind(IntEnum):
    """How a rank failed, in order of how likely it is the root cause (lowest first)."""

    DIED = 0  # the process ended without a report: killed, out of memory, a native crash
    RAISED = 1  # ``fn`` raised
    PEER_GONE = 2  # ``fn`` raised only because a peer hung up: a consequence


@dataclass(frozen=True)
class _RankConfig:
    """What every child needs besides its rank: where to meet and report, and how."""

    folder: str  # holds the rendezvous store and each rank's result or error
    backend: str
    collective_timeout: float
    threads: int
    pin_cores: bool = False


class SpawnError(RuntimeError):
    """A rank of :func:`spawn` raised (or died); the message holds that rank's traceback."""

    def __init__(self, message: str, rank: int, error_type: str, rank_traceback: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.error_type = error_type
        self.rank_traceback = rank_traceback


def default_backend(world_size: int) -> str:
    """``"nccl"`` when there is a CUDA device for every rank, otherwise ``"gloo"``."""
    if dist.is_nccl_available() and torch.cuda.is_available():
        if torch.cuda.device_count() >= world_size:
            return "nccl"
    return "gloo"


def rank_device() -> torch.device:
    """The device this rank's tensors live on: its own GPU under NCCL, else the CPU.

    NCCL only moves CUDA tensors, gloo (in this book) CPU ones; workers call this instead of
    assuming either.
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_from_env(backend: str | None = None, timeout_s: float = 300.0) -> tuple[int, int]:
    """Join the process group described by ``torchrun``'s environment; return (rank, world size).

    Does nothing but report if a group is already initialised, so a worker can call it whether it
    was started by :func:`spawn` or by ``torchrun``.
    """
    check_number("timeout_s", timeout_s, above=0.0)
    if not dist.is_initialized():
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        backend = backend or default_backend(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(
            backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s)
        )
    return dist.get_rank(), dist.get_world_size()


def _loopback_interface() -> str | None:
    """The name of the loopback interface ("lo" on Linux, "lo0" on macOS), if any."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((name for name in names if name.startswith("lo")), None)


def _run_rank(
    rank: int, fn: Callable[..., Any], world_size: int, args: tuple, config: _RankConfig
) -> None:
    """Body of one child process: join the group, run ``fn``, write the outcome to a file."""
    torch.set_num_threads(config.threads)
    if config.pin_cores and hasattr(os, "sched_setaffinity"):  # spawn warned if ranks > cores
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    backend = config.backend
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = _loopback_interface()  # one machine: talk over loopback, whatever DNS says
        if interface:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"file://{os.path.join(config.folder, 'store')}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=config.collective_timeout),
        )
        result = fn(rank, world_size, *args)
    except BaseException as error:  # every failure must reach the parent
        try:
            cause = pickle.dumps(error)
        except Exception:  # an unpicklable exception still reports its text
            cause = None
        when = time.time()  # wall clock: comparable across ranks, to find the first failure
        report = (type(error).__name__, str(error), traceback.format_exc(), cause, when)
        with open(os.path.join(config.folder, f"error-{rank}"), "wb") as file:
            pickle.dump(report, file)
        os._exit(1)  # peers may be stuck in a collective with us: leave without a goodbye
    path = os.path.join(config.folder, f"result-{rank}")
    with open(path + ".part", "wb") as file:
        pickle.dump(result, file)
    os.replace(path + ".part", path)  # the parent sees a result whole or not at all
    dist.destroy_process_group()


def _all_returned(folder: str, world_size: int) -> bool:
    return all(os.path.exists(os.path.join(folder, f"result-{r}")) for r in range(world_size))


def _spawn_error(folder: str, rank: int, world_size: int, exitcode: int | None) -> SpawnError:
    """The :class:`SpawnError` for a rank that failed, from the report it left (if any)."""
    path = os.path.join(folder, f"error-{rank}")
    if not os.path.exists(path):
        message = (
            f"rank {rank} of {world_size} died with exit code {exitcode} before returning "
            "(killed, out of memory, or a crash in native code)"
        )
        return SpawnError(message, rank, "ProcessDied", "")
    with open(path, "rb") as file:
        error_type, text, rank_traceback, cause, _ = pickle.load(file)
    message = (
        f"rank {rank} of {world_size} raised {error_type}: {text}\n\n"
        f"Traceback from rank {rank}:\n{rank_traceback}"
    )
    error = SpawnError(message, rank, error_type, rank_traceback)
    error.__cause__ = _unpickle(cause)
    return error


def _root_cause(folder: str, world_size: int, first: int) -> int:
    """The rank to blame: one that died without a report, else the earliest that raised for a
    reason of its own, else the earliest "peer hung up" (``first``: the rank torch noticed)."""
    candidates = []
    for rank in range(world_size):
        path = os.path.join(folder, f"error-{rank}")
        if not os.path.exists(path):
            if rank == first:
                candidates.append((FailureKind.DIED, 0.0, rank))
            continue
        with open(path, "rb") as file:
            _, text, _, _, when = pickle.load(file)
        gone = any(marker in text for marker in _PEER_GONE)
        candidates.append((FailureKind.PEER_GONE if gone else FailureKind.RAISED, when, rank))
    return min(candidates)[2] if candidates else first


def _joins_with_grace(context: Any) -> bool:
    """Whether torch's ``ProcessContext.join`` takes ``grace_period`` (torch 2.4 has none)."""
    return "grace_period" in inspect.signature(context.join).parameters


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float | None = None,
    collective_timeout: float = 60.0,
    threads_per_rank: int = 1,
    preload: Sequence[str] = DEFAULT_PRELOAD,
    pin_cores: bool = False,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes; return results by rank.

    Each process starts inside an initialised default process group (``backend``: gloo on CPU,
    NCCL when there is a GPU per rank; see :func:`default_backend`) whose set-up and collectives
    time out after ``collective_timeout`` seconds. ``timeout`` bounds the whole launch. Results
    travel home pickled, so return tensors, numbers and dataclasses, not open files.
    ``preload`` names modules the forkserver imports once when it first starts (a module that
    is not installed is skipped); later calls cannot change what a running server preloaded.
    ``pin_cores`` binds rank ``r`` to the ``r``-th core this process may use (modulo their
    number; Linux only), so that ranks timed side by side do not trade cores.

    Raises :class:`SpawnError` with the failing rank's traceback as soon as one rank raises or
    dies, and ``TimeoutError`` when ``timeout`` passes, after stopping every child.
    ``start_processes`` reports the first process it sees fail, which may be a consequence (a
    peer whose connection dropped), so the others get a moment (``_GRACE_S``) to report and
    the root cause is raised (see :class:`FailureKind`).
    """
    check_int("world_size", world_size, minimum=1)
    if timeout is not None:  # inf passes "> 0" and NaN passes "<= 0": both checked here
        check_number("timeout", timeout, above=0.0)
    check_number("collective_timeout", collective_timeout, above=0.0)
    check_int("threads_per_rank", threads_per_rank, minimum=1)
    if pin_cores and hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
        if world_size > cores:
            warnings.warn(
                f"spawn: pin_cores with {world_size} ranks on {cores} usable cores: some ranks "
                "share a core",
                stacklevel=2,
            )
    backend = backend or default_backend(world_size)
    if backend not in ("gloo", "nccl", "mpi"):
        raise ValueError(f"Unknown backend: {backend!r} (expected 'gloo', 'nccl' or 'mpi')")
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if method == "forkserver":  # takes effect when the server first starts
        mp.get_context(method).set_forkserver_preload(list(preload))
    folder = tempfile.mkdtemp(prefix="trainfast-spawn-")
    config = _RankConfig(folder, backend, collective_timeout, threads_per_rank, pin_cores)
    context = None
    try:
        context = torch_mp.start_processes(
            _run_rank,
            args=(fn, world_size, args, config),
            nprocs=world_size,
            join=False,
            start_method=method,
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        # the grace period (SIGTERM, then SIGKILL) is newer than torch 2.4, whose join kills at once
        grace = {"grace_period": _GRACE_S} if _joins_with_grace(context) else {}
        returned_at = None
        try:
            while not context.join(timeout=0.05, **grace):
                if returned_at is None and _all_returned(folder, world_size):
                    returned_at = time.monotonic()
                # every rank has returned its result, and one still hangs in the group's
                # teardown (torch 2.4's gloo destroy_process_group can, once its peers have
                # gone): the results are whole, and the `finally` below stops it
                if returned_at is not None and time.monotonic() - returned_at > _TEARDOWN_S:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    ranks = [r for r, p in enumerate(context.processes) if p.is_alive()]
                    raise TimeoutError(
                        f"spawn: ranks {ranks} of {world_size} did not finish within {timeout} s "
                        "(a deadlock, or a rank waiting for a message that never comes?)"
                    )
        except (torch_mp.ProcessRaisedException, torch_mp.ProcessExitedException) as failure:
            exitcode = getattr(failure, "exit_code", None)
            rank = _root_cause(folder, world_size, failure.error_index)  # torch names the first
            error = _spawn_error(folder, rank, world_size, exitcode)
            raise error from error.__cause__  # the rank's own exception, not torch's wrapper
        results = []
        for rank in range(world_size):
            with open(os.path.join(folder, f"result-{rank}"), "rb") as file:
                results.append(pickle.load(file))
        return results
    finally:
        for process in context.processes if context is not None else []:
            if process.is_alive():
                process.kill()
            process.join()
        shutil.rmtree(folder, ignore_errors=True)


def _unpickle(data: bytes | None) -> BaseException | None:
    if data is None:
        return None
    try:
        error = pickle.loads(data)
    except Exception:  # the text in the message is what matters
        return None
    return error if isinstance(error, BaseException) else None
