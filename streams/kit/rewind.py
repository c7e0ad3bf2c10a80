"""The shell of :mod:`~rankwatch.streams.kit.stalls` on a faust app: reads the consumer's
positions, the committed offsets and the agents' queues at each tick, and reads a
partition again where faust dropped its records (docs/running.md, "A partition read
past").

Two of the things read here are faust-streaming 0.15.3 internals (the committed offsets
it keeps, the agent channel's queue); where they are missing (another faust version) the
guard logs once and goes on with what it has: no committed offset means the log's start
(a read again from there costs duplicates, which the workers drop), no queue means the
queue counts as empty.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import faust

from rankwatch.streams.kit.stalls import Partition, Rewind, StallWatch


class StallGuard:
    """Watches the partitions of ``topics`` that ``app`` is assigned. Each agent calls
    :meth:`stream` once and :meth:`handed` for every event; the worker's status reporter
    calls :meth:`check` at each tick."""

    def __init__(
        self, app: faust.App, topics: Iterable[str], log: logging.Logger, wait_s: float = 5.0
    ) -> None:
        self.app = app
        self.topics = set(topics)
        self.log = log
        self.watch = StallWatch(wait_s=wait_s)
        self._queues: dict[str, Any] = {}
        self._log_start: dict[Partition, int] = {}
        self._warned: set[str] = set()
        app.on_partitions_revoked.connect(self._reassigned)  # type: ignore[arg-type]
        app.on_partitions_assigned.connect(self._reassigned)  # type: ignore[arg-type]

    def stream(self, topic: str, stream: Any) -> None:
        """The agent reading ``topic`` starts with ``stream``: its queue is watched."""
        queue = getattr(getattr(stream, "channel", None), "queue", None)
        if queue is None or not hasattr(queue, "qsize"):
            self._warn("queue", "cannot see the agent's queue for %s (faust internals changed?)")
            return
        self._queues[topic] = queue

    def handed(self, message: Any) -> None:
        """The agent got ``message`` (a faust event's ``message``)."""
        self.watch.handed((message.topic, message.partition), message.offset)

    def counters(self) -> dict[str, int]:
        return {"partitions_read_again": self.watch.rewinds, "partitions_stuck": self.watch.stuck}

    async def check(self, assigned: Iterable[Any]) -> list[Rewind]:
        """Check the watched partitions among ``assigned`` (faust TPs); read again those
        faust read past. Nothing while the group rebalances (faust seeks then itself)."""
        if self.app.rebalancing:
            return []
        tps = {(tp.topic, tp.partition): tp for tp in assigned if tp.topic in self.topics}
        positions = await self._positions(tps)
        resumed = await self._resumed(tps, positions)
        quiet = {topic: self._quiet(topic) for topic in self.topics}
        found = self.watch.check(time.monotonic(), positions, resumed, quiet)
        for rewind in found:
            await self._act(tps[rewind.partition], rewind)
        return found

    async def _act(self, tp: Any, rewind: Rewind) -> None:
        where = f"{tp.topic}:{tp.partition}"
        if rewind.stuck:
            self.log.warning(
                "%s: read again from offset %d, and the consumer is at %d again with nothing"
                " handed to the worker for %.0f s: left alone",
                where,
                rewind.offset,
                rewind.position,
                rewind.waited_s,
            )
            return
        self.log.warning(
            "%s: the consumer is at offset %d but the worker got nothing past %d for %.0f s"
            " (records dropped inside faust): reading the partition again from %d",
            where,
            rewind.position,
            rewind.offset,
            rewind.waited_s,
            rewind.offset,
        )
        try:
            await self.app.consumer.seek(tp, rewind.offset)
        except Exception as exc:  # the consumer is being rebuilt: the next check retries
            self.log.warning("%s: cannot seek (%s)", where, exc)

    async def _positions(self, tps: dict[Partition, Any]) -> dict[Partition, int]:
        out = {}
        for key, tp in tps.items():
            try:
                position = await self.app.consumer.position(tp)
            except Exception:  # not fetched yet, or the consumer is being rebuilt
                continue
            if position is not None:
                out[key] = int(position)
        return out

    async def _resumed(
        self, tps: dict[Partition, Any], positions: dict[Partition, int]
    ) -> dict[Partition, int]:
        """Where reading resumed after the assignment, for the partitions the agent got
        nothing from since and the consumer has read into: the committed offset, or the
        log's start when nothing is committed and the app starts there (a worker that
        starts at the log's end, the hang worker, leaves those partitions unchecked)."""
        out: dict[Partition, int] = {}
        unknown = []
        from_start = self.app.conf.consumer_auto_offset_reset == "earliest"
        for key, position in positions.items():
            if position == 0 or self.watch.expects(key) is not None:
                continue
            committed = self._committed(tps[key])
            if committed is not None:
                out[key] = committed
            elif key in self._log_start:
                out[key] = self._log_start[key]
            elif from_start:
                unknown.append(tps[key])
        if unknown:
            try:
                starts = await self.app.consumer.earliest_offsets(*unknown)
            except Exception:  # asked again at the next check
                starts = {}
            for tp, offset in starts.items():
                if offset is not None:
                    out[(tp.topic, tp.partition)] = self._log_start[(tp.topic, tp.partition)] = int(
                        offset
                    )
        return out

    def _committed(self, tp: Any) -> int | None:
        """The committed offset faust knows (None for nothing committed, and for 0)."""
        offsets = getattr(self.app.consumer, "_committed_offset", None)
        if offsets is None:
            self._warn("committed", "cannot see faust's committed offsets for %s (internals?)")
            return None
        value = offsets.get(tp)
        return int(value) if value else None

    def _quiet(self, topic: str) -> bool:
        queue = self._queues.get(topic)
        return queue is None or queue.qsize() == 0

    async def _reassigned(self, sender: Any, *_: Any, **__: Any) -> None:
        self.watch.reassigned()
        self._log_start.clear()

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            self.log.info(message, ", ".join(sorted(self.topics)))
