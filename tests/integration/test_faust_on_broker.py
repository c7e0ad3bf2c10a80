"""faust-streaming runs against the pinned Kafka 4 broker: a worker process consumes,
keeps a table, produces, commits its offsets, and resumes after a restart without
reprocessing or losing table state.

The app is ``faust_counter_app.py`` beside this file, run as a real worker subprocess
(``python faust_counter_app.py worker``), the way the rankwatch workers run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition
from support.faustproc import faust_worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = Path(__file__).with_name("faust_counter_app.py")
PARTITIONS = 2
KEYS = [b"job-a", b"job-b", b"job-c", b"job-d"]
TopicFactory = Callable[..., str]


async def _send(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def _read(
    consumer: AIOKafkaConsumer, count: int, timeout_s: float
) -> list[tuple[bytes, bytes]]:
    got: list[tuple[bytes, bytes]] = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(got) < count and asyncio.get_running_loop().time() < deadline:
        for records in (await consumer.getmany(timeout_ms=500)).values():
            got.extend((r.key, r.value) for r in records if r.key is not None and r.value)
    return got


async def _wait_committed(
    bootstrap: str, group: str, topic: str, total: int, timeout_s: float = 20.0
) -> dict[int, int]:
    """Poll the group's committed offsets on ``topic`` until they add up to ``total``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            offsets = await admin.list_consumer_group_offsets(group)
            mine = {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == topic}
            if sum(mine.values()) >= total or asyncio.get_running_loop().time() > deadline:
                return mine
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


def _by_key(records: list[tuple[bytes, bytes]]) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for key, value in records:
        out.setdefault(key, []).append(value)
    return out


def _worker_env(bootstrap: str, topic_factory: TopicFactory, tmp_path: Path) -> dict[str, str]:
    return {
        "BOOTSTRAP": bootstrap,
        "APP_ID": f"rankwatch-test-{uuid.uuid4().hex[:8]}",
        "SOURCE": topic_factory(partitions=PARTITIONS, suffix="in"),
        "SINK": topic_factory(partitions=PARTITIONS, suffix="out"),
        "PARTITIONS": str(PARTITIONS),
        "DATADIR": str(tmp_path / "faust-data"),
    }


async def _wait_for_log(log: Path, text: str, times: int, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while log.read_text(errors="replace").count(text) < times:
        assert asyncio.get_running_loop().time() < deadline, f"no {text!r} in {log}"
        await asyncio.sleep(0.1)


async def _restart_scenario(
    env: dict[str, str], log: Path, *, backlog: bool, wait_s: float = 30.0
) -> None:
    """First worker: 12 records. Then a second worker, with 4 more records sent while
    no worker runs (``backlog``) or after the second worker is ready."""
    bootstrap, source, sink = env["BOOTSTRAP"], env["SOURCE"], env["SINK"]

    def log_tail() -> str:
        return "\n".join(log.read_text(errors="replace").splitlines()[-40:])

    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await reader.start()
    reader.assign([TopicPartition(sink, p) for p in range(PARTITIONS)])
    try:
        first = [(k, f"{k.decode()}:{i}".encode()) for i in range(3) for k in KEYS]
        with faust_worker(APP, env, log):
            await _send(bootstrap, source, first)
            out = await _read(reader, len(first), timeout_s=60)
            assert len(out) == len(first), log_tail()
            assert _by_key(out)[b"job-a"] == [b"job-a:0|1", b"job-a:1|2", b"job-a:2|3"]
            committed = await _wait_committed(bootstrap, env["APP_ID"], source, len(first))
            assert sum(committed.values()) == len(first), (committed, log_tail())

        # The second worker starts at the committed offsets (nothing of the first batch
        # again) and the counts go on from 3: the table is rebuilt from its changelog.
        second = [(k, f"{k.decode()}:3".encode()) for k in KEYS]
        if backlog:
            await _send(bootstrap, source, second)
        with faust_worker(APP, env, log):
            if not backlog:
                await _wait_for_log(log, "Worker ready", times=2)
                await _send(bootstrap, source, second)
            out = await _read(reader, len(second), timeout_s=wait_s)
            committed = await _wait_committed(
                bootstrap, env["APP_ID"], source, 16, timeout_s=wait_s / 2
            )
            out += await _read(reader, len(second), timeout_s=1.0)
        assert sorted(out) == sorted((k, v + b"|4") for k, v in second), log_tail()
        assert sum(committed.values()) == 16, (committed, log_tail())
    finally:
        await reader.stop()


def test_faust_worker_consumes_produces_commits_and_resumes(
    kafka_broker: str, topic_factory: TopicFactory, tmp_path: Path, artifacts_dir: Path
) -> None:
    """Stock faust: offsets committed, table state recovered from the changelog."""
    env = _worker_env(kafka_broker, topic_factory, tmp_path)
    asyncio.run(_restart_scenario(env, artifacts_dir / "faust-worker.log", backlog=False))


@pytest.mark.xfail(
    strict=False,
    reason="faust-streaming 0.15.3 with a table: records waiting when a worker starts are "
    "sometimes processed twice or not at all (5 of 13 probe runs were exact); see "
    "streams/FAUST_NOTES.md",
)
def test_faust_worker_restart_with_backlog_processes_each_record_once(
    kafka_broker: str, topic_factory: TopicFactory, tmp_path: Path, artifacts_dir: Path
) -> None:
    """Records that arrived while no worker ran are each processed once after a restart.

    Kept (not strict) as the detector for a faust release that fixes it; it costs at
    most ~20 s when it fails.
    """
    env = _worker_env(kafka_broker, topic_factory, tmp_path)
    asyncio.run(
        _restart_scenario(env, artifacts_dir / "faust-worker.log", backlog=True, wait_s=8.0)
    )
