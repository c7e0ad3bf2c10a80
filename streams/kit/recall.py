"""Jobs first met: looked up in the store in a thread while their messages wait.

A worker that meets a job for the first time (at start, after a rebalance) recalls what
the store holds of it: open episodes, alert states stored but never sent, snapshots. The
store serves one request at a time, so a lookup can wait behind a slow insert for as
long as the store's timeout; run on the event loop, it stopped every job's messages for
that long. The hang and Minder workers hold the new job's messages here instead, run
the lookup in a thread (:class:`RecallTasks`) while the other jobs' messages are read
on, and take the held ones back, in the order they came, when it answers
(docs/detection.md, "After a restart"). The ops worker holds them here too, but runs
its own recall: a job it cannot restore waits, it never starts afresh (docs/sizing.md,
"Moving jobs between workers").
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
Found = TypeVar("Found")


@dataclass
class _Waiting(Generic[T]):
    ticket: int
    items: deque[T] = field(default_factory=deque)


class Held(Generic[T]):
    """The jobs whose recall has not answered yet, each with what it held meanwhile: at
    most ``limit`` items a job, the oldest dropped past that (counted in :attr:`dropped`),
    or every item (``limit`` None: the worker stops reading while :attr:`total` is too
    high, rather than lose one).

    Each recall has a ticket: an answer for a job forgotten meanwhile (its partition
    revoked), and maybe met again since, is stale and takes nothing."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.dropped = 0
        self.total = 0
        """Items held, over all jobs."""
        self._jobs: dict[str, _Waiting[T]] = {}
        self._new: list[tuple[str, int]] = []
        self._tickets = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job: object) -> bool:
        return job in self._jobs

    def hold(self, job: str, item: T) -> T | None:
        """Hold ``item`` until ``job``'s recall answers (a job's first item asks for its
        recall: :meth:`take_new`); returns the item dropped to make room, if any."""
        waiting = self._jobs.get(job)
        if waiting is None:
            self._tickets += 1
            waiting = self._jobs[job] = _Waiting(self._tickets)
            self._new.append((job, waiting.ticket))
        dropped = None
        if self.limit is not None and len(waiting.items) >= self.limit:
            dropped = waiting.items.popleft()
            self.dropped += 1
            self.total -= 1
        waiting.items.append(item)
        self.total += 1
        return dropped

    def first(self, job: str) -> T | None:
        """The oldest item ``job`` holds (None: it holds none, or its recall answered)."""
        waiting = self._jobs.get(job)
        return waiting.items[0] if waiting is not None and waiting.items else None

    def current(self, job: str, ticket: int) -> bool:
        """Whether ``ticket`` is ``job``'s recall still waited for (not stale)."""
        waiting = self._jobs.get(job)
        return waiting is not None and waiting.ticket == ticket

    def jobs(self) -> list[str]:
        """The jobs whose recall has not answered."""
        return list(self._jobs)

    def take_new(self) -> list[tuple[str, int]]:
        """(job, ticket) of the recalls asked for since the last call: run each, then
        give its answer to the worker, which calls :meth:`answered`."""
        new, self._new = self._new, []
        return new

    def answered(self, job: str, ticket: int) -> deque[T] | None:
        """What ``job`` held, in the order it came, now that its recall ``ticket``
        answered; None when that recall is stale."""
        waiting = self._jobs.get(job)
        if waiting is None or waiting.ticket != ticket:
            return None
        del self._jobs[job]
        self.total -= len(waiting.items)
        return waiting.items

    def take(self, job: str, ticket: int, n: int) -> list[T] | None:
        """Up to ``n`` of what ``job`` held, oldest first, for recall ``ticket`` (None:
        stale). The job stays held, and holds what comes meanwhile, until it is empty:
        a worker can take its items in parts, the event loop free in between."""
        waiting = self._jobs.get(job)
        if waiting is None or waiting.ticket != ticket:
            return None
        out = [waiting.items.popleft() for _ in range(min(n, len(waiting.items)))]
        self.total -= len(out)
        if not waiting.items:
            del self._jobs[job]
        return out

    def forget(self, job: str) -> deque[T]:
        """Drop what ``job`` holds (its partition was revoked): its recall is stale.
        Returns what it held."""
        waiting = self._jobs.pop(job, None)
        self._new = [(j, t) for j, t in self._new if j != job]
        if waiting is None:
            return deque()
        self.total -= len(waiting.items)
        return waiting.items


def recall_now(
    recalls: Iterable[tuple[str, int]],
    look_up: Callable[[str], Found | None],
    recalled: Callable[[str, int, Found | None], None],
) -> None:
    """Run ``recalls`` here and now, one after the other (tests, and callers without an
    event loop)."""
    for job, ticket in recalls:
        recalled(job, ticket, look_up(job))


class RecallTasks(Generic[Found]):
    """Runs each recall's lookup in a thread and hands its answer back on the event loop.

    ``look_up(job)`` reads the store only (it must touch no worker state) and returns
    None when the store cannot answer; ``recalled(job, ticket, found)`` restores the job
    and takes what it held."""

    def __init__(
        self,
        look_up: Callable[[str], Found | None],
        recalled: Callable[[str, int, Found | None], None],
        log: logging.Logger,
    ) -> None:
        self._look_up = look_up
        self._recalled = recalled
        self._log = log
        self._running: set[asyncio.Task[None]] = set()
        """A reference to each running recall, so that none is collected mid-way."""

    def start(self, recalls: Iterable[tuple[str, int]]) -> None:
        for job, ticket in recalls:
            task = asyncio.ensure_future(self._recall(job, ticket))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _recall(self, job: str, ticket: int) -> None:
        try:
            found = await asyncio.to_thread(self._look_up, job)
        except Exception:  # never leave a job's messages held for good
            self._log.exception("recall of job %s failed: its state starts afresh", job)
            found = None
        try:
            self._recalled(job, ticket, found)
        except Exception:  # a bug: logged here, not lost in a task nobody awaits
            self._log.exception("taking job %s's recall failed", job)
