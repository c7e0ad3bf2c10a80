"""Table rows carry DateTime64 columns in UTC; the streams keep times as ns integers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc(ns: int) -> datetime:
    """An ns timestamp as the timezone-aware datetime a DateTime64 column takes,
    truncated to the microsecond in integers: ``datetime.fromtimestamp(ns / 1e9)``
    rounds through a float to the nearest microsecond, so 12:00:00.085999717 became
    .086000 and a millisecond column read .086 where every other path stores .085."""
    return _EPOCH + timedelta(microseconds=ns // 1000)
