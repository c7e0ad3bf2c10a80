"""Two workers in one consumer group on a four-partition topic, four jobs replayed at
once: each job is analysed by exactly one worker, and the results are those of a
single uninterrupted run.

Twice: each worker with its own embedded chDB path (one process owns a chDB path), where
"stored once" is checked over the union of the two stores (no (job, step) in both, none
missing); and both workers storing into one store over HTTP, as a deployment's workers
share a ClickHouse server (chDB behind ``support/chdbhttp.py``), where a step stored by
both would show twice in the one table.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.chdbhttp import endpoint
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
from rankwatch.streams.ops.replay import ReplayedBatch

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PARTITIONS = 4


def ops_partitions(status: dict, topic: str) -> set[str]:
    return {tp for tp in status.get("assigned", []) if tp.startswith(f"{topic}:")}


@contextlib.contextmanager
def store_dsns(layout: str, tmp_path: Path) -> Iterator[list[str]]:
    """The two workers' stores: their own chDB paths, or one endpoint's database."""
    if layout == "own":
        yield [f"chdb://{tmp_path / name}" for name in ("a", "b")]
        return
    with endpoint(tmp_path / "endpoint") as serving:
        yield [serving.dsn()] * 2


@pytest.fixture(scope="module")
def replay() -> tuple[list[ReplayedBatch], dict[tuple[str, int], Any]]:
    """Four jobs' batches, and the rows of one uninterrupted run of them."""
    batches = several_jobs(spread_jobs(4, PARTITIONS), steps=6, origin_ns=time.time_ns())
    return batches, reference_rows(batches)


@pytest.mark.parametrize("layout", ["own", "shared"])
def test_two_workers_split_the_jobs_and_agree_with_one(
    kafka_broker: str,
    tmp_path: Path,
    artifacts_dir: Path,
    replay: tuple[list[ReplayedBatch], dict[tuple[str, int], Any]],
    layout: str,
) -> None:
    batches, expected = replay
    with store_dsns(layout, tmp_path) as dsns:
        statuses, rows = run_group(kafka_broker, batches, dsns, artifacts_dir)
    assert all(s["steps_analysed"] > 0 for s in statuses), "both workers had jobs"
    if layout == "own":
        jobs = [{r["job"] for r in part} for part in rows]
        assert not jobs[0] & jobs[1], "a job analysed by both workers"
    every = [r for part in rows for r in part]
    assert sorted((r["job"], r["step"]) for r in every) == sorted(expected)  # each once
    assert_same_numbers(every, expected)


def run_group(
    kafka_broker: str, batches: list[ReplayedBatch], dsns: list[str], artifacts_dir: Path
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """Both workers through ``batches``: their last statuses, and the steps rows of
    each distinct store."""
    prefix = f"g{uuid.uuid4().hex[:10]}"
    topic = f"{prefix}.ops"
    asyncio.run(create_topics(kafka_broker, [topic], PARTITIONS))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.steps", f"{prefix}.alerts"], 1))
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
    return statuses, [stored_steps(dsn) for dsn in dict.fromkeys(dsns)]
