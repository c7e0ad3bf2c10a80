"""Fault: one of two hang workers is paused (SIGSTOP) for 20 s, longer than its group
session and than the silence after which a rank counts as gone, while two healthy jobs
beat; then it runs again (SIGCONT).

A paused hang worker hears no one: at SIGCONT every rank of its jobs had been silent
for 20 s, and its next evaluation declared them all hung, a page for two healthy jobs,
stored and sent before it noticed that its partitions had moved. Now the time it could
not hear is held against no one, and a worker that lost its partitions stores and sends
nothing for them. No hang alert is stored or published."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import pytest
from aiokafka.partitioner import DefaultPartitioner
from support.chdbhttp import ChdbHttp
from support.devbroker import create_topics
from support.hangjob import Ranks, start_worker
from support.workers import records_until, until

from rankwatch.streams.kit.health import read_status
from rankwatch.streams.kit.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 2
PAUSE_S = 20.0  # start_worker: silent after 10 s, session 6 s


def one_job_a_partition() -> list[str]:
    partition = DefaultPartitioner()
    every = list(range(PARTITIONS))
    found: dict[int, str] = {}
    for i in range(10_000):
        found.setdefault(partition(f"job-{i}".encode(), every, every), f"job-{i}")
        if len(found) == PARTITIONS:
            return [found[p] for p in every]
    raise AssertionError("no job name for some partition")


def status(log: Path) -> dict[str, object]:
    try:
        return read_status(log.with_suffix(".status.json"))
    except (OSError, ValueError):
        return {}


def test_a_paused_hang_worker_declares_no_healthy_job_hung(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    prefix = f"f{uuid.uuid4().hex[:10]}"
    topics = [f"{prefix}.heartbeats", f"{prefix}.stacks"]
    asyncio.run(create_topics(kafka_broker, topics, PARTITIONS))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.alerts"], 1))
    server = ChdbHttp(tmp_path / "store").start()
    jobs = [Ranks(kafka_broker, f"{prefix}.heartbeats", job) for job in one_job_a_partition()]
    for job in jobs:
        job.move_on()  # healthy: every rank starts a new op at every beat
    logs = [artifacts_dir / "paused.log", artifacts_dir / "other.log"]
    workers = [start_worker(kafka_broker, prefix, server.dsn(), log) for log in logs]
    paused = workers[0]
    try:
        until(lambda: all(status(log).get("jobs") == 1 for log in logs), 90, "a job each")
        paused.send_signal(signal.SIGSTOP)
        time.sleep(PAUSE_S)
        paused.send_signal(signal.SIGCONT)
        until(lambda: status(logs[0]).get("written_ns", 0) > time.time_ns() - 1e9, 60, "awake")
        time.sleep(10)  # the resumed worker's evaluations, and its rejoin
        woke = status(logs[0])
        alerts = asyncio.run(records_until(kafka_broker, f"{prefix}.alerts", bool, 3))
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            proc.wait(30)
        for job in jobs:
            job.stop()
    try:
        with Store.connect(server.dsn()) as store:
            stored = store.query("SELECT alert_id, state FROM alerts WHERE kind = 'hang'")
        assert stored == [] and alerts == [], (stored, alerts)
        assert woke.get("blind_ticks", 0) >= 1, woke
    finally:
        server.stop()
