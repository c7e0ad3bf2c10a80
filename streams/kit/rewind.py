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

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import faust

from rankwatch.streams.kit.stalls import Partition, Rewind, StallWatch

LOG_START_TIMEOUT_S = 2.0
"""How long a check waits for the log's start of newly assigned partitions."""


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
        self._at_first: dict[Partition, int | None] = {}
        """partition -> faust's committed offset when the agent got its first record"""
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
        """The agent got ``message`` (a faust event's ``message``). For the first one of
        a partition since the assignment, what was committed then is kept: faust commits
        past records it dropped once the agent acknowledges later ones."""
        key = (message.topic, message.partition)
        first = key not in self._at_first and self.watch.wants_resumed(key)
        if first and not self.app.rebalancing:  # between revocation and seek: not known
            self._at_first[key] = self._committed(key)
        self.watch.handed(key, message.offset)

    def counters(self) -> dict[str, int]:
        return {"partitions_read_again": self.watch.rewinds, "partitions_stuck": self.watch.stuck}

    async def check(self, positions: Mapping[Any, int]) -> list[Rewind]:
        """Check the watched partitions among those in ``positions`` (faust TP -> the
        consumer's position); read again those faust read past. Nothing while the group
        rebalances (faust seeks then itself)."""
        if self.app.rebalancing:
            return []
        tps = {(tp.topic, tp.partition): tp for tp in positions if tp.topic in self.topics}
        at = {key: positions[tp] for key, tp in tps.items()}
        resumed = await self._resumed(tps, at)
        quiet = {topic: self._quiet(topic) for topic in self.topics}
        found = self.watch.check(time.monotonic(), at, resumed, quiet)
        for rewind in found:
            await self._act(tps[rewind.partition], rewind)
        return found

    async def _act(self, tp: Any, rewind: Rewind) -> None:
        where = f"{tp.topic}:{tp.partition}"
        if rewind.stuck:
            self.log.warning(
                "%s: read again from offset %d once already, and the worker still did not"
                " get that record (consumer at %d): left alone",
                where,
                rewind.offset,
                rewind.position,
            )
            return
        what = (
            f"the worker got nothing past {rewind.offset} for {rewind.waited_s:.0f} s"
            if rewind.waited_s
            else f"the worker never got the record at offset {rewind.offset}"
        )
        self.log.warning(
            "%s: the consumer is at offset %d but %s (records dropped inside faust):"
            " reading the partition again from %d",
            where,
            rewind.position,
            what,
            rewind.offset,
        )
        try:
            await self.app.consumer.seek(tp, rewind.offset)
        except Exception as exc:  # the consumer is being rebuilt: the next check retries
            self.log.warning("%s: cannot seek (%s)", where, exc)

    async def _resumed(
        self, tps: dict[Partition, Any], positions: dict[Partition, int]
    ) -> dict[Partition, int]:
        """Where reading resumed after the assignment, for the partitions the watch asks
        about: the committed offset (or the log's start, if retention removed records
        past it), or the log's start when nothing is committed and the app starts there
        (a worker that starts at the log's end, the hang worker, leaves those out)."""
        wanted = [k for k, at in positions.items() if at > 0 and self.watch.wants_resumed(k)]
        missing = [tps[k] for k in wanted if k not in self._log_start]
        if missing:
            try:  # a request to the broker: bounded, the tick must not wait on it
                starts = await asyncio.wait_for(
                    self.app.consumer.earliest_offsets(*missing), LOG_START_TIMEOUT_S
                )
            except Exception:  # broker away or slow: asked again at the next check
                starts = {}
            for tp, offset in starts.items():
                if offset is not None:
                    self._log_start[(tp.topic, tp.partition)] = int(offset)
        from_start = self.app.conf.consumer_auto_offset_reset == "earliest"
        out: dict[Partition, int] = {}
        for key in wanted:
            committed = self._at_first[key] if key in self._at_first else self._committed(key)
            start = self._log_start.get(key)
            if committed is not None:
                out[key] = committed if start is None else max(committed, start)
            elif start is not None and from_start:
                out[key] = start
        return out

    def _committed(self, tp: Partition) -> int | None:
        """The committed offset faust knows (None for nothing committed, and for 0);
        ``tp`` a faust TP or the same (topic, partition) tuple."""
        offsets = getattr(self.app.consumer, "_committed_offset", None)
        if offsets is None:
            self._warn(
                "committed", "cannot see faust's committed offsets for %s (internals changed?)"
            )
            return None
        value = offsets.get(tp)
        return int(value) if value else None

    def _quiet(self, topic: str) -> bool:
        queue = self._queues.get(topic)
        return queue is None or queue.qsize() == 0

    async def _reassigned(self, sender: Any, *_: Any, **__: Any) -> None:
        self.watch.reassigned()
        self._log_start.clear()
        self._at_first.clear()

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            self.log.info(message, ", ".join(sorted(self.topics)))
