"""A hang worker that loses jobs in a rebalance forgets them; it does not declare them hung.

The hang worker is scaled by running more of it in its group (README, "In a cluster"):
when a second one joins, some jobs' partitions move to it. The first had heard those
jobs' ranks until then; it kept them, they fell silent there, and ``silent_after`` later
it declared each moved job hung: a false alert for a healthy job, and on its own
partition's worker a recalled open episode. Now a worker forgets the jobs whose
partitions it no longer reads (``HangState.keep_partitions``).

Real broker, two real ``rankwatch hang worker`` subprocesses (silent after 10 s), chDB
behind the HTTP endpoint of ``support/chdbhttp.py``, four healthy jobs, one on each of
the topic's four partitions.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner
from support.chdbhttp import ChdbHttp
from support.devbroker import create_topics
from support.hangjob import Ranks, start_worker
from support.workers import read_topic, until

from rankwatch.streams.kit.health import read_status

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PARTITIONS = 4
SILENT_S = 10  # start_worker's --silent-after


def one_job_a_partition() -> list[str]:
    """Job names whose keys the producer's partitioner puts on partitions 0, 1, 2, 3."""
    partition = DefaultPartitioner()
    every = list(range(PARTITIONS))
    found: dict[int, str] = {}
    for i in range(10_000):
        found.setdefault(partition(f"job-{i}".encode(), every, every), f"job-{i}")
        if len(found) == PARTITIONS:
            return [found[p] for p in every]
    raise AssertionError("no job name for some partition")


def health(log: Path) -> dict[str, Any]:
    try:
        return read_status(log.with_suffix(".status.json"))
    except (OSError, ValueError):  # not written yet
        return {}


def test_jobs_moved_to_a_new_worker_are_not_declared_hung_by_the_old_one(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    prefix = f"t.hangmove.{uuid.uuid4().hex[:8]}"
    kinds = ("heartbeats", "stacks", "alerts", "dead-letters")
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.{k}" for k in kinds], PARTITIONS))
    server = ChdbHttp(tmp_path / "endpoint").start()
    ranks: list[Ranks] = []
    workers: list[subprocess.Popen[bytes]] = []
    first, second = artifacts_dir / "hang-first.log", artifacts_dir / "hang-second.log"
    try:
        for job in one_job_a_partition():
            ranks.append(Ranks(kafka_broker, f"{prefix}.heartbeats", job))
            ranks[-1].move_on()  # healthy: every rank on a new op at each beat
        workers.append(start_worker(kafka_broker, prefix, server.dsn(), first))
        until(
            lambda: (
                health(first).get("jobs") == PARTITIONS and not health(first).get("recalls_waiting")
            ),
            90,
            "the first worker hearing every job",
        )
        workers.append(start_worker(kafka_broker, prefix, server.dsn(), second))
        until(lambda: health(second).get("jobs", 0) > 0, 90, "jobs moved to the second worker")
        time.sleep(SILENT_S + 4)  # a moved job declared hung by the first would show now
        alerts = asyncio.run(read_topic(kafka_broker, f"{prefix}.alerts", "alerts", 1, 3))
        assert alerts == [], first.read_text()[-3000:]
        kept, taken = health(first), health(second)
        assert kept["jobs"] + taken["jobs"] == PARTITIONS, (kept, taken)
        assert kept["open_episodes"] == taken["open_episodes"] == 0, (kept, taken)
        for worker, log in zip(workers, (first, second), strict=True):
            assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        for job_ranks in ranks:
            job_ranks.stop()
        for worker in workers:
            worker.terminate()
            worker.wait(timeout=30)
        server.stop()
