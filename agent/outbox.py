"""Where the agent's messages go: a bounded queue drained by a background thread.

Sampling never waits for the network: when the queue is full the oldest message is
dropped and counted; when the transport fails (broker away) the batch is dropped and
counted and the transport is reopened after a pause. Transports: Kafka (aiokafka,
imported only when used, on a private event loop owned by the thread) and a JSON-lines
stream (stdout or a file) for debugging and for running without a broker.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol


class Transport(Protocol):
    def open(self) -> None: ...
    def send_many(self, items: Sequence[tuple[bytes, bytes]]) -> None: ...
    def close(self) -> None: ...


class LinesTransport:
    """One JSON document per line on a text stream."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def open(self) -> None:
        pass

    def send_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        for _, value in items:
            self.stream.write(value.decode() + "\n")
        self.stream.flush()

    def close(self) -> None:
        self.stream.flush()


class KafkaTransport:
    def __init__(
        self, bootstrap: str, topic: str, timeout_s: float = 10.0, linger_ms: int = 20
    ) -> None:
        self.bootstrap, self.topic, self.timeout_s = bootstrap, topic, timeout_s
        self.linger_ms = linger_ms
        """How long the producer waits to batch messages: the relay, which sends its
        bundles and waits for the broker before it reads on, wants 0."""
        self._loop: Any = None
        self._producer: Any = None

    def open(self) -> None:
        import asyncio

        from aiokafka import AIOKafkaProducer

        async def start() -> Any:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                acks="all",  # sent means every in-sync replica has it
                enable_idempotence=True,  # the producer's own retries add no copies
                linger_ms=self.linger_ms,
                request_timeout_ms=int(self.timeout_s * 1000),
            )
            await producer.start()
            return producer

        self._loop = asyncio.new_event_loop()
        try:
            self._producer = self._loop.run_until_complete(start())
        except BaseException:
            self.close()
            raise

    def send_many(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        async def go() -> None:
            futures = [await self._producer.send(self.topic, v, key=k) for k, v in items]
            for f in futures:
                await f

        self._loop.run_until_complete(go())

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            if self._producer is not None:
                self._loop.run_until_complete(self._producer.stop())
        except Exception:
            pass
        finally:
            self._loop.close()
            self._loop = self._producer = None


@dataclass
class OutboxCounters:
    queued: int = 0
    sent: int = 0
    dropped_full: int = 0
    dropped_failed: int = 0
    transport_errors: int = 0


class Outbox:
    def __init__(self, transport: Transport, capacity: int = 600, retry_s: float = 5.0) -> None:
        self.transport, self.retry_s = transport, retry_s
        self.counters = OutboxCounters()
        self._queue: deque[tuple[bytes, bytes]] = deque()
        self._capacity = capacity
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(
            target=self._drain, name="rankwatch-agent-outbox", daemon=True
        )
        self._thread.start()

    def put(self, key: bytes, value: bytes) -> None:
        with self._cond:
            if len(self._queue) >= self._capacity:
                self._queue.popleft()
                self.counters.dropped_full += 1
            self._queue.append((key, value))
            self.counters.queued += 1
            self._cond.notify()

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (within the timeout), then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _drain(self) -> None:
        opened = False
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    break
                batch = list(self._queue)
                self._queue.clear()
            try:
                if not opened:
                    self.transport.open()
                    opened = True
                self.transport.send_many(batch)
                self.counters.sent += len(batch)
            except Exception:
                self.counters.transport_errors += 1
                self.counters.dropped_failed += len(batch)
                if opened:
                    self.transport.close()
                opened = False
                with self._cond:
                    if self._closing:
                        break
                    self._cond.wait(self.retry_s)
        if opened:
            self.transport.close()
