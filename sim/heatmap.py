"""The worker heatmap: S_w on the DP x PP grid, as PNG bytes (writing them is the caller's).

matplotlib is imported here only, lazily, with the Agg canvas (no display, no global
backend switch), so the engine itself needs numpy alone.
"""

from __future__ import annotations

import io

import numpy as np

from rankwatch.sim.analysis import Analysis

CMAP = "RdBu_r"
"""Diverging: white is the median worker, red slower than it, blue faster."""

_MIN_HALF_RANGE = 1e-3
"""A grid of equal workers still gets a (narrow) scale instead of a division by zero."""


def colour_scale(grid: np.ndarray) -> tuple[float, float, float]:
    """(low, centre, high) of the colour scale for S_w: centred on the median worker and
    symmetric, as wide as the worker farthest from it, so the scale spends its colours on
    the spread between workers. (S_w of a whole job is often 1.1 to 1.2 on every worker;
    a scale starting at 1 paints them all the same red.)"""
    finite = grid[np.isfinite(grid)]
    if not finite.size:
        return 1.0 - _MIN_HALF_RANGE, 1.0, 1.0 + _MIN_HALF_RANGE
    centre = float(np.median(finite))
    half = max(float(np.abs(finite - centre).max()), _MIN_HALF_RANGE)
    return centre - half, centre, centre + half


def colour_label(grid: np.ndarray) -> str:
    _, centre, _ = colour_scale(grid)
    return f"S_w (white: the median worker, {centre:.3f}; red: slower, blue: faster)"


def render_heatmap(a: Analysis, title: str = "") -> bytes:
    """PNG of S_w (rows: DP ranks, columns: stages); the top workers are outlined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    grid = a.worker_DP
    dp, pp = grid.shape
    fig = Figure(figsize=(min(2 + 0.6 * pp, 14), min(1.5 + 0.25 * dp, 14)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    low, _, high = colour_scale(grid)
    image = ax.imshow(grid, aspect="auto", cmap=CMAP, vmin=low, vmax=high)
    fig.colorbar(image, ax=ax, label=colour_label(grid))
    ax.set_xlabel("pipeline stage (PP rank)")
    ax.set_ylabel("DP rank")
    ax.set_xticks(range(pp))
    ax.set_yticks(range(0, dp, max(1, dp // 16)))
    for d, p in a.top_workers:
        ax.add_patch(Rectangle((p - 0.5, d - 0.5), 1, 1, fill=False, edgecolor="black", lw=2))
    ax.set_title(title or f"worker slowdown S_w (S = {a.slowdown:.3f})")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()
