"""The profiling chapter's figure that is drawn more than once: the case study's waterfall.

matplotlib is imported when a figure is drawn, not with the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["plot_waterfall"]


def plot_waterfall(rows: Sequence[dict[str, Any]], *, ax: Any = None, title: str = "") -> Any:
    """Step time after each fix, as a waterfall: each bar spans the change one fix made.

    ``rows`` are :func:`~trainfast.profiling.case_study.compare_fixes` rows of a cumulative
    chain (``variant`` and ``step_ms``, with ``iqr_ms`` drawn as error bars), baseline first.
    Rows after the first whose ``variant`` does not start with ``"+ "`` (the names
    :func:`~trainfast.profiling.case_study.cumulative_fixes` gives the links of the chain) were
    measured alone, not in the chain, and are left out. Green bars are fixes that made the step
    faster, red ones slower; the last bar is the total. Returns the axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = [row for i, row in enumerate(rows) if i == 0 or str(row["variant"]).startswith("+ ")]

    if len(rows) < 2:
        raise ValueError(f"Invalid rows: a waterfall needs a baseline and a fix, got {len(rows)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4.5))
    times = [row["step_ms"] for row in rows]
    labels = [row["variant"] for row in rows]
    ax.bar(0, times[0], color="0.55")
    for i in range(1, len(rows)):
        low, high = sorted((times[i - 1], times[i]))
        color = "tab:green" if times[i] < times[i - 1] else "tab:red"
        ax.bar(i, high - low, bottom=low, color=color)
        ax.annotate(
            f"×{times[i - 1] / times[i]:.2f}", (i, high), ha="center", va="bottom", fontsize=8
        )
    ax.bar(len(rows), times[-1], color="tab:blue")
    ax.annotate(f"×{times[0] / times[-1]:.2f} in all", (len(rows), times[-1]), ha="center",
                va="bottom", fontsize=8)  # fmt: skip
    ax.errorbar(range(len(rows)), times, yerr=[row.get("iqr_ms", 0.0) / 2 for row in rows],
                fmt="none", ecolor="black", capsize=3, linewidth=1)  # fmt: skip
    ax.set_xticks(range(len(rows) + 1), [*labels, "all fixes"], rotation=30, ha="right")
    ax.set(ylabel="time per training step (ms)", title=title or "Step time, one fix at a time")
    ax.legend(
        handles=[Patch(color="0.55", label="baseline"), Patch(color="tab:green", label="fix made it faster"),
                 Patch(color="tab:red", label="fix made it slower"), Patch(color="tab:blue", label="all fixes"),
                 plt.Line2D([], [], color="black", label="± half the IQR of the samples")],
        fontsize=8, loc="upper right",
    )  # fmt: skip
    ax.set_ylim(0, max(times) * 1.15)
    return ax
