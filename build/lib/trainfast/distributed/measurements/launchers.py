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

``spawn`` never restarts a failed job; ``torchrun`` (``torch.distributed.elastic``) can, with
``--max-restarts``. :func:`restart_record` (``--only launcher-restart``) measures what a restart
costs: it runs this module under ``torchrun`` on two processes, where rank 1 of the first attempt
raises (:func:`restart_main`), with ``--max-restarts 0`` and ``1``, and without the failure.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from trainfast.distributed.launch import SpawnError, init_from_env, spawn
from trainfast.records import Record, make_record
from trainfast.timing import timestamp

__all__ = [
    "failing_trial",
    "launcher_record",
    "restart_main",
    "restart_record",
    "torch_failing_trial",
]

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
        "gloo",
        init_method=f"file://{store}",
        rank=index,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
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
                torch_failing_trial,
                args=(world_size, os.path.join(folder, "store"), marker),
                nprocs=world_size,
                join=False,
                start_method="forkserver",
            )
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
        row = {
            "launcher": launcher,
            "trials": len(results),
            "median_seconds_after_raise": statistics.median(
                r["seconds_after_raise"] for r in results
            ),
            "blamed_the_root_cause": sum(r["blamed_rank"] == 1 for r in results),
            "children_left": (
                "not counted here"
                if results[0]["children_left"] is None
                else sum(int(r["children_left"]) for r in results)
            ),
        }
        rows.append(row)
    return make_record(
        "launcher-failure",
        "Rank 1 of 3 raises while the others wait for it: seconds from the raise to the "
        "launcher's exception (median), trials whose exception blames rank 1 (the root cause), "
        "children alive afterwards (start_processes; spawn's are counted by the tests); "
        "trainfast.distributed.spawn vs "
        "torch.multiprocessing.start_processes(start_method='forkserver').",
        rows,
        units={"median_seconds_after_raise": "s"},
        device=torch.device("cpu"),  # CPU processes, whatever GPU the machine has
    )


def restart_main(argv: list[str] | None = None) -> None:
    """Entry under ``torchrun``: join the group and all-reduce once; with ``--fail-once``, rank 1
    raises on the first attempt (torchrun numbers attempts in ``TORCHELASTIC_RESTART_COUNT``)."""
    parser = argparse.ArgumentParser(prog="python -m trainfast.distributed.measurements.launchers")
    parser.add_argument("--fail-once", action="store_true")
    args = parser.parse_args(argv)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, _ = init_from_env(timeout_s=60)
    if args.fail_once and attempt == 0 and rank == 1:
        raise ValueError(_ROOT_CAUSE)
    ones = torch.ones(1)
    dist.all_reduce(ones)
    if rank == 0:
        print(f"finished on attempt {attempt}", flush=True)
    dist.destroy_process_group()


#: The torchrun runs :func:`restart_record` compares: (row name, --max-restarts, --fail-once,
#: whether the workers get a TCP store of their own instead of sharing the rendezvous store; a
#: shared store can hand a restarted rank its peer's address from the failed attempt,
#: pytorch/pytorch#135712).
_RESTART_RUNS = [
    ("torchrun, no failure", 0, False, False),
    ("torchrun --max-restarts 0, rank 1 fails once", 0, True, False),
    ("torchrun --max-restarts 1, rank 1 fails once", 1, True, False),
    ("the same, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", 1, True, True),
]


def _torchrun(
    max_restarts: int, fail_once: bool, own_store: bool, timeout_s: float = 120.0
) -> dict[str, object]:
    """One torchrun of :func:`restart_main` on two CPU processes: seconds, exit code (``None``:
    still running after ``timeout_s``, then killed), and the attempt that finished."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "--max-restarts", str(max_restarts)]
    command += ["-m", "trainfast.distributed.measurements.launchers"]
    if fail_once:
        command.append("--fail-once")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1" if own_store else "0"
    with tempfile.TemporaryFile("w+") as output:  # not a pipe: a pipe may outlive the job
        start = timestamp()
        job = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            returncode = job.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # a hung restart: stop torchrun and its workers
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            returncode = None
        seconds = timestamp() - start
        output.seek(0)
        lines = output.read().splitlines()
    finished = [line for line in lines if line.startswith("finished on")]
    attempt = int(finished[-1].split()[-1]) if finished else None
    return {"seconds": seconds, "returncode": returncode, "attempt": attempt}


def restart_record(device: torch.device, quick: bool = False) -> Record:
    """The ``launcher-restart`` record: what torchrun's ``--max-restarts`` does and costs."""
    trials = 1 if quick else 3
    runs = _RESTART_RUNS[-1:] if quick else _RESTART_RUNS  # quick: the restart that recovers
    results: dict[str, list[dict[str, object]]] = {run[0]: [] for run in runs}
    for _ in range(trials):  # taking turns, so a busy moment hits every setting alike
        for name, max_restarts, fail_once, own_store in runs:
            results[name].append(_torchrun(max_restarts, fail_once, own_store))
    rows = []
    for name, outcomes in results.items():
        attempts = sorted({r["attempt"] for r in outcomes if r["attempt"] is not None})
        row = {
            "launcher": name,
            "trials": len(outcomes),
            "median_seconds": statistics.median(r["seconds"] for r in outcomes),
            "succeeded": sum(r["returncode"] == 0 for r in outcomes),
            "hung": sum(r["returncode"] is None for r in outcomes),
            "finished_on_attempt": ", ".join(map(str, attempts)) or "none",
        }
        rows.append(row)
    return make_record(
        "launcher-restart",
        "Two CPU processes under torchrun (python -m torch.distributed.run --standalone) that "
        "join a gloo group and all-reduce once; in the failing runs rank 1 raises on the first "
        "attempt. Wall seconds of the whole torchrun command (median), runs that exited 0, runs "
        "still running after 120 s (killed), and the attempts (0 = first) that finished; the "
        "last row gives the workers their own TCP store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) "
        "instead of torchrun's rendezvous store.",
        rows,
        units={"median_seconds": "s"},
        device=torch.device("cpu"),  # CPU processes, whatever GPU the machine has
    )


if __name__ == "__main__":
    restart_main()
