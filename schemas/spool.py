"""A local spool file: messages the broker did not take, kept for a later resend.

A contract between two processes of a host, so it lives with the others: the hooks write
it (``rankwatch.hooks``), the host's agent or relay reads what a rank left behind
(``rankwatch.agent.spools``).

A file opens with its head: ``RWSP``, the length of what follows (4 bytes), and a JSON
object saying whose it is and where its messages go (``job``, ``rank``,
``topic_prefix``, ``kafka``), so that whoever sends a spool its rank left behind sends
it where the rank would have. Frames follow: ``kind code (1 byte) | records (4 bytes) |
length (4 bytes) | payload``, so a resend knows how many op records each message
carries (for the accounting). The file is bounded; a message that does not fit is
refused and the caller counts it dropped. Only the publisher thread touches it.

A rank spools by default, into :func:`default_spool_dir` (private to the user, on the
host's own disk), and holds an exclusive ``flock`` on ``<file>.lock`` while it runs: a
file whose lock is free belongs to a rank that is gone, and the host's agent or relay
sends it (``rankwatch.agent.spools``), so a job that ends while the broker is away
loses nothing even if it never runs again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import orjson

KINDS = ("ops", "heartbeats")
_HEADER = struct.Struct(">BII")
_MAGIC = b"RWSP"
_HEAD_LENGTH = struct.Struct(">I")
SUFFIX = ".spool"
LOCK_SUFFIX = ".lock"
DEFAULT_MAX_BYTES = 128 * 1024 * 1024
"""A rank's spool at most (about 3 million op records): what a rank publishing SE-like
steps writes in hours of broker outage."""


class SpoolError(OSError):
    """The spool cannot be used: its directory is not private, or cannot be made."""


class SpoolBusy(SpoolError):
    """Another live process holds this spool (the same rank run twice, or an agent
    sending it)."""


class Message(NamedTuple):
    kind: str
    value: bytes
    records: int
    """Op records inside (0 for heartbeats)."""


def default_spool_dir() -> Path:
    """``$TMPDIR/rankwatch-<uid>/spool``: per user (the directory is the user's alone,
    mode 0700) and on the host's own disk, where its agent finds it; not the home
    directory, which clusters share over NFS, where ``flock`` cannot be trusted."""
    return Path(tempfile.gettempdir()) / f"rankwatch-{os.getuid()}" / "spool"


def private_dir(path: Path) -> Path:
    """``path``, made if missing (mode 0700, and its parent too when that is the default's
    ``rankwatch-<uid>``), after checking no one else can write there: in a shared /tmp,
    a directory someone else made first (or a link to one) would let them read and plant
    spooled messages. Raises :class:`SpoolError` saying why."""
    ours = (path, path.parent) if path.parent.name.startswith("rankwatch-") else (path,)
    for folder in reversed(ours):  # made private one level at a time (not by umask)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for folder in ours:
        info = folder.lstat()
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise SpoolError(f"spool directory {folder} is not a directory of its own")
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise SpoolError(
                f"spool directory {folder} is not private to this user"
                f" (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})"
            )
    return path


def take_lock(path: Path) -> int | None:
    """An exclusive lock on ``<path>.lock`` (its descriptor), or None when another
    process holds it."""
    fd = os.open(f"{path}{LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class Spool:
    """One rank's spool file. ``lock``: hold ``<path>.lock`` for as long as the spool is
    open (raises :class:`SpoolBusy` when another process holds it); the agent that sends
    a dead rank's spool takes the lock itself and opens it without."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        lock: bool = True,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._head = _MAGIC + _HEAD_LENGTH.pack(0) if meta is None else _head_of(meta)
        """The head written when the file is made (a file that exists keeps its own)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = None
        if lock:
            self._lock_fd = take_lock(self.path)
            if self._lock_fd is None:
                raise SpoolBusy(f"spool {self.path} is held by another process")
        self._size = self.path.stat().st_size if self.path.exists() else 0

    @property
    def size(self) -> int:
        return self._size

    def append(self, message: Message) -> bool:
        """Write one message; False (nothing written, the caller counts it dropped) when
        the spool is full, or its disk is (a frame cut short by the disk is cut off again:
        the file stays whole)."""
        frame = _HEADER.pack(KINDS.index(message.kind), message.records, len(message.value))
        head = b"" if self._size else self._head
        if self._size + len(head) + len(frame) + len(message.value) > self.max_bytes:
            return False
        try:
            with self.path.open("ab") as f:
                f.write(head + frame + message.value)
        except OSError:
            with contextlib.suppress(OSError):
                os.truncate(self.path, self._size)
            return False
        self._size += len(head) + len(frame) + len(message.value)
        return True

    @property
    def meta(self) -> dict[str, Any]:
        """Whose the file is and where its messages go (empty for a file without a head,
        or with a head this version cannot read)."""
        data = self._bytes()
        return _meta_of(data) if data else {}

    def read(self) -> list[Message]:
        """Every complete message in the file (a torn last frame is ignored)."""
        data = self._bytes()
        out: list[Message] = []
        pos = _frames_start(data)
        while pos + _HEADER.size <= len(data):
            code, records, length = _HEADER.unpack_from(data, pos)
            start = pos + _HEADER.size
            if start + length > len(data) or code >= len(KINDS):
                break
            out.append(Message(KINDS[code], data[start : start + length], records))
            pos = start + length
        return out

    def replace(self, messages: list[Message]) -> None:
        """Keep only ``messages`` (those a resend did not deliver), atomically."""
        data = self._bytes()
        head = data[: _frames_start(data)] or self._head
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with tmp.open("wb") as f:
            if messages:
                f.write(head)
            for m in messages:
                f.write(_HEADER.pack(KINDS.index(m.kind), m.records, len(m.value)) + m.value)
        tmp.replace(self.path)
        self._size = self.path.stat().st_size

    def pending_records(self) -> int:
        return sum(m.records for m in self.read())

    def _bytes(self) -> bytes:
        if not self._size:
            return b""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:  # sent and removed by an agent after close
            return b""

    def close(self) -> None:
        """Let the lock go: the file, if anything is left in it, is the agent's to send;
        an empty one is removed with its lock file."""
        if self._lock_fd is None:
            return
        if not self._size:
            for leftover in (self.path, Path(f"{self.path}{LOCK_SUFFIX}")):
                leftover.unlink(missing_ok=True)
        os.close(self._lock_fd)
        self._lock_fd = None


def _head_of(meta: Mapping[str, Any]) -> bytes:
    body = orjson.dumps(dict(meta))
    return _MAGIC + _HEAD_LENGTH.pack(len(body)) + body


def _frames_start(data: bytes) -> int:
    """Where the frames begin: after the head (0 for a file without one, as written
    before heads existed)."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _HEAD_LENGTH.size:
        return 0
    (length,) = _HEAD_LENGTH.unpack_from(data, len(_MAGIC))
    return len(_MAGIC) + _HEAD_LENGTH.size + length


def _meta_of(data: bytes) -> dict[str, Any]:
    start = len(_MAGIC) + _HEAD_LENGTH.size
    body = data[start : _frames_start(data)]
    try:
        meta = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        return {}
    return meta if isinstance(meta, dict) else {}
