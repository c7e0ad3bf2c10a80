"""ClickHouse unavailable, then back: the worker retries with growing backoff, commits
no offset while what it read is not stored, then stores every step once.

Embedded chDB is unavailable when its path is held by another process, at the worker's
start; a server (here chDB behind the HTTP endpoint of ``support/chdbhttp.py``) can also
refuse inserts while it is loaded, or go away mid-run."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.chdbhttp import ChdbHttp
from support.devbroker import create_topics
from support.workers import (
    WorkerProcess,
    assert_same_numbers,
    reference_rows,
    several_jobs,
    stored_steps,
    uncommitted,
    until,
    wait_committed,
)

from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.publish import publish
from rankwatch.streams.ops.replay import ReplayedBatch

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_store_outage_is_waited_out_without_committing_or_losing(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    batches, expected = _jobs(steps=5)
    prefix, topic, group = _topics(kafka_broker)
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


def test_a_busy_then_absent_server_costs_no_rows(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """A ClickHouse server (chDB behind ``support/chdbhttp.py``) that first refuses
    inserts as a loaded server does (TOO_MANY_PARTS), then goes away mid-run and comes
    back on the same address: the worker keeps the rows, commits nothing they feed,
    and stores every step once, as an uninterrupted run does."""
    batches, expected = _jobs(steps=6)
    steps = sorted({b.batch.step_span[0] for b in batches})
    parts = [[b for b in batches if b.batch.step_span[0] in chunk] for chunk in _thirds(steps)]
    topic, group, server, worker = _first_part_stored(
        kafka_broker, tmp_path, artifacts_dir, parts[0]
    )
    try:
        server.refuse_inserts(252, 3)  # TOO_MANY_PARTS, three times
        publish(kafka_broker, parts[1], topic=topic)
        busy = worker.wait_for(lambda s: s.get("store_failures", 0) >= 3, 60, "refusals")
        assert "Code: 252" in busy["last_error"], busy
        wait_committed(kafka_broker, group, topic, 2, timeout_s=90)
        assert server.refusals_left() == 0

        server.stop()
        failures = worker.status().get("store_failures", 0)
        publish(kafka_broker, parts[2], topic=topic)
        worker.wait_for(lambda s: s.get("store_failures", 0) > failures, 60, "the outage")
        assert uncommitted(kafka_broker, group, topic, 2) > 0  # nothing stored: held
        server.start()
        status, rows = _all_stored(kafka_broker, topic, group, server, worker)
        assert status["rows_refused"] == 0, status
    finally:
        worker.stop()
        server.stop()
    assert sorted((r["job"], r["step"]) for r in rows) == sorted(expected)  # each once
    assert_same_numbers(rows, expected)


def test_a_hung_server_holds_the_worker_for_its_timeout_only(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """A server that takes two inserts and stays silent on them for 6 s, against a
    worker whose store timeout is 1 s: each is a transient failure after 1 s (the rows
    are kept, nothing they feed is committed, they are stored again with backoff),
    not a worker stuck until the server answers. The late inserts run after all, so
    some rows are stored twice (the tables collapse duplicates, and every board
    counts such a row once); every step is there with an uninterrupted run's numbers."""
    batches, expected = _jobs(steps=6)
    prefix, topic, group = _topics(kafka_broker)
    server = ChdbHttp(tmp_path / "endpoint").start()
    env = {"RANKWATCH_STORE_TIMEOUT_S": "1"}
    worker = WorkerProcess(kafka_broker, prefix, server.dsn(), artifacts_dir, **env)
    try:
        worker.wait_for(lambda s: s.get("store_connected"), 60, "store")
        server.hang_inserts(6, 2)
        publish(kafka_broker, batches, topic=topic)
        hung = worker.wait_for(lambda s: s.get("store_failures", 0) >= 1, 30, "a timeout")
        assert "timed out" in hung["last_error"], hung
        wait_committed(kafka_broker, group, topic, 2, timeout_s=90)
        status = worker.settled()
        worker.stop()
        assert server.hangs_left() == 0
        assert status["rows_refused"] == 0, status
        time.sleep(6)  # the late inserts land
        rows = stored_steps(server.dsn())
    finally:
        worker.stop()
        server.stop()
    assert {(r["job"], r["step"]) for r in rows} == set(expected)
    assert_same_numbers(rows, expected)


def test_a_slow_server_holds_one_store_not_the_reading(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """A server that holds one insert 10 s, within the store's timeout (30 s): the
    worker goes on reading and writing its health file while the insert waits, commits
    nothing past what is stored, and stores what it read meanwhile with its next store:
    every step once, with an uninterrupted run's numbers. (Both jobs are known before
    the hang: a job first met meanwhile is the next test's.)"""
    batches, expected = _jobs(steps=6)
    parts = [[b for b in batches if b.batch.step_span[0] // 2 == i] for i in range(3)]
    topic, group, server, worker = _first_part_stored(
        kafka_broker, tmp_path, artifacts_dir, parts[0]
    )
    try:
        held_at = _hold_an_insert(kafka_broker, topic, server, parts[1])
        publish(kafka_broker, parts[2], topic=topic)
        status = worker.wait_for(
            lambda s: s.get("messages_in", 0) == len(batches), 7, "reading while it waits"
        )
        assert time.monotonic() - held_at < 10  # the insert is still held
        assert status["buffered_rows"] > 0 and status["sink_lag_s"] > 0, status
        assert uncommitted(kafka_broker, group, topic, 2) > 0
        status, rows = _all_stored(kafka_broker, topic, group, server, worker)
        assert status["store_failures"] == 0 and status["rows_refused"] == 0, status
        assert status["restored_jobs"] == 2, status
    finally:
        worker.stop()
        server.stop()
    assert sorted((r["job"], r["step"]) for r in rows) == sorted(expected)  # each once
    assert_same_numbers(rows, expected)


def test_a_job_first_met_during_a_slow_store_waits_alone(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """job-2 is first met while an insert is held 10 s. Its restore reads the store, so
    it waits behind the insert; it does so in a thread, with job-2's messages held, and
    the messages of job-0 and job-1 sent after job-2's are read meanwhile (on the event
    loop, the restore stopped every job's messages for the hold). job-2's held messages
    are taken once its restore answers: every step of the three jobs stored once, with
    an uninterrupted run's numbers, and nothing committed past what is stored."""
    batches = several_jobs(["job-0", "job-1", "job-2"], steps=6, origin_ns=time.time_ns())
    expected = reference_rows(batches)
    known = [b for b in batches if b.batch.job != "job-2"]
    newcomer = [b for b in batches if b.batch.job == "job-2"]
    parts = [[b for b in known if b.batch.step_span[0] // 2 == i] for i in range(3)]
    topic, group, server, worker = _first_part_stored(
        kafka_broker, tmp_path, artifacts_dir, parts[0]
    )
    try:
        held_at = _hold_an_insert(kafka_broker, topic, server, parts[1])
        publish(kafka_broker, newcomer, topic=topic)
        publish(kafka_broker, parts[2], topic=topic)
        status = worker.wait_for(
            lambda s: s.get("messages_in", 0) == len(batches), 7, "reading while job-2 waits"
        )
        assert time.monotonic() - held_at < 10  # the insert is still held
        assert status["recalls_waiting"] == 1 and status["recall_held"] > 0, status
        assert uncommitted(kafka_broker, group, topic, 2) > 0
        status, rows = _all_stored(kafka_broker, topic, group, server, worker)
        assert status["store_failures"] == 0 and status["rows_refused"] == 0, status
        assert status["restored_jobs"] == 3 and status["recalls_waiting"] == 0, status
    finally:
        worker.stop()
        server.stop()
    assert sorted((r["job"], r["step"]) for r in rows) == sorted(expected)  # each once
    assert_same_numbers(rows, expected)


def _hold_an_insert(
    kafka_broker: str, topic: str, server: ChdbHttp, part: list[ReplayedBatch]
) -> float:
    """Publish ``part`` with the server set to hold the next insert 10 s; when
    (``time.monotonic``) the insert was held, at the latest."""
    server.hang_inserts(10, 1)
    publish(kafka_broker, part, topic=topic)
    until(lambda: server.hangs_left() == 0, 30, "an insert held")
    return time.monotonic()


def _jobs(steps: int) -> tuple[list[ReplayedBatch], dict[tuple[str, int], dict[str, Any]]]:
    """Two jobs' batches and the rows an uninterrupted run stores for them."""
    batches = several_jobs(["job-0", "job-1"], steps=steps, origin_ns=time.time_ns())
    return batches, reference_rows(batches)


def _first_part_stored(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path, first: list[ReplayedBatch]
) -> tuple[str, str, ChdbHttp, WorkerProcess]:
    """(ops topic, group, server, worker): a worker storing into a server has stored
    ``first`` and committed every offset."""
    prefix, topic, group = _topics(kafka_broker)
    server = ChdbHttp(tmp_path / "endpoint").start()
    worker = WorkerProcess(kafka_broker, prefix, server.dsn(), artifacts_dir)
    try:
        worker.wait_for(lambda s: s.get("store_connected"), 60, "store")
        publish(kafka_broker, first, topic=topic)
        wait_committed(kafka_broker, group, topic, 2, timeout_s=90)
    except BaseException:
        worker.stop()
        server.stop()
        raise
    return topic, group, server, worker


def _all_stored(
    kafka_broker: str, topic: str, group: str, server: ChdbHttp, worker: WorkerProcess
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the worker's last status, the stored steps) once every offset is committed and
    the worker stopped."""
    wait_committed(kafka_broker, group, topic, 2, timeout_s=90)
    status = worker.settled()
    worker.stop()
    return status, stored_steps(server.dsn())


def _topics(kafka_broker: str) -> tuple[str, str, str]:
    """A fresh prefix, its two-partition ops topic and the workers' group."""
    prefix = f"o{uuid.uuid4().hex[:10]}"
    topic, group = f"{prefix}.ops", f"{prefix}-workers"
    asyncio.run(create_topics(kafka_broker, [topic], 2))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.steps", f"{prefix}.alerts"], 1))
    return prefix, topic, group


def _thirds(items: list[int]) -> list[list[int]]:
    n = len(items)
    return [items[: n // 3], items[n // 3 : 2 * n // 3], items[2 * n // 3 :]]
