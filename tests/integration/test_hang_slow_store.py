"""A slow store does not stop the hang worker reading heartbeats.

The hang worker judges a rank by when its heartbeats arrive: a worker that stopped
reading while an insert waited on the server would find every rank silent, and a
healthy job hung, once the store answered. Its stores now run in a task of their own,
the inserts in a thread (``kit.delivery.flush_in_thread``): the agents read on and the
tick writes the health file meanwhile.

Real broker, a real ``rankwatch hang worker`` subprocess, chDB behind the HTTP endpoint
of ``support/chdbhttp.py`` holding one insert 8 s (within the store's 30-s timeout).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.chdbhttp import ChdbHttp
from support.devbroker import create_topics
from support.hangjob import Ranks, start_worker
from support.workers import read_topic, send_in_order, until

from rankwatch.streams.kit.health import read_status

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HANG_S = 8.0
NS = 1_000_000_000


def test_heartbeats_are_read_while_a_store_waits(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    prefix = f"t.hangslow.{uuid.uuid4().hex[:8]}"
    kinds = ("heartbeats", "stacks", "alerts", "dead-letters")
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.{k}" for k in kinds], 1))
    server = ChdbHttp(tmp_path / "endpoint").start()
    log = artifacts_dir / "hang-worker.log"
    health = log.with_suffix(".status.json")
    ranks = Ranks(kafka_broker, f"{prefix}.heartbeats", "job-s")
    ranks.move_on()  # a healthy job: every rank on a new op at each beat
    worker = start_worker(kafka_broker, prefix, server.dsn(), log)
    try:
        until(lambda: _reading(_status(health)), 90, "the worker reading, its job recalled")
        server.hang_inserts(HANG_S, 1)
        bad = [(b"job-s", b"not a heartbeat")]  # its dead-letter row is the next insert
        asyncio.run(send_in_order(kafka_broker, f"{prefix}.heartbeats", bad))
        until(lambda: server.hangs_left() == 0, 30, "an insert held")
        held_ns = time.time_ns()  # the held insert began before this
        time.sleep(HANG_S - 4)
        read_by = ranks.sent  # heartbeats the broker had 4 s before the insert answers
        until(lambda: _status(health).get("messages_in", 0) >= read_by, 2, "reading on")
        status = _status(health)
        assert status["written_ns"] < held_ns + (HANG_S - 0.5) * NS, "not during the hold"
        assert status["store_failures"] == 0 and status["buffered_rows"] > 0, status
        time.sleep(2)  # more ticks: a hang declared for the wait would show
        alerts = asyncio.run(read_topic(kafka_broker, f"{prefix}.alerts", "alerts", 1, 3))
        assert alerts == [], alerts
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        ranks.stop()
        worker.terminate()
        worker.wait(timeout=30)
        server.stop()


def _reading(status: dict[str, Any]) -> bool:
    """The worker has read a few heartbeats and recalled their job (its first lookup
    connects to the store and migrates it: an insert held before that would hold it)."""
    return (
        status.get("messages_in", 0) > 20
        and status.get("jobs") == 1
        and not status.get("recalls_waiting")
    )


def _status(path: Path) -> dict[str, Any]:
    try:
        return read_status(path)
    except (OSError, ValueError):  # not written yet
        return {}


def test_heartbeats_are_read_while_a_sent_alert_is_recorded(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """The record of a sent alert (``announced``) was stored on the event loop, right
    after the send: a server slow to take it stopped the worker reading heartbeats. It
    is now stored in a thread too (``kit.delivery.publish``)."""
    prefix = f"t.hangsent.{uuid.uuid4().hex[:8]}"
    kinds = ("heartbeats", "stacks", "alerts", "dead-letters")
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.{k}" for k in kinds], 1))
    server = ChdbHttp(tmp_path / "endpoint").start()
    server.hang_inserts(HANG_S, 1, table="announced")
    log = artifacts_dir / "hang-worker.log"
    health = log.with_suffix(".status.json")
    ranks = Ranks(kafka_broker, f"{prefix}.heartbeats", "job-r")  # hung: rank 1 stuck
    worker = start_worker(kafka_broker, prefix, server.dsn(), log)
    try:
        fired = asyncio.run(read_topic(kafka_broker, f"{prefix}.alerts", "alerts", 1, 90))
        assert [a["state"] for a in fired] == ["firing"], log.read_text()[-3000:]
        until(lambda: server.hangs_left() == 0, 30, "the record's insert held")
        held_ns = time.time_ns()  # the held insert began before this
        time.sleep(HANG_S - 4)
        read_by = ranks.sent  # heartbeats the broker had 4 s before the insert answers
        until(lambda: _status(health).get("messages_in", 0) >= read_by, 2, "reading on")
        assert _status(health)["written_ns"] < held_ns + (HANG_S - 0.5) * NS
        until(lambda: "alert states sent and recorded" in log.read_text(), 30, "recorded")
        status = _status(health)
        assert status["store_failures"] == 0 and status["recorded_sent"] == 1, status
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        ranks.stop()
        worker.terminate()
        worker.wait(timeout=30)
        server.stop()


def test_heartbeats_are_read_while_a_new_jobs_recall_waits(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """A job first met is looked up in the store (its open episode, its unsent alerts),
    and the store serves one request at a time: a lookup behind a held insert waited
    with it. Done on the event loop, that stopped every job's heartbeats; the lookup
    now runs in a thread, and only the new job's heartbeats wait for it."""
    prefix = f"t.hangrecall.{uuid.uuid4().hex[:8]}"
    kinds = ("heartbeats", "stacks", "alerts", "dead-letters")
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.{k}" for k in kinds], 1))
    server = ChdbHttp(tmp_path / "endpoint").start()
    log = artifacts_dir / "hang-worker.log"
    health = log.with_suffix(".status.json")
    ranks = Ranks(kafka_broker, f"{prefix}.heartbeats", "job-a")
    ranks.move_on()  # a healthy job
    newcomer: Ranks | None = None
    worker = start_worker(kafka_broker, prefix, server.dsn(), log)
    try:
        until(lambda: _reading(_status(health)), 90, "the worker reading, its job recalled")
        server.hang_inserts(HANG_S, 1)
        bad = [(b"job-a", b"not a heartbeat")]  # its dead-letter row is the next insert
        asyncio.run(send_in_order(kafka_broker, f"{prefix}.heartbeats", bad))
        until(lambda: server.hangs_left() == 0, 30, "an insert held")
        held_ns = time.time_ns()  # the held insert began before this
        newcomer = Ranks(kafka_broker, f"{prefix}.heartbeats", "job-b")  # met during the hold
        newcomer.move_on()
        until(lambda: newcomer.sent > 0, 5, "the new job's first heartbeat")
        time.sleep(HANG_S - 4)
        read_by = ranks.sent + newcomer.sent  # what the broker had 4 s before the answer
        until(lambda: _status(health).get("messages_in", 0) >= read_by, 2, "reading on")
        status = _status(health)
        assert status["written_ns"] < held_ns + (HANG_S - 0.5) * NS, "not during the hold"
        assert status["recalls_waiting"] == 1, status  # job-b's lookup waits for the insert
        until(lambda: _status(health).get("recalls_waiting") == 0, HANG_S + 10, "recalled")
        assert _status(health)["jobs"] == 2
        time.sleep(2)  # more ticks: a hang declared for the wait would show
        alerts = asyncio.run(read_topic(kafka_broker, f"{prefix}.alerts", "alerts", 1, 3))
        assert alerts == [], alerts
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        ranks.stop()
        if newcomer is not None:
            newcomer.stop()
        worker.terminate()
        worker.wait(timeout=30)
        server.stop()
