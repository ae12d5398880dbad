"""Does PyTorch's own launcher fail as fast and as clearly as ours? A measurement.

It decided the design of :func:`~trainfast.distributed.spawn`: run against the book's earlier,
hand-written launcher (commit 2de4935), ``start_processes`` was as prompt, blamed the same rank
and left nothing behind, so ``spawn`` now wraps it; run now, it checks that the wrapper adds
nothing.

In each trial, rank 1 of three raises ``ValueError`` (the root cause) while ranks 0 and 2 wait
to receive from it; they then fail too, with a "peer hung up" error (a consequence). We launch
the trial with :func:`~trainfast.distributed.spawn` and with
``torch.multiprocessing.start_processes(..., start_method="forkserver")`` and record, per
launcher: the seconds from the raise to the exception in the launching process, whether that
exception names the root cause, and how many children were still alive afterwards.
:func:`launcher_record` is ``python -m trainfast.measure --only launcher-failure``.
"""

from __future__ import annotations

import datetime
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from trainfast.distributed.launch import SpawnError, spawn
from trainfast.records import Record, make_record

__all__ = ["failing_trial", "launcher_record", "torch_failing_trial"]

_ROOT_CAUSE = "the root cause: rank 1 failed on purpose"


def failing_trial(rank: int, world_size: int, marker: str) -> None:
    """Rank 1 raises (writing the time first); the others wait for it forever."""
    if rank == 1:
        time.sleep(0.3)
        with open(marker, "w") as file:
            file.write(repr(time.time()))
        raise ValueError(_ROOT_CAUSE)
    waiting = torch.zeros(1)
    dist.recv(waiting, src=1)


def torch_failing_trial(index: int, world_size: int, store: str, marker: str) -> None:
    """The same trial under ``torch.multiprocessing``: join the group first."""
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=index, world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    failing_trial(index, world_size, marker)


def _trial(launcher: str, world_size: int = 3) -> dict[str, object]:
    """One trial; which rank the launcher's exception blames (-1: none) and when."""
    import torch.multiprocessing as torch_mp

    folder = tempfile.mkdtemp(prefix="trainfast-launcher-")
    marker = os.path.join(folder, "raised")
    alive, blamed, context = 0, -1, None
    try:
        if launcher == "trainfast spawn":
            spawn(failing_trial, world_size, marker, timeout=120, collective_timeout=60)
        else:
            context = torch_mp.start_processes(
                torch_failing_trial, args=(world_size, os.path.join(folder, "store"), marker),
                nprocs=world_size, join=False, start_method="forkserver",
            )  # fmt: skip
            while not context.join(timeout=0.01):
                pass
    except SpawnError as error:
        blamed = error.rank
    except (torch_mp.ProcessRaisedException, torch_mp.ProcessExitedException) as error:
        blamed = error.error_index
    raised = time.time()  # before anything else: this is the launcher's latency
    if context is not None:
        time.sleep(0.2)  # let terminated children finish dying before counting them
        alive = sum(p.is_alive() for p in context.processes)
    seconds = raised - float(open(marker).read())
    left = alive if context is not None else None  # spawn's children: tests/test_parallelism.py
    return {"seconds_after_raise": seconds, "blamed_rank": blamed, "children_left": left}


def launcher_record(device: torch.device, quick: bool = False) -> Record:
    """The ``launcher-failure`` record: each launcher, several trials, taking turns."""
    trials = 2 if quick else 6
    rows = []
    runs: dict[str, list[dict[str, object]]] = {"trainfast spawn": [], "torch start_processes": []}
    for _ in range(trials):
        for launcher, results in runs.items():
            results.append(_trial(launcher))
    for launcher, results in runs.items():
        rows.append({
            "launcher": launcher,
            "trials": len(results),
            "median_seconds_after_raise": statistics.median(r["seconds_after_raise"] for r in results),
            "blamed_the_root_cause": sum(r["blamed_rank"] == 1 for r in results),
            "children_left": (
                "not counted here" if results[0]["children_left"] is None
                else sum(int(r["children_left"]) for r in results)
            ),
        })  # fmt: skip
    return make_record(
        "launcher-failure",
        "Rank 1 of 3 raises while the others wait for it: seconds from the raise to the "
        "launcher's exception (median), trials whose exception blames rank 1 (the root cause), "
        "children alive afterwards (start_processes; spawn's are counted by the tests); "
        "trainfast.distributed.spawn vs "
        "torch.multiprocessing.start_processes(start_method='forkserver').",
        rows,
        units={"median_seconds_after_raise": "s"},
        device=device,
    )
