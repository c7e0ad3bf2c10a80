"""Two workers in one consumer group on a four-partition topic, four jobs replayed at
once: each job is analysed by exactly one worker, and the results are those of a
single uninterrupted run.

Each worker has its own chDB path (one process owns a chDB path), so "stored once" is
checked over the union of the two stores: no (job, step) in both, none missing.
"""

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
    spread_jobs,
    stored_steps,
    wait_committed,
)

from rankwatch.streams.ops.publish import publish

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PARTITIONS = 4


def ops_partitions(status: dict, topic: str) -> set[str]:
    return {tp for tp in status.get("assigned", []) if tp.startswith(f"{topic}:")}


def test_two_workers_split_the_jobs_and_agree_with_one(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    batches = several_jobs(spread_jobs(4, PARTITIONS), steps=6, origin_ns=time.time_ns())
    expected = reference_rows(batches)
    prefix = f"g{uuid.uuid4().hex[:10]}"
    topic = f"{prefix}.ops"
    asyncio.run(create_topics(kafka_broker, [topic], PARTITIONS))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.steps", f"{prefix}.alerts"], 1))
    dsns = [f"chdb://{tmp_path / name}" for name in ("a", "b")]
    workers = [
        WorkerProcess(kafka_broker, prefix, dsn, artifacts_dir, name)
        for dsn, name in zip(dsns, ("a", "b"), strict=True)
    ]
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # both in the group, partitions split
            owned = [ops_partitions(w.status(), topic) for w in workers]
            if all(owned) and len(owned[0] | owned[1]) == PARTITIONS:
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"group never split the partitions: {[w.tail(1500) for w in workers]}")
        publish(kafka_broker, batches, topic=topic)
        wait_committed(kafka_broker, f"{prefix}-workers", topic, PARTITIONS, timeout_s=90)
        statuses = [w.settled() for w in workers]
    finally:
        for w in workers:
            w.stop()
    assert all(s["steps_analysed"] > 0 for s in statuses), "both workers had jobs"

    rows = [stored_steps(dsn) for dsn in dsns]
    jobs = [{r["job"] for r in part} for part in rows]
    assert not jobs[0] & jobs[1], "a job analysed by both workers"
    keys = [(r["job"], r["step"]) for part in rows for r in part]
    assert sorted(keys) == sorted(expected)  # each step once over both stores
    assert_same_numbers(rows[0] + rows[1], expected)
