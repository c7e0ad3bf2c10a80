"""The report's text and HTML forms, from a report value (no store)."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime

import numpy as np

from rankwatch.grafana.report import JobReport, format_text
from rankwatch.grafana.report_html import render_html

T = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def report(grid: np.ndarray | None) -> JobReport:
    return JobReport(
        job="j<1>",
        steps=10,
        analysed=9,
        partial=1,
        first_step=0,
        last_step=9,
        first_time=T,
        last_time=T,
        slowdown=1.25,
        waste=0.2,
        gpu_hours_wasted=None,
        mean_recorded_s=1.0,
        mean_simulated_s=0.98,
        mean_ideal_s=0.784,
        top={"optype": [("backward-compute", 1.2)], "stage": [], "dp_rank": [], "worker": []},
        grid=grid,
        open_hangs=[{"episode_id": "h1", "summary": "rank 3 stuck"}],
    )


def test_text_has_the_key_numbers() -> None:
    text = format_text(report(np.array([[1.0, 1.3], [1.0, 1.0]])))
    assert "Slowdown S        1.250" in text and "Waste W           20.0%" in text
    assert "GPU-hours wasted  unknown (no world size)" in text
    assert "by op type: backward-compute 1.200" in text
    assert "Open hangs: 1" in text and "h1: rank 3 stuck" in text
    assert "    0    1.000   1.300" in text


def test_html_is_self_contained_with_the_heatmap_png() -> None:
    page = render_html(report(np.array([[1.0, 1.3], [1.0, 1.0]])))
    assert "j&lt;1&gt;" in page and "<j<1>" not in page  # escaped
    (data,) = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(data).startswith(b"\x89PNG")
    assert not re.search(r'(src|href)="https?:', page)


def test_html_without_attribution() -> None:
    page = render_html(report(None))
    assert "No step was slow enough" in page and "data:image/png" not in page
