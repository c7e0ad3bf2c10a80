"""A local spool file: messages the broker did not take, kept for a later resend.

Frames are ``kind code (1 byte) | records (4 bytes) | length (4 bytes) | payload``, so a
resend knows how many op records each message carries (for the accounting). The file
is bounded; a message that does not fit is refused and the caller counts it dropped.
Only the publisher thread touches it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

KINDS = ("ops", "heartbeats")
_HEADER = struct.Struct(">BII")


class Message(NamedTuple):
    kind: str
    value: bytes
    records: int
    """Op records inside (0 for heartbeats)."""


class Spool:
    def __init__(self, path: str | os.PathLike[str], max_bytes: int = 256 * 1024 * 1024) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._size = self.path.stat().st_size if self.path.exists() else 0

    @property
    def size(self) -> int:
        return self._size

    def append(self, message: Message) -> bool:
        """Write one message; False (nothing written) when the spool is full."""
        frame = _HEADER.pack(KINDS.index(message.kind), message.records, len(message.value))
        if self._size + len(frame) + len(message.value) > self.max_bytes:
            return False
        with self.path.open("ab") as f:
            f.write(frame + message.value)
        self._size += len(frame) + len(message.value)
        return True

    def read(self) -> list[Message]:
        """Every complete message in the file (a torn last frame is ignored)."""
        if not self._size:
            return []
        data = self.path.read_bytes()
        out: list[Message] = []
        pos = 0
        while pos + _HEADER.size <= len(data):
            code, records, length = _HEADER.unpack_from(data, pos)
            start = pos + _HEADER.size
            if start + length > len(data):
                break
            out.append(Message(KINDS[code], data[start : start + length], records))
            pos = start + length
        return out

    def replace(self, messages: list[Message]) -> None:
        """Keep only ``messages`` (those a resend did not deliver), atomically."""
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with tmp.open("wb") as f:
            for m in messages:
                f.write(_HEADER.pack(KINDS.index(m.kind), m.records, len(m.value)) + m.value)
        tmp.replace(self.path)
        self._size = self.path.stat().st_size

    def pending_records(self) -> int:
        return sum(m.records for m in self.read())
