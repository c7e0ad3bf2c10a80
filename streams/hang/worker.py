"""The faust agent of the hang detector: heartbeats and stack dumps in, hangs out.

A thin shell around :class:`rankwatch.streams.hang.service.HangService`: ``<prefix>.heartbeats``
and ``<prefix>.stacks`` are keyed by job, so one worker owns all of a job's ranks. Each
message is handed to the service with its arrival time; a timer (every ``tick_s``)
evaluates the jobs, stores the ``hangs``, ``stacks``, ``alerts`` and ``dead_letters``
rows, and only once they are stored publishes the alerts on ``<prefix>.alerts`` (a
store that fails keeps rows and alerts for the next tick); each alert sent is then
recorded in ``announced`` once the broker has it.

A job first met (after a restart, or a rebalance) is recalled from the store: its open
episode (the latest stored ``hang`` alert, if firing) is reopened, and its latest alert
states that were stored but never recorded as sent are sent now (docs/detection.md,
"After a restart"). The lookup runs in a thread, and the job's heartbeats are held
until it answers, then taken at the times they came; the other jobs' heartbeats are
read on meanwhile. Done on the event loop, a lookup behind a slow insert (the store
serves one request at a time) stopped every job's heartbeats, and the next tick found
their ranks silent. A job none of whose ranks beat for ``retire_after_s`` is forgotten
the same way, to be recalled if it beats again (docs/sizing.md, "Jobs that end").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import faust
import orjson

from rankwatch.streams.hang.detector import Episode, HangConfig
from rankwatch.streams.hang.service import HangService, episode_from_alert
from rankwatch.streams.kit.delivery import Delivery, flush_in_thread, publish
from rankwatch.streams.kit.faustapp import input_topic, new_app, output_topics, shorten_fetch_wait
from rankwatch.streams.kit.health import StatusReporter
from rankwatch.streams.kit.membership import GroupLease, member_of
from rankwatch.streams.kit.output import DEAD_LETTERS, Output, Source
from rankwatch.streams.kit.recall import Held, RecallTasks, recall_now
from rankwatch.streams.kit.restart import load_snapshot, snapshot_row, unannounced
from rankwatch.streams.kit.rewind import StallGuard
from rankwatch.streams.kit.settings import ServiceSettings
from rankwatch.streams.kit.store import Store, StoreError

log = logging.getLogger("rankwatch.hang")
DETECTOR = "hang"
SNAPSHOT_EVERY_S = 10
"""A job's step-time baseline is stored at most this often (it changes every step)."""
NS = 1_000_000_000
STALL_TICKS = 5.0
"""An evaluation this many ticks after the one before means the process did not run
meanwhile (paused, starved): it heard no one for that time, and holds it against no one."""
MAX_HELD = 100_000
"""Heartbeats a job holds while its recall runs; past it the oldest go (counted). A
recall takes milliseconds; one behind a hung server waits up to the store's timeout,
and a job of 10,000 ranks beating once a second sends 300,000 heartbeats in 30 s."""


@dataclass(frozen=True)
class Recollection:
    """What the store holds of a job first met (:meth:`HangState.look_up`)."""

    unsent: list[dict[str, Any]]
    """Alert states stored but never recorded as sent."""
    latest: list[dict[str, Any]]
    """The latest ``hang`` alert row, if any."""
    baseline: dict[str, Any] | None
    """The latest step-time snapshot, if any."""


@dataclass(frozen=True)
class HangSettings(ServiceSettings):
    """The hang worker's settings: the shared ones and its own section."""

    group: str = "rankwatch-hang"
    fetch_wait_ms: int = 50
    """Faust's fetch waits 1.5 s for idle partitions: a heartbeat held that long would
    make its rank look silent too late (the episode is then declared before it is)."""
    offset_reset: str = "latest"
    """Where a new consumer group starts: heartbeats are about now, so replaying old
    ones would only declare long-gone jobs hung ("earliest" for tests on new topics)."""
    hang: HangConfig = field(default_factory=HangConfig)


class HangState:
    """The service and its delivery (store, then publish: :mod:`~rankwatch.streams.kit.delivery`).

    The hang worker never pauses its input for back-pressure, unlike the ops and Minder
    workers: a worker that stopped reading heartbeats would find every rank silent. What
    it buffers while the store is down is small (hang episodes, stack dumps, alerts).
    """

    def __init__(
        self,
        settings: HangSettings,
        store: Store | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.settings = settings
        self.service = HangService(settings.hang)  # recalls: take_recalls, recalled
        self.delivery = Delivery.for_settings(settings, store, record_sent=True, wall_ns=clock)
        self.clock = clock
        self.messages_in = 0
        self.topics: dict[str, int] = {}
        """Topic -> partitions, as made or found at start (:mod:`~rankwatch.streams.kit.topics`)."""
        self.restored_episodes = 0
        self.reannounced = 0
        self.retired_jobs = 0
        """Jobs forgotten after ``retire_after_s`` of silence."""
        self._baselines: dict[str, tuple[tuple[float, ...], int]] = {}
        """job -> (step times last snapshotted, when)"""
        self._held: Held[tuple[dict[str, Any], int]] = Held(MAX_HELD)
        """Jobs first met whose recall has not answered: (heartbeat, arrival ns) each."""
        self.job_partitions: dict[str, tuple[str, int]] = {}
        """job -> the (topic, partition) its heartbeats come from"""
        self._evaluated_ns: int | None = None
        self.blind_ticks = 0
        """Evaluations at which the worker could not have heard its jobs since the one
        before (broker unreachable, process stalled): their silence was excused."""

    def on_heartbeat(self, value: bytes, source: Source) -> None:
        """One heartbeat, at its arrival time; a job not recalled yet holds it."""
        self.messages_in += 1
        now = self.clock()
        message, out = self.service.read_heartbeat(value, source, now)
        self.delivery.write(out)
        if message is None:
            return
        job = message["job"]
        self.job_partitions[job] = (source.topic, source.partition)
        if self.service.detector.knows(job) and job not in self._held:
            self.service.detector.observe(message, now)
            return
        self._held.hold(job, (message, now))  # first met: until its recall answers

    def take_recalls(self) -> list[tuple[str, int]]:
        """The recalls to run (:class:`~rankwatch.streams.kit.recall.RecallTasks`):
        :meth:`look_up`, then :meth:`recalled`."""
        return self._held.take_new()

    def look_up(self, job: str) -> Recollection | None:
        """What the store holds of ``job``; None when it cannot answer (logged: the job
        starts afresh). Store calls only, no state touched: safe in a thread."""
        try:
            store = self.delivery.store()
            return Recollection(
                unsent=unannounced(store, job, "hang"),
                latest=store.query(_LATEST_HANG, {"job": job}),
                baseline=load_snapshot(store, job, DETECTOR),
            )
        except StoreError as exc:
            log.warning("job %s not recalled (%s): its state starts afresh", job, exc)
            return None

    def recalled(self, job: str, ticket: int, found: Recollection | None) -> None:
        """Restore ``job`` from ``found`` (:meth:`look_up`), then take the heartbeats it
        held, in order, at the times they came."""
        held = self._held.answered(job, ticket)
        if held is None:  # a stale recall
            return
        try:
            episode, times = self._recall(job, found)
        except Exception:  # whatever the store held, the held heartbeats are taken
            log.exception("job %s: its recall could not be used: it starts afresh", job)
            episode, times = None, []
        self.service.detector.restore(job, episode, times)
        for message, at in held:
            self.service.detector.observe(message, at)

    def recall_waiting(self) -> None:
        """Every recall not started yet, here and now (tests, and callers without an
        event loop)."""
        recall_now(self.take_recalls(), self.look_up, self.recalled)

    def keep_partitions(self, assigned: set[tuple[str, int]]) -> list[str]:
        """The partitions this worker reads now (after a rebalance): forget the jobs
        whose heartbeats came from another, and return them. Their new owner recalls
        them from the store; kept here, they would fall silent and be declared hung.
        A job that stays keeps its state (faust revokes every partition and assigns
        the new set, so a revocation alone says nothing)."""
        gone = [job for job, tp in self.job_partitions.items() if tp not in assigned]
        for job in gone:
            self._forget(job)
            self._held.forget(job)
        return gone

    def _forget(self, job: str) -> None:
        """Drop what this worker holds of ``job`` (the store keeps its rows)."""
        self.job_partitions.pop(job, None)
        self.service.forget(job)
        self._baselines.pop(job, None)

    def on_stacks(self, value: bytes, source: Source) -> None:
        self.messages_in += 1
        self.delivery.write(self.service.on_stacks(value, source, self.clock()))

    def snapshot(self) -> dict[str, Any]:
        """Counters and state for logs and the health file."""
        return {
            "messages_in": self.messages_in,
            "dead_letters": self.service.dead_letters,
            "jobs": len(self.service.detector.jobs()),
            "open_episodes": len(self.service.detector.episodes()),
            "restored_episodes": self.restored_episodes,
            "reannounced_alerts": self.reannounced,
            "retired_jobs": self.retired_jobs,
            "blind_ticks": self.blind_ticks,
            "recalls_waiting": len(self._held),
            "held_dropped": self._held.dropped,
            **self.delivery.snapshot(),
            "topics": dict(self.topics),
        }

    def on_tick(self) -> bool:
        """Evaluate the jobs and store their rows; True when everything is stored (its
        alerts and dead letters may then be published)."""
        self.evaluate()
        return self.delivery.flush()

    def evaluate(self, blind: bool = False) -> None:
        """Evaluate the jobs: their rows and alerts are buffered for the next flush.
        ``blind``: the worker cannot read its heartbeats now (its broker is unreachable);
        that time, and a stall of the process since the last evaluation, excuse every
        rank's silence (:meth:`~.detector.HangDetector.excuse`)."""
        now = self.clock()
        last, self._evaluated_ns = self._evaluated_ns, now
        stalled = last is not None and now - last > STALL_TICKS * self.settings.tick_s * NS
        if blind or stalled:
            self.service.detector.excuse(now)
            self.blind_ticks += 1
        out = self.service.on_tick(now)
        self._log_alerts(out, now)
        self.delivery.write(out)
        self.delivery.write(self._snapshots())
        self._prune()
        self._retire_silent()

    def _log_alerts(self, out: Output, now_ns: int) -> None:
        """Say in the log what each alert rests on: every rank's heartbeat age, progress
        age and phase as this worker saw them, so that an alert nobody expected can be
        explained after the fact from the worker's log alone."""
        for kind, job, alert in out.messages:
            if kind != "alerts":
                continue
            log.warning("hang %s: %s", alert["state"], alert["summary"])
            if alert["state"] != "firing":
                continue
            for r in self.service.detector.ranks(job):
                log.warning(
                    "  rank %d step %d: heard %.1f s ago, progress %.1f s ago, %s, phase %s",
                    r.rank,
                    r.step,
                    (now_ns - r.heard_ns) / NS,
                    (now_ns - r.progress_ns) / NS,
                    "waiting" if r.waiting else "not in communication",
                    r.phase,
                )

    def _prune(self) -> None:
        """Forget the partitions and baselines of jobs the detector dropped (they
        finished) and no recall waits for: one entry a job ever met, else."""
        known = self.service.detector.knows
        self.job_partitions = {
            j: tp for j, tp in self.job_partitions.items() if known(j) or j in self._held
        }
        self._baselines = {j: b for j, b in self._baselines.items() if known(j)}

    def _retire_silent(self) -> None:
        """Forget each job none of whose ranks beat for ``retire_after_s`` (killed, or
        ended without a "finished" heartbeat), once its rows are stored and its latest
        step times snapshotted: a heartbeat of it that comes later recalls it as a job
        first met, its open episode included, which resolves when a rank progresses. A
        silent job's episode stays as stored: nothing says the job recovered."""
        if self.delivery.pending:
            return
        now, detector = self.clock(), self.service.detector
        for job in detector.jobs():
            last = detector.last_heard_ns(job)
            if last is None or now - last < self.settings.retire_after_s * NS:
                continue
            if job in self._held:
                continue
            if self._baselines.get(job, ((), 0))[0] != tuple(detector.step_times(job)):
                continue  # its snapshot is due: written at the next tick, then retired
            self._forget(job)
            self.retired_jobs += 1
            log.info(
                "job %s silent for %.0f s: forgotten until it beats again", job, (now - last) / NS
            )

    def _recall(self, job: str, found: Recollection | None) -> tuple[Episode | None, list[float]]:
        """The job's open episode and step times as stored; its unsent alert states
        queued for sending."""
        if found is None:
            return None, []
        try:
            times = [float(t) for t in (found.baseline or {"step_times": []})["step_times"]]
            latest = found.latest
            episode = episode_from_alert(_alert_message(latest[0])) if latest else None
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # stored data too
            log.warning("job %s: stored state not usable (%r): it starts afresh", job, exc)
            times, episode = [], None
        self._baselines[job] = (tuple(times), self.clock())
        sent = self.delivery.announce_stored("alerts", job, found.unsent)
        self.reannounced += sent
        self.restored_episodes += episode is not None
        what = f"episode {episode.episode_id} open" if episode else "no open episode"
        log.info("job %s recalled: %s, %d unsent alert states sent again", job, what, sent)
        return episode, times

    def _snapshots(self) -> Output:
        """``detector_state`` rows of the jobs whose step times changed, at most one per
        job every ``SNAPSHOT_EVERY_S``."""
        out, now = Output(), self.clock()
        detector = self.service.detector
        for job in detector.jobs():
            times = tuple(detector.step_times(job))
            written, at = self._baselines.get(job, ((), -SNAPSHOT_EVERY_S * NS))
            if times != written and now - at >= SNAPSHOT_EVERY_S * NS:
                state = {"step_times": times}
                generation = self.service.generation
                out.add("detector_state", snapshot_row(job, DETECTOR, now, state, generation))
                self._baselines[job] = (times, now)
        return out


def build_hang_app(settings: HangSettings) -> tuple[faust.App, HangState]:
    app = new_app(settings, settings.offset_reset)
    state = HangState(settings)

    def topic(kind: str) -> Any:
        return input_topic(app, settings.topic_prefix, kind, settings.partitions)

    out_topics = output_topics(app, settings.topic_prefix, ("alerts", DEAD_LETTERS))

    inputs = {kind: topic(kind) for kind in ("heartbeats", "stacks")}
    guard = StallGuard(app, [t.get_topic_name() for t in inputs.values()], log)

    recalls = RecallTasks(state.look_up, state.recalled, log)

    @app.agent(inputs["heartbeats"])
    async def heartbeats(stream: Any) -> None:
        guard.stream(inputs["heartbeats"].get_topic_name(), stream)
        async for event in stream.events():
            guard.handed(event.message)
            state.on_heartbeat(event.value, _source(event.message))
            recalls.start(state.take_recalls())  # in a thread: the others read on

    @app.agent(inputs["stacks"])
    async def stacks(stream: Any) -> None:
        guard.stream(inputs["stacks"].get_topic_name(), stream)
        async for event in stream.events():
            guard.handed(event.message)
            state.on_stacks(event.value, _source(event.message))

    lease = GroupLease(
        settings.bootstrap,
        settings.session_timeout_s,
        member=lambda: member_of(app),
        assigned=lambda: app.consumer_generation_id,
    )
    status = StatusReporter(app, settings.status_file, log, guard=guard, lease=lease)

    async def on_revoked(sender: Any, revoked: set[Any], **_: Any) -> None:
        """Partitions taken while this worker could not answer (paused, cut off): what
        it buffered since (a hang it declared of jobs it could not hear, say) is not
        stored; the next owner judges from the heartbeats. A revocation in a rebalance
        this worker took part in changes nothing here (see ``on_assigned``)."""
        if revoked and lease.lost():
            log.warning("partitions lost, not handed over: rows buffered since go unstored")
            state.delivery.discard()

    async def on_assigned(sender: Any, assigned: set[Any], **_: Any) -> None:
        state.service.generation = app.consumer_generation_id
        gone = state.keep_partitions({(tp.topic, tp.partition) for tp in assigned})
        if gone:
            log.info("%d jobs moved to other workers, forgotten here: %s", len(gone), gone)

    app.on_partitions_assigned.connect(on_assigned)  # type: ignore[arg-type]
    app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]

    storing: list[asyncio.Task[None]] = []
    """The running store, if any: one at a time."""

    async def store_and_publish() -> None:
        if state.delivery.pending and not await lease.may_store():
            return  # not (or no longer) the owner: its rows wait, or go with the partitions
        await flush_in_thread(state.delivery)  # heartbeats are read meanwhile: their
        await publish(state.delivery, out_topics)  # arrival is what says a rank is silent

    @app.timer(interval=settings.tick_s)
    async def tick() -> None:
        """Evaluate the jobs, start a store unless one runs (its rows wait for the next
        one), and write the health file, which a slow store does not hold up."""
        shorten_fetch_wait(app, settings.fetch_wait_ms)
        lease.poll()
        state.evaluate(blind=lease.unreachable_since is not None)
        if storing and storing[0].done():
            storing.pop().result()  # a store that raised raises here, in the timer
        if not storing:
            storing.append(asyncio.ensure_future(store_and_publish()))
        await status(state.snapshot())

    return app, state


_LATEST_HANG = (
    "SELECT alert_id, job, state, ts_ns, summary, evidence FROM alerts FINAL "
    "WHERE job = {job:String} AND kind = 'hang' ORDER BY ts_ns DESC, state = 'resolved' DESC "
    "LIMIT 1"
)


def _alert_message(row: dict[str, Any]) -> dict[str, Any]:
    evidence = row["evidence"]
    return {**row, "evidence": orjson.loads(evidence) if isinstance(evidence, str) else evidence}


def _source(m: Any) -> Source:
    return Source(m.topic, m.partition, m.offset, m.key)
