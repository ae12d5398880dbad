"""``trainfast.profiling.sampling.call_tree``: a pyinstrument tree that fits a book page."""

from __future__ import annotations

import pytest
import torch

pyinstrument = pytest.importorskip("pyinstrument")

from trainfast.profiling.sampling import call_tree  # noqa: E402


def _busy() -> None:
    x = torch.randn(64, 64)
    for _ in range(300):
        x = torch.tanh(x @ x)


def _profiled():
    torch.set_num_threads(1)
    profiler = pyinstrument.Profiler(interval=0.0005)
    profiler.start()
    _busy()
    profiler.stop()
    return profiler


def test_the_tree_fits_the_width_names_the_work_and_hides_small_frames():
    profiler = _profiled()
    tree = call_tree(profiler, min_fraction=0.05, width=60)
    lines = tree.splitlines()
    assert all(len(line) <= 60 for line in lines), max(lines, key=len)
    assert any("_busy" in line for line in lines)
    full = profiler.output_text(unicode=True, color=False)
    assert len(lines) < len(full.splitlines())


def test_notebook_cells_are_named_not_their_temporary_files():
    from trainfast.profiling.sampling import _CELL

    assert _CELL.sub("<cell>", "/tmp/ipykernel_4242/123456.py") == "<cell>"


@pytest.mark.parametrize("bad", [{"min_fraction": 1.5}, {"width": 10}])
def test_bad_arguments_are_named(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        call_tree(_profiled(), **bad)


def test_the_waterfall_colours_a_fix_by_the_sign_tests_verdict():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.colors import to_rgb
    from trainfast.profiling.plots import VERDICT_COLORS, plot_waterfall

    base = [10.0 + 0.1 * i for i in range(15)]
    faster = [t - 2.0 for t in base]
    mixed = [t + (0.3 if i % 2 else -0.3) for i, t in enumerate(faster)]  # 7 of 15 faster
    rows = [
        {"variant": "baseline", "step_ms": 10.7, "iqr_ms": 0.6, "samples_ms": base},
        {"variant": "+ a", "step_ms": 8.7, "iqr_ms": 0.6, "samples_ms": faster},
        {"variant": "+ b", "step_ms": 8.6, "iqr_ms": 0.6, "samples_ms": mixed},
    ]
    ax = plot_waterfall(rows)
    colors = [patch.get_facecolor()[:3] for patch in ax.patches]
    assert colors[1] == to_rgb(VERDICT_COLORS["faster"])
    assert colors[2] == to_rgb(VERDICT_COLORS["noise"])  # faster median, but within the noise
    labels = {t.get_text(): t.xy[1] for t in ax.texts}
    assert labels["×1.01"] > 8.7 + 0.3  # above the error bar's cap, not through it


def test_a_predicted_waterfall_is_hatched_has_no_spread_and_says_so():
    import matplotlib

    matplotlib.use("Agg")
    from trainfast.profiling.plots import plot_waterfall

    rows = [{"variant": "baseline", "step_ms": 10.0}, {"variant": "+ a", "step_ms": 5.0}]
    ax = plot_waterfall(rows, predicted=True)
    assert all(patch.get_hatch() == "//" for patch in ax.patches)
    assert not ax.collections  # no error bars: a prediction has no spread
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fix: predicted faster" in labels and not any("rank-sum" in label for label in labels)


def test_link_speedups_draw_each_chains_own_links_and_pale_the_noise():
    import matplotlib

    matplotlib.use("Agg")
    from trainfast.profiling.plots import plot_link_speedups

    noisy = [10.0, 10.2, 9.9, 10.1, 10.3]
    measured = [
        {"variant": "baseline", "step_ms": 10.0, "samples_ms": noisy},
        {"variant": "+ a", "step_ms": 5.0, "samples_ms": [t / 2 for t in noisy]},
        {
            "variant": "+ b",
            "step_ms": 4.9,
            "samples_ms": [t / 2 + 0.1 * (-1) ** i for i, t in enumerate(noisy)],
        },
    ]
    predicted = [{"variant": "baseline", "step_ms": 8.0}, {"variant": "+ c", "step_ms": 2.0}]
    ax = plot_link_speedups([("one", measured, False), ("two", predicted, True)])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    widths = sorted(round(p.get_width(), 3) for p in ax.patches)
    assert widths == sorted([round(2.0 - 1, 3), round(5.0 / 4.9 - 1, 3), 3.0])
    alphas = {round(p.get_width(), 3): p.get_alpha() for p in ax.patches}
    assert alphas[round(5.0 / 4.9 - 1, 3)] == 0.35  # within the noise: pale
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_link_speedups([])
