"""An in-memory stand-in for :class:`rankwatch.streams.kit.store.Store`, for unit tests of
shell logic (retries, ordering, acknowledgements) that must make the store fail on
demand. Integration tests use the real chDB store."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rankwatch.streams.kit.store import StoreError


class MemoryStore:
    """Records inserts in order; fails (transiently) while ``down``, and for good on the
    tables in ``rejects``."""

    def __init__(self, *, down: bool = False, rejects: Sequence[str] = ()) -> None:
        self.down = down
        self.rejects = set(rejects)
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.order: list[str] = []
        """Tables in the order their inserts arrived."""
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise StoreError("connection refused", transient=True)

    def migrate(self) -> list[str]:
        self._check()
        return []

    def insert(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self._check()
        if table in self.rejects:
            raise StoreError(f"{table}: rows do not fit the table")
        self.order.append(table)
        self.rows.setdefault(table, []).extend(dict(r) for r in rows)

    def insert_ops(self, batches: Sequence[Any]) -> None:
        self.insert("ops", [{"n": len(b)} for b in batches])

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> list[dict]:
        self._check()
        return []

    def close(self) -> None:
        pass
