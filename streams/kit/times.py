"""Table rows carry DateTime64 columns in UTC; the streams keep times as ns integers."""

from __future__ import annotations

from datetime import UTC, datetime


def utc(ns: int) -> datetime:
    """An ns timestamp as the timezone-aware datetime a DateTime64 column takes."""
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)
