"""``python -m trainfast.speedrun``: run entries of the speedrun's log and print their table.

Examples::

    python -m trainfast.speedrun --preset cpu                       # the whole log, 3 seeds
    python -m trainfast.speedrun --preset cpu --entry baseline SDPA --seeds 2
    python -m trainfast.speedrun --preset cpu --ablation --compare-to book

The whole log (``--log``, the default) keeps each change only if it beats the noise
(:func:`~trainfast.speedrun.study.run_log`). ``--entry`` and ``--ablation`` alone build their
entries with the changes the book's record did not keep left out, so that they are the book's.

Each evaluation prints a line (step, validation loss against the target, training tokens per
second); the end prints one line per entry: median time to the target, spread, tokens, the
speed-up over the entry it is compared with, and the rank-sum verdict. ``--compare-to book``
puts the book's committed record of the same preset beside it (or give a record's JSON file).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import torch

from trainfast.device import environment_line, pick_device
from trainfast.files import read_json
from trainfast.records import Record, records_for, write_record
from trainfast.speedrun.changes import PRESETS, entries, preset
from trainfast.speedrun.study import (
    RECORD_NAME,
    dropped_changes,
    run_log,
    run_study,
    summary_table,
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r} (expected an int >= 1)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {text!r} (expected an int >= 1)")
    return value


def book_record(preset_name: str, source: str) -> Record:
    """The record to compare with: ``"book"`` (the book's CPU record of ``preset_name``) or a
    record's JSON file. ``ValueError`` naming ``source`` if there is none."""
    if source == "book":
        found = [
            r
            for r in records_for(RECORD_NAME, device=None)
            if r.rows and r.rows[0]["preset"] == preset_name
        ]
        if not found:
            raise ValueError(f"--compare-to book: the book has no record of preset {preset_name!r}")
        return found[0]
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"--compare-to {source!r}: no such record file")
    return Record.from_dict(read_json(path), source=source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainfast.speedrun", description=__doc__)
    parser.add_argument("--preset", default="cpu", help=f"one of {sorted(PRESETS)}")
    parser.add_argument("--entry", nargs="+", metavar="NAME", help="run only these entries")
    parser.add_argument("--log", action="store_true", help="the whole log (the default)")
    parser.add_argument("--ablation", action="store_true", help="the leave-one-out ablation")
    parser.add_argument("--seeds", type=_positive_int, help="seeds per entry (default: preset's)")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    parser.add_argument("--threads", type=_positive_int, default=1, help="torch threads (1)")
    parser.add_argument("--out", help="write the record into this folder")
    parser.add_argument("--compare-to", metavar="book|FILE", help="print a record's beside")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)

    try:
        chosen = preset(args.preset)
        parts = ("log",) * (args.log or not args.ablation) + ("ablation",) * args.ablation
        whole_log = args.entry is None and "log" in parts and chosen.full_log
        try:  # the changes the book's own log did not keep
            dropped = dropped_changes(book_record(chosen.name, "book"))
        except ValueError:  # the book has no record of this preset
            dropped = set()
        planned = entries(chosen, args.entry, parts=parts, dropped=dropped)
        if whole_log and (args.seeds or chosen.seeds) < 3:
            raise ValueError(
                f"--seeds {args.seeds}: the whole log needs at least 3 seeds per entry (with "
                "fewer, no change could be kept); give --entry to run single entries"
            )
        book = None if args.compare_to is None else book_record(chosen.name, args.compare_to)
        device = pick_device(args.device)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)
    print(environment_line(device), f"load average {os.getloadavg()[0]:.2f}", flush=True)
    options = {
        "seeds": args.seeds,
        "device": device,
        "out": args.out,
        "progress": None if args.quiet else lambda line: print(line, flush=True),
        "command": shlex.join(["python", "-m", "trainfast.speedrun", *(argv or sys.argv[1:])]),
    }
    if whole_log:
        record = run_log(chosen, ablation=args.ablation, **options)
    else:
        record = run_study(chosen, planned, **options)
    if args.out:
        print(f"wrote {write_record(record, args.out)}")
    print(summary_table(record, book))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
