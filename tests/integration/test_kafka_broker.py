"""The development broker is a real Kafka that aiokafka talks to over the network.

Kafka 4 dropped the protocol versions older than Kafka 2.1 (KIP-896); these tests are the
evidence that aiokafka (and so faust) still works against the pinned broker: produce,
consume in a consumer group, commit and resume, multi-partition topics, keyed
partitioning.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka.structs import TopicPartition
from support.devbroker import DevBroker

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


async def _produce(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]
) -> list[int]:
    """Send (key, value) records in order; return the partition each landed on."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        metas = [await producer.send_and_wait(topic, value, key=key) for key, value in records]
    finally:
        await producer.stop()
    return [m.partition for m in metas]


async def _consume(
    bootstrap: str, topic: str, group: str, count: int, timeout_s: float = 30.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read ``count`` records as member of ``group``, commit, and leave the group."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    got: list[ConsumerRecord[bytes, bytes]] = []
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(got) < count and asyncio.get_running_loop().time() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=count - len(got))
            for records in batches.values():
                got.extend(records)
        await consumer.commit()
    finally:
        await consumer.stop()
    return got


async def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        return {
            p: (await consumer.committed(TopicPartition(topic, p))) or 0 for p in range(partitions)
        }
    finally:
        await consumer.stop()


def test_group_consumer_commits_and_resumes(
    kafka_broker: str, unique_topic: str, unique_group: str
) -> None:
    async def scenario() -> None:
        first = [(None, f"a{i}".encode()) for i in range(5)]
        await _produce(kafka_broker, unique_topic, first)
        got = await _consume(kafka_broker, unique_topic, unique_group, 5)
        assert [r.value for r in got] == [v for _, v in first]
        assert await _committed(kafka_broker, unique_group, unique_topic, 1) == {0: 5}

        # The same group picks up after its committed offset, not from the start.
        second = [(None, f"b{i}".encode()) for i in range(3)]
        await _produce(kafka_broker, unique_topic, second)
        again = await _consume(kafka_broker, unique_topic, unique_group, 3)
        assert [r.value for r in again] == [v for _, v in second]
        assert [r.offset for r in again] == [5, 6, 7]

    asyncio.run(scenario())


def test_multi_partition_topic(
    kafka_broker: str, topic_factory: TopicFactory, unique_group: str
) -> None:
    topic = topic_factory(partitions=4)

    async def scenario() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
        await producer.start()
        try:
            assert await producer.partitions_for(topic) == {0, 1, 2, 3}
            for p in range(4):
                for i in range(p + 1):  # partition p gets p+1 records
                    await producer.send_and_wait(topic, f"p{p}-{i}".encode(), partition=p)
        finally:
            await producer.stop()
        got = await _consume(kafka_broker, topic, unique_group, 10)
        per_partition: dict[int, list[bytes]] = defaultdict(list)
        for r in got:
            per_partition[r.partition].append(r.value)
        assert {p: len(v) for p, v in per_partition.items()} == {0: 1, 1: 2, 2: 3, 3: 4}
        # Order holds within a partition.
        assert per_partition[3] == [b"p3-0", b"p3-1", b"p3-2", b"p3-3"]
        assert await _committed(kafka_broker, unique_group, topic, 4) == {0: 1, 1: 2, 2: 3, 3: 4}

    asyncio.run(scenario())


def test_keyed_records_stay_on_one_partition(
    kafka_broker: str, topic_factory: TopicFactory, unique_group: str
) -> None:
    """rankwatch keys op batches by job so one worker owns a job: same key, same partition."""
    topic = topic_factory(partitions=4)
    keys = [f"job-{j}".encode() for j in range(16)]
    records = [(k, f"{k.decode()}:{step}".encode()) for step in range(3) for k in keys]

    async def scenario() -> None:
        sent_to = await _produce(kafka_broker, topic, records)
        partition_of: dict[bytes, set[int]] = defaultdict(set)
        for (key, _), p in zip(records, sent_to, strict=True):
            assert key is not None
            partition_of[key].add(p)
        assert all(len(ps) == 1 for ps in partition_of.values())
        # 16 keys on 4 partitions: more than one partition is used (all on one: 4**-15).
        assert len(set(sent_to)) > 1

        got = await _consume(kafka_broker, topic, unique_group, len(records))
        assert len(got) == len(records)
        for r in got:
            assert r.key is not None
            assert partition_of[r.key] == {r.partition}
        steps_of_job0 = [r.value for r in got if r.key == b"job-0"]
        assert steps_of_job0 == [b"job-0:0", b"job-0:1", b"job-0:2"]

    asyncio.run(scenario())


@pytest.mark.slow
def test_dev_broker_restarts_with_its_data(tmp_path: Path) -> None:
    """The script's lifecycle: start, status, stop, start again on the same port and data."""
    broker = DevBroker(tmp_path / "broker")
    with broker:
        assert broker.is_running()
        first = broker.bootstrap
        broker.create_topic("kept", partitions=2)
        asyncio.run(_produce(first, "kept", [(None, b"survives")]))
    assert not broker.is_running()
    assert "Kafka Server started" in broker.server_log.read_text()

    with broker:
        assert broker.bootstrap == first
        got = asyncio.run(_consume(broker.bootstrap, "kept", "after-restart", 1))
        assert [r.value for r in got] == [b"survives"]
