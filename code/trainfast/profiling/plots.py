"""The profiling chapter's figures that are drawn more than once: the case studies' waterfalls
and their links side by side.

matplotlib is imported when a figure is drawn, not with the package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["VERDICT_COLORS", "fix_verdict", "plot_link_speedups", "plot_waterfall"]


#: Colours of a fix's bar, by the verdict of the rank-sum test (or of the medians, without samples).
VERDICT_COLORS = {"faster": "tab:green", "slower": "tab:red", "noise": "0.78"}


def fix_verdict(before: dict[str, Any], after: dict[str, Any], alpha: float = 0.05) -> str:
    """``"faster"``, ``"slower"`` or ``"noise"`` for the fix that turned ``before`` into ``after``.

    With samples (``samples_ms``, from :func:`~trainfast.profiling.case_study.compare_fixes`,
    which times the variants one after the other) it is the verdict of Mann and Whitney's
    rank-sum test (:func:`~trainfast.timing.rank_sum_test`, at ``alpha``); without them, the
    direction of the medians.
    """
    from trainfast.timing import rank_sum_test

    if "samples_ms" in before and "samples_ms" in after:
        share, p_value = rank_sum_test(before["samples_ms"], after["samples_ms"])
        if p_value >= alpha:
            return "noise"
        return "faster" if share > 0.5 else "slower"
    return "faster" if after["step_ms"] < before["step_ms"] else "slower"


def plot_waterfall(
    rows: Sequence[dict[str, Any]], *, ax: Any = None, title: str = "", predicted: bool = False
) -> Any:
    """Step time after each fix, as a waterfall: each bar spans the change one fix made.

    ``rows`` are :func:`~trainfast.profiling.case_study.compare_fixes` rows of a cumulative
    chain (``variant`` and ``step_ms``, with ``iqr_ms`` drawn as error bars), baseline first.
    Rows after the first whose ``variant`` does not start with ``"+ "`` (the names
    :func:`~trainfast.profiling.case_study.cumulative_fixes` gives the links of the chain) were
    measured alone, not in the chain, and are left out. A fix's bar is green when it made the
    step faster, red when slower, and grey when the difference is within the noise
    (:func:`fix_verdict`); the last bar is the total. The ``×`` labels sit above the error bars.
    With ``predicted`` the rows are a model's predictions, not measurements: the bars are
    hatched, coloured by the predicted direction, and the legend says so. Returns the axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = [row for i, row in enumerate(rows) if i == 0 or str(row["variant"]).startswith("+ ")]

    if len(rows) < 2:
        raise ValueError(f"Invalid rows: a waterfall needs a baseline and a fix, got {len(rows)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.8, 4.2))
    times = [row["step_ms"] for row in rows]
    half_iqr = [row.get("iqr_ms", 0.0) / 2 for row in rows]
    labels = [row["variant"] for row in rows]
    top = max(t + e for t, e in zip(times, half_iqr, strict=True))
    gap = 0.015 * top  # between an error bar's cap and the label above it
    hatch = "//" if predicted else None
    ax.bar(0, times[0], color="0.45", hatch=hatch)
    for i in range(1, len(rows)):
        low, high = sorted((times[i - 1], times[i]))
        verdict = fix_verdict(rows[i - 1], rows[i])
        ax.bar(
            i,
            max(high - low, 0.004 * top),
            bottom=low,
            color=VERDICT_COLORS[verdict],
            hatch=hatch,
        )
        above = max(high, times[i] + half_iqr[i]) + gap
        ratio = times[i - 1] / times[i]
        ax.annotate(f"×{ratio:.2f}", (i, above), ha="center", va="bottom", fontsize=11)
    ax.bar(len(rows), times[-1], color="tab:blue", hatch=hatch)
    ax.annotate(
        f"×{times[0] / times[-1]:.2f}\nin all",  # two lines: no wider than its bar's slot
        (len(rows), times[-1] + half_iqr[-1] + gap),
        ha="center",
        va="bottom",
        fontsize=11,
        linespacing=1.0,
    )
    if not predicted:  # a prediction has no spread
        ax.errorbar(
            range(len(rows)),
            times,
            yerr=half_iqr,
            fmt="none",
            ecolor="black",
            capsize=3,
            linewidth=1,
        )
    ax.set_xticks(range(len(rows) + 1), [*labels, "all fixes"], rotation=30, ha="right")
    ax.tick_params(labelsize=11)
    ax.set(ylabel="time per training step (ms)", title=title or "Step time, one fix at a time")
    ax.yaxis.label.set_size(11)
    ax.title.set_size(12)
    if predicted:
        handles = [
            Patch(facecolor="0.45", hatch=hatch, label="baseline, predicted"),
            Patch(facecolor=VERDICT_COLORS["faster"], hatch=hatch, label="fix: predicted faster"),
            Patch(facecolor=VERDICT_COLORS["slower"], hatch=hatch, label="fix: predicted slower"),
            Patch(facecolor="tab:blue", hatch=hatch, label="all fixes, predicted"),
        ]
    else:
        handles = [
            Patch(color="0.45", label="baseline"),
            Patch(color=VERDICT_COLORS["faster"], label="fix: faster (rank-sum test, p < 0.05)"),
            Patch(color=VERDICT_COLORS["slower"], label="fix: slower (rank-sum test, p < 0.05)"),
            Patch(color=VERDICT_COLORS["noise"], label="fix: within the noise"),
            Patch(color="tab:blue", label="all fixes"),
            plt.Line2D([], [], color="black", label="± half the IQR of the samples"),
        ]
    ax.set_ylim(0, top * 1.15)
    _legend_below(ax, handles)
    return ax


def _legend_below(ax: Any, handles: list[Any]) -> None:
    """The legend in two columns under the axes' tick labels, so that it covers no bar or label
    and leaves the axes the figure's width (beside them, the ratio labels of neighbouring bars
    ran into each other). Placed a fixed number of points below the axes, the depth of the
    rotated tick labels, so it stays clear of them when ``tight_layout`` resizes the axes."""
    from matplotlib.transforms import offset_copy

    figure = ax.figure
    renderer = figure.canvas.get_renderer()
    labels = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    depth = ax.get_window_extent(renderer).y0 - min((b.y0 for b in labels), default=0.0)
    depth_pt = max(depth, 0.0) * 72 / figure.dpi + 4
    below = offset_copy(ax.transAxes, fig=figure, y=-depth_pt, units="points")
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        bbox_transform=below,
        ncol=2,
        frameon=False,
    )


def plot_link_speedups(
    chains: Sequence[tuple[str, Sequence[dict[str, Any]], bool]],
    *,
    ax: Any = None,
    title: str = "",
    alpha: float = 0.05,
) -> Any:
    """Each fix's own speed-up (the run before it over the run with it), side by side for
    several chains: ``chains`` holds ``(label, rows, predicted)`` with rows as
    :func:`plot_waterfall` takes them. A fix one chain lacks has no bar in it. A measured link
    within the noise (:func:`fix_verdict`) is drawn pale; a predicted one hatched. Returns the
    axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not chains:
        raise ValueError("Invalid chains: nothing to draw")
    links: list[dict[str, tuple[float, str]]] = []
    names: list[str] = []
    for _, rows, _ in chains:
        chain = [
            row for i, row in enumerate(rows) if i == 0 or str(row["variant"]).startswith("+ ")
        ]
        found = {}
        for before, after in zip(chain, chain[1:], strict=False):
            name = str(after["variant"]).removeprefix("+ ")
            found[name] = (before["step_ms"] / after["step_ms"], fix_verdict(before, after, alpha))
            if name not in names:
                names.append(name)
        links.append(found)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.5))
    height = 0.8 / len(chains)
    handles = []
    for k, ((label, _, predicted), found) in enumerate(zip(chains, links, strict=True)):
        color = f"C{k}"
        for i, name in enumerate(names):
            if name not in found:
                continue
            ratio, verdict = found[name]
            pale = not predicted and verdict == "noise"
            ax.barh(
                i + (k - (len(chains) - 1) / 2) * height,
                ratio - 1,
                left=1,
                height=height,
                color=color,
                alpha=0.35 if pale else 1.0,
                hatch="//" if predicted else None,
            )
        kind = "predicted" if predicted else "measured"
        handles.append(
            Patch(facecolor=color, hatch="//" if predicted else None, label=f"{label}, {kind}")
        )
        if not predicted:
            handles.append(Patch(facecolor=color, alpha=0.35, label=f"{label}: within the noise"))
    ax.axvline(1.0, color="0.3", linewidth=1)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()  # the chain's order, top to bottom
    ax.set_xscale("log")
    ratios = [ratio for found in links for ratio, _ in found.values()]
    low, high = min(ratios + [1.0]) / 1.1, max(ratios + [1.0]) * 1.1
    ticks = [t for t in (0.5, 0.7, 0.85, 1, 1.5, 2, 3, 4, 6, 8, 12, 16) if low <= t <= high]
    ax.set_xlim(low, high)
    ax.set_xticks(ticks, [f"×{t:g}" for t in ticks])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.set(xlabel="speed-up of the fix over the run before it (log scale)", title=title)
    # below the axes, so that it covers no bar
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=11)
    return ax
