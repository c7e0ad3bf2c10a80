"""An in-memory stand-in for :class:`rankwatch.streams.kit.store.Store`, for unit tests of
shell logic (retries, ordering, acknowledgements) that must make the store fail on
demand. Integration tests use the real chDB store."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rankwatch.streams.kit.store_errors import StoreError


class MemoryStore:
    """Records inserts in order. While ``down`` every call fails as a lost connection
    does; while ``full`` every insert fails as a full disk does (not transient, not a
    refusal); a row for which ``refuses(table, row)`` holds is refused, and with it the
    insert it is in, as the engine refuses a batch with one bad value."""

    def __init__(
        self,
        *,
        down: bool = False,
        full: bool = False,
        refuses: Callable[[str, Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self.down = down
        self.full = full
        self.refuses = refuses or (lambda table, row: False)
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
        if self.full:
            raise StoreError(f"insert into {table}: Code: 243. NOT_ENOUGH_SPACE")
        if any(self.refuses(table, row) for row in rows):
            raise StoreError(f"insert into {table}: Code: 469. VIOLATED_CONSTRAINT", refused=True)
        self.order.append(table)
        self.rows.setdefault(table, []).extend(dict(r) for r in rows)

    def insert_ops(self, batches: Sequence[Any]) -> None:
        self.insert("ops", [{"n": len(b)} for b in batches])

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> list[dict]:
        self._check()
        return []

    def close(self) -> None:
        pass
