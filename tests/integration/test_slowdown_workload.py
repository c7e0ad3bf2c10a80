"""The slowdown signals end to end: the real gloo workload (hooks writing ops v2),
the ops pipeline into real chDB, and ``rankwatch diagnose`` reading it back.

One rank is throttled from step 12 (extra matmuls inside its forward): its FLOP/s
drops, one ``flops-drop`` alert names it (the job may also be slower:
``throughput-drop``), and the diagnosis says ``straggler compute`` on that rank; every
rank has a signals row for every step with FLOP/s and bus bandwidth. And a slowdown
episode open when a worker stops stays open for the one that restores the job from the
store.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankwatch.hooks.identity import Identity
from rankwatch.hooks.records import encode_ops
from rankwatch.ingest import run_embedded_workload
from rankwatch.schemas.examples import rank_step
from rankwatch.streams.kit.output import Source
from rankwatch.streams.kit.sink import TableSink
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.recovery import load_history
from rankwatch.streams.slowdown.detector import DetectorConfig
from rankwatch.workload.config import WorkloadConfig
from rankwatch.workload.launch import torch_available

pytestmark = pytest.mark.integration
MS = 1_000_000
NOW_NS = time.time_ns() - 3600 * 10**9
"""Rows must be recent: older ones fall to the tables' TTL at once."""
needs_torch = pytest.mark.skipif(not torch_available(), reason="the workload needs torch")


@needs_torch
def test_a_throttled_rank_is_diagnosed_from_the_stored_signals(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'chdb'}"
    # a strong fault: detection margins are the study's business, the plumbing is this one's.
    # 16 extra matmuls were once too few on the loaded CI box (2026-12-02): rank 1 fell to
    # 0.4 of its baseline, at the edge of its noise band over 10 loaded steps, no episode.
    # The fault starts once the baselines hold more than their warm-up: the 10 steps an
    # episode needs to open come after it.
    cfg = WorkloadConfig(steps=40, job="slow-1", fault_from=20, slow_rank=1, slow_matmuls=48)
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
        (s, r) for s in range(2, 40) for r in range(4)
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
    # The verdict names every rank that had a flops-drop episode open at any step. Rank
    # 1's is the injected fault; on an oversubscribed CI box (4 ranks and a test beside
    # them on 2 cores) another rank's FLOP/s can really fall for a few steps too, as it
    # did once (2026-11-27: "ranks 1,3", the alert naming rank 1 alone). Margins are the
    # study's business; this test's is that the stored signals give the verdict.
    # The straggler alert, when its 20-step window filled and it fired, is the verdict
    # ("worker 1,0, rank 1 on ..."); else the open episodes are.
    verdict = re.search(
        r"cause: straggler compute \((?:flops-drop on|worker \d+,\d+,) ranks? ([\d,]+)", shown
    )
    assert verdict is not None, shown
    assert 1 in [int(r) for r in verdict.group(1).split(",")], shown


def _closing_message(rank: int, step: int, flops: float) -> bytes:
    """Rank ``rank``'s ops v2 message closing ``step`` (one 80 ms op of ``flops``)."""
    ident = Identity(job="r", host=f"h{rank}", rank=rank, dp_rank=rank, pp_rank=0, dp_size=2)
    t0 = NOW_NS + step * 100 * MS
    item = rank_step(
        step=step, prev_end_ns=t0, begin_ns=t0 + 10 * MS, end_ns=t0 + 100 * MS,
        covered_ns=80 * MS, data_wait_ns=0, gc_ns=0,
        ops=[{"optype": "optimizer", "n": 1, "time_ns": 80 * MS, "flops": flops}],
    )  # fmt: skip
    record = (step, "optimizer", 0, -1, -1, -1, t0 + 10 * MS, 80 * MS)
    return encode_ops(
        ident, [record], batch_seq=step, sent_ns=t0 + 100 * MS, steps_done=[(step, 1)],
        rank_steps=[item],
    )  # fmt: skip


OPEN = DetectorConfig().open_after
SLOW = range(12, 15 + OPEN)
"""Rank 1's slow steps: its episode opens at step 11 + OPEN and closes 3 steps after."""
END = 25 + OPEN


def _run(pipeline: Pipeline, steps: range, sink: TableSink | None = None) -> list[tuple[str, ...]]:
    """Feed both ranks (rank 1 at 1/8 the FLOPs in the SLOW steps); the alerts sent."""
    sent = []
    for step in steps:
        for rank in (0, 1):
            flops = 1e9 if rank == 1 and step in SLOW else 8e9
            out = pipeline.on_message(_closing_message(rank, step, flops), Source("ops"), 0)
            if sink is not None:
                sink.write(out)
                sink.flush()
            sent += [
                (m["kind"], m["state"], m["alert_id"]) for k, _, m in out.messages if k == "alerts"
            ]
    return sent


def test_the_open_episode_survives_a_restart_through_the_store(tmp_path: Path) -> None:
    """Rows stored by one pipeline, read back by load_history, restore a fresh one: the
    alerts of the two together are those of an uninterrupted run (one firing, one
    resolved, one id)."""
    whole = _run(Pipeline(), range(END))
    killed = 13 + OPEN  # two steps after the alert fired
    with Store.connect(f"chdb://{tmp_path / 'chdb'}") as store:
        store.migrate()
        before = _run(Pipeline(), range(killed), TableSink(store))
        history = load_history(store, "r", (2, 1), closed_memory=4096, window=20, alert_window=10)
    assert len(history.signals) == killed and [a["kind"] for a in history.slowdown_alerts] == [
        "flops-drop"
    ]
    after = Pipeline()
    after.restore("r", (2, 1), history)
    assert before + _run(after, range(killed, END)) == whole
    assert [state for _, state, _ in whole] == ["firing", "resolved"]
