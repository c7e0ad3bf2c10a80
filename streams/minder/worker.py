"""The faust agent of the faulty-machine detector: ``<prefix>.metrics`` in, Minder out.

A thin shell around :class:`rankwatch.streams.minder.online.JobMonitor` (one per job;
metrics are keyed by job, so one worker owns a job): each message is decoded and
validated (a bad one becomes a ``dead_letters`` row), handed to its job's monitor; a
timer evaluates the monitors, stores ``machine_scores``, ``machine_faults`` and
``alerts`` rows and each evaluated monitor's snapshot (``detector_state``), and only
then publishes the alerts on ``<prefix>.alerts``, recording each in ``announced`` once
the broker has it.

State that survives a restart (docs/detection.md, "After a restart"): a message is
acknowledged (so its offset may be committed) only once a stored snapshot covers it,
i.e. its sample is older than the end of a window its monitor evaluated (or it was a
dead letter or too late to count). A job first met is recalled from its latest snapshot
(continuity counts, open episodes, each host's residual baseline, the samples the next
windows still need, where the next window ends); the messages after it are read again
from the committed offset, so the windows evaluated after a restart are those an
uninterrupted run evaluated. Alert states stored but not recorded as sent are sent
again. The lookup runs in a thread, and the job's messages are held until it answers,
then taken in the order they came; the other jobs' messages are read on meanwhile. On
the event loop, a lookup behind a slow insert (the store serves one request at a time)
stopped every job's metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zipfile
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import faust
import numpy as np

from rankwatch.schemas.agentmetrics import agent_metric, agent_metric_examples
from rankwatch.schemas.codec import InvalidMessage, decode
from rankwatch.streams.kit.acks import InOrder
from rankwatch.streams.kit.deadletter import dead_letter, dead_letter_row
from rankwatch.streams.kit.delivery import Delivery, flush_in_thread, publish
from rankwatch.streams.kit.faustapp import input_topic, new_app, output_topics
from rankwatch.streams.kit.health import StatusReporter
from rankwatch.streams.kit.membership import GroupLease, member_of
from rankwatch.streams.kit.output import DEAD_LETTERS, Output, Source, alert_row, keyless
from rankwatch.streams.kit.recall import Held, RecallTasks, recall_now
from rankwatch.streams.kit.restart import load_snapshot, snapshot_row, unannounced
from rankwatch.streams.kit.rewind import StallGuard
from rankwatch.streams.kit.settings import ServiceSettings
from rankwatch.streams.kit.store import Store, StoreError
from rankwatch.streams.minder.detector import MinderModel
from rankwatch.streams.minder.online import NS, Episode, JobMonitor, MonitorOutput, OnlineConfig
from rankwatch.streams.minder.serial import model_from_arrays

log = logging.getLogger("rankwatch.minder")


@dataclass(frozen=True)
class MinderSettings(ServiceSettings):
    """The Minder worker's settings: the shared ones and its own section."""

    group: str = "rankwatch-minder"
    online: OnlineConfig = field(default_factory=OnlineConfig)
    model_path: str = ""
    """A model written by ``rankwatch minder train`` (denoisers, priority, thresholds);
    empty: no denoising, metrics in name order, the default threshold."""


DETECTOR = "minder"
Token = Any
"""What the shell acknowledges (a faust event); None: nothing to acknowledge."""
MAX_HELD = 20_000
"""Messages the jobs first met may hold while their recalls run; past it the worker
stops reading until one answers (a sample dropped would be a window's sample lost). A
recall takes milliseconds; one behind a hung server waits up to the store's timeout,
and a job of 1,250 hosts (10,000 GPUs) sampled once a second sends 20,000 messages in
16 s."""


@dataclass(frozen=True)
class Recollection:
    """What the store holds of a job first met (:meth:`MinderState.look_up`)."""

    snapshot: dict[str, Any] | None
    """The latest snapshot of the job's monitor, if any."""
    unsent: list[dict[str, Any]]
    """Alert states stored but never recorded as sent."""


def monitor_state(monitor: JobMonitor, evaluated_end_ns: int) -> dict[str, Any]:
    """A monitor's snapshot as of a window it evaluated: what the next windows need
    (samples up to that window's end; later ones are read again after a restart)."""
    return {
        "next_end_ns": monitor.next_end_ns,
        "newest_ns": monitor.newest_ns,
        "evaluated_end_ns": evaluated_end_ns,
        "runs": [[metric, host, n] for (metric, host), n in monitor.runs.items() if n],
        "episodes": [asdict(ep) for ep in monitor.episodes.values()],
        "samples": {
            host: [[t, dict(m)] for t, m in q if t <= evaluated_end_ns]
            for host, q in monitor.samples.items()
        },
        "baselines": monitor.baselines.to_state(),
        "blend": monitor.blend.to_state(),
    }


def restore_monitor(monitor: JobMonitor, state: dict[str, Any]) -> None:
    monitor.next_end_ns = state["next_end_ns"]
    monitor.newest_ns = state["evaluated_end_ns"]  # later samples are read again
    monitor.runs = {(metric, host): int(n) for metric, host, n in state["runs"]}
    monitor.episodes = {ep["host"]: Episode(**ep) for ep in state["episodes"]}
    monitor.samples = {
        host: deque((int(t), m) for t, m in rows) for host, rows in state["samples"].items() if rows
    }
    if "baselines" in state:  # a snapshot stored before residual scoring: warm up again
        try:
            monitor.baselines.restore(state["baselines"])
        except (ValueError, KeyError, TypeError) as exc:  # another history length, say
            log.warning(
                "job %s: stored baselines not usable (%s): hosts warm up again", monitor.job, exc
            )
            monitor.baselines = monitor.fresh_baselines()
    if "blend" in state:  # a snapshot stored before blend scoring: warm up again
        try:
            monitor.blend.restore(state["blend"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning(
                "job %s: stored blend rings not usable (%s): hosts warm up again", monitor.job, exc
            )
            monitor.blend = monitor.fresh_blend()


def load_model(path: str) -> MinderModel | None:
    if not path:
        return None
    with np.load(Path(path), allow_pickle=False) as arrays:
        return model_from_arrays(dict(arrays))


def model_refusal(path: str) -> str | None:
    """Why the worker must not start with this model, in one line; None if it may.
    A model none of whose metrics the agent sends (one trained on ASD's ``m1..m19``)
    would score nothing at all, silently: refused before the worker connects."""
    if not path:
        return None
    try:
        model = load_model(path)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        return f"cannot read the model {path}: {exc}"
    assert model is not None
    if any(agent_metric(name) for name in model.metrics):
        return None
    shown = ", ".join(model.metrics[:4]) + (", ..." if len(model.metrics) > 4 else "")
    return (
        f"the model {path} knows {len(model.metrics)} metrics ({shown}), none of which the "
        f"agent sends ({', '.join(agent_metric_examples())}, ...): train it on the agent's "
        "metrics, or start without --model"
    )


class MinderState:
    """Monitors of the jobs this worker owns, and their delivery (store, then publish:
    :mod:`~rankwatch.streams.kit.delivery`)."""

    def __init__(
        self,
        settings: MinderSettings,
        store: Store | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.model = load_model(settings.model_path)
        if self.model is not None:  # a job whose machines send none of them is not scored
            names = self.model.metrics
            log.info("model %s: %d metrics (%s)", settings.model_path, len(names),
                     ", ".join(names[:6]) + (", ..." if len(names) > 6 else ""))  # fmt: skip
        self.monitors: dict[str, JobMonitor] = {}
        self.delivery = Delivery.for_settings(settings, store, record_sent=True)
        self.dead_letters = 0
        self.unacked: dict[str, list[tuple[Token, int]]] = {}
        """job -> (token, sample ts_ns) of messages no stored snapshot covers yet"""
        self.settled: list[Token] = []
        """Tokens to acknowledge once the buffered rows are stored."""
        self.acks: list[Token] = []
        """Tokens whose messages are covered by stored rows: the shell acknowledges them
        in the order they were read, per partition (:attr:`order`)."""
        self.order: InOrder[Token] = InOrder()
        """A covered message waits for every message read before it on its partition:
        faust-streaming commits past a gap in out-of-order acknowledgements
        (:class:`~rankwatch.streams.kit.acks.InOrder`), and jobs sharing a partition are
        covered at different times."""
        self.covered_ns: dict[str, int] = {}
        """job -> end of the window its recalled snapshot was taken at: messages up to
        it are in that snapshot, or were not needed by it."""
        self.restored_jobs = 0
        self.retired_jobs = 0
        self.messages_in = 0
        self.topics: dict[str, int] = {}
        """Topic -> partitions, as made or found at start (:mod:`~rankwatch.streams.kit.topics`)."""
        self.clock = clock
        self.heard: dict[str, float] = {}
        """job -> when its latest message came (this worker's clock, seconds)"""
        self.job_partitions: dict[str, tuple[str, int]] = {}
        """job -> the (topic, partition) its messages come from"""
        self._held: Held[tuple[dict[str, Any], Token]] = Held(limit=None)
        """Jobs first met whose recall has not answered, and their messages meanwhile
        (all of them: :attr:`held_full` stops the reading instead)."""
        self.generation = 0
        """The consumer group's generation of this worker's assignment (0: no group), in
        the versions of the rows it writes (:mod:`~rankwatch.streams.kit.versions`)."""

    def assigned(self, generation: int) -> None:
        """A new assignment: rows from now on carry its ``generation``."""
        self.generation = generation
        for monitor in self.monitors.values():
            monitor.generation = generation

    def on_message(
        self,
        value: bytes,
        topic: str = "",
        partition: int = -1,
        offset: int = -1,
        token: Token = None,
        key: bytes | None = None,
    ) -> None:
        self.messages_in += 1
        if token is not None:
            self.order.received(token, (topic, partition))
        source = Source(topic, partition, offset, key)
        try:
            refused = keyless(source)
            if refused is not None:
                raise refused
            msg = decode("metrics", value)
        except InvalidMessage as exc:
            self._refuse(value, source, exc)
            self._settle(token)
            return
        job = msg["job"]
        self.job_partitions[job] = (topic, partition)
        if job in self.monitors and job not in self._held:
            self._take(msg, token)
            return
        self._held.hold(job, (msg, token))  # first met: until its recall answers

    @property
    def held_full(self) -> bool:
        """Stop reading until a recall answers (back-pressure, as :attr:`Delivery.full`)."""
        return self._held.total >= MAX_HELD

    def take_recalls(self) -> list[tuple[str, int]]:
        """The recalls to run (:class:`~rankwatch.streams.kit.recall.RecallTasks`):
        :meth:`look_up`, then :meth:`recalled`."""
        return self._held.take_new()

    def look_up(self, job: str) -> Recollection | None:
        """The job's latest snapshot and unsent alert states; None when the store
        cannot answer (logged). It reads the store and touches nothing: a thread runs it."""
        try:
            store = self.delivery.store()
            snapshot = load_snapshot(store, job, DETECTOR)
            return Recollection(snapshot, unannounced(store, job, "faulty_machine"))
        except StoreError as exc:
            log.warning("job %s not recalled (%s): its state starts afresh", job, exc)
            return None

    def recalled(self, job: str, ticket: int, found: Recollection | None) -> None:
        """Give ``job`` its monitor, restored from ``found`` (:meth:`look_up`), then take
        the messages it held, in the order they came. A recall whose job was forgotten
        meanwhile (its partition revoked) changes nothing."""
        held = self._held.answered(job, ticket)
        if held is None:
            return
        try:
            self._meet(job, found)
        except Exception:  # whatever the store held, the held messages are taken
            log.exception("job %s: its recall could not be used: its state starts afresh", job)
            self.monitors[job] = JobMonitor(job, self.settings.online, self.model)
            self.covered_ns.pop(job, None)
        for msg, token in held:
            self._take(msg, token)

    def recall_waiting(self) -> None:
        """Every recall not started yet, here and now (tests, and callers without an
        event loop)."""
        recall_now(self.take_recalls(), self.look_up, self.recalled)

    def _take(self, msg: dict[str, Any], token: Token) -> None:
        """A valid sample of a job whose monitor exists."""
        job = msg["job"]
        if msg["ts_ns"] <= self.covered_ns.get(job, -1):  # read again after a restart
            self._settle(token)
            return
        monitor = self.monitors[job]
        late = monitor.late
        monitor.add(msg["host"], msg["ts_ns"], msg["metrics"])
        if monitor.late > late:  # too late to count: nothing to keep
            self._settle(token)
        elif token is not None:
            self.unacked.setdefault(job, []).append((token, msg["ts_ns"]))
        self.heard[job] = self.clock()

    def on_tick(self) -> bool:
        """Evaluate every job and store the rows (snapshots last), on the caller's
        thread; True when everything is stored: :attr:`acks` then holds what the stored
        rows cover, and the alerts may be published. A store that fails keeps rows,
        alerts and acknowledgements for the next tick. (The worker itself evaluates on
        its timer and stores in a thread: :func:`build_minder_app`.) Jobs first met are
        recalled first, here."""
        self.recall_waiting()
        self.evaluate()
        tokens = self.take_settled()
        stored = self.delivery.flush()
        self.stored(tokens, stored)
        return stored

    def evaluate(self) -> None:
        """Evaluate every job: its rows (snapshots last) and alerts are buffered, and the
        messages a buffered snapshot covers join :attr:`settled`."""
        for job, monitor in self.monitors.items():
            before, unscored = monitor.next_end_ns, monitor.unscored
            result: MonitorOutput = monitor.evaluate()
            if monitor.unscored and monitor.unscored != unscored:
                log.warning("job %s: nothing scored: %s", job, monitor.unscored)
            out = Output(rows={t: list(rows) for t, rows in result.rows.items()})
            for alert in result.alerts:
                out.add("alerts", alert_row(alert))
                out.messages.append(("alerts", job, alert))
            if monitor.next_end_ns != before:
                self._snapshot(job, monitor, out)
            self.delivery.write(out)
        self._release_idle()
        self._retire_silent()

    def take_settled(self) -> list[Token]:
        """The messages the buffered rows settle. Take them right before a flush begins,
        with nothing in between: a message settled later (a dead letter read while the
        flush runs) has rows the flush does not hold."""
        taken, self.settled = self.settled, []
        return taken

    def stored(self, tokens: list[Token], ok: bool) -> None:
        """The flush that followed :meth:`take_settled` stored everything (``ok``): its
        messages may be acknowledged; else they wait for the next flush."""
        if ok:
            self.acks += tokens
        else:
            self.settled[:0] = tokens

    def snapshot(self) -> dict[str, Any]:
        """Counters and state for logs and the health file."""
        return {
            "messages_in": self.messages_in,
            "dead_letters": self.dead_letters,
            "jobs": len(self.monitors),
            "open_episodes": sum(len(m.episodes) for m in self.monitors.values()),
            "unscored_jobs": dict(
                list({j: m.unscored for j, m in self.monitors.items() if m.unscored}.items())[:20]
            ),
            "restored_jobs": self.restored_jobs,
            "retired_jobs": self.retired_jobs,
            "recalls_waiting": len(self._held),
            "recall_held": self._held.total,
            "acks_waiting": sum(len(w) for w in self.unacked.values()),
            "acks_held": self.order.held,
            **self.delivery.snapshot(),
            "topics": dict(self.topics),
        }

    def forget_partitions(self, revoked: set[tuple[str, int]]) -> None:
        """The partitions were revoked: drop their jobs' monitors and tokens. Their next
        owner (faust rebalances eagerly, so maybe this worker again) recalls each job
        from its latest stored snapshot and reads the messages after the committed
        offset again; a monitor kept here would miss whatever another owner read
        meanwhile, and its tokens belong to reads the consumer has given up."""
        gone = [job for job, tp in self.job_partitions.items() if tp in revoked]
        for job in gone:
            self._forget(job)
        self.order.forget(revoked)

    def lose_partitions(self, revoked: set[tuple[str, int]]) -> None:
        """The partitions went while this worker could not answer: every row and
        acknowledgement buffered goes unstored (every partition goes at once under the
        eager protocol), then their jobs are forgotten."""
        self.delivery.discard()
        self.settled.clear()
        self.acks.clear()
        self.forget_partitions(revoked)

    def _forget(self, job: str) -> None:
        self.job_partitions.pop(job, None)
        self.monitors.pop(job, None)
        self.unacked.pop(job, None)
        self.covered_ns.pop(job, None)
        self.heard.pop(job, None)
        self._held.forget(job)  # its recall, if running, changes nothing

    def _retire_silent(self) -> None:
        """Forget each job none of whose messages came for ``retire_after_s``, once all
        of them are settled: its latest snapshot is in the store (or buffered for it),
        and a sample of it that comes later recalls it as a job first met."""
        now = self.clock()
        for job, last in list(self.heard.items()):
            if now - last < self.settings.retire_after_s:
                continue
            if self.unacked.get(job) or job in self._held:
                continue
            self._forget(job)
            self.retired_jobs += 1
            log.info("job %s silent for %.0f s: forgotten until it speaks again", job, now - last)

    def take_acks(self) -> list[Token]:
        """The tokens to acknowledge now, in read order per partition."""
        acks, self.acks = self.acks, []
        return self.order.release(acks)

    def _refuse(self, value: bytes, source: Source, exc: InvalidMessage) -> None:
        """A message that is not a metrics sample: a dead letter, for the table and the
        dead-letter topic."""
        self.dead_letters += 1
        reason, detail = exc.reason, exc.detail
        out = Output(dead_letters=[dead_letter(value, source, reason, detail)])
        out.add("dead_letters", dead_letter_row(value, source, time.time_ns(), reason, detail))
        self.delivery.write(out)

    def _release_idle(self) -> None:
        """A job silent for two windows and strides is not evaluated again until it
        speaks: its messages no window covers are acknowledged anyway, or the
        partition's committed offset would wait for them for ever (a restart then
        forgets that unevaluated tail)."""
        cfg = self.settings.online
        limit = 2 * (cfg.window_s + cfg.stride_s + cfg.lag_s)
        now = self.clock()
        for job, waiting in self.unacked.items():
            if waiting and now - self.heard.get(job, now) > limit:
                self.settled += [token for token, _ in waiting]
                waiting.clear()

    def _settle(self, token: Token) -> None:
        if token is not None:
            self.settled.append(token)

    def _snapshot(self, job: str, monitor: JobMonitor, out: Output) -> None:
        """Add the monitor's snapshot to ``out`` (stored after the other rows); the
        messages it covers are acknowledged once it is stored."""
        assert monitor.next_end_ns is not None
        end = monitor.next_end_ns - self.settings.online.stride_s * NS
        state = monitor_state(monitor, end)
        out.add("detector_state", snapshot_row(job, DETECTOR, end, state, self.generation))
        waiting = self.unacked.get(job, [])
        self.unacked[job] = [(t, ts) for t, ts in waiting if ts > end]
        self.settled += [t for t, ts in waiting if ts <= end]

    def _meet(self, job: str, found: Recollection | None) -> None:
        """A new monitor for a job first met, restored from its latest snapshot; its
        unsent alert states sent again. A snapshot this version cannot read is logged
        and the job starts afresh (input from the store is data too)."""
        monitor = JobMonitor(job, self.settings.online, self.model)
        state = found.snapshot if found is not None else None
        if state is not None:
            try:
                restore_monitor(monitor, state)
                covered = int(state["evaluated_end_ns"])
            except (AttributeError, KeyError, TypeError, ValueError) as exc:
                log.warning("job %s: snapshot not usable (%r): its state starts afresh", job, exc)
                monitor, state = JobMonitor(job, self.settings.online, self.model), None
            else:
                self.covered_ns[job] = covered
                self.restored_jobs += 1
        monitor.generation = self.generation
        self.monitors[job] = monitor
        if found is None:
            return
        sent = self.delivery.announce_stored("alerts", job, found.unsent)
        log.info(
            "job %s recalled: %s, %d open episodes, %d unsent alert states sent again",
            job, "snapshot" if state else "no snapshot", len(monitor.episodes), sent,
        )  # fmt: skip


def build_minder_app(settings: MinderSettings) -> tuple[faust.App, MinderState]:
    app = new_app(
        settings,
        stream_wait_empty=False,  # unacknowledged events wait for their window, not rebalances
    )
    state = MinderState(settings)
    metrics = input_topic(app, settings.topic_prefix, "metrics", settings.partitions)
    topics = output_topics(app, settings.topic_prefix, ("alerts", DEAD_LETTERS))

    guard = StallGuard(app, [metrics.get_topic_name()], log)

    recalls = RecallTasks(state.look_up, state.recalled, log)

    @app.agent(metrics)
    async def consume(stream: Any) -> None:
        guard.stream(metrics.get_topic_name(), stream)
        async for event in stream.noack().events():
            m = event.message
            guard.handed(m)
            state.on_message(event.value, m.topic, m.partition, m.offset, token=event, key=m.key)
            recalls.start(state.take_recalls())  # in a thread: the others read on
            # back-pressure: the timer stores, or a recall answers, then we read on
            while state.delivery.full or state.held_full:
                await asyncio.sleep(min(max(state.delivery.retry_in(), 0.05), 1.0))

    lease = GroupLease(
        settings.bootstrap,
        settings.session_timeout_s,
        member=lambda: member_of(app),
        assigned=lambda: app.consumer_generation_id,
    )
    status = StatusReporter(app, settings.status_file, log, guard=guard, lease=lease)

    storing = asyncio.Lock()
    """One store at a time (the timer's task, the revocation's)."""
    running: list[asyncio.Task[None]] = []
    """The timer's store, if one runs."""

    async def store() -> None:
        """Store what is buffered, the inserts in a thread (the agent reads on and the
        timer evaluates and writes the health file while a slow server answers), then
        acknowledge what it covers. Hold ``storing``. Not (or no longer) the owner of its
        partitions, it stores nothing: its rows wait, or go with the partitions."""
        if state.delivery.pending and not await lease.may_store():
            return
        tokens = state.take_settled()
        state.stored(tokens, await flush_in_thread(state.delivery))
        for event in state.take_acks():
            event.ack()

    async def store_and_publish() -> None:
        async with storing:
            await store()
            await publish(state.delivery, topics)

    @app.timer(interval=settings.tick_s)
    async def tick() -> None:
        """Evaluate the jobs, start a store unless one runs (what is buffered meanwhile
        waits for the next), and write the health file."""
        lease.poll()
        state.evaluate()
        if running and running[0].done():
            running.pop().result()  # a store that raised raises here, in the timer
        if not running:
            running.append(asyncio.ensure_future(store_and_publish()))
        await status(state.snapshot())

    async def on_revoked(sender: Any, revoked: set[Any], **_: Any) -> None:
        """Store what is due (snapshots included, so the next owner recalls them) and
        acknowledge what it covers, then give the revoked partitions' jobs up. Partitions
        lost while this worker could not answer (paused, cut off) are given up with
        nothing stored: their next owner re-reads every message no stored row covers."""
        if revoked and lease.lost():
            log.warning("partitions lost, not handed over: rows buffered since go unstored")
            async with storing:
                state.lose_partitions({(tp.topic, tp.partition) for tp in revoked})
            return
        state.evaluate()
        async with storing:  # after a running store: one flush at a time
            await store()
            state.forget_partitions({(tp.topic, tp.partition) for tp in revoked})
            await publish(state.delivery, topics)

    async def on_assigned(sender: Any, assigned: set[Any], **_: Any) -> None:
        state.assigned(app.consumer_generation_id)

    app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(on_assigned)  # type: ignore[arg-type]
    return app, state
