"""A slow store does not stop the Minder worker reading, nor its health file.

The Minder worker stored on its event loop: while an insert waited on the server (up to
the store's 30-s timeout), it read no metrics and wrote no health file, and a probe
that reads the file's age would restart a worker that was only waiting. Its timer now
evaluates, starts a store in a task of its own (the inserts in a thread) unless one
runs, and writes the health file. A job first met is looked up in a thread, its
messages held meanwhile: the lookup waits behind a held insert (the store serves one
request at a time), and on the event loop it stopped every job's metrics.

Real broker, a real ``rankwatch minder worker`` subprocess, chDB behind the HTTP
endpoint of ``support/chdbhttp.py`` holding one insert 12 s (within the store's 30-s
timeout).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from support.chdbhttp import ChdbHttp
from support.devbroker import create_topics
from support.workers import WorkerProcess, send_in_order, until

from rankwatch.agent import metrics_message

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HANG_S = 12.0
"""How long the endpoint holds an insert: reading on must show within ``READ_S`` of it."""
READ_S = HANG_S - 4
"""Time given to the worker to read what was sent during the hold (3 s was too short
for a worker whose ticks overran on a loaded CI box)."""
NS = 1_000_000_000


def samples(job: str, start_ns: int, seconds: range) -> list[tuple[bytes, bytes]]:
    """Four hosts' samples, one a second each, keyed by job."""
    return [
        (
            job.encode(),
            orjson.dumps(metrics_message(job, f"h{h}", start_ns + s * NS, {"cpu_util": 60.0 + h})),
        )
        for s in seconds
        for h in range(4)
    ]


@dataclass
class Setup:
    bootstrap: str
    topic: str
    server: ChdbHttp
    worker: WorkerProcess
    start_ns: int

    def send(self, messages: list[tuple[bytes, bytes]]) -> None:
        asyncio.run(send_in_order(self.bootstrap, self.topic, messages))

    def hold_next_insert(self) -> int:
        """Hold the next insert (a dead letter's row) ``HANG_S``; when it is held."""
        self.server.hang_inserts(HANG_S, 1)
        self.send([(b"job-m", b"not a sample")])
        until(lambda: self.server.hangs_left() == 0, 30, "an insert held")
        return time.time_ns()  # the held insert began before this


@contextmanager
def minder_worker(kafka_broker: str, tmp_path: Path, artifacts_dir: Path) -> Iterator[Setup]:
    """A Minder worker storing through the endpoint, job-m's first five seconds read
    and stored."""
    prefix = f"t.mindslow.{uuid.uuid4().hex[:8]}"
    kinds = ("metrics", "alerts", "dead-letters")
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.{k}" for k in kinds], 1))
    server = ChdbHttp(tmp_path / "endpoint").start()
    status_file = artifacts_dir / "minder-worker.status.json"  # WorkerProcess reads it
    argv = [sys.executable, "-m", "rankwatch", "minder", "worker", "--window", "10"]
    argv += ["--status-file", str(status_file)]
    worker = WorkerProcess(
        kafka_broker, prefix, server.dsn(), artifacts_dir, name="minder-worker", argv=argv
    )
    setup = Setup(kafka_broker, f"{prefix}.metrics", server, worker, time.time_ns())
    try:
        setup.send(samples("job-m", setup.start_ns, range(0, 5)))
        worker.wait_for(lambda s: s.get("messages_in", 0) >= 20, 90, "the worker reading")
        worker.wait_for(lambda s: s.get("flushes", 0) > 0, 30, "a first store")
        yield setup
        assert worker.proc.poll() is None, worker.tail(3000)
    finally:
        worker.stop()
        server.stop()


def test_metrics_are_read_and_health_written_while_a_store_waits(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    with minder_worker(kafka_broker, tmp_path, artifacts_dir) as job:
        held_ns = job.hold_next_insert()
        more = samples("job-m", job.start_ns, range(5, 10))
        job.send(more)
        status = job.worker.wait_for(
            lambda s: s.get("messages_in", 0) >= 21 + len(more), READ_S, "reading on"
        )
        assert status["written_ns"] < held_ns + (HANG_S - 2) * NS, "not during the hold"
        assert status["store_failures"] == 0 and status["buffered_rows"] > 0, status
        job.worker.wait_for(lambda s: s.get("buffered_rows") == 0, HANG_S + 10, "stored after")
        assert job.worker.status()["store_failures"] == 0


def test_metrics_are_read_while_a_new_jobs_recall_waits(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    """A job first met while an insert is held: its lookup waits behind the insert, in
    a thread; job-m's samples sent after it are read during the hold, and job-n's are
    taken once its recall answers."""
    with minder_worker(kafka_broker, tmp_path, artifacts_dir) as job:
        job.hold_next_insert()
        newcomer = samples("job-n", job.start_ns, range(0, 5))
        more = samples("job-m", job.start_ns, range(5, 10))
        job.send(newcomer + more)
        status = job.worker.wait_for(
            lambda s: s.get("messages_in", 0) >= 21 + len(newcomer) + len(more),
            READ_S,
            "reading on",
        )
        assert status["recalls_waiting"] == 1 and status["jobs"] == 1, status
        status = job.worker.wait_for(
            lambda s: s.get("recalls_waiting") == 0, HANG_S + 10, "job-n recalled"
        )
        assert status["jobs"] == 2 and status["recall_held"] == 0, status
        assert status["store_failures"] == 0, status
