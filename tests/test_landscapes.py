"""Tests of trainfast.landscapes: surface values and gradients, trajectories, the plot helper."""

from __future__ import annotations

import functools
import math
import re

import pytest
import torch
from trainfast.landscapes import (
    GAUSSIANS,
    SURFACES,
    Surface,
    neg_gaussians,
    pathological_curvature,
    plot_trajectories,
    rosenbrock,
    trajectory,
)

f64 = functools.partial(torch.tensor, dtype=torch.float64)


def _grad(fn, x: float, y: float) -> torch.Tensor:
    point = f64([x, y]).requires_grad_(True)
    fn(point[0], point[1]).backward()
    return point.grad


def test_rosenbrock_values_and_gradient():
    assert rosenbrock(f64(1.0), f64(1.0)).item() == 0.0
    assert rosenbrock(f64(0.0), f64(0.0)).item() == 1.0
    assert rosenbrock(f64(0.0), f64(1.0)).item() == 101.0
    assert rosenbrock(f64(2.0), f64(4.0), a=2.0, b=5.0).item() == 0.0  # minimum at (a, a**2)
    # d/dx = -2(a - x) - 4bx(y - x^2), d/dy = 2b(y - x^2)
    torch.testing.assert_close(_grad(rosenbrock, 0.0, 1.0), f64([-2.0, 200.0]))
    torch.testing.assert_close(_grad(rosenbrock, 1.0, 1.0), f64([0.0, 0.0]))


def test_pathological_curvature_values_and_gradient():
    assert pathological_curvature(f64(0.0), f64(0.0)).item() == pytest.approx(0.5, abs=1e-12)
    expected = math.tanh(1.0) ** 2 + 0.01 + 0.5
    assert pathological_curvature(f64(1.0), f64(0.0)).item() == pytest.approx(expected, abs=1e-12)
    # Symmetric in x; sigmoid'(0) = 1/4 along y; 2 tanh(x) sech^2(x) + 0.01 across x.
    assert pathological_curvature(f64(-1.0), f64(0.0)).item() == pytest.approx(expected, abs=1e-12)
    torch.testing.assert_close(_grad(pathological_curvature, 0.0, 0.0), f64([0.0, 0.25]))
    dx = 2 * math.tanh(1.0) * (1 - math.tanh(1.0) ** 2) + 0.01
    torch.testing.assert_close(_grad(pathological_curvature, 1.0, 0.0)[0], f64(dx))
    # Steep across the valley, nearly flat along it: the point of the surface.
    grad = _grad(pathological_curvature, 0.5, 2.5)
    assert grad[0] > 5 * grad[1] > 0


def test_neg_gaussians_is_the_documented_sum():
    x, y = f64(0.3), f64(-0.7)
    expected = -sum(
        h * math.exp(-((0.3 - cx) ** 2 + (-0.7 - cy) ** 2) / (2 * w**2))
        for cx, cy, h, w in GAUSSIANS
    )
    assert neg_gaussians(x, y).item() == pytest.approx(expected, abs=1e-12)
    assert len(GAUSSIANS) == 3


def test_neg_gaussians_has_three_basins_of_different_depth():
    # LBFGS from each centre settles in that centre's basin; the three floors differ.
    lbfgs = functools.partial(torch.optim.LBFGS, lr=1, line_search_fn="strong_wolfe")
    floors = []
    for cx, cy, _, _ in GAUSSIANS:
        end = trajectory(neg_gaussians, f64([cx, cy]), lbfgs, 5)[-1]
        assert math.dist(end.tolist(), (cx, cy)) < 0.1
        floors.append(neg_gaussians(end[0], end[1]).item())
    assert min(abs(a - b) for i, a in enumerate(floors) for b in floors[i + 1 :]) > 0.05


@pytest.mark.parametrize("name", sorted(SURFACES))
def test_surfaces_work_elementwise_on_a_meshgrid(name: str):
    surface = SURFACES[name]
    xs = torch.linspace(*surface.xlim, 7, dtype=torch.float64)
    ys = torch.linspace(*surface.ylim, 5, dtype=torch.float64)
    grid_x, grid_y = torch.meshgrid(xs, ys, indexing="xy")  # (5, 7) each
    z = surface(grid_x, grid_y)
    assert z.shape == (5, 7)
    for i, j in [(0, 0), (2, 3), (4, 6)]:
        assert z[i, j].item() == pytest.approx(surface.fn(xs[j], ys[i]).item())


@pytest.mark.parametrize("name", sorted(SURFACES))
def test_registry_entries_are_consistent(name: str):
    surface = SURFACES[name]
    assert isinstance(surface, Surface) and surface.name == name
    assert surface.xlim[0] < surface.start[0] < surface.xlim[1]
    assert surface.ylim[0] < surface.start[1] < surface.ylim[1]
    if surface.minimum is None:
        return
    # The recorded minimum is stationary and no grid point of the plotted range is lower.
    assert _grad(surface, *surface.minimum).norm().item() < 1e-3
    xs = torch.linspace(*surface.xlim, 301, dtype=torch.float64)
    ys = torch.linspace(*surface.ylim, 301, dtype=torch.float64)
    grid = surface(*torch.meshgrid(xs, ys, indexing="xy"))
    assert surface(*f64(surface.minimum)).item() <= grid.min().item() + 1e-6


def test_rosenbrock_surface_minimum_is_a_a_squared():
    assert SURFACES["rosenbrock"].minimum == (1.0, 1.0)
    assert SURFACES["pathological_curvature"].minimum is None  # falls towards 0 as y -> -inf


def test_trajectory_shape_dtype_and_start():
    sgd = functools.partial(torch.optim.SGD, lr=1e-3)
    path = trajectory(SURFACES["rosenbrock"], (-1.5, 2.5), sgd, 10)
    assert path.shape == (11, 2) and path.dtype == torch.get_default_dtype()
    assert path[0].tolist() == [-1.5, 2.5]
    assert not torch.equal(path[1], path[0])
    assert trajectory(rosenbrock, [0.0, 0.0], sgd, 0).shape == (1, 2)
    start = f64([-1.5, 2.5])
    path64 = trajectory(rosenbrock, start, sgd, 3)
    assert path64.dtype == torch.float64 and torch.equal(path64[0], start)
    assert start.grad is None and not start.requires_grad  # the caller's tensor is untouched


def test_one_sgd_step_matches_the_analytic_gradient():
    x, y, lr, a, b = -1.5, 2.5, 1e-3, 1.0, 100.0
    grad = (-2 * (a - x) - 4 * b * x * (y - x**2), 2 * b * (y - x**2))
    path = trajectory(rosenbrock, f64([x, y]), lambda p: torch.optim.SGD(p, lr=lr), 1)
    torch.testing.assert_close(path[1], f64([x - lr * grad[0], y - lr * grad[1]]))


def test_small_lr_sgd_decreases_rosenbrock_monotonically():
    surface = SURFACES["rosenbrock"]
    path = trajectory(surface, surface.start, lambda p: torch.optim.SGD(p, lr=1e-4), 20)
    losses = surface(path[:, 0], path[:, 1])
    assert (losses[1:] < losses[:-1]).all(), losses


@pytest.mark.parametrize("nesterov", [False, True])
def test_trajectory_equals_a_hand_rolled_sgd_loop(nesterov: bool):
    def make(params):
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, nesterov=nesterov)

    start, n_steps = (-1.5, 2.5), 50
    point = torch.tensor(start, requires_grad=True)
    optimizer = make([point])
    expected = [point.detach().clone()]
    for _ in range(n_steps):
        optimizer.zero_grad()
        rosenbrock(point[0], point[1]).backward()
        optimizer.step()
        expected.append(point.detach().clone())
    path = trajectory(rosenbrock, start, make, n_steps)
    torch.testing.assert_close(path, torch.stack(expected), rtol=1e-6, atol=1e-7)


def test_divergence_leaves_nans_instead_of_raising():
    # lr = 3e-3 is beyond 2 / (curvature across the valley at the start, about 1700).
    path = trajectory(rosenbrock, (-1.5, 2.5), lambda p: torch.optim.SGD(p, lr=3e-3), 200)
    assert path.shape == (201, 2)
    finite = torch.isfinite(path).all(dim=1)
    first_bad = int((~finite).nonzero()[0])
    assert 1 < first_bad < 200
    assert finite[:first_bad].all() and torch.isnan(path[first_bad:]).all()


@pytest.mark.parametrize("n_steps", [-1, 2.5, True])
def test_bad_n_steps_raises_with_the_value(n_steps):
    with pytest.raises(ValueError, match=re.escape(f"n_steps: {n_steps!r}")):
        trajectory(rosenbrock, (0.0, 0.0), lambda p: torch.optim.SGD(p, lr=0.1), n_steps)


@pytest.mark.parametrize("start", [(1.0, 2.0, 3.0), [1.0], [[1.0, 2.0]], (float("nan"), 0.0)])
def test_bad_start_raises_with_the_value(start):
    with pytest.raises(ValueError, match=re.escape(f"start: {start!r}")):
        trajectory(rosenbrock, start, lambda p: torch.optim.SGD(p, lr=0.1), 5)


def test_factory_must_return_an_optimizer():
    with pytest.raises(TypeError, match="list"):
        trajectory(rosenbrock, (0.0, 0.0), lambda p: p, 5)


@pytest.fixture
def plt():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    yield plt
    plt.close("all")


def test_plot_trajectories_draws_one_line_per_path_and_a_legend(plt):
    from matplotlib.axes import Axes

    surface = SURFACES["rosenbrock"]
    paths = {
        "SGD": trajectory(surface, surface.start, lambda p: torch.optim.SGD(p, lr=1e-3), 30),
        "SGD too fast": trajectory(
            surface, surface.start, lambda p: torch.optim.SGD(p, lr=3e-3), 30
        ),
        "Adam": trajectory(surface, surface.start, lambda p: torch.optim.Adam(p, lr=0.1), 30),
    }
    assert torch.isnan(paths["SGD too fast"]).any()
    ax = plot_trajectories(surface, paths, levels=12)
    assert isinstance(ax, Axes)
    assert len(ax.lines) == 3
    assert [line.get_label() for line in ax.lines] == ["SGD", "SGD too fast (diverged)", "Adam"]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert legend == ["SGD", "SGD too fast (diverged)", "Adam", "minimum"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("parameter x (no unit)", "parameter y (no unit)")
    assert ax.get_title() == "Optimizers on rosenbrock"  # no identifier in a figure
    assert "_" not in ax.figure.axes[-1].get_ylabel()  # the colour bar's label
    assert ax.get_xlim() == surface.xlim and ax.get_ylim() == surface.ylim
    ax.figure.canvas.draw()  # renders with NaNs present
    # The legend sits below the axes, so it covers no path (inside, "best" hid end points).
    legend_box = ax.get_legend().get_window_extent()
    assert legend_box.y1 < ax.get_window_extent().y0


def test_plot_trajectories_uses_the_given_axes_and_title(plt):
    _, given = plt.subplots()
    surface = SURFACES["pathological_curvature"]
    path = trajectory(surface, surface.start, lambda p: torch.optim.SGD(p, lr=0.1), 5)
    ax = plot_trajectories(surface, {"SGD": path}, ax=given, levels=[0.2, 0.5, 1.0, 1.5], title="T")
    assert ax is given and ax.get_title() == "T" and len(ax.lines) == 1
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["SGD"]  # no known minimum
    with pytest.raises(ValueError, match="levels: 1"):
        plot_trajectories(surface, {"SGD": path}, levels=1)
