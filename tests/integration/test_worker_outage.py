"""ClickHouse unavailable when the worker starts (its chDB path held by another
process, the transient failure chDB has), then back: the worker retries with growing
backoff, commits no offset while nothing is stored, then stores every step once."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from support.devbroker import create_topics
from support.workers import (
    WorkerProcess,
    assert_same_numbers,
    reference_rows,
    several_jobs,
    stored_steps,
    uncommitted,
    wait_committed,
)

from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.publish import publish

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_store_outage_is_waited_out_without_committing_or_losing(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    batches = several_jobs(["job-0", "job-1"], steps=5, origin_ns=time.time_ns())
    expected = reference_rows(batches)
    prefix = f"o{uuid.uuid4().hex[:10]}"
    topic, group = f"{prefix}.ops", f"{prefix}-workers"
    asyncio.run(create_topics(kafka_broker, [topic], 2))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.steps", f"{prefix}.alerts"], 1))
    dsn = f"chdb://{tmp_path / 'chdb'}"
    publish(kafka_broker, batches, topic=topic)

    holder = Store.connect(dsn)  # the store is "down" for the worker while we hold it
    worker = WorkerProcess(kafka_broker, prefix, dsn, artifacts_dir)
    try:
        status = worker.wait_for(lambda s: s.get("store_failures", 0) >= 4, 60, "retries")
        assert not status["store_connected"]
        assert "in use by another process" in status["last_error"]
        assert uncommitted(kafka_broker, group, topic, 2) == len(batches)
        holder.close()
        wait_committed(kafka_broker, group, topic, 2, timeout_s=90)
        worker.settled()
    finally:
        holder.close()
        worker.stop()
    log = worker.tail(10**6)
    delays = [
        float(x.split("retry in ")[1].split("s")[0]) for x in log.splitlines() if "retry in" in x
    ]
    assert delays[:3] == sorted(delays[:3]) and delays[2] > delays[0], delays  # backoff grows

    rows = stored_steps(dsn)
    assert sorted((r["job"], r["step"]) for r in rows) == sorted(expected)
    assert_same_numbers(rows, expected)
