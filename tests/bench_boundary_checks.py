"""What the model's and the trainer's boundary checks cost per step: before and after, interleaved.

Not a test (no ``test_`` prefix, never collected): a script to run by hand, on a quiet machine
if there is one::

    .venv/bin/python tests/bench_boundary_checks.py --before 26fa116 --rounds 10

It copies the package as it was at ``--before`` (``git archive``) into a temporary folder, then
alternates a fresh process on that copy and one on this checkout's ``code/``, ``--rounds``
times each, so a machine that gets busier or quieter in between affects both alike. Each
process times, with ``timeit`` and ``repeat`` samples of ``number`` calls:

* ``forward``: ``Transformer.forward`` of a small model on a ``(8, 64)`` batch under
  ``torch.no_grad()`` (the token checks are the only change on this path);
* ``train_step``: one step of ``Trainer.train`` (a whole epoch of a small classifier on 2,048
  examples, divided by its steps; the loop keeps every step's loss for the NaN check).

It prints each measurement's median over rounds (each round's figure is the fastest of its
samples, the usual ``timeit`` reading) and the ratio after / before with the spread of the
per-round ratios. On a shared machine that ratio is noisy, so the after-processes also time the
checks on their own (the token checks of one forward; per step, one loss appended and an eighth
of the NaN check, which runs once per logged window of eight steps here) and print them as a
share of the call they are part of.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, timeit, torch
torch.set_num_threads(1)
from torch.utils.data import TensorDataset
from trainfast.transformer import Transformer, TransformerShape
from trainfast.training import Trainer, TrainingArguments

repeat, number = int(sys.argv[1]), int(sys.argv[2])
shape = TransformerShape(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=256,
                         seq_len=64, batch_size=8)
torch.manual_seed(0)
model = Transformer(shape).eval()
tokens = torch.randint(0, 256, (8, 64))
with torch.no_grad():
    forward = min(timeit.repeat(lambda: model(tokens), repeat=repeat, number=number)) / number

x, y = torch.randn(2048, 64), torch.randint(0, 10, (2048,))
data = TensorDataset(x, y)
def epoch():
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    args = TrainingArguments(lr=1e-3, batch_size=32, epochs=1, log_every=256, device="cpu",
                             progress_bar=False)
    trainer = Trainer(net, args, data)  # set-up outside the timed loop
    return trainer, trainer.total_steps
samples = []
for _ in range(repeat):
    trainer, steps = epoch()
    samples.append(timeit.timeit(trainer.train, number=1) / steps)
result = {"forward": forward, "train_step": min(samples)}
try:  # the checks alone, where this package has them: what they add to each call
    from trainfast.transformer import _check_token_layout
except ImportError:
    pass
else:
    result["token_check"] = min(timeit.repeat(
        lambda: _check_token_layout(tokens, 64), repeat=repeat, number=1000)) / 1000
    trainer, steps = epoch()
    losses = [torch.tensor(1.0) for _ in range(8)]  # log_every 256 / batch 32: 8 per check
    def check():
        window = list(losses)
        trainer._check_finite(window)
    per_check = min(timeit.repeat(check, repeat=repeat, number=200)) / 200
    append = min(timeit.repeat(lambda: [].append(losses[0]), repeat=repeat, number=1000)) / 1000
    result["loss_check"] = per_check / 8 + append  # per step: an eighth of a check, one append
print(json.dumps(result))
"""


def _before_package(revision: str, folder: Path) -> Path:
    """``code/`` as it was at ``revision``, unpacked into ``folder``."""
    archive = folder / "before.tar"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "-o", str(archive), revision, "code/trainfast"],
        check=True,
    )
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    return folder / "code"


def _measure(code: Path, repeat: int, number: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(repeat), str(number)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=code,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="26fa116", help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=10, help="processes of each, alternated")
    parser.add_argument("--repeat", type=int, default=5, help="timeit samples per process")
    parser.add_argument("--number", type=int, default=50, help="forward calls per sample")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        before_code = _before_package(args.before, Path(folder))
        runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            for label, code in (("before", before_code), ("after", ROOT / "code")):
                runs[label].append(_measure(code, args.repeat, args.number))
    print(f"{args.rounds} rounds, alternated; per call, the median of each round's best sample")
    for key, unit in (("forward", "Transformer.forward"), ("train_step", "Trainer.train step")):
        before = [r[key] for r in runs["before"]]
        after = [r[key] for r in runs["after"]]
        ratios = sorted(a / b for a, b in zip(after, before, strict=True))
        quartiles = statistics.quantiles(ratios, n=4)
        print(
            f"{unit:>20}: before {statistics.median(before) * 1e6:8.1f} us, after "
            f"{statistics.median(after) * 1e6:8.1f} us, ratio {statistics.median(ratios):.3f} "
            f"(per-round ratios: quartiles {quartiles[0]:.3f} to {quartiles[2]:.3f}, "
            f"range {ratios[0]:.3f} to {ratios[-1]:.3f})"
        )
    # the checks timed on their own, in the same processes: a figure the machine's noise
    # does not swamp, as a share of the call they are part of
    for key, step, unit in (
        ("token_check", "forward", "token checks per forward"),
        ("loss_check", "train_step", "NaN check per train step"),
    ):
        cost = statistics.median(r[key] for r in runs["after"])
        share = cost / statistics.median(r[step] for r in runs["after"])
        print(f"{unit:>26}: {cost * 1e9:7.0f} ns, {share:.3%} of the call")


if __name__ == "__main__":
    main()
