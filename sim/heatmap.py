"""The worker heatmap's colour scale: S_w on the DP x PP grid (pure; the PNG is drawn
by ``rankwatch.heatmap``, the HTML report by ``rankwatch.grafana.report_html``)."""

from __future__ import annotations

import numpy as np

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
