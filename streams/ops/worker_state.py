"""The state of one ops worker process, between the faust shell and the pure core.

It owns the pipeline, the acknowledgement tracker and the worker's
:class:`~rankwatch.streams.kit.delivery.Delivery` (store, then publish: retry with
backoff, back-pressure, dropped-for-good tables, as for every worker), and adds the
ops worker's own rules:

- a message is acknowledged (its offset may be committed) only once everything it fed
  is stored (:mod:`rankwatch.streams.kit.acks`);
- a job met for the first time is restored first (its messages held meanwhile:
  :meth:`WorkerState.hold`), from the newer of its ``jobstate`` message (what the
  worker that owned it before handed over: :mod:`~.handover`) and the store
  (:mod:`~.recovery`): its stored steps count as late, its windows and open alert
  come back, and its latest alert state is announced again; restored from the message,
  it also takes from the store the batches of its open steps stored after the message
  was sent (their messages are read again: acknowledged only once their step closes);
- after each flush, the ``jobstate`` message of every job the flush changed is sent
  (:meth:`WorkerState.handover`) before the messages that fed it are acknowledged, so a
  committed offset never runs ahead of the state the next owner restores from
  (docs/sizing.md, "Moving jobs between workers");
- a job silent for ``retire_after_s`` with nothing of it open is forgotten, and
  restored like any job first met if it speaks again (docs/sizing.md, "Jobs that end").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rankwatch.schemas.codec import (
    DEFAULT_MAX_BYTES,
    InvalidMessage,
    Member,
    decode,
    decode_ops_members,
    encode,
)
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.streams.kit.acks import AckTracker, InOrder
from rankwatch.streams.kit.delivery import Delivery, Flush
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.kit.pacing import Pacer
from rankwatch.streams.kit.recall import Held
from rankwatch.streams.kit.settings import ServiceSettings
from rankwatch.streams.kit.store import Store, StoreError
from rankwatch.streams.ops.alerts import AlertConfig
from rankwatch.streams.ops.analyser import DEFAULT_WINDOW
from rankwatch.streams.ops.analysing import analysing_pipeline
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.handover import history_from, newest_closed, state_message
from rankwatch.streams.ops.pipeline import JobHistory
from rankwatch.streams.ops.recovery import load_history, newest_stored_step, stored_open_batches
from rankwatch.streams.slowdown.detector import DetectorConfig, SlowdownDetector

log = logging.getLogger("rankwatch.worker")

JOBSTATE_MAX_BYTES = DEFAULT_MAX_BYTES
"""Largest jobstate message written or read (the topic and the producer allow it)."""

BEHIND_TICKS = 2.0
"""A worker whose latest message is older than this many ticks is working through a
backlog, and stores closed steps once a tick, not once per ``store_gap_s``: drains that
stored every closed step at once took 14-23% more CPU per record (benchmarks/README.md,
"Closed steps stored at once" and its re-landed sequel). Two ticks, so that a live burst
(a large job's step end: 0.7-1 s of work) and clocks a few hundred ms apart do not
count as a backlog."""

DEFER_OPS = 1 << 16
"""Closed steps are analysed before each store, those of a job since the last store in
one simulation pass, or once their ops reach this many (:attr:`Pipeline.defer_ops`):
65,536 ops bound the traces held and a pass's arrays to a few MB (26 steps of the SE
trace; a 1,024-GPU job's step is larger and goes alone, as before)."""

STALL_TICKS = 5.0
"""A tick this many ticks after the one before means the process did not run meanwhile
(paused, swapped out, starved): like a broker it could not reach, that time restarts
the grace of its open steps (:meth:`~.assembly.StepAssembler.restart_grace`)."""

MAX_HELD_MESSAGES = 10_000
MAX_HELD_BYTES = 64 * 1024 * 1024
"""Messages of jobs whose restore has not answered yet, held at most (their number, their
bytes): past either the worker reads nothing more until a restore answers
(:attr:`WorkerState.held_full`). None is ever dropped: its offset could not be committed."""


@dataclass(frozen=True)
class HeldMessage:
    """A message of a job first met, read while the job's restore runs."""

    token: Any
    value: bytes
    source: Source
    members: list[Member] | None
    batch: OpBatch
    """Its first batch: what names the job, its layout and its key."""


@dataclass(frozen=True)
class Recollection:
    """What a job first met is restored from (:meth:`WorkerState.look_up`)."""

    history: JobHistory
    from_jobstate: bool
    """Whether ``history`` is its jobstate message's (else the store's)."""


def _newer_in_store(store: Store, job: str, handed: int | None) -> bool:
    """Whether the store holds a closed step of ``job`` newer than ``handed`` (the
    newest closed step of its jobstate message): the store is then the newer history
    (this worker owned the job last, and died before its jobstate message went out)."""
    stored = newest_stored_step(store, job)
    return stored is not None and (handed is None or stored > handed)


def _with_stored_batches(
    store: Store, handed: JobHistory, job: str, assembly: AssemblyConfig
) -> JobHistory:
    """``handed`` (a jobstate message's history) with the batches of its open steps that
    this store holds: a message describes what was stored when it was sent, and batches
    of still open steps stored after it would otherwise be stored a second time when
    their messages are read again (they are acknowledged only once their step closes)."""
    later = stored_open_batches(store, job, handed.closed_steps, assembly.closed_memory)
    return replace(handed, stored_batches=handed.stored_batches | later)


def first_batch(members: list[Member] | None) -> OpBatch | None:
    """The first batch a message's members hold (every member names its job)."""
    for _, got in members or ():
        if isinstance(got, OpBatch):
            return got
    return None


@dataclass(frozen=True)
class WorkerSettings(ServiceSettings):
    """The ops worker's settings: the shared ones and its own section."""

    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)
    slowdown: DetectorConfig = field(default_factory=DetectorConfig)
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
    store_gap_s: float = 0.1
    """Shortest time between two stores that closed steps ask for. A step that closes
    is stored, handed over and announced at once (:meth:`WorkerState.settle_in`), not
    at the next tick (up to ``tick_s`` later), unless the previous store was less than
    this ago: then when the gap has passed. Each store is an insert per table and a
    jobstate message per job that closed a step, so many jobs closing steps all the time
    make at most ``1 / store_gap_s`` of them a second, not one per step. A worker behind
    its input (:data:`BEHIND_TICKS`) stores closed steps once per ``tick_s`` instead."""


@dataclass(frozen=True)
class StoreRound:
    """One store of the ops worker (:meth:`WorkerState.begin_store`)."""

    flush: Flush
    tokens: list[Any]
    """The messages whose rows are all in ``flush``: safe once it stored them."""
    closed_before: bool
    """Whether steps closed before it began (the pacer's)."""


@dataclass
class WorkerCounters:
    messages_in: int = 0
    acked: int = 0
    restored_jobs: int = 0
    restored_from_jobstate: int = 0
    """Of ``restored_jobs``: from the job's jobstate message (newer than the store)."""
    reannounced_alerts: int = 0
    jobstates_sent: int = 0
    jobstates_bad: int = 0
    """jobstate messages that could not be read back (the store is used instead)."""
    jobstates_too_large: int = 0
    """jobstate messages over ``JOBSTATE_MAX_BYTES``, not sent (docs/sizing.md)."""
    retired_jobs: int = 0
    """Jobs forgotten after ``retire_after_s`` of silence."""
    blind_ticks: int = 0
    """Ticks at which the worker could not have read its input since the one before
    (broker unreachable, process stalled): open steps' grace restarted."""
    discarded_rows: int = 0
    """Rows buffered for partitions this worker had lost when it learnt of it (their next
    owner stores them from the messages it re-reads)."""


class WorkerState:
    """The pipeline, the delivery and the acknowledgements of one worker process."""

    def __init__(
        self, settings: WorkerSettings, connect: Callable[[], Store] | None = None
    ) -> None:
        self.settings = settings
        self.pipeline = analysing_pipeline(
            assembly=settings.assembly,
            window=settings.window,
            alerts=settings.alerts,
            slowdown=settings.slowdown,
            keep_ops=settings.keep_ops,
            max_message_bytes=settings.max_message_bytes,
            defer_ops=DEFER_OPS,
        )
        self.delivery = Delivery.for_settings(settings, connect, settings.max_buffered_rows)
        self.acks: AckTracker[Any] = AckTracker()
        self.order: InOrder[Any] = InOrder()
        """Safe tokens go to the consumer in the order their messages were read, per
        partition (faust commits past a gap in out-of-order acknowledgements)."""
        self.counters = WorkerCounters()
        self.job_partitions: dict[str, tuple[str, int]] = {}
        self.topics: dict[str, int] = {}
        """Topic -> partitions, as made or found at start (:mod:`~rankwatch.streams.kit.topics`)."""
        self.input_lag_s = 0.0
        """Largest age (broker timestamp to processing) of a message since the last
        snapshot: how far behind the input the worker is."""
        self.changed: set[str] = set()
        """Jobs that closed a step since their last jobstate message was sent (what the
        next owner must know to go on exactly changes with a closed step; the batches
        stored for open steps in between are sent with the next one)."""
        self.stored = False
        """Whether the latest :meth:`flush` stored everything (only then may the jobs'
        state be handed over: it must describe stored rows only)."""
        self._unacked: list[Any] = []
        """Stored messages' tokens waiting for their jobs' jobstate messages to be sent."""
        self.pacer = Pacer(settings.store_gap_s, backlog_gap_s=settings.tick_s)
        """When the steps closed since the last store are due to be stored."""
        self.latest_lag_s: float | None = None
        """Age (broker timestamp to processing) of the latest message that had one."""
        self.heard: dict[str, float] = {}
        """job -> when (``delivery.clock``) its latest message was taken in."""
        self._held: Held[HeldMessage] = Held(limit=None)
        """Messages of jobs first met, waiting for their restores (:meth:`hold`)."""
        self._held_bytes = 0
        self._last_tick: float | None = None
        """When (``delivery.clock``) the latest tick ran."""

    # -- messages ----------------------------------------------------------------------

    def decode(self, value: bytes) -> list[Member] | None:
        """The batches in ``value`` (a bundle's members, or the message alone), or None
        when the message is refused whole (the pipeline dead-letters it)."""
        try:
            return decode_ops_members(value, max_bytes=self.settings.max_message_bytes)
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

    def restore(self, batch: OpBatch, saved: bytes | None = None) -> bool:
        """Load the history of ``batch``'s job, here and now: from ``saved`` (its latest
        jobstate message, None when there is none) unless the store has a newer closed
        step, else from the store; False if the store is unavailable. The worker runs
        the same steps with the store read in a thread (:meth:`hold`)."""
        job, layout = batch.job, (batch.dp_size, batch.pp_size)
        if not self.delivery.store_ready:
            return False
        try:
            found = self.look_up(job, layout, self.jobstate_history(job, saved))
        except StoreError as exc:
            self.delivery.failed(exc)
            return False
        self.restored(job, layout, found)
        return True

    def look_up(self, job: str, layout: tuple[int, int], handed: JobHistory | None) -> Recollection:
        """What ``job`` is restored from: ``handed`` (its jobstate message's history,
        :meth:`jobstate_history`) with the batches of its open steps stored since, unless the
        store holds a newer closed step; else the store's history. Raises StoreError.
        It reads the store and changes nothing here: a thread may run it while the
        event loop takes other jobs' messages."""
        store = self.delivery.store()
        if handed is not None and not _newer_in_store(store, job, newest_closed(handed)):
            later = _with_stored_batches(store, handed, job, self.settings.assembly)
            return Recollection(later, from_jobstate=True)
        history = load_history(
            store,
            job,
            layout,
            closed_memory=self.settings.assembly.closed_memory,
            window=self.settings.window,
            alert_window=2 * self.settings.alerts.window,
        )
        return Recollection(history, from_jobstate=False)

    def restored(self, job: str, layout: tuple[int, int], found: Recollection) -> None:
        """Give ``job`` the history :meth:`look_up` found."""
        history = found.history
        self.pipeline.restore(job, layout, history)
        self.counters.restored_jobs += 1
        self.counters.restored_from_jobstate += found.from_jobstate
        if history.last_alert is not None:
            # a crash between storing an alert and publishing it would lose the message:
            # announce the job's latest alert state again (at least once; automation
            # deduplicates on alert_id and state)
            self.delivery.announce("alerts", job, history.last_alert.message())
            self.counters.reannounced_alerts += 1
        log.info(
            "restored job %s from %s: %d closed steps, %d in the window, open alert %s",
            job,
            "its jobstate message" if found.from_jobstate else "the store",
            len(history.closed_steps),
            len(history.summaries or {}) if found.from_jobstate else len(history.analysed),
            history.open_alert,
        )

    # -- jobs first met, restored while the others' messages are read -------------------

    def must_hold(self, batch: OpBatch | None, key: bytes | None = None) -> bool:
        """Whether a message whose first batch is ``batch`` waits for its job's restore:
        the job is met now (:meth:`needs_restore`), or its restore has not answered."""
        return batch is not None and (batch.job in self._held or self.needs_restore(batch, key))

    def hold(self, message: HeldMessage) -> None:
        """Read a message of a job whose restore has not answered: it waits, in order,
        for :meth:`restore_held` and :meth:`take_held`. It takes its place in its
        partition's acknowledgements now, so no later message of the partition is
        committed past it. A job's first message asks for its restore
        (:meth:`take_recalls`)."""
        self.counters.messages_in += 1
        self.order.received(message.token, (message.source.topic, message.source.partition))
        self._held.hold(message.batch.job, message)
        self._held_bytes += len(message.value)

    @property
    def held_full(self) -> bool:
        """Too much held for restores that have not answered: read nothing more."""
        return self._held.total >= MAX_HELD_MESSAGES or self._held_bytes >= MAX_HELD_BYTES

    def take_recalls(self) -> list[tuple[str, int]]:
        """(job, ticket) of the restores to start: :meth:`recall_subject`, read its
        jobstate message, :meth:`look_up` in a thread, then :meth:`restore_held` and
        :meth:`take_held`."""
        return self._held.take_new()

    def recall_subject(self, job: str, ticket: int) -> HeldMessage | None:
        """The first message ``job`` holds for restore ``ticket`` (None: the restore is
        stale, its job forgotten since)."""
        return self._held.first(job) if self._held.current(job, ticket) else None

    def restore_held(self, job: str, ticket: int, found: Recollection) -> bool:
        """Restore ``job`` from ``found``; its messages stay held, and hold what comes
        meanwhile, until :meth:`take_held` has taken them all. False, changing nothing,
        when restore ``ticket`` is stale (the job's partitions were revoked meanwhile:
        their messages are read again)."""
        first = self.recall_subject(job, ticket)
        if first is None:
            return False
        batch = first.batch
        try:
            self.restored(job, (batch.dp_size, batch.pp_size), found)
        except Exception:  # a history this code cannot use: the job starts afresh, logged
            log.exception("job %s: its restored history could not be used", job)
            self.pipeline.forget(job)
        # its partition, now: a revocation before its messages are taken forgets it
        self.job_partitions[job] = (first.source.topic, first.source.partition)
        return True

    def take_held(self, job: str, ticket: int, limit: int) -> bool:
        """Take up to ``limit`` of the messages ``job`` held, in the order they came,
        once :meth:`restore_held` restored it; True while more wait."""
        taken = self._held.take(job, ticket, limit)
        for message in taken or ():
            self._held_bytes -= len(message.value)
            self._take_in(message.token, message.value, message.source, message.members)
        return taken is not None and job in self._held

    def forget_held(self, revoked: set[tuple[str, int]]) -> None:
        """Drop the messages held for restores of jobs read from ``revoked`` partitions
        (they are read again, by their next owner); those restores are stale."""
        for job in self._held.jobs():
            first = self._held.first(job)
            if first is None or (first.source.topic, first.source.partition) in revoked:
                self._held_bytes -= sum(len(m.value) for m in self._held.forget(job))

    def jobstate_history(self, job: str, saved: bytes | None) -> JobHistory | None:
        """The history in a jobstate message; None (counted, logged) when there is none
        or it cannot be read back: the store is then all there is."""
        if saved is None:
            return None
        try:
            message = decode("jobstate", saved, max_bytes=JOBSTATE_MAX_BYTES)
            if message["job"] != job:
                raise ValueError(f"keyed {job!r}, names {message['job']!r}")
            history = history_from(message)
            if history.detector is not None:  # checked field by field: a trial load
                SlowdownDetector(self.settings.slowdown).load(job, history.detector)
            return history
        except (InvalidMessage, ValueError, KeyError, TypeError) as exc:
            self.counters.jobstates_bad += 1
            log.warning("jobstate of %s not usable, restoring from the store: %s", job, exc)
            return None

    def handover(self, every: bool = False) -> list[tuple[str, int, bytes]]:
        """(job, source partition, jobstate message) of every job changed since its last
        message (``every``: of every job, as the partitions are revoked): call right
        after a flush that stored everything (the message must describe stored state
        only) and send them before acknowledging."""
        out = []
        for job in sorted(self.job_partitions if every else self.changed):
            if not self.pipeline.knows(job) or job not in self.job_partitions:
                continue
            message = state_message(job, self.pipeline.history(job))
            try:
                data = encode("jobstate", message, validate=False, max_bytes=JOBSTATE_MAX_BYTES)
            except InvalidMessage as exc:  # too large: the job cannot be handed over
                self.counters.jobstates_too_large += 1
                log.error("jobstate of %s not sent: %s", job, exc.detail)
                continue
            out.append((job, self.job_partitions[job][1], data))
        self.changed.clear()
        return out

    def handed_over(self, sent: list[tuple[str, int, bytes]], ok: bool) -> None:
        """The broker has ``sent`` (``ok``), or sending them failed: their jobs stay
        changed, for the next try."""
        if ok:
            self.counters.jobstates_sent += len(sent)
        else:
            self.changed.update(job for job, _, _ in sent)

    def release(self, tokens: list[Any], ok: bool = True) -> list[Any]:
        """The tokens now safe to acknowledge: ``tokens`` and those held back before,
        once a flush stored everything and its jobstate messages are sent (``ok``:
        including those of the jobs whose sending failed before); none otherwise. In
        the order their messages were read, per partition: a safe token waits for every
        earlier message of its partition (:class:`~rankwatch.streams.kit.acks.InOrder`)."""
        self._unacked += tokens
        if not ok:
            return []
        out, self._unacked = self._unacked, []
        return self.order.release(out)

    def on_message(
        self, token: Any, value: bytes, source: Source, members: list[Member] | None = None
    ) -> None:
        """One consumed message (``members``: already decoded, None to decode it here);
        ``token`` is acknowledged once what it fed is stored."""
        self.counters.messages_in += 1
        self.order.received(token, (source.topic, source.partition))
        self._take_in(token, value, source, members)

    def _take_in(
        self, token: Any, value: bytes, source: Source, members: list[Member] | None
    ) -> None:
        """A message read (and placed in its partition's order) before."""
        now_ns = time.time_ns()
        if source.timestamp_ns is not None:
            self.latest_lag_s = (now_ns - source.timestamp_ns) / 1e9
            self.input_lag_s = max(self.input_lag_s, self.latest_lag_s)
        if members is None:
            out = self.pipeline.on_message(value, source, now_ns)
        else:
            out = self.pipeline.on_members(members, value, source, now_ns)
        batch = first_batch(members)
        job = batch.job if batch is not None else ""
        if out.pending:
            job = out.pending[0][0]
        if job:
            self.job_partitions[job] = (source.topic, source.partition)
            if self.pipeline.knows(job):
                self.heard[job] = self.delivery.clock()
        self._write(out)
        self.acks.received(token, job, out.pending)

    def on_tick(self, blind: bool = False) -> None:
        """Close the steps whose grace period ran out; forget the jobs gone silent.
        ``blind``: the worker cannot read its input now (its broker is unreachable).
        While it is, and after a tick the process was stalled for, the open steps' grace
        starts again: what they wait for may be held up where the worker cannot see."""
        now = self.delivery.clock()
        stalled = self._last_tick is not None and now - self._last_tick > (
            STALL_TICKS * self.settings.tick_s
        )
        self._last_tick = now
        now_ns = time.time_ns()
        if (blind or stalled) and self.pipeline.assembler.restart_grace(now_ns):
            self.counters.blind_ticks += 1
        self._write(self.pipeline.on_tick(now_ns))
        self._retire_silent()

    def _retire_silent(self) -> None:
        """Forget each job none of whose messages came for ``retire_after_s``, once it
        has no step open, no message waiting, no state unsent and no store running: its
        latest jobstate message and the store hold all of it, and a message of it that
        comes later restores it as a job first met. Its ``jobs`` row is written."""
        if self.delivery.flying:
            return
        now = self.delivery.clock()
        for job, last in list(self.heard.items()):
            if now - last < self.settings.retire_after_s or not self._quiet(job):
                continue
            self._write(self.pipeline.retire(job))
            del self.heard[job]
            self.job_partitions.pop(job, None)
            self.counters.retired_jobs += 1
            log.info("job %s silent for %.0f s: forgotten until it speaks again", job, now - last)

    def _quiet(self, job: str) -> bool:
        """Whether nothing of ``job`` is open, waiting or unsent."""
        return not (
            job in self.changed
            or job in self._held
            or self.pipeline.assembler.has_open(job)
            or self.acks.waits_for(job)
        )

    def _write(self, out: Output) -> None:
        self.delivery.write(out)
        self.acks.closed((s.job, s.step) for s in out.steps)
        self.changed.update(s.job for s in out.steps)
        if out.steps:
            self.pacer.closed()

    @property
    def behind(self) -> bool:
        """Whether the worker is working through a backlog: the latest message was
        produced more than ``BEHIND_TICKS`` ticks before it was processed."""
        lag = self.latest_lag_s
        return lag is not None and lag > BEHIND_TICKS * self.settings.tick_s

    def settle_in(self) -> float | None:
        """Seconds until the steps closed since the last store are due to be stored,
        handed over, acknowledged and announced (0.0: now; None: none closed). At once,
        unless the previous store was less than ``store_gap_s`` ago (``tick_s`` while
        :attr:`behind`) or the store is backing off after a failure: then when that has
        passed."""
        due = self.pacer.due_in(self.delivery.clock(), self.behind)
        return None if due is None else max(due, self.delivery.retry_in())

    @property
    def full(self) -> bool:
        return self.delivery.full

    def flush(self) -> list[Any]:
        """Store everything buffered; return the tokens now safe to acknowledge (empty
        when the store is unavailable: retried with backoff on a later call)."""
        store = self.begin_store()
        if store is None:
            self.stored = False
            return []
        try:
            self.delivery.run(store.flush)
        finally:
            tokens = self.end_store(store)
        return tokens

    def wants_store(self) -> bool:
        """Whether a store now would write anything (rows buffered, or closed steps
        waiting for their analysis)."""
        return bool(self.delivery.pending or self.pipeline.has_closed())

    def begin_store(self) -> StoreRound | None:
        """Take what is buffered for one store, and the messages it settles, in one go
        (None while the store backs off): :meth:`handover` right after it describes
        exactly these rows. Run ``delivery.run(round.flush)`` (in another thread if need
        be: the pipeline may take more messages meanwhile), then :meth:`end_store`."""
        self._write(self.pipeline.take_closed(time.time_ns()))  # closed since the last
        flush = self.delivery.begin()
        if flush is None:
            return None
        return StoreRound(flush, self.acks.flushed(), self.pacer.started(self.delivery.clock()))

    def end_store(self, store: StoreRound) -> list[Any]:
        """The tokens now safe to acknowledge once ``store`` ran (:attr:`stored`); none
        when it did not store everything: they wait for the next store."""
        self.stored = False
        try:
            self.stored = self.delivery.end(store.flush)
        finally:
            self.pacer.ended(store.closed_before, store.flush.stored)
            if not store.flush.stored:
                self.acks.unflushed(store.tokens)
        if not self.stored:
            return []
        self.counters.acked += len(store.tokens)
        return store.tokens

    def lose_partitions(self, revoked: set[tuple[str, int]]) -> None:
        """The partitions were lost, not handed over: the group gave them to another
        worker while this one could not answer (paused, cut off). Nothing of them may be
        stored from here: their state is dropped, and with it every row and message
        buffered (under the eager protocol every partition goes at once, and the next
        owner re-reads every message that fed them: none was acknowledged)."""
        self.counters.discarded_rows += self.delivery.discard()
        self.forget_partitions(revoked)

    def forget_partitions(self, revoked: set[tuple[str, int]]) -> None:
        """The partitions went to another worker: drop their jobs' state (the new owner
        re-reads their unacknowledged messages and restores from the store)."""
        gone = {job for job, tp in self.job_partitions.items() if tp in revoked}
        for job in gone:
            self.pipeline.forget(job)
            del self.job_partitions[job]
            self.heard.pop(job, None)
        self.acks.forget(lambda job: job in gone)
        self.changed -= gone
        # faust rebalances eagerly: every partition is revoked, and read again from its
        # committed offset once assigned; tokens held back are of those reads
        self._unacked.clear()
        self.order.forget(revoked)
        self.forget_held(revoked)

    def snapshot(self) -> dict[str, Any]:
        """Counters and state for logs and the health file."""
        c = self.pipeline.assembler.counters
        numbers = {k: int(v) for k, v in {**vars(c), **vars(self.counters)}.items()}
        return {
            **numbers,
            **self.delivery.snapshot(),
            "steps_analysed": self.pipeline.steps_analysed,
            "dead_letters": self.pipeline.dead_letters,
            "dead_letter_reasons": dict(self.pipeline.dead_letter_reasons),
            "input_lag_s": round(self.input_lag_s, 3),
            "behind": self.behind,
            "acks_waiting": self.acks.waiting,
            "acks_settled": self.acks.settled,
            "acks_held": self.order.held,
            "recalls_waiting": len(self._held),
            "recall_held": self._held.total,
            "open_steps": sum(1 for _ in self.pipeline.assembler.open_steps()),
            "topics": dict(self.topics),
        }
