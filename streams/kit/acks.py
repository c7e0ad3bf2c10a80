"""When may a consumed message be acknowledged? When everything it fed is stored.

A message feeds zero or more open steps; its own rows (raw ops, a dead letter) and the
rows of the steps it closed are in the sink's buffer. It is *settled* once every step
it fed has closed, and *safe* once a flush that started after it settled succeeded.
Only safe messages are acknowledged, so the consumer (which commits the highest
contiguous acknowledged offset per partition) never commits past what is stored: a
worker killed at any point loses nothing, it re-reads from the committed offset.

Pure: tokens are whatever the shell acknowledges (faust events); no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
StepKey = tuple[str, int]
"""(job, step)"""


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

    def forget(self, drop: Callable[[str], bool]) -> None:
        """Forget the messages of jobs for which ``drop(job)`` (partition revoked): they
        are never acknowledged here, the next owner re-reads them."""
        gone = {i for i, (_, job, _) in self._tokens.items() if drop(job)}
        for ident in gone:
            del self._tokens[ident]
        for key in [k for k in self._waiters if drop(k[0])]:
            del self._waiters[key]
