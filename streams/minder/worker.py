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
(continuity counts, open episodes, the samples the next windows still need, where the
next window ends); the messages after it are read again from the committed offset, so
the windows evaluated after a restart are those an uninterrupted run evaluated. Alert
states stored but not recorded as sent are sent again.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import faust
import numpy as np

from rankwatch.schemas.codec import InvalidMessage, decode, encode
from rankwatch.streams.kit.deadletter import DeadLetter, dead_letter, dead_letter_row
from rankwatch.streams.kit.faustapp import input_topic, new_app, output_topics
from rankwatch.streams.kit.output import DEAD_LETTERS, Publication, Source, alert_row
from rankwatch.streams.kit.restart import (
    announced_row,
    deliver,
    load_snapshot,
    snapshot_row,
    unannounced,
)
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
    }


def restore_monitor(monitor: JobMonitor, state: dict[str, Any]) -> None:
    monitor.next_end_ns = state["next_end_ns"]
    monitor.newest_ns = state["evaluated_end_ns"]  # later samples are read again
    monitor.runs = {(metric, host): int(n) for metric, host, n in state["runs"]}
    monitor.episodes = {ep["host"]: Episode(**ep) for ep in state["episodes"]}
    monitor.samples = {
        host: deque((int(t), m) for t, m in rows) for host, rows in state["samples"].items() if rows
    }


def load_model(path: str) -> MinderModel | None:
    if not path:
        return None
    with np.load(Path(path), allow_pickle=False) as arrays:
        return model_from_arrays(dict(arrays))


class MinderState:
    """Monitors of the jobs this worker owns, and the store they write to."""

    def __init__(
        self,
        settings: MinderSettings,
        store: Store | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.model = load_model(settings.model_path)
        self.monitors: dict[str, JobMonitor] = {}
        self._store = store
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.dead_letters = 0
        self.dead_outbox: list[DeadLetter] = []
        """Refused messages whose rows wait to be stored, then go to the dead-letter topic."""
        self._dead_ready: list[DeadLetter] = []
        self.unacked: dict[str, list[tuple[Token, int]]] = {}
        """job -> (token, sample ts_ns) of messages no stored snapshot covers yet"""
        self.settled: list[Token] = []
        """Tokens to acknowledge once the pending rows are stored."""
        self.acks: list[Token] = []
        """Tokens whose messages are covered by stored rows: the shell acknowledges them."""
        self.outbox: list[dict[str, Any]] = []
        """Alerts to publish once the pending rows are stored (with the stored alert
        states never recorded as sent, found when a job was recalled)."""
        self.covered_ns: dict[str, int] = {}
        """job -> end of the window its recalled snapshot was taken at: messages up to
        it are in that snapshot, or were not needed by it."""
        self.restored_jobs = 0
        self.clock = clock
        self.heard: dict[str, float] = {}
        """job -> when its latest message came (this worker's clock, seconds)"""

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.connect(self.settings.dsn, database=self.settings.database)
            self._store.migrate()
        return self._store

    def on_message(
        self,
        value: bytes,
        topic: str = "",
        partition: int = -1,
        offset: int = -1,
        token: Token = None,
        key: bytes | None = None,
    ) -> None:
        try:
            msg = decode("metrics", value)
        except InvalidMessage as exc:
            self.dead_letters += 1
            source = Source(topic, partition, offset, key)
            self.pending.setdefault("dead_letters", []).append(
                dead_letter_row(value, source, time.time_ns(), exc.reason, exc.detail)
            )
            self.dead_outbox.append(dead_letter(value, source, exc.reason, exc.detail))
            self._settle(token)
            return
        monitor = self.monitors.get(msg["job"]) or self._meet(msg["job"])
        if msg["ts_ns"] <= self.covered_ns.get(msg["job"], -1):  # read again after a restart
            self._settle(token)
            return
        late = monitor.late
        monitor.add(msg["host"], msg["ts_ns"], msg["metrics"])
        if monitor.late > late:  # too late to count: nothing to keep
            self._settle(token)
        elif token is not None:
            self.unacked.setdefault(msg["job"], []).append((token, msg["ts_ns"]))
        self.heard[msg["job"]] = self.clock()

    def on_tick(self) -> list[tuple[str, bytes]]:
        """Evaluate every job, store the rows (snapshots last), return the alerts to
        publish (job, bytes); :attr:`acks` then holds what the stored rows cover. A
        store that fails keeps rows, alerts and acknowledgements for the next tick."""
        for job, monitor in self.monitors.items():
            before = monitor.next_end_ns
            out: MonitorOutput = monitor.evaluate()
            for table, rows in out.rows.items():
                self.pending.setdefault(table, []).extend(rows)
            self.pending.setdefault("alerts", []).extend(alert_row(a) for a in out.alerts)
            self.outbox.extend(out.alerts)
            if monitor.next_end_ns != before:
                self._snapshot(job, monitor)
        self._release_idle()
        tables = [t for t, rows in self.pending.items() if rows and t != "detector_state"]
        for table in [*tables, "detector_state"]:  # a snapshot only after its rows
            if self.pending.get(table):
                self.store.insert(table, self.pending[table])
            self.pending.pop(table, None)
        self.acks += self.settled
        self._dead_ready += self.dead_outbox
        self.dead_outbox = []
        alerts, self.outbox, self.settled = self.outbox, [], []
        return [(a["job"], encode("alerts", a)) for a in alerts]

    def sent(self, alerts: list[tuple[str, bytes]]) -> None:
        """These alerts are on the broker: record them (a kill before the record is
        stored makes the next worker send them again)."""
        now = time.time_ns()
        rows = [announced_row(decode("alerts", value), now) for _, value in alerts]
        if rows:
            self.store.insert("announced", rows)
            log.info("%d alert states sent and recorded", len(rows))

    def take_dead_letters(self) -> list[Publication]:
        """Dead letters whose rows are stored, for ``<prefix>.dead-letters``."""
        ready, self._dead_ready = self._dead_ready, []
        return [Publication.of_dead_letter(d) for d in ready]

    def take_acks(self) -> list[Token]:
        acks, self.acks = self.acks, []
        return acks

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

    def _snapshot(self, job: str, monitor: JobMonitor) -> None:
        """Queue the monitor's snapshot; the messages it covers are acknowledged once
        it is stored."""
        assert monitor.next_end_ns is not None
        end = monitor.next_end_ns - self.settings.online.stride_s * NS
        state = monitor_state(monitor, end)
        self.pending.setdefault("detector_state", []).append(
            snapshot_row(job, DETECTOR, end, state)
        )
        waiting = self.unacked.get(job, [])
        self.unacked[job] = [(t, ts) for t, ts in waiting if ts > end]
        self.settled += [t for t, ts in waiting if ts <= end]

    def _meet(self, job: str) -> JobMonitor:
        """A new monitor for a job first met, restored from its latest snapshot."""
        monitor = self.monitors[job] = JobMonitor(job, self.settings.online, self.model)
        try:
            state = load_snapshot(self.store, job, DETECTOR)
            resend = unannounced(self.store, job, "faulty_machine")
        except StoreError as exc:
            log.warning("job %s not recalled (%s): its state starts afresh", job, exc)
            return monitor
        self.outbox += resend
        if state is not None:
            restore_monitor(monitor, state)
            self.covered_ns[job] = state["evaluated_end_ns"]
            self.restored_jobs += 1
        log.info(
            "job %s recalled: %s, %d open episodes, %d unsent alert states sent again",
            job, "snapshot" if state else "no snapshot", len(monitor.episodes), len(resend),
        )  # fmt: skip
        return monitor


def build_minder_app(settings: MinderSettings) -> tuple[faust.App, MinderState]:
    app = new_app(
        settings.group,
        settings.bootstrap,
        settings.partitions,
        session_timeout_s=settings.session_timeout_s,
        stream_wait_empty=False,  # unacknowledged events wait for their window, not rebalances
    )
    state = MinderState(settings)
    metrics = input_topic(app, settings.topic_prefix, "metrics", settings.partitions)
    topics = output_topics(app, settings.topic_prefix, ("alerts", DEAD_LETTERS))

    @app.agent(metrics)
    async def consume(stream: Any) -> None:
        async for event in stream.noack().events():
            m = event.message
            state.on_message(event.value, m.topic, m.partition, m.offset, token=event, key=m.key)

    @app.timer(interval=settings.tick_s)
    async def tick() -> None:
        ready = state.on_tick()
        for event in state.take_acks():
            event.ack()
        try:
            await deliver(topics, [Publication("alerts", job, value) for job, value in ready])
        except Exception:
            state.outbox[:0] = [decode("alerts", value) for _, value in ready]  # the next tick
            raise
        state.sent(ready)
        await deliver(topics, state.take_dead_letters())

    return app, state
