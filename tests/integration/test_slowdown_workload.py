"""The slowdown signals end to end: the real gloo workload (hooks writing ops v2),
the ops pipeline into real chDB, and ``rankwatch diagnose`` reading it back.

One rank is throttled from step 12 (extra matmuls inside its forward): its FLOP/s
drops, one ``flops-drop`` alert names it (the job may also be slower:
``throughput-drop``), and the diagnosis says ``straggler compute`` on that rank; every
rank has a signals row for every step with FLOP/s and bus bandwidth.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rankwatch.commands.workload import run_embedded_workload
from rankwatch.hooks.workload.config import WorkloadConfig
from rankwatch.hooks.workload.launch import torch_available
from rankwatch.streams.store import Store

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not torch_available(), reason="the workload needs torch"),
]


def test_a_throttled_rank_is_diagnosed_from_the_stored_signals(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'chdb'}"
    # a strong fault: detection margins are the study's business, the plumbing is this one's
    cfg = WorkloadConfig(steps=30, job="slow-1", fault_from=12, slow_rank=1, slow_matmuls=16)
    run_embedded_workload(cfg, tmp_path / "run", skip_steps=2, dsn=dsn)
    with Store.connect(dsn) as store:
        rows = store.query(
            "SELECT step, rank, flops_per_s, busbw, throughput, v_inter FROM rank_signals"
            " FINAL WHERE job = 'slow-1' ORDER BY step, rank"
        )
        alerts = store.query(
            "SELECT kind, state, evidence FROM alerts FINAL WHERE job = 'slow-1'"
            " AND kind != 'straggler' ORDER BY time"
        )
    assert [(r["step"], r["rank"]) for r in rows] == [
        (s, r) for s in range(2, 30) for r in range(4)
    ]
    assert all(r["flops_per_s"] > 0 and r["busbw"] > 0 and r["throughput"] > 0 for r in rows)
    flops = [a for a in alerts if a["kind"] == "flops-drop"]
    assert [a["state"] for a in flops] == ["firing"] and '"ranks":[1]' in flops[0]["evidence"]
    assert {a["kind"] for a in alerts} <= {"flops-drop", "throughput-drop"}
    shown = subprocess.run(
        [sys.executable, "-m", "rankwatch", "diagnose", "slow-1", "--clickhouse", dsn],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "cause: straggler compute (flops-drop on rank 1)" in shown
