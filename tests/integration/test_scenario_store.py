"""``rankwatch scenario JOB``: a job stored in real chDB as the ops worker stores it (raw
ops kept) is read back, its scenarios computed and stored in the ``scenarios`` table
(docs/scenarios.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from rankwatch.cli import main
from rankwatch.sim.scenario import Scenario, calibrate_trace, run_scenarios
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.sink import TableSink
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.embedded import run_embedded
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import replay_batches

pytestmark = pytest.mark.integration


def test_a_stored_job_s_scenarios_are_computed_and_stored(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cfg = GenConfig(dp=2, pp=2, microbatches=4, steps=6, stragglers=(Straggler(1, 1, 1.5),))
    trace, meta = generate_trace(cfg)
    (tmp_path / "meta.yaml").write_text(
        "hardware:\n  inter_gbps: 200\n  intra_gbps: 2400\n  gpus_per_host: 2\n"
    )
    dsn = f"chdb://{tmp_path / 'chdb'}"
    batches = replay_batches(trace, meta, "scn", origin_ns=time.time_ns() - 10**9)
    with Store.connect(dsn) as store:  # as the ops worker stores a job: raw ops kept
        store.migrate()
        run_embedded(batches, Pipeline(analyser=WhatIfAnalyser(), keep_ops=True), TableSink(store))

    sweep = ["--sweep", "network.inter_gbps=100,200,400", "--meta", str(tmp_path / "meta.yaml")]
    argv = ["scenario", "scn", *sweep, "--clickhouse", dsn, "--store", "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)["scenarios"]
    assert [s["name"] for s in out] == [f"network.inter_gbps={v}" for v in (100, 200, 400)]
    assert out[1]["speedup"] == 1.0  # the job's own bandwidth

    with Store.connect(dsn) as store:
        rows = store.query(
            "SELECT name, swept_key, swept_value, step_time_s, baseline_s, speedup, steps, "
            "last_step, position, settings FROM scenarios FINAL WHERE job = 'scn' "
            "ORDER BY position"
        )
        analysed = store.query("SELECT step FROM steps FINAL WHERE t_sim IS NOT NULL")
    assert [r["name"] for r in rows] == [s["name"] for s in out]
    assert [r["swept_value"] for r in rows] == [100.0, 200.0, 400.0]
    assert {r["swept_key"] for r in rows} == {"network.inter_gbps"}
    assert [r["speedup"] for r in rows] == [s["speedup"] for s in out]
    assert json.loads(rows[2]["settings"]) == {"network.inter_gbps": 400.0}
    steps = sorted(int(r["step"]) for r in analysed)
    assert rows[0]["steps"] == len(steps) and rows[0]["last_step"] == steps[-1]

    # the stored job's records are the replayed ones: the same baseline as the trace's
    kept = trace.select(np.isin(trace.step, steps))
    (base,) = run_scenarios(calibrate_trace(kept, meta), [Scenario.of({})])
    assert rows[0]["baseline_s"] == pytest.approx(base.step_time_s, rel=1e-6)


def test_an_unknown_job_is_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    dsn = f"chdb://{tmp_path / 'chdb'}"
    assert main(["db", "migrate", "--clickhouse", dsn]) == 0
    capsys.readouterr()
    assert main(["scenario", "nope", "--clickhouse", dsn]) == 2
    err = capsys.readouterr().err
    assert "unknown job 'nope'" in err and err.count("\n") == 1
