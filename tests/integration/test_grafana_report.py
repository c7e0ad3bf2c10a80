"""``rankwatch report JOB`` on real chDB: the terminal numbers, and the HTML file opened in
headless Chromium (Debian's package) whose screenshot must show the heatmap."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rankwatch.cli import main
from rankwatch.grafana import sample
from rankwatch.grafana.report import collect
from rankwatch.streams.kit.store import Store

pytestmark = pytest.mark.integration

JOB = "report-job"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("report") / "chdb"
    with Store.connect(f"chdb://{path}") as store:
        store.migrate()
        sample.fill(store, JOB, time.time_ns())
    yield f"chdb://{path}"


def test_report_prints_the_key_numbers(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", JOB, "--clickhouse", dsn]) == 0
    out = capsys.readouterr().out
    assert f"rankwatch report: job {JOB}" in out
    assert "Partial steps     1" in out
    assert "by worker (dp,stage): 2,1 " in out  # the generator's straggler comes first
    assert "Open hangs: 1" in out and "Open alerts: 3" in out


def test_report_numbers_equal_the_boards(dsn: str) -> None:
    with Store.connect(dsn) as store:
        report = collect(store, JOB)
        direct = store.query(
            "SELECT sum(t_sim) / sum(t_ideal) AS S, count() AS n FROM steps FINAL"
            " WHERE job = {job:String} AND t_sim IS NOT NULL",
            {"job": JOB},
        )[0]
    assert report.slowdown == pytest.approx(direct["S"])
    assert report.analysed == direct["n"] == report.steps - 1  # one partial step
    assert report.grid is not None and report.grid.shape == (4, 4)
    assert np.unravel_index(np.nanargmax(report.grid), report.grid.shape) == (2, 1)
    assert report.gpu_hours_wasted is not None and report.gpu_hours_wasted > 0


def test_unknown_job_is_a_user_error(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "no-such-job", "--clickhouse", dsn]) == 2
    err = capsys.readouterr().err.splitlines()
    expected = f"unknown job 'no-such-job' in {dsn} (jobs there: {JOB})"
    assert err == [f"rankwatch report: error: {expected}"]


def test_html_report_screenshot_shows_the_heatmap(dsn: str, tmp_path: Path) -> None:
    from matplotlib.image import imread

    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("no chromium: make test runs scripts/ensure-chromium.sh first")
        pytest.skip("no chromium: run scripts/ensure-chromium.sh")

    page = tmp_path / "report.html"
    assert main(["report", JOB, "--clickhouse", dsn, "--html", str(page)]) == 0
    text = page.read_text()
    assert 'src="data:image/png;base64,' in text and "http" not in text.split("<body>")[1]
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1100,900",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    keep = os.environ.get("RANKWATCH_REPORT_SCREENSHOT")  # where to keep it, for a review
    if keep:
        shutil.copy(shot, keep)
    rgb = imread(shot)[..., :3]
    assert rgb.shape[:2] == (900, 1100)
    assert rgb.std() > 0.05  # not one flat colour
    # RdBu_r centred on the median worker: the straggler's cell (and the colour bar's top)
    # are red, well above green and blue
    heat = (rgb[..., 0] > rgb[..., 1] + 0.25) & (rgb[..., 0] > rgb[..., 2] + 0.2)
    assert heat.sum() > 2000, f"{heat.sum()} heatmap-coloured pixels"
