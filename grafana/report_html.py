"""The job report as one self-contained HTML file (inline CSS, the heatmap as a data: URI
PNG), to attach to a ticket: no network, no Grafana, opens in any browser."""

from __future__ import annotations

import base64
import html
import io

import numpy as np

from rankwatch.grafana.report import DIMENSION_NAMES, JobReport, key_numbers, method_line
from rankwatch.sim.heatmap import CMAP, colour_label, colour_scale

_CSS = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { padding: 4px 10px; border-bottom: 1px solid #ddd;
text-align: left; } th { background: #f3f3f3; }
img.heatmap { border: 1px solid #ccc; max-width: 100%; }
.muted { color: #777; }
"""


def render_heatmap_png(grid: np.ndarray, title: str) -> bytes:
    """S_w on the DP x PP grid (rows DP ranks, columns stages), worst cells annotated."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dp, pp = grid.shape
    fig = Figure(figsize=(min(3 + 0.9 * pp, 14), min(2 + 0.45 * dp, 14)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    low, _, high = colour_scale(grid)
    image = ax.imshow(grid, aspect="auto", cmap=CMAP, vmin=low, vmax=high)
    fig.colorbar(image, ax=ax, label=colour_label(grid))
    if dp * pp <= 256:
        _, centre, _ = colour_scale(grid)
        for (d, p), value in np.ndenumerate(grid):
            if np.isfinite(value):
                strong = abs(value - centre) > 0.6 * (high - centre)  # dark cell: white text
                ax.text(p, d, f"{value:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if strong else "black")  # fmt: skip
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("DP rank")
    ax.set_xticks(range(pp))
    ax.set_yticks(range(0, dp, max(1, dp // 16)))
    ax.set_title(title)
    out = io.BytesIO()
    fig.savefig(out, format="png", bbox_inches="tight")
    return out.getvalue()


def render_html(r: JobReport) -> str:
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>rankwatch report: {esc(r.job)}</title><style>{_CSS}</style></head><body>",
        f"<h1>rankwatch report: job {esc(r.job)}</h1>",
        f'<p class="muted">{esc(method_line(r))}</p>',
        "<table>",
        *(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in key_numbers(r)),
        "</table>",
        "<h2>Worker heatmap (S_w, DP x PP)</h2>",
    ]
    if r.grid is None:
        parts.append('<p class="muted">No step was slow enough to attribute to workers.</p>')
    else:
        png = render_heatmap_png(r.grid, f"{r.job}: S_w per worker")
        data = base64.b64encode(png).decode("ascii")
        src = f"data:image/png;base64,{data}"
        parts.append(f'<img class="heatmap" id="heatmap" alt="S_w heatmap" src="{src}">')
    parts.append("<h2>Who is to blame (S_g)</h2><table><tr><th>by</th><th>top groups</th></tr>")
    for dim, groups in r.top.items():
        shown = ", ".join(f"{g} {s:.3f}" for g, s in groups) or "-"
        parts.append(f"<tr><td>{esc(DIMENSION_NAMES[dim])}</td><td>{esc(shown)}</td></tr>")
    parts.append("</table>")
    parts.append(f"<h2>Open hangs ({len(r.open_hangs)})</h2>")
    parts += [f"<p>{esc(h['episode_id'])}: {esc(h['summary'])}</p>" for h in r.open_hangs]
    parts.append(f"<h2>Open alerts ({len(r.open_alerts)})</h2>")
    parts += [
        f"<p>[{esc(a['severity'])}] {esc(a['kind'])}: {esc(a['summary'])}</p>"
        for a in r.open_alerts
    ]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
