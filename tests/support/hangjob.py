"""A job's heartbeats written by a test, and the hang worker that reads them (used by
the hang worker's integration tests): four ranks, rank 1 stuck in compute and the
others waiting in a collective until the test lets the job move on, so that the job
is hung for exactly as long as the test says."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rankwatch.schemas.codec import encode
from support.lifetime import tied

NS = 1_000_000_000
FLOOR_S = 3.0
STUCK = 1


class Ranks:
    """Four ranks' heartbeats every 0.3 s on a real topic, stuck until ``move_on``."""

    def __init__(self, bootstrap: str, topic: str, job: str) -> None:
        self.bootstrap, self.topic, self.job = bootstrap, topic, job
        self.since_ns = time.time_ns()
        self.moved_ns: int | None = None
        self.done = threading.Event()
        self.sent = 0
        """Heartbeats the broker has taken."""
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    def move_on(self) -> None:
        self.moved_ns = time.time_ns()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=30)

    def beat(self, rank: int) -> bytes:
        stuck = self.moved_ns is None
        since = self.since_ns + (0 if rank == STUCK else NS // 10)
        op = "forward-compute" if rank == STUCK else "grads-reduce-scatter"
        flight = {"optype": op, "seq_id": 0, "mb_id": -1, "since_ns": since}
        if not stuck:  # every rank busy again, a new op each beat
            flight = {**flight, "optype": "forward-compute", "since_ns": time.time_ns()}
        message: dict[str, Any] = {
            "schema": "heartbeats", "version": 1, "job": self.job, "host": f"h{rank}",
            "rank": rank, "dp_rank": rank, "pp_rank": 0, "tp_rank": 0, "cp_rank": 0,
            "sent_ns": time.time_ns(), "step": 5 if stuck else 6, "pid": 100 + rank,
            "last_done": None, "in_flight": flight,
        }  # fmt: skip
        return encode("heartbeats", message)

    async def _run(self) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap)
        await producer.start()
        try:
            while not self.done.is_set():
                for rank in range(4):
                    await producer.send_and_wait(self.topic, self.beat(rank), key=self.job.encode())
                    self.sent += 1
                await asyncio.sleep(0.3)
        finally:
            await producer.stop()


def start_worker(
    bootstrap: str, prefix: str, dsn: str, log: Path, **extra: str
) -> subprocess.Popen[bytes]:
    """A ``rankwatch hang worker`` (floor ``FLOOR_S``, silent after 10 s, ticks of 0.3 s)
    logging to ``log``, its health file beside it (``.status.json``); ``extra``: more
    environment."""
    env = {**os.environ, "RANKWATCH_TOPIC_PREFIX": prefix, "RANKWATCH_GROUP": f"{prefix}-g"}
    env.update(extra)
    env["RANKWATCH_SESSION_TIMEOUT_S"] = "6"  # the killed worker's partition moves on soon
    cmd = [sys.executable, "-m", "rankwatch", "hang", "worker", "--kafka", bootstrap]
    cmd += [
        "--clickhouse",
        dsn,
        "--floor",
        str(FLOOR_S),
        "--warmup",
        str(FLOOR_S),
        "--silent-after",
        "10",
    ]
    cmd += ["--tick", "0.3", "--offset-reset", "earliest"]
    cmd += ["--status-file", str(log.with_suffix(".status.json"))]
    with log.open("ab") as out:
        return subprocess.Popen(tied(cmd), env=env, stdout=out, stderr=out)
