"""The jobstate reader's cache across a revocation (the broker side is covered by
tests/integration/test_worker_rebalance.py; here a stand-in consumer holds a read open
while the partition is revoked)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rankwatch.streams.kit.changelog import ChangelogReader


@dataclass
class Record:
    offset: int
    key: bytes
    value: bytes


@dataclass
class SlowConsumer:
    """One partition's log; reads wait for ``gate``, as a slow broker's fetch does."""

    log: list[Record] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    at: int = 0

    def assign(self, partitions: Any) -> None:
        pass

    async def seek_to_beginning(self, partition: Any) -> None:
        self.at = 0

    async def end_offsets(self, partitions: Any) -> dict[Any, int]:
        return {partitions[0]: len(self.log)}

    async def position(self, partition: Any) -> int:
        return self.at

    async def getmany(self, partition: Any, timeout_ms: int) -> dict[Any, list[Record]]:
        await self.gate.wait()
        records, self.at = self.log[self.at :], len(self.log)
        return {partition: records}


def reader_of(consumer: SlowConsumer) -> ChangelogReader:
    """A reader whose consumer is ``consumer``."""
    reader = ChangelogReader("unused:9092", "t.jobstate", 1 << 20)

    async def started() -> SlowConsumer:
        return consumer

    reader._started = started  # type: ignore[method-assign]
    return reader


def test_a_read_that_spans_a_revocation_is_not_cached() -> None:
    """The revocation handed the job over (a newer state) while a read of the partition
    was in flight: the next assignment must read the partition again, not the old read."""

    async def run() -> tuple[bytes, bytes]:
        consumer = SlowConsumer([Record(0, b"job", b"before")])
        reader = reader_of(consumer)
        read = asyncio.create_task(reader.latest(0))
        await asyncio.sleep(0)
        consumer.log.append(Record(1, b"job", b"handed over"))
        reader.forget()
        consumer.gate.set()
        first = (await read)[b"job"]
        return first, (await reader.latest(0))[b"job"]

    first, again = asyncio.run(run())
    assert first == b"before"  # what the read saw, to the end offset it started with
    assert again == b"handed over"


def test_reads_are_cached_until_forgotten() -> None:
    async def run() -> int:
        consumer = SlowConsumer([Record(0, b"job", b"s")])
        consumer.gate.set()
        reader = reader_of(consumer)
        await reader.latest(0)
        await reader.latest(0)
        reader.forget({0})
        await reader.latest(0)
        return reader.partitions_read

    assert asyncio.run(run()) == 2


def test_a_job_met_during_a_warm_up_waits_for_it_instead_of_reading_twice() -> None:
    """A partition being read ahead when its first job arrives: the job gets that read
    (reads share one consumer and its assignment, so two at once would mix)."""

    async def run() -> tuple[bytes, int]:
        consumer = SlowConsumer([Record(0, b"job", b"s")])
        reader = reader_of(consumer)
        warm = asyncio.create_task(reader.warm([0]))
        await asyncio.sleep(0)
        job = asyncio.create_task(reader.latest(0))
        await asyncio.sleep(0)
        consumer.gate.set()
        await warm
        return (await job)[b"job"], reader.partitions_read

    value, reads = asyncio.run(run())
    assert value == b"s"
    assert reads == 1


def test_a_warm_up_the_broker_refuses_is_left_to_the_jobs() -> None:
    async def run() -> int:
        reader = ChangelogReader("unused:9092", "t.jobstate", 1 << 20)

        async def refused() -> SlowConsumer:
            raise OSError("connection refused")

        reader._started = refused  # type: ignore[method-assign]
        await reader.warm([0, 1])  # logged, not raised
        try:
            await reader.latest(0)
        except OSError:
            return reader.partitions_read
        raise AssertionError("a job's own read must raise: its caller retries")

    assert asyncio.run(run()) == 0
