"""The memory chapter's figure of the resource arithmetic: training memory by part, stacked.

:func:`plot_memory` draws what :func:`trainfast.accounting.training_memory` and
:func:`~trainfast.accounting.zero_memory` compute (the arithmetic stays in
:mod:`trainfast.accounting`, which draws nothing). matplotlib is imported when a figure is
drawn, not with the package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from trainfast.accounting import MemoryBreakdown
from trainfast.gpus import GPUSpec

__all__ = ["plot_memory"]


def plot_memory(
    breakdowns: Mapping[str, MemoryBreakdown],
    *,
    title: str = "Training memory per device, by part",
    xlabel: str = "configuration",
    device: GPUSpec | None = None,
    ax: Any = None,
) -> tuple[Any, Any]:
    """The calculator, drawn: one stacked bar per configuration, one colour per part, in GB.

    ``breakdowns`` maps a bar's label to its :class:`~trainfast.accounting.MemoryBreakdown`
    (from :func:`~trainfast.accounting.training_memory` or
    :func:`~trainfast.accounting.zero_memory`), e.g. one per recipe, ZeRO stage or
    checkpointing choice. Parts that are 0 in every bar are left out; each bar is labelled with
    its total; ``device`` draws its memory as a dashed line. Returns ``(figure, axes)``; draws
    into ``ax`` if given. Needs matplotlib (imported here, not with the module).
    """
    import textwrap

    import matplotlib.pyplot as plt

    if not breakdowns:
        raise ValueError("Nothing to draw: breakdowns is empty")
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(7.5, max(5.0, 1.8 * len(breakdowns) + 3.0)), 4.5))
    else:
        fig = ax.figure
    labels = list(breakdowns)
    names = ["\n".join(textwrap.wrap(label.replace("\n", " "), 16)) for label in labels]
    tops = [0.0] * len(labels)
    for part in fields(MemoryBreakdown):
        if part.name == "loss_buffers":  # not in the total: only at the start of backward
            continue
        values = [getattr(breakdowns[label], part.name) / 1e9 for label in labels]
        if any(values):
            ax.bar(names, values, bottom=tops, label=part.name.replace("_", " "))
            tops = [top + value for top, value in zip(tops, values, strict=True)]
    for x, top in enumerate(tops):
        ax.annotate(f"{top:.1f}", (x, top), ha="center", va="bottom")
    if device is not None:
        memory = device.memory_bytes / 1e9
        ax.axhline(memory, color="black", linestyle="--", label=f"{device.name}: {memory:.0f} GB")
    ax.set(title=title, xlabel=xlabel, ylabel="memory (GB)")
    ax.margins(y=0.15)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    # wrapped narrower until neighbouring bars' labels do not run into each other (words stay
    # whole); where even that fails, turned upright
    for width in (16, 13, 10, 0):
        if width:
            wrapped = [
                textwrap.wrap(label.replace("\n", " "), width, break_long_words=False)
                for label in labels
            ]
            ax.set_xticks(range(len(labels)), ["\n".join(lines) for lines in wrapped])
        else:
            ax.tick_params(axis="x", labelrotation=90)
        fig.tight_layout()
        boxes = [text.get_window_extent() for text in ax.get_xticklabels()]
        if all(left.x1 <= right.x0 for left, right in zip(boxes[:-1], boxes[1:], strict=True)):
            break
    return fig, ax
