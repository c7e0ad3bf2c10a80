"""One number per job: after ``rankwatch demo``, every command finds the stored job with no
flags (the store comes from RANKWATCH_CLICKHOUSE, the one place to change it), and
``whatif``, ``demo``, ``report`` and the Grafana panels' SQL agree to float precision on
the same figures, or name the method that makes them differ (docs/whatif.md, "Offline and
live figures"): the stored figures are live (rolling ideal), ``whatif --window 20``
reproduces them; ``whatif`` alone is offline (whole-trace ideal), as the demo's offline
block.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.grafana.build import DASHBOARD_DIR
from rankwatch.grafana.checks import panel_queries
from rankwatch.grafana.macros import expand
from rankwatch.grafana.report import collect, context
from rankwatch.sim.tracegen import demo_config
from rankwatch.streams.kit.store import Store

pytestmark = pytest.mark.integration

WINDOW = 20  # the ops worker's default (RANKWATCH_WINDOW)
PANELS = {
    (q.board, q.title): q.sql
    for path in sorted(DASHBOARD_DIR.glob("*.json"))
    for q in panel_queries(json.loads(path.read_text()))
}
TOP_PANELS = {
    "optype": ("rankwatch-job", "Top op types", "optype"),
    "stage": ("rankwatch-job", "Top pipeline stages", "stage"),
    "dp_rank": ("rankwatch-job", "Top DP ranks", "dp_rank"),
    "worker": ("rankwatch-workers", "Top workers", "worker"),
}


@dataclass(frozen=True)
class Demo:
    workload: str
    dsn: str
    out: str
    directory: Path


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


@pytest.fixture(scope="module", params=["generator", "torch"])
def demo(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Demo]:
    """One demo run per workload, shared by the tests (the torch one takes seconds)."""
    tmp = tmp_path_factory.mktemp(f"demo-{request.param}")
    dsn = f"chdb://{tmp / 'store'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RANKWATCH_CLICKHOUSE", dsn)
        patch.chdir(tmp)  # the demo's files land in ./var/demo, as for a user
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["demo", "--workload", request.param]) == 0
        yield Demo(request.param, dsn, out.getvalue(), tmp / "var" / "demo")


def test_every_command_finds_the_demo_job_without_flags(
    demo: Demo, capsys: pytest.CaptureFixture[str]
) -> None:
    assert f"stored in {demo.dsn}" in demo.out.splitlines()[0]
    assert "rankwatch report: job demo" in run(["report", "demo"], capsys)
    assert run(["hang", "report", "demo"], capsys).startswith("job demo: no hang episode")
    trace, meta = demo.directory / "trace.parquet", demo.directory / "meta.yaml"
    assert "Slowdown S = " in run(["whatif", str(trace), "--meta", str(meta)], capsys)
    with Store.connect(demo.dsn) as store:
        last = store.query("SELECT max(time) AS t FROM steps WHERE job = 'demo'")[0]["t"]
    assert last <= datetime.now(UTC)  # the job's time range does not reach into the future


def test_the_demo_raises_its_straggler_alert_and_supports_diagnose_and_scenario(
    demo: Demo, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the live worker would tell an engineer about the same job: the straggler
    alert naming the slowed worker, its diagnosis, and a what-if scenario from its raw
    ops (on main the demo said "Open alerts: 0" and both commands refused the job)."""
    report = run(["report", "demo"], capsys)
    diagnosis = run(["diagnose", "demo"], capsys)
    scenario = run(["scenario", "demo", "--sweep", "gpu.speed=1,2"], capsys)
    assert "gpu.speed=2" in scenario
    if demo.workload == "generator":  # the torch job's timings are real: no fixed verdict
        assert "Open alerts: 1" in report
        assert "straggler: job demo runs" in report and "worker 2,1 (rank 6 on host-0)" in report
        assert "cause: straggler compute (worker 2,1, rank 6 on host-0" in diagnosis


def test_whatif_demo_report_and_panels_agree(
    demo: Demo, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, meta = demo.directory / "trace.parquet", demo.directory / "meta.yaml"
    whatif = ["whatif", str(trace), "--meta", str(meta), "--format", "json"]
    live = json.loads(run([*whatif, "--window", str(WINDOW)], capsys))
    offline = json.loads(run(whatif, capsys))
    with Store.connect(demo.dsn) as store:
        report = collect(store, "demo")
        ctx = context("demo")

        def panel(board: str, title: str) -> list[dict[str, object]]:
            return store.query(expand(PANELS[(board, title)], ctx))

        s_panel = panel("rankwatch-job", "Slowdown S")[0]["S"]
        tops = {
            dim: {str(r[column]): r["S_g" if dim != "worker" else "S_w"] for r in panel(b, t)}
            for dim, (b, t, column) in TOP_PANELS.items()
        }
    # live: whatif --window, the report and the panels, to float precision
    assert live["method"] == "live" and live["window"] == WINDOW and offline["method"] == "offline"
    assert live["slowdown"] == pytest.approx(report.slowdown, rel=1e-12)
    assert s_panel == pytest.approx(live["slowdown"], rel=1e-12)
    for dim, rows in tops.items():  # the panels list the top 10 (workers: 20) groups
        every = live["attribution"][dim]
        assert rows == {g: pytest.approx(every[g], rel=1e-12) for g in rows}, dim
        assert next(iter(rows)) == next(iter(every)) and len(rows) >= min(len(every), 10)
    for dim, groups in report.top.items():
        assert dict(groups) == {g: tops[dim][g] for g, _ in groups}
    # the demo prints the stored (live) S and the offline one, each under its method's name
    assert f"Slowdown S = {live['slowdown']:.3f}, waste W" in demo.out
    assert f"Slowdown S = {offline['slowdown']:.3f}: steps took" in demo.out
    assert "ideal costs from the latest analysed steps up to it (rolling window" in demo.out
    assert "against ideal costs from the whole trace (offline)" in demo.out
    assert "rolling window" in run(["report", "demo"], capsys)  # the report names its method
    # offline: the engine over the exported trace, the figures the demo printed
    demo_offline = demo.out.split("Offline figures over the whole trace")[1]
    text = run(["whatif", str(trace), "--meta", str(meta)], capsys)
    assert text.strip() in demo_offline


def test_the_generated_demo_gives_the_same_numbers_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANKWATCH_CLICKHOUSE", f"chdb://{tmp_path / 'store'}")
    monkeypatch.chdir(tmp_path)
    first, second = (run(["demo"], capsys) for _ in range(2))

    def numbers(out: str) -> list[str]:  # all but the wall time of the assembly
        return [re.sub(r"assembled in [0-9.]+ s", "", line) for line in out.splitlines()]

    assert numbers(first) == numbers(second)
    assert first.startswith("job demo: generated trace (seed 0)")
    with Store.connect(f"chdb://{tmp_path / 'store'}") as store:  # replaced, not doubled
        count = store.query("SELECT count() AS n FROM steps WHERE job = 'demo'")[0]["n"]
    assert count == demo_config().steps
