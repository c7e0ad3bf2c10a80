"""Read a compacted, job-keyed topic back: the latest value of every key of a partition.

The ops worker hands a job over to the next owner through ``<prefix>.jobstate``
(:mod:`rankwatch.streams.ops.handover`): one message per job and change, written to the
partition of the job's ops messages, so that partition ``p`` of the changelog holds the
jobs of partition ``p`` of the input. A worker that meets a job it does not know reads
that partition from its start to its current end, once per assignment, and keeps the
latest value per key (a ``None`` value, a tombstone, deletes). Nobody else writes to the
partition while this worker owns the input partition (the old owner sent everything and
waited for the broker before it gave the partition up), so the cache stays true until
the partition is revoked (:meth:`ChangelogReader.forget`).

The first read of a partition waits for the broker (a consumer's start, offsets,
fetches: 0.5-0.6 s in the 10,240-GPU benchmark, most of what set a job's first step
apart from its others). So a worker warms the cache when the group assigns it partitions
(:meth:`ChangelogReader.warm`), before their jobs' messages arrive, and a job met then
finds its partition read. Reads go one at a time through one consumer.

A plain aiokafka consumer outside the group, assigned by hand: faust's own changelog
tables were not used (``streams/FAUST_NOTES.md``: their recovery processes waiting
records twice or not at all when a worker starts with a backlog, which is exactly the
moment a partition moves).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer

log = logging.getLogger("rankwatch.changelog")


class ChangelogReader:
    """The latest value per key of ``topic``'s partitions, read on demand and cached."""

    def __init__(self, bootstrap: str, topic: str, max_bytes: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_bytes = max_bytes
        self._consumer: AIOKafkaConsumer | None = None
        self._cache: dict[int, dict[bytes, bytes]] = {}
        self._reading = asyncio.Lock()
        """One read at a time: they share the consumer, and its assignment."""
        self._generation = 0
        """Bumped by :meth:`forget`: a read that began before it may have missed what the
        revocation handed over, so it is returned to its caller but never cached."""
        self.partitions_read = 0
        self.records_read = 0

    async def latest(self, partition: int) -> dict[bytes, bytes]:
        """key -> latest value in ``partition`` (read once, then cached). Raises
        aiokafka's KafkaError (or OSError) when the broker cannot be read: the caller
        retries, it must not go on without the job's state."""
        cached = self._cache.get(partition)
        if cached is not None:
            return cached
        async with self._reading:
            cached = self._cache.get(partition)  # read meanwhile (a warm-up)
            if cached is not None:
                return cached
            return await self._read(partition)

    async def warm(self, partitions: Iterable[int]) -> None:
        """Read ``partitions`` ahead of need; a partition that cannot be read now is
        left to the job that needs it (which retries), never raised here."""
        for partition in sorted(set(partitions)):
            try:
                await self.latest(partition)
            except Exception as exc:  # the broker is away: read when a job needs it
                log.info("%s:%d not read ahead (%s)", self.topic, partition, exc)
                return

    async def _read(self, partition: int) -> dict[bytes, bytes]:
        from aiokafka import TopicPartition

        generation = self._generation
        consumer = await self._started()
        tp = TopicPartition(self.topic, partition)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        found: dict[bytes, bytes] = {}
        while await consumer.position(tp) < end:
            for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                if record.offset >= end:
                    break
                self.records_read += 1
                if record.key is None:
                    continue
                if record.value is None:
                    found.pop(record.key, None)
                else:
                    found[record.key] = record.value
        if generation == self._generation:
            self._cache[partition] = found
        self.partitions_read += 1
        log.info("read %s:%d to offset %d: %d keys", self.topic, partition, end, len(found))
        return found

    def forget(self, partitions: set[int] | None = None) -> None:
        """Drop the cache of ``partitions`` (all: None), revoked from this worker."""
        self._generation += 1
        if partitions is None:
            self._cache.clear()
        for p in partitions or ():
            self._cache.pop(p, None)

    async def stop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()

    async def _started(self) -> Any:
        if self._consumer is None:
            from aiokafka import AIOKafkaConsumer

            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                max_partition_fetch_bytes=self.max_bytes + 65536,
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer
