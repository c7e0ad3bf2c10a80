"""Dead letters: a message a worker refused, with the reason (one shape for every topic).

Each goes to the ``dead_letters`` table (for SQL) and, from the workers, to the
``<prefix>.dead-letters`` topic (for automation): keyed by job (the message's own key,
else the job its body names), the value the original bytes untouched, the reason and where the
message came from in headers (:data:`rankwatch.schemas.topics.DEAD_LETTER_HEADERS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.tables import table_row
from rankwatch.schemas.topics import DEAD_LETTER_HEADERS
from rankwatch.streams.kit.times import utc

PAYLOAD_BYTES = 4096
"""How much of a rejected message the row keeps (enough to debug; the topic has it all)."""


@dataclass(frozen=True)
class DeadLetter:
    """One refused message, as it goes to the dead-letter topic."""

    key: str
    data: bytes
    reason: str
    detail: str
    topic: str
    partition: int
    offset: int

    def headers(self) -> list[tuple[str, bytes]]:
        values = (self.reason, self.detail, self.topic, str(self.partition), str(self.offset))
        return [(name, v.encode()) for name, v in zip(DEAD_LETTER_HEADERS, values, strict=True)]


def dead_letter(data: bytes, source: Any, reason: str, detail: str, job: str = "") -> DeadLetter:
    """``source`` is a :class:`rankwatch.streams.kit.output.Source`; ``job`` the job the
    body names, when it could be read. Keyed as it was read (the partition's job: a body
    that names another is the suspect), else by the body's job. A record without a value
    (a tombstone) goes on with an empty one."""
    key = (source.key or b"").decode("utf-8", "replace") or job
    return DeadLetter(
        key,
        bytes(data or b""),
        reason,
        detail[:1000],
        source.topic,
        source.partition,
        source.offset,
    )


def dead_letter_row(
    data: bytes, source: Any, now_ns: int, reason: str, detail: str
) -> dict[str, Any]:
    """``source`` is a :class:`rankwatch.streams.kit.output.Source` (topic, partition,
    offset, key, broker timestamp). The row's time is the broker's timestamp when known,
    so a re-delivered bad message gives the same row (the table collapses it). A record
    without a value (a tombstone) has an empty payload."""
    data = data or b""
    stamp = getattr(source, "timestamp_ns", None)
    return table_row(
        "dead_letters",
        time=utc(now_ns if stamp is None else stamp),
        topic=source.topic,
        partition=source.partition,
        offset=source.offset,
        key=(source.key or b"").decode("utf-8", "replace"),
        reason=reason,
        detail=detail[:1000],
        payload=data[:PAYLOAD_BYTES].decode("utf-8", "replace"),
        payload_bytes=len(data),
    )


STORE_REFUSED = "store-refused"
"""The reason of a row the store refused for what it holds (``dead_letters.reason``)."""


def refused_row_letter(table: str, item: Any, detail: str, now_ns: int) -> dict[str, Any]:
    """The ``dead_letters`` row of one row the store refused (an op batch, for ``ops``):
    its topic is ``store:<table>``, its payload the row as JSON (a batch: its header and
    size), its key the job it names."""
    if isinstance(item, OpBatch):
        body: Any = {
            "job": item.job,
            "rank": item.rank,
            "batch_seq": item.batch_seq,
            "steps": list(item.step_span),
            "records": len(item),
        }
        job = item.job
    else:
        body, job = dict(item), str(item.get("job", ""))
    data = orjson.dumps(body, default=str, option=orjson.OPT_SERIALIZE_NUMPY)
    return table_row(
        "dead_letters",
        time=utc(now_ns),
        topic=f"store:{table}",
        partition=-1,
        offset=-1,
        key=job,
        reason=STORE_REFUSED,
        detail=detail[:1000],
        payload=data[:PAYLOAD_BYTES].decode("utf-8", "replace"),
        payload_bytes=len(data),
    )
