"""kill -9 a stream worker in the middle of a replay, start it again: every step of the
trace is in ClickHouse exactly once (no duplicate rows even before merges), with the
numbers of an uninterrupted run, and the group's offsets end committed.

Real broker, real ``rankwatch worker`` subprocesses, real chDB.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.devbroker import create_topics
from support.workers import (
    STEP_FIELDS,
    WorkerProcess,
    read_topic,
    reference_rows,
    reference_run,
    uncommitted,
    wait_committed,
)

from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.publish import publish
from rankwatch.streams.ops.replay import replay_batches
from rankwatch.traceio import read_meta, read_trace

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "stragglers"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _stored(steps: int) -> Callable[[dict[str, Any]], bool]:
    def check(status: dict[str, Any]) -> bool:
        return (
            status.get("steps_analysed", 0) >= steps
            and status.get("flushes", 0) > 0
            and status.get("buffered_rows", 1) == 0
        )

    return check


def test_kill_9_mid_replay_loses_and_duplicates_nothing(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    if not (DATA / "trace-ST.parquet").exists():
        pytest.skip("../shared/data is absent")
    trace, meta = read_trace(DATA / "trace-ST.parquet"), read_meta(DATA / "meta-ST.yaml")
    batches = list(replay_batches(trace, meta, "job-st", origin_ns=time.time_ns()))
    expected = reference_rows(batches)
    reference_alerts = reference_run(batches).rows.get("alerts", [])
    alerts = [(a["alert_id"], a["state"]) for a in reference_alerts]
    alert_ns = {(a["alert_id"], a["state"]): a["ts_ns"] for a in reference_alerts}
    assert alerts, "trace ST's straggler fires an alert"
    prefix = f"k{uuid.uuid4().hex[:10]}"
    topic, group = f"{prefix}.ops", f"{prefix}-workers"
    asyncio.run(create_topics(kafka_broker, [topic], 4))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.steps", f"{prefix}.alerts"], 1))
    dsn = f"chdb://{tmp_path / 'chdb'}"
    half = len(batches) // 2 + 3  # step 16 open: three of its eight batches sent

    # no commit before the kill, whatever the timing: the restart must re-read stored steps
    worker = WorkerProcess(
        kafka_broker, prefix, dsn, artifacts_dir, "first", RANKWATCH_COMMIT_INTERVAL_S="600"
    )
    try:
        publish(kafka_broker, batches[:half], topic=topic)
        # analysed is not stored: wait for a flush that left nothing buffered, or the
        # kill may fall before any step reached the store and the restart re-reads none
        worker.wait_for(_stored(8), 90, "steps stored")
        worker.kill()
    finally:
        worker.stop()
    assert uncommitted(kafka_broker, group, topic, 4) > 0  # killed before all was committed

    publish(kafka_broker, batches[half:], topic=topic)
    worker = WorkerProcess(kafka_broker, prefix, dsn, artifacts_dir, "second")
    try:
        wait_committed(kafka_broker, group, topic, 4, timeout_s=120)
        status = worker.settled()
    finally:
        worker.stop()
    assert status["late_batches"] > 0, "the restart re-read stored steps' batches"

    with Store.connect(dsn) as store:
        rows = store.query(f"SELECT {', '.join(STEP_FIELDS)} FROM steps ORDER BY step")
        stored_alerts = store.query("SELECT alert_id, state FROM alerts FINAL ORDER BY time")
        ops_raw, ops_final = (
            store.query(f"SELECT count() AS n FROM ops {f}")[0]["n"] for f in ("", "FINAL")
        )
        jobs = store.query(
            "SELECT job, world_size, toUnixTimestamp64Milli(first_seen) AS first_ms FROM jobs FINAL"
        )
    assert len(rows) == len(expected) == 32  # no duplicates, even unmerged
    for row in rows:
        want = expected[(row["job"], row["step"])]
        assert row["partial"] == 0 and row["t_sim"] is not None
        for name in STEP_FIELDS[1:]:
            assert row[name] == pytest.approx(want[name], rel=1e-12, abs=1e-12), (row, want)
    assert [(a["alert_id"], a["state"]) for a in stored_alerts] == alerts  # one per episode
    # every stored alert state is announced at least once, even if the kill fell between
    # storing and publishing it (the restarted worker announces the latest one again)
    announced = asyncio.run(read_topic(kafka_broker, f"{prefix}.alerts", "alerts", 99, 5))
    assert set(alerts) <= {(a["alert_id"], a["state"]) for a in announced}
    # re-sent or not, an alert carries the ts_ns it was first sent with, to the ns
    assert all(a["ts_ns"] == alert_ns[(a["alert_id"], a["state"])] for a in announced)
    # the batches of the step open at the kill were stored before it and re-read after:
    # not stored twice, even unmerged
    assert ops_raw == ops_final == len(trace)
    assert status["reannounced_alerts"] <= status["restored_jobs"]
    # the jobs row: the restarted worker kept when the job was first seen
    first_ns = min(int(b.batch.start_ns.min()) for b in batches)
    assert [(j["job"], j["world_size"]) for j in jobs] == [("job-st", 8)]
    assert jobs[0]["first_ms"] == first_ns // 10**6
