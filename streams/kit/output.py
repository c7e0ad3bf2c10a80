"""What every worker's pure core hands its shell: rows per table, messages to publish
once those rows are stored, dead letters, and where each message came from.

The ops pipeline, the hang service and the Minder monitor all return an
:class:`Output`; the shell stores its rows through the sink (``kit.sink``) and only
then publishes its messages. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from rankwatch.schemas.errors import InvalidMessage
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.tables import CONTRACTS
from rankwatch.streams.kit.deadletter import DeadLetter
from rankwatch.streams.kit.times import utc


@dataclass(frozen=True)
class Source:
    """Where a message came from, for dead letters (offset -1 when not from Kafka)."""

    topic: str
    partition: int = -1
    offset: int = -1
    key: bytes | None = None
    timestamp_ns: int | None = None
    """The broker's timestamp: dead letters carry it, so a re-delivered bad message
    gives the same row (the table collapses it) rather than a second one."""


def keyless(source: Source) -> InvalidMessage | None:
    """Why a record read from a topic without a key (or with an empty one) is refused:
    every topic is keyed by job, so that one worker holds all of a job's state; a keyless
    record may reach a worker that does not own its job. None for a keyed record, and
    for one that came from no topic (a replay in-process: partition -1)."""
    if source.partition < 0 or source.key:
        return None
    return InvalidMessage("no-key", "the record has no key: records are keyed by job")


DEAD_LETTERS = "dead-letters"
"""The kind (topic ``<prefix>.dead-letters``) of a refused message's publication."""


@dataclass(frozen=True)
class Publication:
    """One message for ``<prefix>.<kind>``, keyed by job, sent once its rows are stored."""

    kind: str
    key: str
    value: bytes
    headers: list[tuple[str, bytes]] | None = None

    @classmethod
    def of_dead_letter(cls, letter: DeadLetter) -> Publication:
        return cls(DEAD_LETTERS, letter.key, letter.data, letter.headers())


@dataclass
class Output:
    """Rows per ClickHouse table produced by one call."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    steps: list[Any] = field(default_factory=list)
    """The ops wing's assembled steps (``AssembledStep``) the call closed."""
    messages: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """(kind, key, message) to publish once the rows are stored."""
    ops: list[OpBatch] = field(default_factory=list)
    """Accepted op batches, for the raw ``ops`` table (when the pipeline keeps them)."""
    pending: tuple[tuple[str, int], ...] = ()
    """(job, step) of the open steps the message fed: not stored until they close."""
    dead_letters: list[DeadLetter] = field(default_factory=list)
    """Refused messages, for the dead-letter topic once their rows are stored."""

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.rows.setdefault(table, []).append(row)

    def extend(self, other: Output) -> None:
        for table, rows in other.rows.items():
            self.rows.setdefault(table, []).extend(rows)
        self.steps.extend(other.steps)
        self.messages.extend(other.messages)
        self.ops.extend(other.ops)
        self.pending += other.pending
        self.dead_letters.extend(other.dead_letters)

    def __bool__(self) -> bool:
        return any(self.rows.values()) or bool(self.ops)


def alert_row(message: Mapping[str, Any]) -> dict[str, Any]:
    """The ``alerts`` row of an alert message (straggler, hang or Minder): the message's
    fields as its table contract says, evidence as JSON, ``time`` its ms copy."""
    row = CONTRACTS["alerts"].row(message, time=utc(message["ts_ns"]))
    row["evidence"] = orjson.dumps(message["evidence"]).decode()
    return row
