"""When may a consumed message be acknowledged? When everything it fed is stored.

A message feeds zero or more open steps; its own rows (raw ops, a dead letter) and the
rows of the steps it closed are in the sink's buffer. It is *settled* once every step
it fed has closed, and *safe* once a flush that started after it settled succeeded.
Only safe messages are acknowledged, and only in the order they were read on their
partition (:class:`InOrder`: the consumer may commit any acknowledged offset, and
faust-streaming commits past a gap), so the committed offset never passes what is
stored: a worker killed at any point loses nothing, it re-reads from the committed
offset.

Pure: tokens are whatever the shell acknowledges (faust events); no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
StepKey = tuple[str, int]
"""(job, step)"""
Partition = tuple[str, int]
"""(topic, partition)"""


@dataclass
class AckTracker(Generic[T]):
    _waiters: dict[StepKey, list[int]] = field(default_factory=dict)
    _tokens: dict[int, tuple[T, str, int]] = field(default_factory=dict)
    """id -> (token, job, steps still open)"""
    _settled: list[T] = field(default_factory=list)
    _next_id: int = 0

    @property
    def waiting(self) -> int:
        """Messages whose steps are still open."""
        return len(self._tokens)

    @property
    def settled(self) -> int:
        """Messages waiting only for the next flush."""
        return len(self._settled)

    def received(self, token: T, job: str, pending: Iterable[StepKey]) -> None:
        """A message was processed; ``pending`` are the open steps it fed."""
        keys = list(dict.fromkeys(pending))
        if not keys:
            self._settled.append(token)
            return
        ident = self._next_id
        self._next_id += 1
        self._tokens[ident] = (token, job, len(keys))
        for key in keys:
            self._waiters.setdefault(key, []).append(ident)

    def closed(self, keys: Iterable[StepKey]) -> None:
        """These steps closed: their rows are in the sink's buffer now."""
        for key in keys:
            for ident in self._waiters.pop(key, ()):
                entry = self._tokens.get(ident)
                if entry is None:
                    continue
                token, job, left = entry
                if left <= 1:
                    del self._tokens[ident]
                    self._settled.append(token)
                else:
                    self._tokens[ident] = (token, job, left - 1)

    def flushed(self) -> list[T]:
        """Call after a flush of *everything* buffered succeeded: the messages now safe."""
        safe, self._settled = self._settled, []
        return safe

    def unflushed(self, tokens: list[T]) -> None:
        """The flush that took ``tokens`` from :meth:`flushed` did not store everything:
        they wait for the next one, ahead of those settled since."""
        self._settled[:0] = tokens

    def waits_for(self, job: str) -> bool:
        """Whether a message of ``job`` waits for a step to close."""
        return any(j == job for _, j, _ in self._tokens.values())

    def forget(self, drop: Callable[[str], bool]) -> None:
        """Forget the messages of jobs for which ``drop(job)`` (partition revoked): they
        are never acknowledged here, the next owner re-reads them."""
        gone = {i for i, (_, job, _) in self._tokens.items() if drop(job)}
        for ident in gone:
            del self._tokens[ident]
        for key in [k for k in self._waiters if drop(k[0])]:
            del self._waiters[key]


@dataclass
class InOrder(Generic[T]):
    """Acknowledgements released per partition in the order the messages arrived.

    The consumer must commit only what is stored, and faust-streaming 0.15.3 does not
    commit "the highest contiguous acknowledged offset" when acknowledgements come out
    of order (ours come when a message's steps close): it commits the first contiguous
    run of acknowledged offsets even when the message at the committed offset, or any
    before the run while nothing is committed yet, was never acknowledged
    (streams/FAUST_NOTES.md, "How offsets are committed"). So a message is handed to
    the consumer only once every message that arrived before it on its partition was:
    the acknowledged offsets are then always a prefix of what was read, and any
    consumer commits the same offsets. Tokens of partitions given up (a rebalance) are
    never handed over: their messages are read again."""

    _queues: dict[Partition, deque[T]] = field(default_factory=dict)
    """partition -> its tokens not handed over yet, in arrival order"""
    _where: dict[Hashable, Partition] = field(default_factory=dict)
    """token -> partition, for tokens not handed over yet (faust events hash by
    identity; any hashable token unique among those in flight will do)"""
    _ready: set[Hashable] = field(default_factory=set)
    """tokens safe but waiting for an earlier message of their partition"""

    @property
    def held(self) -> int:
        """Safe tokens waiting for an earlier message of their partition."""
        return len(self._ready)

    def received(self, token: T, partition: Partition) -> None:
        """A message was read from ``partition`` (call in the order they arrive)."""
        self._where[token] = partition
        self._queues.setdefault(partition, deque()).append(token)

    def release(self, safe: list[T]) -> list[T]:
        """``safe`` tokens may be acknowledged: those now at the head of their partitions
        (and the safe ones behind them), in order; the rest wait. Tokens not received
        here, already handed over, or of a partition given up since are dropped."""
        touched: set[Partition] = set()
        for token in safe:
            partition = self._where.get(token)
            if partition is not None:
                self._ready.add(token)
                touched.add(partition)
        out: list[T] = []
        for partition in touched:
            queue = self._queues[partition]
            while queue and queue[0] in self._ready:
                token = queue.popleft()
                self._ready.discard(token)
                del self._where[token]
                out.append(token)
            if not queue:
                del self._queues[partition]
        return out

    def forget(self, partitions: set[Partition] | None = None) -> None:
        """Give ``partitions`` up (None: all): their tokens are never handed over."""
        gone = set(self._queues) if partitions is None else partitions & set(self._queues)
        for partition in gone:
            for token in self._queues.pop(partition):
                self._where.pop(token, None)
                self._ready.discard(token)
