"""A host's relay: the small op frames of the host's ranks in, bundles of them out.

A worker pays a fixed cost for every message (faust's hand-over, its own bookkeeping:
docs/contracts.md, "Bundles"), and a rank whose steps take seconds sends one small
message per step. The ranks' hooks (``HooksConfig.relay``) hand those frames to this
process over a Unix datagram socket; it gathers each job's frames by the relay rule
(``schemas/batching.py``: ``RelayRule``, ``Bundler``) and sends each bundle to
``<prefix>.ops`` under the job's key, so the worker reads one message per host and
moment, not one per rank. A bundle's frames go joined when they can (``x-joined``:
one set of column blocks, which the worker reads and checks once, not once a rank).

Trust: a datagram is data. One whose header names no job (not a frame, a broken
header) is sent alone under an empty key, for the worker to dead-letter with its
reason; one larger than the relay reads is counted and dropped (a rank sends only
frames well under it). Nothing a datagram says can make the relay put it in another
job's bundle: the job read from its header is the key the worker checks it against.

When the broker is away the relay keeps what it could not send and stops reading its
socket until the broker takes it: the socket's queue fills, and the ranks' hooks send
their frames themselves (spooling them when they cannot). So a relay loses only what it
holds when it is killed: at most ``linger_s`` of its host's frames, more during an
outage (counted as ``lost_at_close`` when it is stopped instead).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rankwatch.schemas import bundle, joined
from rankwatch.schemas.batching import Bundler, RelayRule

Send = Callable[[list[tuple[bytes, bytes]]], None]
"""Sends (key, value) messages to ``<prefix>.ops``, raising when not all of them were
delivered (``agent.outbox.KafkaTransport.send_many``)."""

RECEIVE_BUFFER = 8 * 1024 * 1024
"""The socket's queue (the kernel may give less): a host's frames of a few steps."""

MAX_JOB_CHARS = 256


@dataclass
class RelayCounters:
    frames_in: int = 0
    frames_sent: int = 0
    messages_sent: int = 0
    """Bundles and frames alone."""
    bundles_sent: int = 0
    joined_sent: int = 0
    """Of the bundles, those sent joined (``x-joined``, ``RelayRule.join``)."""
    unnamed: int = 0
    """Datagrams whose header names no job: sent alone, under an empty key."""
    truncated: int = 0
    """Datagrams larger than the relay reads: dropped."""
    send_failures: int = 0
    lost_at_close: int = 0
    """Frames still held when the relay stopped and the broker did not take them."""
    held: int = 0
    """Frames held now (open bundles and unsent messages)."""


@dataclass
class _Unsent:
    key: bytes
    value: bytes
    frames: int


class Relay:
    """The relay's loop; ``sock`` is a bound datagram socket, ``send`` the producer."""

    def __init__(
        self,
        sock: socket.socket,
        send: Send,
        rule: RelayRule | None = None,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = 1.0,
    ) -> None:
        self.sock = sock
        self.send = send
        self.rule = rule or RelayRule()
        self.clock = clock
        self.retry_s = retry_s
        self.counters = RelayCounters()
        self.bundler = Bundler(self.rule)
        self._unsent: list[_Unsent] = []
        self._retry_at = 0.0
        self._buffer = bytearray(self.rule.max_bytes)

    def run(
        self, stop: threading.Event, report: Callable[[RelayCounters], Any] | None = None
    ) -> RelayCounters:
        """Relay until ``stop`` is set, then send what is held; ``report`` is called
        about once a second with the counters."""
        next_report = 0.0
        while not stop.is_set():
            self.round()
            if report is not None and self.clock() >= next_report:
                next_report = self.clock() + 1.0
                report(self.snapshot())
        self.close()
        if report is not None:
            report(self.snapshot())
        return self.snapshot()

    def round(self, wait_s: float = 0.2) -> None:
        """Read what came (waiting up to ``wait_s``, less when a bundle falls due), send
        the bundles that are ready; while the broker is away, only retry."""
        if self._unsent:
            pause = self._retry_at - self.clock()
            if pause > 0:
                time.sleep(min(pause, wait_s))
                return
            self._flush()
            return
        deadline = self.bundler.deadline
        until = self.clock() + wait_s if deadline is None else min(deadline, self.clock() + wait_s)
        self._receive(until)
        self._queue(self.bundler.due(self.clock()))
        self._flush()

    def close(self) -> None:
        """Send every open bundle and what is unsent (one try); count what is left."""
        self._queue(self.bundler.drain())
        self._retry_at = 0.0
        self._flush()
        self.counters.lost_at_close += sum(u.frames for u in self._unsent)
        self._unsent.clear()

    def snapshot(self) -> RelayCounters:
        held = self.bundler.held + sum(u.frames for u in self._unsent)
        return RelayCounters(**{**asdict(self.counters), "held": held})

    # -- in ------------------------------------------------------------------------------

    def _receive(self, until: float) -> None:
        """The first datagram, waited for until ``until``, then those already queued
        (not waiting for more: a steady stream must not keep a due bundle back)."""
        wait = until - self.clock()
        if wait > 0:
            self.sock.settimeout(wait)
        else:
            self.sock.setblocking(False)
        for _ in range(self.rule.max_members):
            try:  # a socket with a timeout waits for data whatever the flags say
                size, _, flags, _ = self.sock.recvmsg_into([self._buffer])
            except (BlockingIOError, TimeoutError):
                return
            self.sock.setblocking(False)
            if flags & socket.MSG_TRUNC:
                self.counters.truncated += 1
                continue
            self._take(bytes(self._buffer[:size]))

    def _take(self, data: bytes) -> None:
        self.counters.frames_in += 1
        job = bundle.frame_job(data, MAX_JOB_CHARS)
        if job is None:
            self.counters.unnamed += 1
            self._unsent.append(_Unsent(b"", data, 1))
            return
        self._queue(self.bundler.add(self.clock(), job, data))

    def _queue(self, ready: list[tuple[str, list[bytes]]]) -> None:
        for job, frames in ready:
            value = joined.message(frames, self.rule.join)
            self._unsent.append(_Unsent(job.encode(), value, len(frames)))

    # -- out -----------------------------------------------------------------------------

    def _flush(self) -> None:
        """Send the unsent in the order they were made; keep them all when that fails
        (the worker takes a message delivered twice once, member by member)."""
        if not self._unsent:
            return
        try:
            self.send([(u.key, u.value) for u in self._unsent])
        except Exception:
            self.counters.send_failures += 1
            self._retry_at = self.clock() + self.retry_s
            return
        for item in self._unsent:
            self.counters.messages_sent += 1
            self.counters.frames_sent += item.frames
            self.counters.bundles_sent += item.frames > 1
            self.counters.joined_sent += joined.is_joined(item.value)
        self._unsent = []


class KafkaSender:
    """The relay's producer (``agent.outbox.KafkaTransport``): opened when first needed,
    closed after a failure and opened again at the next try."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self._open = False

    def __call__(self, items: list[tuple[bytes, bytes]]) -> None:
        if not self._open:
            self.transport.open()
            self._open = True
        try:
            self.transport.send_many(items)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._open:
            self._open = False
            self.transport.close()


def bind(path: str | Path) -> socket.socket:
    """The relay's datagram socket at ``path`` (a stale socket file there is replaced;
    any other file is an error)."""
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.stat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.bind(os.fspath(path))
    return sock
