"""The dead-letter row of a message that could not be decoded (one shape for every topic)."""

from __future__ import annotations

from typing import Any

from rankwatch.streams.times import utc

PAYLOAD_BYTES = 4096
"""How much of a rejected message the row keeps (enough to debug)."""


def dead_letter_row(
    data: bytes, source: Any, now_ns: int, reason: str, detail: str
) -> dict[str, Any]:
    """``source`` is a :class:`rankwatch.streams.pipeline.Source` (topic, partition,
    offset, key, broker timestamp). The row's time is the broker's timestamp when known,
    so a re-delivered bad message gives the same row (the table collapses it)."""
    stamp = getattr(source, "timestamp_ns", None)
    return {
        "time": utc(now_ns if stamp is None else stamp),
        "topic": source.topic,
        "partition": source.partition,
        "offset": source.offset,
        "key": (source.key or b"").decode("utf-8", "replace"),
        "reason": reason,
        "detail": detail[:1000],
        "payload": data[:PAYLOAD_BYTES].decode("utf-8", "replace"),
        "payload_bytes": len(data),
    }
