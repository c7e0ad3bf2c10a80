"""Ship op batches to Kafka (the shell of ``rankwatch replay --kafka``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from rankwatch.schemas.codec import encode_ops
from rankwatch.schemas.topics import TOPICS
from rankwatch.streams.ops.replay import ReplayedBatch


async def publish_batches(
    bootstrap: str, batches: Iterable[ReplayedBatch], topic: str = TOPICS["ops"]
) -> int:
    """Send every batch keyed by job (so one worker owns a job); return how many."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=5,
        acks="all",
        enable_idempotence=True,
        max_request_size=8 * 1024 * 1024,
    )
    await producer.start()
    sent = 0
    try:
        pending = []
        for item in batches:
            value = encode_ops(item.batch)
            pending.append(await producer.send(topic, value, key=item.batch.job.encode()))
            sent += 1
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return sent


def publish(bootstrap: str, batches: Iterable[ReplayedBatch], topic: str = TOPICS["ops"]) -> int:
    return asyncio.run(publish_batches(bootstrap, batches, topic))
