"""Benchmarks of the hyperparameters chapter, run by ``python -m trainfast.measure``.

The scaling study trains hundreds of small networks, too many for the chapter's time budget,
so it runs here once per machine and the chapter renders its record.
"""

from __future__ import annotations

import math

import torch

from trainfast.records import Record, make_record
from trainfast.training.arguments import TrainingArguments
from trainfast.training.data import load_images
from trainfast.training.scaling import scaling_study, widths_by_sqrt2

__all__ = ["BASE_WIDTH", "scaling_study_record"]

#: The width whose learning rate is the base of the 1/sqrt(fan_in) rule.
BASE_WIDTH = 8


def scaling_study_record(device: torch.device, quick: bool = False, widen: int = 3) -> Record:
    """The scaling study: :class:`~trainfast.training.scaling.ScalingCNN` of widths √2 apart on
    fractions of the digits, one epoch each, with and without dropout, several seeds.

    Each width's learning rate follows ``1/sqrt(fan_in)``, ``lr = base * sqrt(BASE_WIDTH /
    width)`` (the second convolution's fan-in is ``9 * width``), times a multiplier from a small
    grid; the multiplier is chosen per configuration on the validation loss (mean over seeds),
    and the row reports that choice's validation and test losses. A multiplier chosen at the
    edge of what was tried is only a bound, so that configuration tries the next multiplier
    out (a factor of two further), up to ``widen`` times; ``lr_multipliers_tried`` says how
    many it tried and ``lr_at_edge`` whether its choice still sits at an edge.
    """
    torch.set_num_threads(1)
    data = load_images("digits", validation_fraction=0.2)
    widths = widths_by_sqrt2(4, 3 if quick else 8)
    fractions = (0.5, 1.0) if quick else (0.25, 0.5, 1.0)
    seeds = (0,) if quick else (0, 1, 2)
    multipliers = (1.0,) if quick else (0.5, 1.0, 2.0)
    base_lr = 1e-2
    rows = []
    for dropout in (0.0, 0.2):

        def study(widths, fractions, multiplier, dropout=dropout):
            return scaling_study(
                widths,
                fractions,
                dropout=dropout,
                seeds=seeds,
                data=data,
                args=TrainingArguments(batch_size=8, device=device.type),
                lr_of_width=lambda w, m=multiplier: base_lr * m * math.sqrt(BASE_WIDTH / w),
            )

        tried: dict[tuple[int, float], dict[float, object]] = {}  # (width, fraction): runs
        for multiplier in multipliers:
            for run in study(widths, fractions, multiplier):
                tried.setdefault((run.width, run.data_fraction), {})[multiplier] = run
        for _ in range(widen if len(multipliers) > 1 else 0):
            for key, runs in tried.items():
                best = min(runs, key=lambda m: runs[m].eval_loss)  # type: ignore[attr-defined]
                if min(runs) < best < max(runs):
                    continue
                outward = best * 2 if best == max(runs) else best / 2
                runs[outward] = study([key[0]], [key[1]], outward)[0]
        for (width, fraction), runs in sorted(tried.items()):
            multiplier = min(runs, key=lambda m: runs[m].eval_loss)  # type: ignore[attr-defined]
            run = runs[multiplier]
            rows.append(
                {
                    "dropout": dropout,
                    "width": width,
                    "data_fraction": fraction,
                    "parameters": run.parameters,  # type: ignore[attr-defined]
                    "examples": run.examples,  # type: ignore[attr-defined]
                    "flops": run.flops,  # type: ignore[attr-defined]
                    "lr": run.lr,  # type: ignore[attr-defined]
                    "lr_multiplier": multiplier,
                    "lr_multipliers_tried": len(runs),
                    "lr_at_edge": len(runs) > 1 and multiplier in (min(runs), max(runs)),
                    "eval_loss": run.eval_loss,  # type: ignore[attr-defined]
                    "eval_loss_std": run.eval_loss_std,  # type: ignore[attr-defined]
                    "test_loss": run.test_loss,  # type: ignore[attr-defined]
                    "seeds": len(seeds),
                }
            )
    description = (
        "Scaling study on scikit-learn's digits: ScalingCNN widths sqrt(2) apart, one epoch on "
        "fractions of the training split, dropout 0 and 0.2; lr = 1e-2 * sqrt(8 / width) times "
        "the multiplier (of a small grid, widened past an edge choice) best on the validation "
        "loss averaged over the seeds; "
        "eval_loss is that validation loss, test_loss the same runs on the test split."
        + (" Quick smoke test: fewer widths, one seed, no lr grid." if quick else "")
    )
    return make_record(
        "scaling-study",
        description,
        rows,
        units={"flops": "FLOP", "eval_loss": "nats", "test_loss": "nats"},
        device=device,
    )
