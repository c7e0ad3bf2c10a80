"""When to store and announce a closed step: at once, but not more often than a gap.

A worker buffers rows and stores them in batches (one insert per table per flush).
Its timer flushes every ``tick_s``; a step that closes just after a flush would wait
almost a whole tick before it is stored, acknowledged and announced. :class:`Pacer`
says when a flush is due because something closed: at once, unless the previous flush
was less than ``gap_s`` ago, then when the gap has passed. So a worker that closes a
step now and then stores it within milliseconds, and one whose many jobs close steps
all the time stores at most once per ``gap_s`` for them (each flush is an insert per
table and a ``jobstate`` message per changed job), not once per step. A worker behind
its input (the caller says when) uses ``backlog_gap_s`` instead: its steps wait for the
backlog anyway, and fewer, larger stores drain it faster.

Pure: the caller passes the time (any monotonic clock, in seconds).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Pacer:
    gap_s: float
    """Shortest time between two flushes that closed steps ask for (0: no limit)."""
    backlog_gap_s: float = 1.0
    """The same while the caller is behind its input."""
    waiting: bool = False
    """Whether something closed since the last flush that stored everything."""
    last_flush: float | None = None
    """When (the caller's clock) the latest flush was tried, whatever asked for it."""

    def closed(self) -> None:
        """Something closed (a step): it wants storing and announcing."""
        self.waiting = True

    def flushed(self, now: float, stored: bool) -> None:
        """A flush was tried at ``now`` (by the timer, back-pressure or this pacer);
        ``stored``: it stored everything, so what closed before it is dealt with."""
        self.ended(self.started(now), stored)

    def started(self, now: float) -> bool:
        """A flush of everything buffered starts at ``now``; returns whether anything
        closed before it (hand that to :meth:`ended`). What closes while it runs is not
        in it, so it is waiting again once it closes, whatever the flush's outcome."""
        had, self.waiting, self.last_flush = self.waiting, False, now
        return had

    def ended(self, had: bool, stored: bool) -> None:
        """The flush :meth:`started` returned ``had`` for is over; ``stored``: it stored
        everything it took, else what closed before it still waits."""
        if had and not stored:
            self.waiting = True

    def due_in(self, now: float, behind: bool = False) -> float | None:
        """Seconds until a flush is due for what closed (0.0: now); None when nothing
        closed since the last flush that stored everything. ``behind``: the caller is
        working through a backlog (``backlog_gap_s`` applies)."""
        if not self.waiting:
            return None
        if self.last_flush is None:
            return 0.0
        gap = max(self.gap_s, self.backlog_gap_s) if behind else self.gap_s
        return max(0.0, self.last_flush + gap - now)
