"""A slow store does not stop the Minder worker reading, nor its health file.

The Minder worker stored on its event loop: while an insert waited on the server (up to
the store's 30-s timeout), it read no metrics and wrote no health file, and a probe
that reads the file's age would restart a worker that was only waiting. Its timer now
evaluates, starts a store in a task of its own (the inserts in a thread) unless one
runs, and writes the health file.

Real broker, a real ``rankwatch minder worker`` subprocess, chDB behind the HTTP
endpoint of ``support/chdbhttp.py`` holding one insert 8 s (within the store's 30-s
timeout).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from support.chdbhttp import ChdbHttp
from support.devbroker import create_topics
from support.workers import WorkerProcess, send_in_order, until

from rankwatch.agent import metrics_message

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HANG_S = 8.0
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


def test_metrics_are_read_and_health_written_while_a_store_waits(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    prefix = f"t.mindslow.{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.metrics"
    kinds = ("metrics", "alerts", "dead-letters")
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.{k}" for k in kinds], 1))
    server = ChdbHttp(tmp_path / "endpoint").start()
    status_file = artifacts_dir / "minder-worker.status.json"  # WorkerProcess reads it
    argv = [sys.executable, "-m", "rankwatch", "minder", "worker", "--window", "10"]
    argv += ["--status-file", str(status_file)]
    worker = WorkerProcess(
        kafka_broker, prefix, server.dsn(), artifacts_dir, name="minder-worker", argv=argv
    )
    start_ns = time.time_ns()
    try:
        asyncio.run(send_in_order(kafka_broker, topic, samples("job-m", start_ns, range(0, 5))))
        worker.wait_for(lambda s: s.get("messages_in", 0) >= 20, 90, "the worker reading")
        worker.wait_for(lambda s: s.get("flushes", 0) > 0, 30, "a first store")
        server.hang_inserts(HANG_S, 1)
        bad = [(b"job-m", b"not a sample")]  # its dead-letter row is the next insert
        asyncio.run(send_in_order(kafka_broker, topic, bad))
        until(lambda: server.hangs_left() == 0, 30, "an insert held")
        held_ns = time.time_ns()  # the held insert began before this
        more = samples("job-m", start_ns, range(5, 10))
        asyncio.run(send_in_order(kafka_broker, topic, more))
        status = worker.wait_for(
            lambda s: s.get("messages_in", 0) >= 21 + len(more), 3, "reading on"
        )
        assert status["written_ns"] < held_ns + (HANG_S - 2) * NS, "not during the hold"
        assert status["store_failures"] == 0 and status["buffered_rows"] > 0, status
        worker.wait_for(lambda s: s.get("buffered_rows") == 0, HANG_S + 10, "stored after")
        assert worker.status()["store_failures"] == 0
        assert worker.proc.poll() is None, worker.tail(3000)
    finally:
        worker.stop()
        server.stop()
