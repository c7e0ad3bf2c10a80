"""A rank's beacon: its latest heartbeat, in a file on its own host, for the host's agent.

A contract between two processes of a host, like the spool: the hooks write it (the
publisher thread, at each heartbeat), the host's ``rankwatch agent`` reads it
(``rankwatch.agent.stacks``). A rank that is stopped (SIGSTOP), wedged with the GIL
held, or blocked where none of its threads runs cannot dump its own stack: its
heartbeats stop, and the age of this file says so on the host itself, with the pid to
look at from outside (py-spy). No message from the network decides which process the
agent looks at.

The file is ``<spool dir>/beats/<job>.rank<N>.<pid>.beat``: one JSON line of meta
(``topic_prefix``, where the agent sends the stacks it takes) and the heartbeat message
as the rank sent it (heartbeats schema). It is written whole into a temporary file and
renamed over the last one, so a reader never sees half of one; its modification time
is when the rank last beat. A rank that ends cleanly removes it.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

import orjson

BEATS = "beats"
SUFFIX = ".beat"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def beats_dir(spool_dir: Path) -> Path:
    """Where the beacons of ranks spooling into ``spool_dir`` go."""
    return spool_dir / BEATS


class Beacon:
    """The writer, on the rank's publisher thread."""

    def __init__(self, folder: Path, job: str, rank: int, topic_prefix: str) -> None:
        name = f"{_UNSAFE.sub('_', job)[:128]}.rank{rank}.{os.getpid()}{SUFFIX}"
        self.path = folder / name
        self._tmp = folder / f".{name}.tmp"
        self._head = orjson.dumps({"topic_prefix": topic_prefix}) + b"\n"

    def write(self, heartbeat: bytes) -> None:
        self._tmp.write_bytes(self._head + heartbeat)
        os.replace(self._tmp, self.path)

    def remove(self) -> None:
        for path in (self.path, self._tmp):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class Beat(NamedTuple):
    """A beacon as read: where to send, the heartbeat, when it was written."""

    path: Path
    topic_prefix: str
    heartbeat: dict[str, Any]
    written_ns: int


def read_beacon(path: Path) -> Beat:
    """Raises ``OSError`` (gone meanwhile), ``ValueError`` or ``InvalidMessage`` (not a
    beacon: the heartbeat is checked against its schema)."""
    from rankwatch.schemas.codec import decode  # the reader's side (numpy): not the hooks'

    written_ns = path.stat().st_mtime_ns
    head, _, heartbeat = path.read_bytes().partition(b"\n")
    meta = orjson.loads(head)
    prefix = meta.get("topic_prefix") if isinstance(meta, dict) else None
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"{path.name}: no topic_prefix in its head")
    return Beat(path, prefix, decode("heartbeats", heartbeat), written_ns)
