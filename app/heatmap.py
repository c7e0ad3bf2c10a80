"""The worker heatmap: S_w on the DP x PP grid, as PNG bytes (writing them is the caller's).

matplotlib is imported here only, lazily, with the Agg canvas (no display, no global
backend switch), so the engine itself needs numpy alone; the colour scale is the
engine's (``rankwatch.sim.heatmap``).
"""

from __future__ import annotations

import io

from rankwatch.sim.analysis import Analysis
from rankwatch.sim.heatmap import CMAP, colour_label, colour_scale


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
