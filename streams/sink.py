"""Buffer pipeline output and write it to ClickHouse in batches.

Inserts are idempotent at the table level (ReplacingMergeTree keyed by job and
step, see the migrations), so a batch retried after a failure cannot duplicate
rows; the caller must not commit its input offsets before :meth:`TableSink.flush`
returned.
"""

from __future__ import annotations

from typing import Any

from rankwatch.streams.pipeline import Output
from rankwatch.streams.store import Store


class TableSink:
    def __init__(self, store: Store, max_rows: int = 5000) -> None:
        self.store = store
        self.max_rows = max_rows
        self._buffer: dict[str, list[dict[str, Any]]] = {}
        self.rows_written: dict[str, int] = {}

    @property
    def pending(self) -> int:
        return sum(len(rows) for rows in self._buffer.values())

    def write(self, out: Output) -> None:
        for table, rows in out.rows.items():
            self._buffer.setdefault(table, []).extend(rows)
        if self.pending >= self.max_rows:
            self.flush()

    def flush(self) -> None:
        """Insert everything buffered; on failure the buffer is kept for a retry."""
        for table in list(self._buffer):
            rows = self._buffer[table]
            if rows:
                self.store.insert(table, rows)
                self.rows_written[table] = self.rows_written.get(table, 0) + len(rows)
            del self._buffer[table]
