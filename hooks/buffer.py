"""The bounded hand-off between the training thread and the publisher thread.

``put`` never blocks and never grows memory past ``capacity``: when the publisher falls
behind (a slow or absent broker), the oldest records are dropped and counted. Step ends
travel in a second small queue so that dropping records can never drop the marker that
tells the stream a rank's step is complete.
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
        self._lock = threading.Lock()
        self.put_count = 0
        self.taken_count = 0
        self.dropped_count = 0
        self.dropped_ends = 0

    def put(self, record: Any) -> None:
        """Append a record (any thread); the oldest one goes if the buffer is full."""
        with self._lock:
            if len(self._records) == self.capacity:
                self.dropped_count += 1
            self._records.append(record)
            self.put_count += 1

    def end_step(self, step: int) -> None:
        """Mark ``step`` finished on this rank: every record of it was put before."""
        with self._lock:
            if len(self._ends) == self._ends.maxlen:
                self.dropped_ends += 1
            self._ends.append(step)

    def take(self) -> tuple[list[Any], list[int]]:
        """Everything buffered: (records in put order, steps ended).

        The step ends are read in the same critical section as the records, so every
        record of an ended step is in this take or an earlier one.
        """
        with self._lock:
            records = list(self._records)
            ends = list(self._ends)
            self._records.clear()
            self._ends.clear()
            self.taken_count += len(records)
        return records, ends

    def __len__(self) -> int:
        return len(self._records)
