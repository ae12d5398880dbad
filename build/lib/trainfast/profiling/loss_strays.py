"""Did every fix of the case study train on the same numbers? Reading a record's loss strays.

Each run of the case study (:mod:`trainfast.profiling.case_study`) is compared with the
baseline's loss over the first :data:`~trainfast.profiling.case_study.LOSS_HORIZON` steps; its
``tolerance`` column is the loosest :data:`~trainfast.profiling.case_study.LOSS_TOLERANCE` of
its fixes. A run whose ``loss_deviation`` exceeds it *strayed*. :func:`loss_strays` reads a
``profiling-case-study`` record and says which runs strayed and whether the book knows why:

* none strayed: every fix kept the loss curve;
* the runs from ``+ data_workers`` to the end of the chain, and those alone, strayed, in a record
  made before 757a110 (2026-11-26): the loader's shared generator, which that commit fixed;
* any other pattern: a contradiction the book does not explain, named run by run with the
  assumption its tolerance makes, for the page to say rather than to fail its build on.

Where not to use it: on a live run, :func:`~trainfast.profiling.case_study.compare_fixes` and the
test of the fixes check the same thing directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from trainfast.profiling.case_study import LOSS_HORIZON
from trainfast.records import Record

__all__ = [
    "SHARED_GENERATOR",
    "SHARED_GENERATOR_FIXED",
    "TOLERANCE_ASSUMPTIONS",
    "LossStrays",
    "Stray",
    "loss_strays",
]

#: the explanation of the one pattern of strays the book knows: every link of the chain from
#: ``+ data_workers`` on, in records measured before the loader got a generator of its own
SHARED_GENERATOR = "the loader's shared generator"

#: when that was fixed (commit 757a110): a record made later with the same pattern is not
#: explained by it (the fix did not hold), so it is a contradiction
SHARED_GENERATOR_FIXED = "2026-11-26T20:51:21+00:00"

#: what each tolerance of :data:`~trainfast.profiling.case_study.LOSS_TOLERANCE` assumes
#: (:func:`trainfast.profiling.case_study.loss_tolerance` says why)
TOLERANCE_ASSUMPTIONS = {
    0.0: "the same kernels on the same numbers, so the same loss bit for bit",
    1e-4: "only the order of float32 additions changes, about 1e-7 a step",
    5e-3: "bf16 rounding moves the loss by less than one value's rounding (0.39 %)",
}


@dataclass(frozen=True)
class Stray:
    """One run beyond its tolerance: its name, how far it strayed and how far it may."""

    variant: str
    deviation: float
    tolerance: float

    @property
    def assumption(self) -> str:
        """What the run's tolerance assumes, which a stray refutes."""
        return TOLERANCE_ASSUMPTIONS.get(
            self.tolerance, f"a relative deviation of at most {self.tolerance}"
        )


@dataclass(frozen=True)
class LossStrays:
    """A case-study record's runs that strayed from the baseline's loss, and why.

    ``explanation`` is :data:`SHARED_GENERATOR` where the strays are that pattern, empty
    otherwise; :attr:`contradiction` is true where runs strayed and nothing explains them.
    """

    record: Record
    strays: tuple[Stray, ...]
    explanation: str = ""

    @property
    def contradiction(self) -> bool:
        return bool(self.strays) and not self.explanation

    @property
    def worst(self) -> float:
        """The largest deviation of a run that strayed (0 where none did)."""
        return max((s.deviation for s in self.strays), default=0.0)

    def sentence(self) -> str:
        """What the record shows about the loss curves, for the page: that every run kept it,
        or (a contradiction) which runs strayed, by how much, and which assumption failed. The
        known pattern gets a short sentence; the page explains it at length."""
        where = f"In the {self.record.device_name} record"
        if not self.strays:
            return (
                f"{where} every run stayed within its tolerance of the baseline's loss over the "
                f"first {LOSS_HORIZON} steps: each fix trained on the same numbers."
            )
        runs = f"{len(self.strays)} of its {len(self.record.rows)} runs"
        if self.explanation:
            return (
                f"{where} {runs} strayed from the baseline's loss beyond their tolerance (by up "
                f"to {self.worst:.1%}), `+ data_workers` and every fix after it: "
                f"{self.explanation}."
            )
        named = "; ".join(
            f"`{s.variant}` by {s.deviation:.3g} against {s.tolerance:g}, which assumes "
            f"{s.assumption}"
            for s in self.strays
        )
        return (
            f"{where} {runs} strayed from the baseline's loss beyond their tolerance, in a "
            f"pattern the book does not explain: {named}. That is a contradiction of the "
            "tolerances' assumptions, to be found and fixed, not a measurement to read past."
        )


def loss_strays(record: Record) -> LossStrays:
    """Which runs of a ``profiling-case-study`` record strayed beyond their tolerance, and
    whether :data:`SHARED_GENERATOR` explains them (the strays are exactly the chain's links from
    ``+ data_workers`` on, in a record made before :data:`SHARED_GENERATOR_FIXED`).

    Never raises for a stray: a new record with an unexplained one is a
    :attr:`LossStrays.contradiction` that the page names. A record that is not a case study
    raises ``ValueError`` naming it."""
    if record.name != "profiling-case-study":
        raise ValueError(f"Not a profiling-case-study record: {record.name!r}")
    missing = {"variant", "loss_deviation", "tolerance"} - set(record.columns)
    if missing:
        raise ValueError(f"Record {record.name!r} lacks the columns {sorted(missing)}")
    strays = tuple(
        Stray(row["variant"], float(row["loss_deviation"]), float(row["tolerance"]))
        for row in record.rows
        if row["loss_deviation"] > row["tolerance"]
    )
    links = [row["variant"] for row in record.rows if row["variant"].startswith("+ ")]
    from_workers = links[links.index("+ data_workers") :] if "+ data_workers" in links else []
    before_fix = datetime.fromisoformat(record.created) < datetime.fromisoformat(
        SHARED_GENERATOR_FIXED
    )
    known = bool(strays) and [s.variant for s in strays] == from_workers and before_fix
    return LossStrays(record, strays, SHARED_GENERATOR if known else "")
