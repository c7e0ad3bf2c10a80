"""The bounded hand-off between the training thread and the publisher thread.

``put`` never blocks and never grows memory past ``capacity``: when the publisher falls
behind (a slow or absent broker), the oldest records are dropped and counted. Step ends
travel in a second small queue so that dropping records can never drop the marker that
tells the stream a rank's step is complete.

No lock on the hot path (a lock cost ~0.5 µs per op here): deque appends and pops are
atomic, and the counters are written by the putting thread only, so records are put
from one thread (the training thread; the integrations ignore other threads). The
taker reads step ends before records, so every record of an ended step is in that
take or an earlier one.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class RecordBuffer:
    def __init__(self, capacity: int = 100_000, max_step_ends: int = 4096) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._records: deque[Any] = deque(maxlen=capacity)
        self._ends: deque[int] = deque(maxlen=max_step_ends)
        self._notes: deque[Any] = deque(maxlen=max_step_ends)
        self._lock = threading.Lock()
        self.put_count = 0
        self.taken_count = 0
        self.dropped_count = 0
        self.dropped_ends = 0

    def put(self, record: Any) -> None:
        """Append a record (the putting thread); the oldest one goes if the buffer is full."""
        records = self._records
        if len(records) == self.capacity:
            self.dropped_count += 1
        records.append(record)
        self.put_count += 1

    def end_step(self, step: int, notes: Any = None) -> None:
        """Mark ``step`` finished on this rank: every record of it was put before.
        ``notes``: the step's signal notes (``signals.StepNotes.close``), if any."""
        if len(self._ends) == self._ends.maxlen:
            self.dropped_ends += 1
        if notes is not None:
            self._notes.append(notes)
        self._ends.append(step)

    def take(self) -> tuple[list[Any], list[int]]:
        """Everything buffered: (records in put order, steps ended). One taker at a time."""
        records, ends, _ = self.take_all()
        return records, ends

    def take_all(self) -> tuple[list[Any], list[int], list[Any]]:
        """(records, steps ended, their notes): notes and ends are read before the
        records, so every record of a step whose notes are here is here or taken before."""
        with self._lock:
            notes = _drain(self._notes)
            ends = _drain(self._ends)
            records = _drain(self._records)
            self.taken_count += len(records)
        return records, ends, notes

    def __len__(self) -> int:
        return len(self._records)


def _drain(queue: deque[Any]) -> list[Any]:
    """Pop everything, one atomic popleft at a time (a put may land meanwhile)."""
    out = []
    pop = queue.popleft
    try:
        while True:
            out.append(pop())
    except IndexError:
        return out
