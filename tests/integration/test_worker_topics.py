"""A worker on topics the broker has never seen: it makes them (configured partitions),
reads what was produced before and after it started, within seconds, and a restart
loses and repeats nothing.

Before this, a worker started first read nothing for five minutes (faust ignored the
missing topic until its metadata refresh) and the broker auto-created the topic with
one partition. Real broker, real ``rankwatch worker`` subprocesses, real chDB.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.workers import (
    WorkerProcess,
    assert_same_numbers,
    records_until,
    reference_rows,
)
from support.workers import several_jobs as make_jobs

from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.publish import publish
from rankwatch.streams.ops.replay import ReplayedBatch

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOBS = ["job-a", "job-b"]
STEPS = 5
PARTITIONS = 3
WITHIN_S = 10.0


@pytest.fixture
def batches() -> list[ReplayedBatch]:
    return make_jobs(JOBS, steps=STEPS, origin_ns=time.time_ns())


def start(bootstrap: str, prefix: str, dsn: str, workdir: Path, name: str) -> WorkerProcess:
    return WorkerProcess(
        bootstrap, prefix, dsn, workdir, name, RANKWATCH_PARTITIONS=str(PARTITIONS)
    )


def ready(worker: WorkerProcess) -> dict[str, Any]:
    """The worker's status once it calls itself healthy (topics, assignment, store)."""
    return worker.wait_for(lambda s: s.get("problems") == [], 60, "a healthy worker")


def steps_announced_within(bootstrap: str, prefix: str, timeout_s: float) -> float:
    """Seconds until every step of every job is on ``<prefix>.steps``; fails past timeout."""
    import orjson

    began = time.monotonic()
    want = len(JOBS) * STEPS
    seen = asyncio.run(
        records_until(bootstrap, f"{prefix}.steps", lambda g: len(g) >= want, timeout_s)
    )
    took = time.monotonic() - began
    steps = {(r.key.decode(), orjson.loads(r.value)["step"]) for r in seen}
    assert steps == {(j, s) for j in JOBS for s in range(STEPS)}, f"after {took:.1f}s: {steps}"
    return took


def check_store(dsn: str, batches: list[ReplayedBatch]) -> None:
    """Every step once, unmerged; raw ops not doubled; the numbers of an in-process run."""
    with Store.connect(dsn) as store:
        rows = store.query("SELECT * FROM steps ORDER BY job, step")
        raw = store.query("SELECT count() AS n FROM ops")[0]["n"]
        final = store.query("SELECT count() AS n FROM ops FINAL")[0]["n"]
    assert [(r["job"], r["step"]) for r in rows] == [(j, s) for j in JOBS for s in range(STEPS)]
    assert raw == final == sum(len(b.batch) for b in batches)
    assert_same_numbers(rows, reference_rows(batches))


def test_worker_started_before_the_producer(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path, batches: list[ReplayedBatch]
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    dsn = f"chdb://{tmp_path / 'chdb'}"
    worker = start(kafka_broker, prefix, dsn, artifacts_dir, "first")
    try:
        status = ready(worker)
        assert status["topics"][f"{prefix}.ops"] == PARTITIONS  # made, not auto-created
        frozen = worker.wait_for(lambda s: s.get("gc_frozen", 0) > 0, 30, "start-up frozen")
        assert frozen["gc_frozen"] > 10_000  # the libraries' objects, not a handful
        publish(kafka_broker, batches, topic=f"{prefix}.ops")
        took = steps_announced_within(kafka_broker, prefix, WITHIN_S)
        print(f"worker first: every step announced {took:.2f}s after the last record")
    finally:
        worker.stop()
    check_store(dsn, batches)


def test_worker_started_after_the_producer(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path, batches: list[ReplayedBatch]
) -> None:
    """The producer's first send auto-creates the topic with the broker's default (one
    partition): the worker keeps it, says so, and reads every record from the start."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    dsn = f"chdb://{tmp_path / 'chdb'}"
    publish(kafka_broker, batches, topic=f"{prefix}.ops")
    began = time.monotonic()
    worker = start(kafka_broker, prefix, dsn, artifacts_dir, "late")
    try:
        status = ready(worker)
        steps_announced_within(kafka_broker, prefix, WITHIN_S)
        took = time.monotonic() - began
        print(f"worker after producer: every step announced {took:.2f}s after its start")
    finally:
        worker.stop()
    assert status["topics"][f"{prefix}.ops"] == 1
    assert f"topic {prefix}.ops has 1 partitions, the configuration says 3" in worker.tail(50_000)
    check_store(dsn, batches)


def test_worker_restarted_between_two_halves(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path, batches: list[ReplayedBatch]
) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    dsn = f"chdb://{tmp_path / 'chdb'}"
    half = len(batches) // 2 + 1  # a step left open: some of its batches come after
    worker = start(kafka_broker, prefix, dsn, artifacts_dir, "before")
    try:
        ready(worker)
        publish(kafka_broker, batches[:half], topic=f"{prefix}.ops")
        worker.wait_for(lambda s: s.get("steps_analysed", 0) >= 2, 30, "some steps stored")
    finally:
        worker.stop()
    publish(kafka_broker, batches[half:], topic=f"{prefix}.ops")
    began = time.monotonic()
    worker = start(kafka_broker, prefix, dsn, artifacts_dir, "after")
    try:
        ready(worker)
        steps_announced_within(kafka_broker, prefix, WITHIN_S)
        took = time.monotonic() - began
        print(f"restarted: every step announced {took:.2f}s after its restart")
        worker.settled()
    finally:
        worker.stop()
    check_store(dsn, batches)
