"""A slow store does not stop the hang worker reading heartbeats.

The hang worker judges a rank by when its heartbeats arrive: a worker that stopped
reading while an insert waited on the server would find every rank silent, and a
healthy job hung, once the store answered. Its stores now run in a task of their own,
the inserts in a thread (``kit.delivery.flush_in_thread``): the agents read on and the
tick writes the health file meanwhile.

Real broker, a real ``rankwatch hang worker`` subprocess, chDB behind the HTTP endpoint
of ``support/chdbhttp.py`` holding one insert 12 s (within the store's 30-s timeout).
Three waits, each of which stopped the worker's event loop before: a store's inserts, a
sent alert's record, and a new job's lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.chdbhttp import ChdbHttp
from support.devbroker import create_topics
from support.hangjob import Ranks, start_worker
from support.workers import read_topic, send_in_order, until

from rankwatch.streams.kit.health import read_status

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HANG_S = 12.0
NS = 1_000_000_000


@dataclass
class Setup:
    """A hang worker on topics of its own, a job's ranks beating, the test endpoint."""

    bootstrap: str
    prefix: str
    server: ChdbHttp
    log: Path
    ranks: Ranks
    worker: subprocess.Popen[bytes]
    others: list[Ranks] = field(default_factory=list)

    @property
    def health(self) -> dict[str, Any]:
        try:
            return read_status(self.log.with_suffix(".status.json"))
        except (OSError, ValueError):  # not written yet
            return {}

    def sent(self) -> int:
        """Heartbeats the broker has taken, every job's."""
        return self.ranks.sent + sum(r.sent for r in self.others)

    def reading(self) -> bool:
        """The worker has read a few heartbeats and recalled their job (its first lookup
        connects to the store and migrates it: an insert held before that would hold it)."""
        status = self.health
        return (
            status.get("messages_in", 0) > 20
            and status.get("jobs") == 1
            and not status.get("recalls_waiting")
        )

    def hold_next_insert(self) -> int:
        """Hold the next insert (a dead letter's row) ``HANG_S``; when it began (ns, no
        later than)."""
        self.server.hang_inserts(HANG_S, 1)
        bad = [(self.ranks.job.encode(), b"not a heartbeat")]
        asyncio.run(send_in_order(self.bootstrap, f"{self.prefix}.heartbeats", bad))
        until(lambda: self.server.hangs_left() == 0, 30, "an insert held")
        return time.time_ns()

    def reads_on_during_the_hold(self, held_ns: int) -> dict[str, Any]:
        """What the broker had 8 s before the held insert answers is read, and the
        health file written, before it answers (6 s given: a loaded box); returns that
        health file."""
        time.sleep(HANG_S - 8)
        read_by = self.sent()
        until(lambda: self.health.get("messages_in", 0) >= read_by, 6, "reading on")
        status = self.health
        assert status["written_ns"] < held_ns + (HANG_S - 0.5) * NS, "not during the hold"
        return status

    def alerts(self, want: int, timeout_s: float) -> list[dict[str, Any]]:
        topic = f"{self.prefix}.alerts"
        return asyncio.run(read_topic(self.bootstrap, topic, "alerts", want, timeout_s))


@contextlib.contextmanager
def hang_worker(
    bootstrap: str, tmp_path: Path, artifacts_dir: Path, job: str, *, healthy: bool, hold: str = ""
) -> Iterator[Setup]:
    """``job``'s four ranks (``healthy``, or rank 1 stuck) and a worker; ``hold``: a
    table whose first insert the endpoint holds ``HANG_S`` (armed before the start)."""
    prefix = f"t.hangslow.{uuid.uuid4().hex[:8]}"
    kinds = ("heartbeats", "stacks", "alerts", "dead-letters")
    asyncio.run(create_topics(bootstrap, [f"{prefix}.{k}" for k in kinds], 1))
    server = ChdbHttp(tmp_path / "endpoint").start()
    if hold:
        server.hang_inserts(HANG_S, 1, table=hold)
    ranks = Ranks(bootstrap, f"{prefix}.heartbeats", job)
    if healthy:
        ranks.move_on()  # every rank on a new op at each beat
    log = artifacts_dir / "hang-worker.log"
    setup = Setup(
        bootstrap, prefix, server, log, ranks, start_worker(bootstrap, prefix, server.dsn(), log)
    )
    try:
        yield setup
        assert setup.worker.poll() is None, log.read_text()[-3000:]
    finally:
        for ranks in [setup.ranks, *setup.others]:
            ranks.stop()
        setup.worker.terminate()
        setup.worker.wait(timeout=30)
        server.stop()


def test_heartbeats_are_read_while_a_store_waits(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    with hang_worker(kafka_broker, tmp_path, artifacts_dir, "job-s", healthy=True) as job:
        until(job.reading, 90, "the worker reading, its job recalled")
        status = job.reads_on_during_the_hold(job.hold_next_insert())
        assert status["store_failures"] == 0 and status["buffered_rows"] > 0, status
        time.sleep(2)  # more ticks: a hang declared for the wait would show
        assert job.alerts(1, 3) == []


def test_heartbeats_are_read_while_a_sent_alert_is_recorded(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """The record of a sent alert (``announced``) was stored on the event loop, right
    after the send: a server slow to take it stopped the worker reading heartbeats. It
    is now stored in a thread too (``kit.delivery.publish``)."""
    with hang_worker(
        kafka_broker, tmp_path, artifacts_dir, "job-r", healthy=False, hold="announced"
    ) as job:
        fired = job.alerts(1, 90)
        assert [a["state"] for a in fired] == ["firing"], job.log.read_text()[-3000:]
        until(lambda: job.server.hangs_left() == 0, 30, "the record's insert held")
        job.reads_on_during_the_hold(time.time_ns())
        until(lambda: "alert states sent and recorded" in job.log.read_text(), 30, "recorded")
        status = job.health
        assert status["store_failures"] == 0 and status["recorded_sent"] == 1, status


def test_heartbeats_are_read_while_a_new_jobs_recall_waits(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """A job first met is looked up in the store (its open episode, its unsent alerts),
    and the store serves one request at a time: a lookup behind a held insert waited
    with it. Done on the event loop, that stopped every job's heartbeats; the lookup
    now runs in a thread, and only the new job's heartbeats wait for it."""
    with hang_worker(kafka_broker, tmp_path, artifacts_dir, "job-a", healthy=True) as job:
        until(job.reading, 90, "the worker reading, its job recalled")
        held_ns = job.hold_next_insert()
        newcomer = Ranks(kafka_broker, f"{job.prefix}.heartbeats", "job-b")  # during the hold
        job.others.append(newcomer)
        newcomer.move_on()
        until(lambda: newcomer.sent > 0, 5, "the new job's first heartbeat")
        status = job.reads_on_during_the_hold(held_ns)
        assert status["recalls_waiting"] == 1, status  # job-b's lookup waits for the insert
        until(lambda: job.health.get("recalls_waiting") == 0, HANG_S + 10, "recalled")
        assert job.health["jobs"] == 2
        time.sleep(2)  # more ticks: a hang declared for the wait would show
        assert job.alerts(1, 3) == []
