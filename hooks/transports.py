"""Where the publisher thread sends messages: Kafka, a spool file, or an in-process sink.

A transport's ``send`` takes a list of messages and says, per message, whether it was
delivered; it never raises for a delivery failure (the publisher spools or drops and
counts what failed). Only the publisher thread calls it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rankwatch.schemas.batching import RelayRule
from rankwatch.schemas.spool import Message, Spool
from rankwatch.schemas.topics import TOPICS

log = logging.getLogger("rankwatch.hooks")
ALONE_BYTES = RelayRule().alone_bytes
"""Ops frames this large go ``direct`` even with a relay (it would send them alone)."""


class Transport(Protocol):
    def send(self, messages: Sequence[Message]) -> list[bool]: ...

    def close(self) -> None: ...


class SinkTransport:
    """Hands each message to ``deliver(kind, value)`` in this process (the embedded mode).

    ``deliver`` raising counts as a failed delivery for that message.
    """

    def __init__(self, deliver: Callable[[str, bytes], None]) -> None:
        self.deliver = deliver

    def send(self, messages: Sequence[Message]) -> list[bool]:
        ok = []
        for m in messages:
            try:
                self.deliver(m.kind, m.value)
                ok.append(True)
            except Exception:
                ok.append(False)
        return ok

    def close(self) -> None:
        pass


class SpoolTransport:
    """Writes every message to a local spool file (no broker at all)."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool

    def send(self, messages: Sequence[Message]) -> list[bool]:
        return [self.spool.append(m) for m in messages]

    def close(self) -> None:
        self.spool.close()


class KafkaTransport:
    """aiokafka on a private event loop owned by the publisher thread.

    Loaded lazily: importing the hooks never imports aiokafka. A broker that is down
    makes ``send`` fail within about ``timeout_s`` (the producer's request timeout also
    expires queued batches); the producer is then dropped and restarted at most every
    ``retry_s``, so a dead broker costs the publisher thread little.

    A message counts as sent once every in-sync replica has it (``acks=all``): with
    ``acks=1`` a leader that fails before its followers copied a batch loses it after
    acknowledging it. The producer is idempotent, so its own retries inside one session
    add no copies (a message resent from the spool by a new session may: the worker takes
    a batch once, by its rank, ``batch_seq`` and first step). Without aiokafka installed,
    every send fails, said once in the log (``pip install 'rankwatch[kafka]'``).
    """

    def __init__(
        self,
        bootstrap: str,
        key: bytes,
        topics: dict[str, str] | None = None,
        timeout_s: float = 2.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bootstrap = bootstrap
        self.key = key
        self.topics = topics or TOPICS
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer: Any = None
        self._next_try = 0.0
        self.last_error = ""

    def send(self, messages: Sequence[Message]) -> list[bool]:
        if not messages:
            return []
        if self._producer is None and not self._start():
            return [False] * len(messages)
        assert self._loop is not None
        ok = self._loop.run_until_complete(self._send(messages))
        if not all(ok):
            self._drop_producer()
        return ok

    def close(self) -> None:
        self._drop_producer(graceful=True)
        if self._loop is not None:
            _close_loop(self._loop)
            self._loop = None

    async def _send(self, messages: Sequence[Message]) -> list[bool]:
        futures: list[Any] = []
        for m in messages:
            try:
                topic = self.topics[m.kind]
                futures.append(await self._producer.send(topic, m.value, key=self.key))
            except Exception as exc:  # no metadata within the timeout: the broker is away,
                self.last_error = repr(exc)  # so fail the rest now rather than one by one
                futures += [None] * (len(messages) - len(futures))
                break
        ok = []
        deadline = self.clock() + self.timeout_s * 2
        for fut in futures:
            if fut is None:
                ok.append(False)
                continue
            try:
                await asyncio.wait_for(fut, max(deadline - self.clock(), 0.01))
                ok.append(True)
            except Exception as exc:
                self.last_error = repr(exc)
                ok.append(False)
        return ok

    def _start(self) -> bool:
        now = self.clock()
        if now < self._next_try:
            return False
        self._next_try = now + self.retry_s
        try:
            from aiokafka import AIOKafkaProducer
        except ImportError as exc:
            if not self.last_error:
                log.warning(
                    "rankwatch hooks: cannot send to Kafka, aiokafka is not installed"
                    " (pip install 'rankwatch[kafka]'): records go to the spool, if any"
                )
            self.last_error = repr(exc)
            return False

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop.set_exception_handler(_quiet)
        ms = int(self.timeout_s * 1000)

        async def start() -> Any:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",
                enable_idempotence=True,
                linger_ms=5,
                request_timeout_ms=ms,
                retry_backoff_ms=100,
                max_request_size=8 * 1024 * 1024,
                metadata_max_age_ms=5000,
            )
            try:
                await asyncio.wait_for(producer.start(), self.timeout_s)
            except BaseException:
                await _abandon(producer)
                raise
            return producer

        try:
            self._producer = self._loop.run_until_complete(start())
        except Exception as exc:
            self.last_error = repr(exc)
            self._producer = None
            return False
        return True

    def _drop_producer(self, graceful: bool = False) -> None:
        if self._producer is None or self._loop is None:
            return
        producer, self._producer = self._producer, None
        self._next_try = self.clock() + (0 if graceful else self.retry_s)
        try:
            if graceful:
                self._loop.run_until_complete(asyncio.wait_for(producer.stop(), self.timeout_s))
            else:
                self._loop.run_until_complete(_abandon(producer))
        except Exception as exc:
            self.last_error = repr(exc)


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """What the producer's loop would print on stderr (a connection future nobody read
    after a broker went away, a task destroyed pending): one debug line instead. The
    default handler writes a traceback into the training job's output, from whichever
    thread collects the object, at any later moment."""
    log.debug(
        "rankwatch hooks: kafka client: %s %r", context.get("message"), context.get("exception")
    )


def _close_loop(loop: asyncio.AbstractEventLoop, wait_s: float = 1.0) -> None:
    """Close the producer's loop with nothing left pending on it: a producer stopped
    while the broker was away leaves its metadata and sender tasks waiting."""
    with contextlib.suppress(Exception):
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=wait_s))
        for task in pending:
            if task.done() and not task.cancelled():
                task.exception()  # read: never reported as unretrieved
        loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


async def _abandon(producer: Any) -> None:
    """Stop a producer without waiting for its queued batches (they failed already)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.stop(), 0.5)


class RelayTransport:
    """Small ops frames to this host's relay (``rankwatch relay``: a Unix datagram
    socket at ``path``), which bundles the host's ranks' frames into one message; the
    rest, and every frame the relay does not take at once, through ``direct``.

    A frame handed over never waits: the socket does not block, and a relay that is not
    running, or whose queue is full (it stops reading while the broker is away), makes
    the frame go ``direct`` (spooled there when that fails), so a relay can only ever
    lose what it holds when it dies (docs/running.md, "A relay per host"). Heartbeats
    and stack dumps always go ``direct``: hang detection does not depend on the relay.
    """

    def __init__(self, path: str, direct: Transport, alone_bytes: int = ALONE_BYTES) -> None:
        self.path = path
        self.direct = direct
        self.alone_bytes = alone_bytes
        self.relayed = 0
        """Messages the relay took."""
        self.fallbacks = 0
        """Small ops frames the relay did not take (sent ``direct`` instead)."""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        with contextlib.suppress(OSError):  # a datagram must fit the send buffer
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * alone_bytes)

    def send(self, messages: Sequence[Message]) -> list[bool]:
        ok = [False] * len(messages)
        rest = []
        for i, m in enumerate(messages):
            if m.kind == "ops" and len(m.value) < self.alone_bytes and self._hand(m.value):
                ok[i] = True
            else:
                rest.append(i)
        if rest:
            for i, sent in zip(rest, self.direct.send([messages[i] for i in rest]), strict=True):
                ok[i] = sent
        return ok

    def _hand(self, value: bytes) -> bool:
        try:
            self._sock.sendto(value, self.path)
        except OSError:  # no relay, its queue full, or too large a datagram
            self.fallbacks += 1
            return False
        self.relayed += 1
        return True

    def close(self) -> None:
        self._sock.close()
        self.direct.close()
