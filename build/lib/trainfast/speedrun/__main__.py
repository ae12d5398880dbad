"""``python -m trainfast.speedrun``: run entries of the speedrun's log and print their table.

Examples::

    python -m trainfast.speedrun --preset cpu --log --ablation    # the whole study (the record's)
    python -m trainfast.speedrun --preset cpu --ablation --compare-to book
    python -m trainfast.speedrun --preset cpu --entry baseline SDPA --seeds 5
    python -m trainfast.speedrun --preset gpu                     # the GPU log, on a GPU

``--log`` (the default) runs the whole study (:func:`~trainfast.speedrun.study.run_log`): every
change decided on the tune split, then the baseline and final entry afresh on the validation
split; with ``--ablation`` too, the final entry without each kept change. ``--ablation`` alone
runs only that last block: the baseline, the final entry and the ablation rows, interleaved on
the validation split, with the book's record's keep decisions, so every ablation row has the
final entry it is compared with. ``--entry`` runs the entries named, interleaved, on
``--split`` (default validation), with the book's keep decisions.

PyTorch's default thread count is the baseline's (set ``OMP_NUM_THREADS`` to change it).
Each evaluation prints a line (step, held-out loss against the target, training tokens per
second); the end prints one line per entry: median time to the target, tokens, tokens/s, the
time ratio to the entry it is compared with and its two factors (tokens, tokens/s), and the
verdict. ``--compare-to book`` puts the book's committed record of the same preset beside it
(or give a record's JSON file); it refuses a record of another preset, corpus or target.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from trainfast.device import environment_line, pick_device
from trainfast.files import read_json
from trainfast.records import Record, records_for, write_record
from trainfast.speedrun.changes import PRESETS, Entry, entries, final_entry, preset
from trainfast.speedrun.study import (
    RECORD_NAME,
    check_comparable,
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
    """The record to compare with: ``"book"`` (the book's record of ``preset_name`` in this
    edition's columns) or a record's JSON file. ``ValueError`` naming ``source`` if none."""
    if source == "book":
        found = [
            r
            for r in records_for(RECORD_NAME, device=None)
            if r.rows and r.rows[0].get("preset") == preset_name and "block" in r.columns
        ]
        if not found:
            raise ValueError(
                f"--compare-to book: the book has no record of preset {preset_name!r} "
                "measured by this edition of the study"
            )
        return found[0]
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"--compare-to {source!r}: no such record file")
    record = Record.from_dict(read_json(path), source=source)
    if "block" not in record.columns:
        raise ValueError(f"--compare-to {source!r}: a record of the first edition's study")
    return record


def ablation_block(chosen, dropped: set[str]) -> list[Entry]:
    """What ``--ablation`` alone runs: the baseline, the final entry (by the keep decisions in
    ``dropped``) and the final entry without each kept learning change."""
    final = final_entry(chosen, dropped)
    planned = entries(chosen, ["baseline", final], dropped=dropped)
    planned = [
        Entry("validation", planned[0].config, None, planned[0].reason),
        Entry("validation", planned[-1].config, "baseline", "the final entry", planned[-1].kind),
    ]
    return planned + entries(chosen, parts=("ablation",), dropped=dropped)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainfast.speedrun",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", default="cpu", help=f"one of {sorted([*PRESETS, 'gpu'])}")
    parser.add_argument("--entry", nargs="+", metavar="NAME", help="run only these entries")
    parser.add_argument("--log", action="store_true", help="the whole study (the default)")
    parser.add_argument("--ablation", action="store_true", help="the leave-one-out ablation")
    parser.add_argument("--split", default="validation", choices=("validation", "tune"))
    parser.add_argument("--seeds", type=_positive_int, help="seeds per entry (default: preset's)")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    parser.add_argument("--out", help="write the record into this folder")
    parser.add_argument("--compare-to", metavar="book|FILE", help="print a record's beside")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)

    try:
        device = pick_device(args.device)
        if args.preset == "gpu":
            from trainfast.speedrun.gpu import gpu_preset

            chosen = gpu_preset()
        else:
            chosen = preset(args.preset)
        try:  # the changes the book's own study did not keep
            dropped = dropped_changes(book_record(chosen.name, "book"))
        except ValueError:  # the book has no record of this preset
            dropped = set()
        whole_log = args.entry is None and (args.log or not args.ablation)
        whole_log = whole_log and args.preset != "gpu"
        if args.entry is not None:
            planned = entries(chosen, args.entry, parts=("log", "ablation"), dropped=dropped)
        elif not whole_log and args.preset != "gpu":
            planned = ablation_block(chosen, dropped)
        else:
            planned = []
        book = None if args.compare_to is None else book_record(chosen.name, args.compare_to)
        if book is not None:  # before the run: a comparison that cannot be made wastes it
            check_comparable(_planned_stamp(chosen), book)
    except ValueError as error:
        parser.error(str(error))
    print(environment_line(device), f"load average {os.getloadavg()[0]:.2f}", flush=True)
    options = {
        "seeds": args.seeds,
        "device": device,
        "out": args.out,
        "progress": None if args.quiet else lambda line: print(line, flush=True),
    }
    command = shlex.join(["python", "-m", "trainfast.speedrun", *(argv or sys.argv[1:])])
    try:
        if args.preset == "gpu":
            from trainfast.speedrun.gpu import run_gpu_log

            record = run_gpu_log(chosen=chosen, **options)
        elif whole_log:
            record = run_log(chosen, ablation=args.ablation, command=command, **options)
        else:
            record = run_study(chosen, planned, split=args.split, command=command, **options)
    except ValueError as error:
        parser.error(str(error))
    if args.out:
        print(f"wrote {write_record(record, args.out)}")
    print(summary_table(record, book))
    return 0


def _planned_stamp(chosen) -> Record:
    """A record of no runs that says what a run of ``chosen`` would measure: its preset, its
    corpus's SHA-256 (the corpus is prepared, or read from the cache) and its target."""
    from trainfast.speedrun.study import prepared

    row = {
        "preset": chosen.name,
        "corpus_sha256": prepared(chosen).corpus_sha256,
        "target_loss": chosen.target.loss,
    }
    return Record(RECORD_NAME, "", list(row), [row], {}, "", "")


if __name__ == "__main__":
    raise SystemExit(main())
