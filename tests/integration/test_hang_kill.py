"""kill -9 the hang worker in the middle of an episode, start it again while the job
stays hung, then let the job move on: exactly one firing and one resolved alert for
the episode, on the topic and in the store (docs/detection.md, "After a restart").

Real broker, real ``rankwatch hang worker`` subprocesses, real chDB. The heartbeats are
written by the test (four ranks, rank 1 stuck in compute, the others waiting in a
collective), so that the job is hung for exactly as long as the test says.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.devbroker import create_topics
from support.workers import read_topic

from rankwatch.schemas.codec import encode
from rankwatch.streams.kit.health import check_status, read_status
from rankwatch.streams.kit.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.slow]
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
                    await producer.send(self.topic, self.beat(rank), key=self.job.encode())
                await asyncio.sleep(0.3)
        finally:
            await producer.stop()


def start_worker(bootstrap: str, prefix: str, dsn: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RANKWATCH_TOPIC_PREFIX": prefix, "RANKWATCH_GROUP": f"{prefix}-g"}
    env["RANKWATCH_SESSION_TIMEOUT_S"] = "6"  # the killed worker's partition moves on soon
    cmd = [sys.executable, "-m", "rankwatch", "hang", "worker", "--kafka", bootstrap]
    cmd += ["--clickhouse", dsn, "--floor", str(FLOOR_S), "--silent-after", "10"]
    cmd += ["--tick", "0.3", "--offset-reset", "earliest"]
    cmd += ["--status-file", str(log.with_suffix(".status.json"))]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=out)


def wait_for_line(log: Path, text: str, timeout_s: float) -> None:
    """Until the worker logs ``text`` (here: the firing alert recorded as sent, so the
    kill falls after it; the kill between the send and its record is
    ``tests/unit/hang/test_hang_worker_state.py``'s)."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"no {text!r} in the worker's log"
        time.sleep(0.1)


def alerts_of(bootstrap: str, prefix: str, want: int, timeout_s: float) -> list[tuple[str, str]]:
    got = asyncio.run(read_topic(bootstrap, f"{prefix}.alerts", "alerts", want, timeout_s))
    return [(a["alert_id"], a["state"]) for a in got]


def test_kill_9_mid_episode_keeps_one_alert_per_episode(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    prefix = f"t.hangkill.{uuid.uuid4().hex[:8]}"
    kinds = ("heartbeats", "stacks", "alerts", "dead-letters")
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.{k}" for k in kinds], 1))
    dsn = f"chdb://{tmp_path / 'chdb'}"
    log = artifacts_dir / "hang-worker.log"
    ranks = Ranks(kafka_broker, f"{prefix}.heartbeats", "job-h")
    worker = start_worker(kafka_broker, prefix, dsn, log)
    try:
        fired = alerts_of(kafka_broker, prefix, 1, 90)
        assert [s for _, s in fired] == ["firing"], log.read_text()[-3000:]
        wait_for_line(log, "alert states sent and recorded", 30)
        worker.kill()  # SIGKILL mid-episode: the job is still hung
        worker.wait(timeout=30)
        worker = start_worker(kafka_broker, prefix, dsn, log)
        # hung for longer than the restarted worker needs to join (session 6 s) and to
        # declare the episode afresh (floor 3 s) had it forgotten it
        time.sleep(20)
        assert worker.poll() is None, log.read_text()[-3000:]
        assert alerts_of(kafka_broker, prefix, 2, 3) == fired, "declared again after the restart"
        status = read_status(log.with_suffix(".status.json"))  # the kit's health file
        assert check_status(status, time.time_ns(), max_age_s=10, max_lag_s=60) == [], status
        assert status["restored_episodes"] == 1 and status["open_episodes"] == 1, status
        ranks.move_on()
        got = alerts_of(kafka_broker, prefix, 2, 60)
        time.sleep(2)  # a few more ticks: a duplicate would show
        got = alerts_of(kafka_broker, prefix, 3, 3)
    finally:
        ranks.stop()
        worker.terminate()
        worker.wait(timeout=30)
    (episode,) = {a for a, _ in fired}
    assert got == [(episode, "firing"), (episode, "resolved")], log.read_text()[-3000:]
    with Store.connect(dsn) as store:
        stored = store.query("SELECT alert_id, state FROM alerts FINAL ORDER BY ts_ns")
        hangs = store.query("SELECT episode_id, resolved_at FROM hangs FINAL")
        sent = store.query("SELECT alert_id, state FROM announced FINAL ORDER BY time")
    assert f"recalled: episode {episode} open, 0 unsent" in log.read_text()
    assert [(a["alert_id"], a["state"]) for a in stored] == got
    assert [h["episode_id"] for h in hangs] == [episode] and hangs[0]["resolved_at"] is not None
    assert [(a["alert_id"], a["state"]) for a in sent] == got  # both recorded as sent
