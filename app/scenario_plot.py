"""The scenario curve as PNG bytes, or an HTML page holding it (writing is the caller's).

A sweep draws step time against the swept value; other scenario sets draw one bar per
scenario. matplotlib is imported lazily, with the Agg canvas.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence

from rankwatch.sim.scenario import ScenarioResult


def render(
    results: Sequence[ScenarioResult], key: str | None, *, as_html: bool = False, title: str = ""
) -> bytes:
    png = _png(results, key, title)
    return _page(png, results, title) if as_html else png


def _png(results: Sequence[ScenarioResult], key: str | None, title: str) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=110)
    ax = fig.add_subplot()
    times = [r.step_time_s for r in results]
    if key is not None:
        xs = [float(r.scenario.settings[key]) for r in results]
        ax.plot(xs, times, marker="o")
        ax.set_xlabel(key)
    else:
        names = [r.scenario.name for r in results]
        ax.bar(range(len(names)), times)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("simulated step time (s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"scenarios: {title}" if title else "scenarios")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def _page(png: bytes, results: Sequence[ScenarioResult], title: str) -> bytes:
    rows = "".join(
        f"<tr><td>{html.escape(r.scenario.name)}</td><td>{r.step_time_s:.6f}</td>"
        f"<td>{r.speedup:.3f}</td></tr>"
        for r in results
    )
    image = base64.b64encode(png).decode()
    text = (
        f"<!doctype html><meta charset=utf-8><title>scenarios {html.escape(title)}</title>"
        f'<img alt="step time per scenario" src="data:image/png;base64,{image}">'
        "<table><tr><th>scenario</th><th>step time (s)</th><th>speedup</th></tr>"
        f"{rows}</table>"
    )
    return text.encode()
