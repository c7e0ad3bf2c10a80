"""End to end over the real services: trace ST replayed into a real Kafka broker, the
faust worker (a separate process) assembling and analysing it into chDB.

Every step of the trace must land exactly once (no duplicate rows even before
ReplacingMergeTree merges) with its recorded step time, and the worker must announce
each stored step on the steps topic.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.devbroker import create_topics
from support.workers import read_topic

from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.publish import publish
from rankwatch.streams.ops.replay import replay_batches
from rankwatch.traceio import read_meta, read_trace

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "stragglers"
pytestmark = pytest.mark.integration


@pytest.fixture
def st_trace():  # type: ignore[no-untyped-def]
    if not (DATA / "trace-ST.parquet").exists():
        pytest.skip("../shared/data is absent")
    published = json.loads((DATA / "result-ST.json").read_text())["step_t_base"]
    return read_trace(DATA / "trace-ST.parquet"), read_meta(DATA / "meta-ST.yaml"), published


def start_worker(bootstrap: str, prefix: str, dsn: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RANKWATCH_KAFKA": bootstrap,
        "RANKWATCH_TOPIC_PREFIX": prefix,
        "RANKWATCH_GROUP": f"{prefix}-workers",
        "RANKWATCH_CLICKHOUSE": dsn,
        "RANKWATCH_GRACE_S": "60",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rankwatch", "worker"], env=env, stdout=out, stderr=out
        )


def test_trace_st_lands_once_per_step_with_its_step_time(
    kafka_broker: str,
    tmp_path: Path,
    st_trace: tuple[Any, Any, dict[str, float]],
) -> None:
    trace, meta, published = st_trace
    prefix = f"t{uuid.uuid4().hex[:10]}"
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.ops"], 4))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.steps", f"{prefix}.alerts"], 1))
    dsn = f"chdb://{tmp_path / 'chdb'}"
    log = tmp_path / "worker.log"
    worker = start_worker(kafka_broker, prefix, dsn, log)
    try:
        sent = publish(
            kafka_broker,
            replay_batches(trace, meta, "job-st", origin_ns=time.time_ns()),
            topic=f"{prefix}.ops",
        )
        assert sent == 32 * 8  # one batch per rank and step
        announced = asyncio.run(read_topic(kafka_broker, f"{prefix}.steps", "steps", 32, 120))
        alerts = asyncio.run(read_topic(kafka_broker, f"{prefix}.alerts", "alerts", 1, 30))
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    assert len(announced) == 32, log.read_text()[-3000:]
    assert "internals changed" not in log.read_text()  # the faust internals we read are there

    with Store.connect(dsn) as store:
        rows = store.query("SELECT step, t_base, t_sim, partial FROM steps ORDER BY step")
    assert [r["step"] for r in rows] == sorted(int(s) for s in published)
    for row in rows:
        assert row["t_base"] == pytest.approx(published[str(row["step"])], abs=1e-6)
        assert row["partial"] == 0
        assert row["t_sim"] is not None
    assert {m["step"] for m in announced} == {r["step"] for r in rows}
    # the straggler of trace ST is its last stage (the authors' M_S, ms-ST.json): one
    # firing alert, which names that stage, not one of its workers
    assert [(a["kind"], a["state"]) for a in alerts] == [("straggler", "firing")]
    blame = alerts[0]["evidence"]["blame"]
    assert (blame["dimension"], blame["group"]) == ("stage", "3"), alerts[0]["summary"]
