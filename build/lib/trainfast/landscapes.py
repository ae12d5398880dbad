"""Two-dimensional test surfaces, and the path an optimizer takes across them.

The optimizers chapter starts every optimizer from the same point on a small surface and draws
the points it visits on a contour plot: with two parameters you can *see* momentum overshoot,
RMSprop rescale a flat direction, Adam take near-constant steps. The surfaces are plain
functions of two tensors ``x`` and ``y`` that work elementwise on any shape, so the same
function draws the contours (on a meshgrid) and is minimised (on two scalar parameters).

The picture idea is ARENA's optimizer exercises (chapter 0, "Optimizers"); Rosenbrock's
valley is the classic test of 1960; the Gaussian basins are ours. Two parameters tell you how
an update rule *behaves*, not how it does on a network with millions of them: do not pick an
optimizer or a learning rate from these pictures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trainfast.validation import check_number

if TYPE_CHECKING:  # matplotlib is optional and imported lazily in plot_trajectories
    from matplotlib.axes import Axes

__all__ = [
    "GAUSSIANS",
    "SURFACES",
    "Surface",
    "SurfaceFn",
    "neg_gaussians",
    "pathological_curvature",
    "plot_trajectories",
    "rosenbrock",
    "trajectory",
]

SurfaceFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def pathological_curvature(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``tanh(x)**2 + 0.01*|x| + sigmoid(y)``: a narrow valley along ``x = 0`` that is nearly flat.

    Across the valley (in ``x``) the curvature at the bottom is 2; along it (in ``y``) the slope
    is at most 0.25 (at ``y = 0``) and fades away on either side, so one learning rate is too
    large for one direction and far too small for the other. There is no minimum: the value
    falls towards 0 as ``y -> -inf``. From ARENA's optimizer exercises
    (``pathological_curve_loss``).
    """
    return torch.tanh(x) ** 2 + 0.01 * torch.abs(x) + torch.sigmoid(y)


def rosenbrock(x: torch.Tensor, y: torch.Tensor, a: float = 1.0, b: float = 100.0) -> torch.Tensor:
    """Rosenbrock's banana ``(a - x)**2 + b*(y - x**2)**2``, minimum 0 at ``(a, a**2)``.

    A curved, steep-sided valley with a nearly flat floor: finding the valley is easy, following
    it to the minimum is hard. Rosenbrock (1960), "An automatic method for finding the greatest
    or least value of a function", The Computer Journal 3(3).
    """

    check_number("a", a)

    check_number("b", b, minimum=0.0)  # b < 0 turns the valley into a ridge
    return (a - x) ** 2 + b * (y - x**2) ** 2


# (centre_x, centre_y, height, width) of each Gaussian bump that neg_gaussians subtracts.
GAUSSIANS: tuple[tuple[float, float, float, float], ...] = (
    (-1.0, -1.0, 1.0, 0.9),  # the deep, wide basin: the global minimum
    (0.8, 0.8, 0.5, 0.6),  # a shallow basin on the way down from the suggested start: a trap
    (1.5, -1.8, 0.7, 0.6),  # a middle basin off to the side
)


def neg_gaussians(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``-sum_i h_i * exp(-((x - cx_i)**2 + (y - cy_i)**2) / (2 * s_i**2))`` over :data:`GAUSSIANS`.

    Three basins of different depth and width on a plateau that is almost flat far from them:
    where an optimizer ends up depends on its start, its step size and its momentum. The
    deepest point lies near the deepest centre, shifted slightly by the other two bumps.
    """
    out = torch.zeros(torch.broadcast_shapes(x.shape, y.shape), dtype=x.dtype, device=x.device)
    for cx, cy, height, width in GAUSSIANS:
        out = out - height * torch.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * width**2))
    return out


@dataclass(frozen=True)
class Surface:
    """A test surface and how to look at it.

    ``start`` is a suggested start point that gives instructive pictures; ``minimum`` is the
    known minimiser, or ``None`` when there is none (``pathological_curvature``).
    ``log_levels`` asks :func:`plot_trajectories` for log-spaced contours, which a surface with
    a flat floor and steep walls (Rosenbrock) needs to show its valley.
    """

    name: str
    fn: SurfaceFn
    xlim: tuple[float, float]
    ylim: tuple[float, float]
    start: tuple[float, float]
    minimum: tuple[float, float] | None = None
    log_levels: bool = False

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fn(x, y)


# Starts and limits chosen so that, from the same start, the optimizers visibly differ. Settings
# that show it: pathological_curvature, 100 steps: SGD lr=0.1 (reaches the valley, then crawls),
# SGD lr=0.1 momentum=0.9, RMSprop lr=0.02, Adam lr=0.1. rosenbrock, 500 steps: SGD lr=1e-3
# (crawls), SGD lr=3e-3 (diverges), SGD lr=1e-3 momentum=0.9, RMSprop lr=0.01, Adam lr=0.1.
# neg_gaussians, 150 steps: SGD lr=0.5, RMSprop lr=0.05 and Adam lr=0.1 stay in the trap; SGD
# lr=0.3 momentum=0.9 rolls through it into the deep basin.
SURFACES: dict[str, Surface] = {
    s.name: s
    for s in (
        Surface(
            "pathological_curvature",
            pathological_curvature,
            xlim=(-2.5, 2.5),
            ylim=(-5.0, 3.0),
            start=(2.0, 2.5),
        ),
        Surface(
            "rosenbrock",
            rosenbrock,
            xlim=(-2.0, 2.0),
            ylim=(-1.0, 3.0),
            start=(-1.5, 2.5),
            minimum=(1.0, 1.0),
            log_levels=True,
        ),
        Surface(
            "neg_gaussians",
            neg_gaussians,
            xlim=(-3.0, 3.0),
            ylim=(-3.5, 2.5),
            start=(2.5, 1.5),
            minimum=(-0.9995, -0.9998),  # LBFGS in float64 from (-1, -1), rounded
        ),
    )
}


def trajectory(
    surface: Surface | SurfaceFn,
    start: Sequence[float] | torch.Tensor,
    optimizer_factory: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    n_steps: int,
) -> torch.Tensor:
    """The ``(n_steps + 1, 2)`` points an optimizer visits minimising ``surface`` from ``start``.

    The point is one parameter tensor of shape ``(2,)``; ``optimizer_factory`` receives
    ``[point]`` and returns any :class:`torch.optim.Optimizer`, e.g.
    ``lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)`` or
    ``functools.partial(torch.optim.Adam, lr=0.1)``. Each step calls ``optimizer.step(closure)``
    with the usual zero-grad / forward / backward closure, so LBFGS works too. Row 0 is
    ``start``; row ``t`` is the point after ``t`` steps, in the dtype of ``start`` when it is a
    floating tensor, else the default dtype.

    Divergence does not raise: once the point stops being finite, that row and every later one
    are NaN (the shape stays fixed, and matplotlib leaves NaNs out of a line).
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
        raise ValueError(f"Invalid n_steps: {n_steps!r} (expected an integer >= 0)")
    is_float = isinstance(start, torch.Tensor) and start.is_floating_point()
    dtype = start.dtype if is_float else torch.get_default_dtype()
    point = torch.as_tensor(start, dtype=dtype).detach().clone()
    if point.shape != (2,):
        raise ValueError(f"Invalid start: {start!r} (expected 2 numbers, got shape {point.shape})")
    if not torch.isfinite(point).all():
        raise ValueError(f"Invalid start: {start!r} (expected finite numbers)")
    point.requires_grad_(True)
    optimizer = optimizer_factory([point])
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer_factory returned {type(optimizer).__name__}, not an Optimizer")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = surface(point[0], point[1])
        loss.backward()
        return loss

    path = torch.full((n_steps + 1, 2), math.nan, dtype=dtype)  # (step, xy)
    path[0] = point.detach()
    for t in range(1, n_steps + 1):
        optimizer.step(closure)
        if not torch.isfinite(point).all():
            break  # diverged: rows t.. stay NaN
        path[t] = point.detach()
    return path


def plot_trajectories(
    surface: Surface,
    trajectories: dict[str, torch.Tensor],
    ax: Axes | None = None,
    levels: int | Sequence[float] = 30,
    title: str | None = None,
    resolution: int = 200,
) -> Axes:
    """Draw ``surface`` as filled contours and each trajectory on top; return the Axes.

    ``trajectories`` maps a legend label (say ``"SGD, lr=0.1"``) to an ``(n, 2)`` tensor from
    :func:`trajectory`. Each becomes one line in ``ax.lines``, dotted at every step, with a
    white circle at its start and a filled one at its end (its last finite point; a diverged
    path says so in the legend), with the legend below the axes so that it covers no path.
    ``levels`` is a number of contour levels, log-spaced above the
    surface's lowest value when ``surface.log_levels``, or the levels themselves. A star marks
    ``surface.minimum`` when it is known. Nothing is shown or saved: that is the caller's call.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import BoundaryNorm

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 5))
    xs = torch.linspace(*surface.xlim, resolution, dtype=torch.float64)
    ys = torch.linspace(*surface.ylim, resolution, dtype=torch.float64)
    grid_x, grid_y = torch.meshgrid(xs, ys, indexing="xy")  # (resolution, resolution) each
    with torch.no_grad():
        z = surface(grid_x, grid_y).numpy()
    grid_x, grid_y = grid_x.numpy(), grid_y.numpy()
    if isinstance(levels, int):
        if levels < 2:
            raise ValueError(f"Invalid levels: {levels} (expected at least 2)")
        low, span = float(z.min()), float(z.max() - z.min())
        if surface.log_levels:  # dense near the floor, sparse up the walls
            contour_levels = low + np.geomspace(span * 1e-5, span, levels)
        else:
            contour_levels = np.linspace(low, low + span, levels)
    else:
        contour_levels = np.asarray(levels, dtype=float)
    cmap = plt.get_cmap("viridis")
    filled = ax.contourf(
        grid_x,
        grid_y,
        z,
        levels=contour_levels,
        cmap=cmap,
        extend="both",
        norm=BoundaryNorm(contour_levels, cmap.N, extend="both"),
    )
    ax.contour(grid_x, grid_y, z, levels=contour_levels, colors="white", linewidths=0.3, alpha=0.4)
    readable = surface.name.replace("_", " ")  # "pathological curvature", not an identifier
    ax.figure.colorbar(
        filled, ax=ax, label=f"loss f(x, y) of the {readable} surface", format="%.3g"
    )

    for label, path in trajectories.items():
        path = path.detach().cpu().double().numpy()
        finite = path[np.isfinite(path).all(axis=1)]  # (n_finite, 2): drops a diverged tail
        if len(finite) < len(path):
            label = f"{label} (diverged)"
        (line,) = ax.plot(
            finite[:, 0], finite[:, 1], "-", marker=".", markersize=3, linewidth=1.5, label=label
        )
        if len(finite):  # start and end as markers (collections, so ax.lines stays one per path)
            ax.scatter(
                finite[[0, -1], 0],
                finite[[0, -1], 1],
                marker="o",
                s=[60, 40],
                zorder=3,
                color=["white", line.get_color()],
                edgecolors="black",
            )
    if surface.minimum is not None:
        ax.scatter(
            *surface.minimum,
            marker="*",
            s=200,
            color="red",
            edgecolors="black",
            zorder=3,
            label="minimum",
        )

    ax.set_xlim(surface.xlim)
    ax.set_ylim(surface.ylim)
    ax.set_xlabel("parameter x (no unit)")
    ax.set_ylabel("parameter y (no unit)")
    ax.set_title(title if title is not None else f"Optimizers on {readable}")
    # Below the axes, not inside them: inside, "best" still covered end points and loops.
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.14),
        ncol=2,
        fontsize=11,
        frameon=False,
    )
    return ax
