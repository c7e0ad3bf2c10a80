"""The state of one stream worker process, between the faust shell and the pure core.

It owns the pipeline, the sink, the acknowledgement tracker and the store connection,
and holds the rules that make the worker lose nothing:

- a message is acknowledged (its offset may be committed) only once everything it fed
  is stored (:mod:`rankwatch.streams.kit.acks`);
- a job met for the first time is restored from the store first (its stored steps
  count as late, its windows and open alert come back: :mod:`~.recovery`);
- a store that fails with a transient error is retried with exponential backoff; the
  buffer is kept, and consumption pauses while it is full (back-pressure), so nothing
  is acknowledged past what is stored. A permanent error on one table drops that
  table's buffered rows with an error log (retrying cannot help) and is counted.

Messages to publish (steps, alerts) are released only once their rows are stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rankwatch.schemas.codec import DEFAULT_MAX_BYTES, InvalidMessage, decode_ops, encode
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.streams.kit.acks import AckTracker
from rankwatch.streams.kit.deadletter import DeadLetter
from rankwatch.streams.kit.output import Output, Publication, Source
from rankwatch.streams.kit.settings import ServiceSettings
from rankwatch.streams.kit.sink import TableSink
from rankwatch.streams.kit.store import Store, StoreError
from rankwatch.streams.ops.alerts import AlertConfig, StragglerAlerts
from rankwatch.streams.ops.analyser import DEFAULT_WINDOW, WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.recovery import load_history

log = logging.getLogger("rankwatch.worker")

MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class WorkerSettings(ServiceSettings):
    """The ops worker's settings: the shared ones and its own section."""

    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)
    alerts: AlertConfig = field(default_factory=AlertConfig)
    window: int = DEFAULT_WINDOW
    max_message_bytes: int = DEFAULT_MAX_BYTES
    """Op-batch messages larger than this are dead letters."""
    keep_ops: bool = True
    """Store raw op records (``ops`` table, TTL): needed to restore windows on restart."""
    max_buffered_rows: int = 200_000
    """Sink rows (op records included) buffered before a flush; consumption pauses while
    a full buffer cannot be stored."""
    fetch_bytes: int = 4 * 1024 * 1024
    """Per partition and fetch (faust's default, 1 MiB, is a few hundred small batches)."""
    stream_buffer: int = 1024
    """Messages faust prefetches for the agent: with ``fetch_bytes`` what bounds the
    memory a backlog takes (faust's default is 4,096)."""
    fetch_wait_ms: int = 50
    """How long the broker may hold a fetch with nothing new. faust fixes it at 1,500 ms,
    and a caught-up worker then gets its partition's new messages only when a fetch for
    its other (idle) partitions returns: up to 1.5 s of latency for nothing."""
    commit_interval_s: float = 1.0
    """How often faust commits the acknowledged offsets (its default is 2.8 s). Only
    acknowledged (stored) offsets are ever committed; a shorter interval just lets the
    group's lag show what is stored sooner, and re-reads less after a crash."""
    status_file: str | None = None
    """Where the worker writes its health (JSON) every tick; see ``rankwatch worker --health``."""


@dataclass
class WorkerCounters:
    messages_in: int = 0
    flushes: int = 0
    store_failures: int = 0
    rows_dropped: int = 0
    acked: int = 0
    restored_jobs: int = 0
    published: int = 0
    reannounced_alerts: int = 0


class WorkerState:
    """The pipeline, the sink and the acknowledgements of one worker process."""

    def __init__(
        self, settings: WorkerSettings, connect: Callable[[], Store] | None = None
    ) -> None:
        self.settings = settings
        self._connect = connect or (lambda: Store.connect(settings.dsn, database=settings.database))
        self.pipeline = Pipeline(
            assembly=settings.assembly,
            analyser=WhatIfAnalyser(window=settings.window),
            alerts=StragglerAlerts(settings.alerts),
            keep_ops=settings.keep_ops,
            max_message_bytes=settings.max_message_bytes,
        )
        self.acks: AckTracker[Any] = AckTracker()
        self.counters = WorkerCounters()
        self.job_partitions: dict[str, tuple[str, int]] = {}
        self.topics: dict[str, int] = {}
        """Topic -> partitions, as made or found at start (:mod:`~rankwatch.streams.kit.topics`)."""
        self.sink = TableSink(None, settings.max_buffered_rows, auto_flush=False)
        self._unpublished: list[tuple[str, str, dict[str, Any]]] = []
        self._publishable: list[tuple[str, str, dict[str, Any]]] = []
        self._unpublished_dead: list[DeadLetter] = []
        self._publishable_dead: list[DeadLetter] = []
        self._delay_s = 0.0
        self._retry_at = 0.0
        self.oldest_unstored: float | None = None
        """Monotonic time of the oldest row not yet stored (sink lag)."""
        self.last_error: str | None = None
        self.input_lag_s = 0.0
        self.flush_s = 0.0
        """Longest store of the buffer since the last snapshot."""
        """Largest age (broker timestamp to processing) of a message since the last
        snapshot: how far behind the input the worker is."""

    # -- the store ---------------------------------------------------------------------

    def _store(self) -> Store:
        """The store, connecting (and migrating) on first use; raises StoreError."""
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
    def store_ready(self) -> bool:
        return time.monotonic() >= self._retry_at

    def retry_in(self) -> float:
        return max(0.0, self._retry_at - time.monotonic())

    def _failed(self, exc: StoreError) -> None:
        self.counters.store_failures += 1
        self.last_error = str(exc)
        if not exc.transient:
            raise exc
        self._delay_s = min(max(2 * self._delay_s, 0.25), MAX_BACKOFF_S)
        self._retry_at = time.monotonic() + self._delay_s
        log.warning("store unavailable, retry in %.2fs: %s", self._delay_s, exc)

    # -- messages ----------------------------------------------------------------------

    def decode(self, value: bytes) -> OpBatch | None:
        """The batch in ``value``, or None when it is bad (the pipeline dead-letters it)."""
        try:
            return decode_ops(value, max_bytes=self.settings.max_message_bytes)
        except InvalidMessage:
            return None

    def needs_restore(self, batch: OpBatch | None, key: bytes | None = None) -> bool:
        """Whether ``batch`` (read under ``key``) is of a job this process has not met
        yet, and may name it (a batch refused on its own is not worth a restore)."""
        return (
            batch is not None
            and not self.pipeline.knows(batch.job)
            and self.pipeline.precheck(batch, key)
        )

    def restore(self, batch: OpBatch) -> bool:
        """Load the history of ``batch``'s job from the store; False if the store is
        unavailable."""
        job, layout = batch.job, (batch.dp_size, batch.pp_size)
        if not self.store_ready:
            return False
        try:
            history = load_history(
                self._store(),
                job,
                layout,
                closed_memory=self.settings.assembly.closed_memory,
                window=self.settings.window,
                alert_window=self.settings.alerts.window,
            )
        except StoreError as exc:
            self._failed(exc)
            return False
        self.pipeline.restore(job, layout, history)
        self.counters.restored_jobs += 1
        if history.last_alert is not None:
            # a crash between storing an alert and publishing it would lose the message:
            # announce the job's latest alert state again (at least once; automation
            # deduplicates on alert_id and state)
            self._publishable.append(("alerts", job, history.last_alert.message()))
            self.counters.reannounced_alerts += 1
        log.info(
            "restored job %s: %d closed steps, %d in the window, open alert %s",
            job,
            len(history.closed_steps),
            len(history.analysed),
            history.open_alert,
        )
        return True

    def on_message(
        self, token: Any, value: bytes, source: Source, batch: OpBatch | None = None
    ) -> None:
        """One consumed message (``batch``: already decoded, None to decode it here);
        ``token`` is acknowledged once what it fed is stored."""
        self.counters.messages_in += 1
        now_ns = time.time_ns()
        if source.timestamp_ns is not None:
            self.input_lag_s = max(self.input_lag_s, (now_ns - source.timestamp_ns) / 1e9)
        if batch is None:
            out = self.pipeline.on_message(value, source, now_ns)
        else:
            out = self.pipeline.on_batch(batch, value, source, now_ns)
        job = batch.job if batch is not None else ""
        if out.pending:
            job = out.pending[0][0]
        if job:
            self.job_partitions[job] = (source.topic, source.partition)
        self._write(out)
        self.acks.received(token, job, out.pending)

    def on_tick(self) -> None:
        """Close the steps whose grace period ran out."""
        self._write(self.pipeline.on_tick(time.time_ns()))

    def _write(self, out: Output) -> None:
        if (out or out.steps) and self.oldest_unstored is None:
            self.oldest_unstored = time.monotonic()
        self.sink.write(out)
        self._unpublished.extend(out.messages)
        self._unpublished_dead.extend(out.dead_letters)
        self.acks.closed((s.job, s.step) for s in out.steps)

    @property
    def full(self) -> bool:
        return self.sink.full

    def flush(self) -> list[Any]:
        """Store everything buffered; return the tokens now safe to acknowledge (empty
        when the store is unavailable: retried with backoff on a later call)."""
        while True:
            if not self.store_ready:
                return []
            try:
                self._store()
                started = time.monotonic()
                self.sink.flush()
                self.flush_s = max(self.flush_s, time.monotonic() - started)
                break
            except StoreError as exc:
                if exc.transient or self.sink.failed_table is None:
                    self._failed(exc)
                    return []
                dropped = self.sink.drop(self.sink.failed_table)
                self.counters.rows_dropped += dropped
                self.counters.store_failures += 1
                log.error("dropped %d rows the store rejects for good: %s", dropped, exc)
        self._delay_s, self._retry_at = 0.0, 0.0
        self.counters.flushes += 1
        self.oldest_unstored = None
        self._publishable += self._unpublished
        self._unpublished = []
        self._publishable_dead += self._unpublished_dead
        self._unpublished_dead = []
        safe = self.acks.flushed()
        self.counters.acked += len(safe)
        return safe

    def take_publishable(self) -> list[Publication]:
        """Stored results and dead letters, encoded, to publish now."""
        ready, self._publishable = self._publishable, []
        dead, self._publishable_dead = self._publishable_dead, []
        self.counters.published += len(ready) + len(dead)
        out = [Publication(kind, key, encode(kind, message)) for kind, key, message in ready]
        out += [Publication.of_dead_letter(d) for d in dead]
        return out

    def forget_partitions(self, revoked: set[tuple[str, int]]) -> None:
        """The partitions went to another worker: drop their jobs' state (the new owner
        re-reads their unacknowledged messages and restores from the store)."""
        gone = {job for job, tp in self.job_partitions.items() if tp in revoked}
        for job in gone:
            self.pipeline.forget(job)
            del self.job_partitions[job]
        self.acks.forget(lambda job: job in gone)

    def sink_lag_s(self) -> float:
        return 0.0 if self.oldest_unstored is None else time.monotonic() - self.oldest_unstored

    def snapshot(self) -> dict[str, Any]:
        """Counters and state for logs and the health file."""
        c = self.pipeline.assembler.counters
        numbers = {k: int(v) for k, v in {**vars(c), **vars(self.counters)}.items()}
        return {
            **numbers,
            "steps_analysed": self.pipeline.steps_analysed,
            "dead_letters": self.pipeline.dead_letters,
            "dead_letter_reasons": dict(self.pipeline.dead_letter_reasons),
            "buffered_rows": self.sink.pending,
            "store_connected": self.sink.store is not None,
            "store_retry_in_s": round(self.retry_in(), 3),
            "sink_lag_s": round(self.sink_lag_s(), 3),
            "input_lag_s": round(self.input_lag_s, 3),
            "flush_s": round(self.flush_s, 3),
            "acks_waiting": self.acks.waiting,
            "acks_settled": self.acks.settled,
            "open_steps": sum(1 for _ in self.pipeline.assembler.open_steps()),
            "last_error": self.last_error,
        }
