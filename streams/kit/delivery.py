"""Store, then publish: the delivery guarantees every stream worker gets from the kit.

A worker's core hands its shell an :class:`~rankwatch.streams.kit.output.Output`: rows
for ClickHouse and messages for Kafka. :class:`Delivery` holds both and keeps these rules
(docs/architecture.md, "Delivery"), the same for the ops, hang and Minder workers:

- **rows first**: a message is published only after every row buffered before it is
  stored, so what automation hears of is always in the store (a kill between the two
  makes the restarted worker announce it again, never the reverse);
- **a failing store is waited out**: a store that fails (connection lost, disk full,
  read-only, over quota, busy, a table that does not match the rows: any error but a
  refusal, :mod:`~rankwatch.streams.kit.store_errors`) is retried after 0.25 s,
  doubling to 30 s; the buffer and the held messages are kept meanwhile, nothing they
  feed is acknowledged or announced, :attr:`Delivery.failing` makes the worker's health
  red with the reason, and :attr:`Delivery.full` tells the shell to stop consuming
  (back-pressure) rather than grow without bound;
- **rows the store refuses** for what they hold are narrowed down to the rows refused
  alone while the store takes the rest (:meth:`TableSink.isolate`), and each becomes a
  ``dead_letters`` row (reason ``store-refused``), counted and logged; only once those
  are stored does the flush go on. A store that refuses a table's every row is failing,
  not refusing: see :data:`MAX_REFUSED`;
- **a send that fails** puts its publications back, first in line for the next try;
- **sent alerts are recorded** (``announced``) once the broker has them, for workers
  that re-announce after a restart what was stored but never recorded as sent
  (:mod:`~rankwatch.streams.kit.restart`).

Acknowledging input is the caller's: :meth:`Delivery.flush` returns whether everything
buffered is stored, and only then may the messages that fed it be acknowledged.

A flush is three steps, so that the inserts can run off a worker's event loop while it
reads on: :meth:`Delivery.begin` takes what is buffered, :meth:`Delivery.run` inserts it
(the one step that may run in another thread), :meth:`Delivery.end` settles it;
:meth:`Delivery.flush` is the three in one call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rankwatch.schemas.codec import InvalidMessage, decode, encode
from rankwatch.streams.kit.deadletter import refused_row_letter
from rankwatch.streams.kit.output import Output, Publication
from rankwatch.streams.kit.restart import announced_row
from rankwatch.streams.kit.settings import ServiceSettings
from rankwatch.streams.kit.sink import TableSink
from rankwatch.streams.kit.store import Store
from rankwatch.streams.kit.store_errors import StoreError

log = logging.getLogger("rankwatch.delivery")
T = TypeVar("T")

FIRST_BACKOFF_S = 0.25
MAX_BACKOFF_S = 30.0
MAX_REFUSED = 64
"""Rows of one table one flush may refuse, each alone, as dead letters. Past that the
table, not its rows, is taken to be at fault (a column changed under the worker, a
constraint added): a failure, waited out with every row kept, rather than a flush's worth
of dead letters."""


@dataclass
class DeliveryCounters:
    flushes: int = 0
    store_failures: int = 0
    rows_refused: int = 0
    """Rows the store refused for what they hold, stored as dead letters instead."""
    published: int = 0
    send_failures: int = 0
    recorded_sent: int = 0


@dataclass
class Flush:
    """One flush: the rows and messages buffered when it began, taken out of the buffer
    at once so that its inserts can run in another thread (:meth:`Delivery.run`) while
    the worker goes on buffering; :meth:`Delivery.end` settles it on the worker's
    thread."""

    rows: TableSink
    held: list[Publication]
    oldest: float | None
    """When the oldest of its rows was buffered (``Delivery.clock``)."""
    size: int = 0
    """Its rows when it began, counted on the worker's thread: :attr:`rows` is the
    inserting thread's to change (it deletes each table once inserted), so the worker
    never reads it while the flush runs."""
    stored: bool = False
    error: StoreError | None = None
    """Why it did not store everything: the store failed (everything is kept)."""
    refused: list[tuple[str, int, str]] = field(default_factory=list)
    """(table, rows, why) the store refused, stored as dead letters instead."""
    seconds: float = 0.0


class Delivery:
    """The rows and messages of one worker process, on their way to the store and the
    broker. ``connect`` opens (and migrates) the store: called on first use and again
    after a failed connection; ``record_sent``: write an ``announced`` row for each
    alert delivered."""

    def __init__(
        self,
        connect: Callable[[], Store],
        max_rows: int = 200_000,
        *,
        record_sent: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._connect = connect
        self.sink = TableSink(None, max_rows, auto_flush=False)
        self.record_sent = record_sent
        self.clock = clock
        self.wall_ns = wall_ns
        self.counters = DeliveryCounters()
        self._held: list[Publication] = []
        """Messages whose rows are in the buffer: published after the next flush."""
        self._ready: list[Publication] = []
        """Messages whose rows are stored: published at the next :meth:`take`."""
        self._delay_s = 0.0
        self._retry_at = 0.0
        self.oldest_unstored: float | None = None
        """When (``clock``) the oldest row not yet stored was buffered (sink lag)."""
        self.last_error: str | None = None
        self.flush_s = 0.0
        """Longest flush since the shell last reset it."""
        self._flying: Flush | None = None
        """The flush begun and not ended yet."""
        self._connecting = threading.Lock()
        self.failing = False
        """Whether the latest store call failed (until one succeeds): health is red."""

    @classmethod
    def for_settings(
        cls,
        settings: ServiceSettings,
        store: Store | Callable[[], Store] | None = None,
        max_rows: int = 200_000,
        **kw: Any,
    ) -> Delivery:
        """The delivery of a worker with these settings: its store opened from the
        settings' DSN, unless ``store`` (a store, or what opens one) is given."""
        if store is None:
            return cls(
                lambda: Store.connect(
                    settings.dsn,
                    settings.database,
                    housekeeping_nice=settings.housekeeping_nice,
                    timeout_s=settings.store_timeout_s,
                ),
                max_rows,
                **kw,
            )
        connect = store if callable(store) else (lambda: store)
        return cls(connect, max_rows, **kw)

    # -- the store -----------------------------------------------------------------------

    def store(self) -> Store:
        """The store, connecting and migrating on first use; raises StoreError. Safe to
        call from a flush's thread and the event loop at once: one connects."""
        with self._connecting:
            if self.sink.store is None:
                store = self._connect()
                try:
                    store.migrate()
                except StoreError:
                    store.close()
                    raise
                self.sink.store = store
            return self.sink.store

    @property
    def connected(self) -> bool:
        return self.sink.store is not None

    @property
    def store_ready(self) -> bool:
        """False while a failed store waits out its backoff."""
        return self.clock() >= self._retry_at

    def retry_in(self) -> float:
        return max(0.0, self._retry_at - self.clock())

    def failed(self, exc: StoreError) -> None:
        """A store call failed: keep everything and back off, whatever the error (only
        a refusal of rows, which :meth:`run` settles, gives anything up). An error that
        waiting is not expected to cure is logged as an error: someone must act."""
        self.counters.store_failures += 1
        self.last_error = str(exc)
        self.failing = True
        self._delay_s = min(max(2 * self._delay_s, FIRST_BACKOFF_S), MAX_BACKOFF_S)
        self._retry_at = self.clock() + self._delay_s
        level = logging.WARNING if exc.transient else logging.ERROR
        log.log(level, "store failing, nothing given up, retry in %.2fs: %s", self._delay_s, exc)

    # -- rows and messages ---------------------------------------------------------------

    def write(self, out: Output) -> None:
        """Buffer a core's output: its rows, and its messages and dead letters to publish
        once those rows are stored."""
        if (out or out.messages or out.dead_letters) and self.oldest_unstored is None:
            self.oldest_unstored = self.clock()
        self.sink.write(out)
        self._held += [Publication(kind, key, encode(kind, m)) for kind, key, m in out.messages]
        self._held += [Publication.of_dead_letter(d) for d in out.dead_letters]

    def announce(self, kind: str, key: str, message: dict[str, Any]) -> None:
        """Publish a message whose rows are stored already (an alert state re-announced
        after a restart), in line after those held for the next flush."""
        self._held.append(Publication(kind, key, encode(kind, message)))

    def announce_stored(self, kind: str, key: str, messages: list[dict[str, Any]]) -> int:
        """:meth:`announce` each of ``messages``, read back from the store; one this
        version cannot encode is logged and skipped (stored data is input too).
        Returns how many were announced."""
        sent = 0
        for message in messages:
            try:
                self.announce(kind, key, message)
            except InvalidMessage as exc:
                log.warning("stored %s of %s not sent again (%s)", kind, key, exc)
                continue
            sent += 1
        return sent

    def discard(self) -> int:
        """Drop every row buffered and the messages waiting for them (a flush running is
        left to end; messages of rows already stored still go out): what a worker holds
        for partitions it lost, whose next owner stores them from the messages it
        re-reads. Returns how many rows went."""
        rows = self.sink.detach().pending
        self._held, self.oldest_unstored = [], None
        if rows:
            log.warning("%d rows of lost partitions discarded, not stored", rows)
        return rows

    @property
    def pending(self) -> int:
        """Rows not stored yet: buffered, or in a flush that is running."""
        flying = self._flying.size if self._flying is not None else 0
        return self.sink.pending + flying

    @property
    def full(self) -> bool:
        """Stop consuming until a flush succeeds (back-pressure)."""
        return self.pending >= self.sink.max_rows

    def flush(self) -> bool:
        """Store everything buffered. True when it is stored (the held messages may then
        be published, the input that fed them acknowledged); False while the store is
        unavailable (retried, with backoff, on a later call)."""
        flush = self.begin()
        if flush is None:
            return False
        try:
            self.run(flush)
        finally:  # an unexpected error still puts the rows back before it goes up
            stored = self.end(flush)
        return stored

    def begin(self) -> Flush | None:
        """Take everything buffered for one flush (None while the store backs off).
        Give it to :meth:`run`, then to :meth:`end`, before the next one begins."""
        if self._flying is not None:
            raise RuntimeError("a flush is running: end it before beginning another")
        if not self.store_ready:
            return None
        rows = self.sink.detach()
        flush = Flush(rows, self._held, self.oldest_unstored, size=rows.pending)
        self._held, self.oldest_unstored = [], None
        self._flying = flush
        return flush

    def run(self, flush: Flush) -> None:
        """Insert ``flush``'s rows, connecting first if need be: the part that waits on
        the store, and the only one that may run in another thread. A failure is kept on
        ``flush`` for :meth:`end`, every row with it; rows the store refuses become dead
        letters (:meth:`_refuse`) and the rest goes on."""
        rows = flush.rows
        started = self.clock()
        while True:
            try:
                rows.store = self.store()
                rows.flush()
                flush.seconds = self.clock() - started
                flush.stored = True
                return
            except StoreError as exc:
                table = rows.failed_table
                if not exc.refused or table is None:
                    flush.error = exc
                    return
                try:
                    flush.refused.append(self._refuse(rows, table))
                except StoreError as failure:  # the store fails meanwhile: keep it all
                    flush.error = failure
                    return

    def _refuse(self, rows: TableSink, table: str) -> tuple[str, int, str]:
        """Store ``table``'s rows but those refused alone, and those as dead letters;
        raises StoreError (everything kept) when the store fails meanwhile, or refuses
        more than :data:`MAX_REFUSED` of them."""
        refused = rows.isolate(table, MAX_REFUSED)
        now = self.wall_ns()
        letters = [refused_row_letter(table, item, str(why), now) for item, why in refused]
        assert rows.store is not None
        rows.store.insert("dead_letters", letters)
        rows.discard(table, [item for item, _ in refused])
        return table, len(refused), str(refused[0][1]) if refused else ""

    def end(self, flush: Flush) -> bool:
        """Settle ``flush`` (on the worker's thread): True when it stored everything it
        took (its messages may be published). Else its rows and messages go back, ahead
        of those buffered since, and the store backs off, or the error is raised when
        waiting cannot help."""
        self._flying = None
        for table, n, why in flush.refused:
            self.counters.rows_refused += n
            log.warning("%d %s rows the store refused stored as dead letters: %s", n, table, why)
        if not flush.stored:
            self.sink.put_back(flush.rows)
            self._held[:0] = flush.held
            if flush.oldest is not None:
                self.oldest_unstored = flush.oldest
            if flush.error is not None:
                self.failed(flush.error)
            return False
        self.flush_s = max(self.flush_s, flush.seconds)
        self._delay_s, self._retry_at = 0.0, 0.0
        if self.failing:
            log.info("store taking rows again")
        self.failing = False
        self.counters.flushes += 1
        self._ready += flush.held
        return True

    # -- publishing ----------------------------------------------------------------------

    def take(self) -> list[Publication]:
        """The stored messages to send now; hand each back to :meth:`sent` or
        :meth:`unsent`."""
        ready, self._ready = self._ready, []
        return ready

    def unsent(self, publications: list[Publication]) -> None:
        """A send failed: these go first at the next try (order kept)."""
        self.counters.send_failures += 1
        self._ready[:0] = publications

    def sent(self, publications: list[Publication]) -> int:
        """The broker has these. With ``record_sent``, each alert among them gets its
        ``announced`` row, buffered for the next flush (:func:`publish` starts one at
        once, its insert in a thread; a kill before it is stored makes the restarted
        worker send the alert again). Returns how many rows it buffered.

        It used to store them itself, on the caller's thread: the event loop then
        waited on the server (up to the store's timeout) after every alert sent, and a
        hang worker, which judges ranks by when their heartbeats arrive, read none."""
        self.counters.published += len(publications)
        if not self.record_sent:
            return 0
        now, out = self.wall_ns(), Output()
        for pub in publications:
            if pub.kind == "alerts":
                out.add("announced", announced_row(decode("alerts", pub.value), now))
        if not out.rows:
            return 0
        n = len(out.rows["announced"])
        self.write(out)
        self.counters.recorded_sent += n
        return n

    @property
    def flying(self) -> bool:
        """Whether a flush is running (begun and not ended)."""
        return self._flying is not None

    def sink_lag_s(self) -> float:
        """Age of the oldest row not stored yet (0.0: none)."""
        flying = self._flying.oldest if self._flying is not None else None
        times = [t for t in (self.oldest_unstored, flying) if t is not None]
        return self.clock() - min(times) if times else 0.0

    def snapshot(self) -> dict[str, Any]:
        """Counters and state for logs and the health file."""
        return {
            **vars(self.counters),
            "buffered_rows": self.pending,
            "held_messages": len(self._held),
            "ready_messages": len(self._ready),
            "store_connected": self.connected,
            "store_failing": self.failing,
            "store_retry_in_s": round(self.retry_in(), 3),
            "sink_lag_s": round(self.sink_lag_s(), 3),
            "flush_s": round(self.flush_s, 3),
            "last_error": self.last_error,
        }


async def in_thread(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a thread. If the caller is cancelled meanwhile (a worker
    stopping, a rebalance), the cancellation waits for the thread to end: the caller's
    cleanup (:meth:`Delivery.end` putting a flush's rows back) must not run while the
    thread still inserts them, or rows buffered since would join a list the thread then
    deletes, and a second flush could start beside it."""
    thread = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        return await asyncio.shield(thread)
    except asyncio.CancelledError:
        while not thread.done():  # the store's timeout bounds this
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([thread])
        raise


async def flush_in_thread(delivery: Delivery) -> bool:
    """:meth:`Delivery.flush` with its inserts in a thread: the worker's agents go on
    reading while the store answers (a worker that judges its input by when it arrives,
    as the hang worker does, must not stop reading for a slow store)."""
    flush = delivery.begin()
    if flush is None:
        return False
    try:
        await in_thread(delivery.run, flush)
    finally:  # an unexpected error still puts the rows back before it goes up
        stored = delivery.end(flush)
    return stored


async def publish(delivery: Delivery, topics: dict[str, Any]) -> None:
    """Send what ``delivery`` has stored to its kinds' faust topics and wait until the
    broker has it all; a failure hands everything back for the next call (re-sent:
    consumers deduplicate on the message's identity) and is logged, never raised into
    the worker's timer."""
    ready = delivery.take()
    if not ready:
        return
    try:
        await deliver(topics, ready)
    except Exception as exc:  # the broker is down or the producer is being rebuilt
        delivery.unsent(ready)
        log.warning("%d messages not sent yet (%s): retried next tick", len(ready), exc)
        return
    recorded = delivery.sent(ready)
    # a flush already running (another task's) leaves the rows to the next one
    if recorded and not delivery.flying and await flush_in_thread(delivery):
        log.info("%d alert states sent and recorded", recorded)  # tests and operators
        # read this line: the record is stored


async def deliver(topics: dict[str, Any], publications: Iterable[Publication]) -> None:
    """Send each publication to its kind's topic, keyed by job, with its headers, and
    wait until the broker has them all."""
    futures = [
        await topics[p.kind].send(key=p.key.encode(), value=p.value, headers=p.headers)
        for p in publications
    ]
    for future in futures:
        await future
