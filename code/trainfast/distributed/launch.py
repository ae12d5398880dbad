"""Start several processes that form a process group, and bring their results home.

:func:`spawn` is the one-machine launcher the chapter uses for every algorithm: it runs
``fn(rank, world_size, *args)`` in ``world_size`` processes, each already inside an initialised
default process group (gloo on CPU; NCCL when there is one GPU per rank), and returns the ranks'
return values in rank order. It is to ``torch.multiprocessing.spawn`` what a test harness is to a
script: it fails fast and loudly.

* **No ports to collide.** Ranks meet through a ``file://`` store in a fresh temporary folder,
  and gloo's own connections use ports the operating system picks, so two builds or test runs
  on one machine never fight over ``MASTER_PORT``.
* **Nothing hangs.** Set-up and every collective have a timeout (``collective_timeout``); the
  whole launch may have one too (``timeout``). A deadlock therefore ends as an error.
* **A failing rank fails the launch, promptly.** The first rank to raise sends its traceback
  home; the others are stopped (they may be waiting for it inside a collective) and
  :class:`SpawnError` is raised with that rank's traceback. No process is left behind.
* **Fast.** Processes are forked from a "forkserver" that has already imported torch, so a
  launch costs a fraction of a second instead of one torch import per rank. The server keeps
  the modules it preloaded (this package included) for the life of the launching process:
  after editing the package, restart the notebook kernel.

``fn`` must be importable by name (defined in a module, not in a notebook cell): the child
processes look it up by its module and name. Under ``torchrun`` the process group already exists;
the package's workers only use the default group, so they run unchanged (see :func:`init_from_env`).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DEFAULT_PRELOAD",
    "FailureKind",
    "SpawnError",
    "default_backend",
    "init_from_env",
    "rank_device",
    "spawn",
]

#: Seconds the other ranks get to report after the first failure, to find the root cause.
_GRACE_S = 1.0
#: Error messages that only say a peer went away: consequences of another rank's failure.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")

#: Modules the forkserver imports once, so that no rank pays for them: torch, what torch.optim
#: imports lazily on its first step (torch._dynamo), and this package. Pass ``preload`` to
#: :func:`spawn` to add what your workers import (a data set's module, say).
DEFAULT_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "trainfast.distributed")


class FailureKind(IntEnum):
    """How a rank failed, in order of how likely it is the root cause (lowest first)."""

    DIED = 0  # the process ended without a word: killed, out of memory, a native crash
    RAISED = 1  # ``fn`` raised
    PEER_GONE = 2  # ``fn`` raised only because a peer hung up: a consequence


@dataclass(frozen=True)
class _RankConfig:
    """What every child needs besides its rank: where to meet, how, and whom to watch."""

    store: str
    backend: str
    collective_timeout: float
    threads: int
    parent_pid: int


@dataclass(frozen=True)
class _Outcome:
    """What a child sends home: its pickled result, or its error."""

    result: bytes | None = None
    error_type: str = ""
    text: str = ""
    rank_traceback: str = ""
    cause: bytes | None = None  # the pickled exception, when it pickles
    when: float = 0.0  # wall clock of the failure: comparable across ranks

    @property
    def ok(self) -> bool:
        return not self.error_type


@dataclass(frozen=True)
class _Failure:
    kind: FailureKind
    when: float
    error: SpawnError


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


def _exit_when_parent_dies(parent_pid: int) -> None:
    """Stop this rank if the launching process disappears (killed kernels leave no orphans)."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # pid reused by another user's process: parent is gone
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="trainfast-parent-watch").start()


def _run_rank(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    args: tuple,
    config: _RankConfig,
    conn: multiprocessing.connection.Connection,
) -> None:
    """Body of one child process: join the group, run ``fn``, send the outcome home."""
    _exit_when_parent_dies(config.parent_pid)
    torch.set_num_threads(config.threads)
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
            init_method=f"file://{config.store}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=config.collective_timeout),
        )
        outcome = _Outcome(result=pickle.dumps(fn(rank, world_size, *args)))
    except BaseException as error:  # every failure must reach the parent
        when = time.time()  # wall clock: comparable across ranks, to find the first failure
        try:
            cause = pickle.dumps(error)
        except Exception:  # an unpicklable exception still reports its text
            cause = None
        outcome = _Outcome(
            None, type(error).__name__, str(error), traceback.format_exc(), cause, when
        )
    conn.send(outcome)
    conn.close()
    if not outcome.ok:
        os._exit(1)  # peers may be stuck in a collective with us: leave without a goodbye
    if dist.is_initialized():
        dist.destroy_process_group()


def _stop(processes: list) -> None:
    """Terminate what is still running, then kill what ignores the request."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + 2.0
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float | None = None,
    collective_timeout: float = 60.0,
    threads_per_rank: int = 1,
    preload: Sequence[str] = DEFAULT_PRELOAD,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes; return results by rank.

    Each process starts inside an initialised default process group (``backend``: gloo on CPU,
    NCCL when there is a GPU per rank; see :func:`default_backend`) whose set-up and collectives
    time out after ``collective_timeout`` seconds. ``timeout`` bounds the whole launch. Results
    travel home pickled, so return tensors, numbers and dataclasses, not open files.
    ``preload`` names modules the forkserver imports once when it first starts (a module that
    is not installed is skipped); later calls cannot change what a running server preloaded.

    Raises :class:`SpawnError` with the failing rank's traceback as soon as one rank raises or
    dies (within a second, while the others report, so that the root cause is the one named),
    and ``TimeoutError`` when ``timeout`` passes; either way every child is stopped first.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"Invalid world_size: {world_size!r} (expected an int >= 1)")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"Invalid timeout: {timeout!r} (expected seconds > 0 or None)")
    backend = backend or default_backend(world_size)
    if backend not in ("gloo", "nccl", "mpi"):
        raise ValueError(f"Unknown backend: {backend!r} (expected 'gloo', 'nccl' or 'mpi')")
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(list(preload))  # takes effect when the server first starts

    folder = tempfile.mkdtemp(prefix="trainfast-spawn-")
    config = _RankConfig(
        os.path.join(folder, "store"), backend, collective_timeout, threads_per_rank, os.getpid()
    )
    processes, readers = [], []
    try:
        for rank in range(world_size):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_run_rank,
                args=(fn, rank, world_size, args, config, writer),
                name=f"trainfast-rank-{rank}",
            )
            process.start()
            writer.close()  # the child holds its own copy; ours would hide its death
            processes.append(process)
            readers.append(reader)
        return _collect(processes, readers, timeout)
    finally:
        _stop(processes)
        for reader in readers:
            reader.close()
        shutil.rmtree(folder, ignore_errors=True)


def _collect(processes: list, readers: list, timeout: float | None) -> list[Any]:
    """Wait for every rank's outcome; raise on a failure or at the deadline.

    One failure usually causes others (its peers lose their connection to it), so after the
    first one arrives the others get a moment (``_GRACE_S``) to report, and the root cause is
    raised: a rank that died without a word if any, else the earliest error that is not merely
    "a peer hung up", else the earliest error.
    """
    world_size = len(processes)
    results: dict[int, Any] = {}
    failures: list[_Failure] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    grace = None
    waiting = {reader: rank for rank, reader in enumerate(readers)}
    while waiting:
        limits = [t for t in (deadline, grace) if t is not None]
        left = max(0.0, min(limits) - time.monotonic()) if limits else None
        ready = mp.connection.wait(list(waiting), timeout=left)
        if not ready and failures:
            break  # the grace period is over
        if not ready:
            ranks = sorted(waiting.values())
            raise TimeoutError(
                f"spawn: ranks {ranks} of {world_size} did not finish within {timeout} s "
                "(a deadlock, or a rank waiting for a message that never comes?)"
            )
        for reader in ready:
            rank = waiting.pop(reader)
            try:
                outcome = reader.recv()
            except EOFError:  # the pipe closed without a word: the process died
                processes[rank].join(1.0)
                message = (
                    f"rank {rank} of {world_size} died with exit code {processes[rank].exitcode} "
                    "before returning (killed, out of memory, or a crash in native code)"
                )
                error = SpawnError(message, rank, "ProcessDied", "")
                failures.append(_Failure(FailureKind.DIED, time.time(), error))
            else:
                if outcome.ok:
                    results[rank] = pickle.loads(outcome.result)
                    continue
                message = (
                    f"rank {rank} of {world_size} raised {outcome.error_type}: {outcome.text}\n\n"
                    f"Traceback from rank {rank}:\n{outcome.rank_traceback}"
                )
                error = SpawnError(message, rank, outcome.error_type, outcome.rank_traceback)
                error.__cause__ = _unpickle(outcome.cause)
                gone = any(p in outcome.text for p in _PEER_GONE)
                kind = FailureKind.PEER_GONE if gone else FailureKind.RAISED
                failures.append(_Failure(kind, outcome.when, error))
            if grace is None:
                grace = time.monotonic() + _GRACE_S
    if failures:
        raise min(failures, key=lambda failure: (failure.kind, failure.when)).error
    return [results[rank] for rank in range(world_size)]


def _unpickle(data: bytes | None) -> BaseException | None:
    if data is None:
        return None
    try:
        error = pickle.loads(data)
    except Exception:  # the text in the message is what matters
        return None
    return error if isinstance(error, BaseException) else None
