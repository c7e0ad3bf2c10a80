"""Batched inserts of pipeline output into ClickHouse.

Rows are buffered per table and inserted in one batch per table. Every table the
pipeline writes is a ReplacingMergeTree keyed on the row's identity, so a batch
retried after a failure cannot leave duplicate rows once merged (and ``steps``, the
row that marks a step as stored, is written last: see below); the caller must not
commit its input offsets before :meth:`TableSink.flush` returned.

Order of a flush: raw ops, attributions, alerts and dead letters first, ``steps``
last. After a crash between two inserts a step has no ``steps`` row yet, so the
restarted worker analyses it again (its other rows are replaced by identical ones),
never the reverse (a stored step whose ops or attributions are missing).
"""

from __future__ import annotations

from typing import Any

from rankwatch.schemas.opbatch import OpBatch
from rankwatch.streams.kit.output import Output
from rankwatch.streams.kit.store import Store
from rankwatch.streams.kit.store_errors import StoreError

_LAST = ("steps", "detector_state")
"""Rows that mark progress (a stored step; a detector's snapshot, which lets its
messages be acknowledged): written after the rows they vouch for."""


class TableSink:
    def __init__(self, store: Store | None, max_rows: int = 5000, auto_flush: bool = True) -> None:
        self.store = store
        self.max_rows = max_rows
        self.auto_flush = auto_flush
        """Flush from :meth:`write` when the buffer is full (the embedded runner); a
        worker flushes itself, to handle failures and acknowledgements in one place."""
        self._buffer: dict[str, list[dict[str, Any]]] = {}
        self._ops: list[OpBatch] = []
        self._op_records = 0
        self.rows_written: dict[str, int] = {}
        self.failed_table: str | None = None
        """The table whose insert raised last (None after a flush that succeeded)."""

    @property
    def pending(self) -> int:
        """Rows buffered (op records included)."""
        return sum(len(rows) for rows in self._buffer.values()) + self._op_records

    @property
    def full(self) -> bool:
        return self.pending >= self.max_rows

    def write(self, out: Output) -> None:
        for table, rows in out.rows.items():
            self._buffer.setdefault(table, []).extend(rows)
        self._ops.extend(out.ops)
        self._op_records += sum(len(b) for b in out.ops)
        if self.auto_flush and self.full:
            self.flush()

    def flush(self) -> None:
        """Insert everything buffered; on failure what is not inserted stays for a retry
        (:class:`~rankwatch.streams.kit.store.StoreError`, ``transient`` says if waiting helps).
        A sink without a store yet (still connecting) fails as transient."""
        if self.store is None:
            if not self.pending:
                return
            raise StoreError("the store is not connected yet", transient=True)
        if self._ops:
            self.failed_table = "ops"
            self.store.insert_ops(self._ops)
            self._count("ops", self._op_records)
            self._ops, self._op_records = [], 0
        first = [t for t in self._buffer if t not in _LAST]
        for table in first + [t for t in _LAST if t in self._buffer]:
            rows = self._buffer[table]
            if rows:
                self.failed_table = table
                self.store.insert(table, rows)
                self._count(table, len(rows))
            del self._buffer[table]
        self.failed_table = None

    def detach(self) -> TableSink:
        """What is buffered, as a sink of its own (same store and counts), leaving this
        one empty: a flush of it can run in another thread while rows come in here."""
        taken = TableSink(self.store, self.max_rows, auto_flush=False)
        taken.rows_written = self.rows_written
        taken._buffer, taken._ops, taken._op_records = self._buffer, self._ops, self._op_records
        self._buffer, self._ops, self._op_records = {}, [], 0
        return taken

    def put_back(self, taken: TableSink) -> None:
        """What a detached sink's flush did not insert goes back, ahead of the rows
        buffered since (one batch per table keeps its order)."""
        for table, rows in self._buffer.items():
            taken._buffer.setdefault(table, []).extend(rows)
        self._buffer = taken._buffer
        self._ops = taken._ops + self._ops
        self._op_records += taken._op_records
        taken._buffer, taken._ops, taken._op_records = {}, [], 0

    def isolate(self, table: str, limit: int) -> list[tuple[Any, StoreError]]:
        """The rows of ``table`` the store refuses, each with why, after inserting all
        the others: the batch whose insert was refused is split in halves, and each half
        again while it is refused, down to the rows refused alone. Nothing is taken out
        of the buffer (:meth:`discard` does, once the refused rows are dead letters).

        Raises :class:`StoreError` when an insert fails for another reason than the
        rows (the store is failing: every row stays buffered for the retry), or when more
        than ``limit`` rows are refused alone (then the table, not its rows, is at fault).
        Rows of ``ops`` are op batches, refused a batch at a time."""
        assert self.store is not None
        store, refused = self.store, []
        insert = store.insert_ops if table == "ops" else lambda rows: store.insert(table, rows)
        items: list[Any] = list(self._ops if table == "ops" else self._buffer.get(table, []))

        def attempt(part: list[Any]) -> None:
            try:
                insert(part)
            except StoreError as exc:
                if not exc.refused:
                    raise
                if len(part) > 1:
                    half = len(part) // 2
                    attempt(part[:half])
                    attempt(part[half:])
                    return
                refused.append((part[0], exc))
                if len(refused) > limit:
                    raise StoreError(
                        f"{table} refuses more than {limit} rows, each alone: the table does"
                        f" not take them ({exc})"
                    ) from exc

        half = len(items) // 2  # the whole batch was refused already
        for part in (items[:half], items[half:]) if half else (items,):
            attempt(part)
        return refused

    def discard(self, table: str, refused: list[Any]) -> None:
        """Take ``table``'s buffered rows out once :meth:`isolate` stored the good ones
        and the ``refused`` ones are dead letters; the good ones are counted written."""
        if table == "ops":
            n = self._op_records - sum(len(batch) for batch in refused)
            self._ops, self._op_records = [], 0
        else:
            n = len(self._buffer.pop(table, [])) - len(refused)
        self._count(table, n)
        if self.failed_table == table:
            self.failed_table = None

    def _count(self, table: str, n: int) -> None:
        self.rows_written[table] = self.rows_written.get(table, 0) + n
