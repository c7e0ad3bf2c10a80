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
"After a restart").
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
from rankwatch.streams.kit.output import DEAD_LETTERS, Output, Source
from rankwatch.streams.kit.restart import load_snapshot, snapshot_row, unannounced
from rankwatch.streams.kit.rewind import StallGuard
from rankwatch.streams.kit.settings import ServiceSettings
from rankwatch.streams.kit.store import Store, StoreError

log = logging.getLogger("rankwatch.hang")
DETECTOR = "hang"
SNAPSHOT_EVERY_S = 10
"""A job's step-time baseline is stored at most this often (it changes every step)."""
NS = 1_000_000_000


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
        self.service = HangService(settings.hang, recall=self._recall)
        self.delivery = Delivery.for_settings(settings, store, record_sent=True, wall_ns=clock)
        self.clock = clock
        self.messages_in = 0
        self.topics: dict[str, int] = {}
        """Topic -> partitions, as made or found at start (:mod:`~rankwatch.streams.kit.topics`)."""
        self.restored_episodes = 0
        self.reannounced = 0
        self._baselines: dict[str, tuple[tuple[float, ...], int]] = {}
        """job -> (step times last snapshotted, when)"""

    def on_heartbeat(self, value: bytes, source: Source) -> None:
        self.messages_in += 1
        self.delivery.write(self.service.on_heartbeat(value, source, self.clock()))

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
            **self.delivery.snapshot(),
            "topics": dict(self.topics),
        }

    def on_tick(self) -> bool:
        """Evaluate the jobs and store their rows; True when everything is stored (its
        alerts and dead letters may then be published)."""
        self.evaluate()
        return self.delivery.flush()

    def evaluate(self) -> None:
        """Evaluate the jobs: their rows and alerts are buffered for the next flush."""
        self.delivery.write(self.service.on_tick(self.clock()))
        self.delivery.write(self._snapshots())

    def _recall(self, job: str) -> tuple[Episode | None, list[float]]:
        """The job's open episode and step times as stored; its unsent alert states
        queued for sending. A store that cannot answer leaves the job unrecalled
        (logged): it starts afresh."""
        try:
            store = self.delivery.store()
            stored = unannounced(store, job, "hang")
            latest = store.query(_LATEST_HANG, {"job": job})
            baseline = load_snapshot(store, job, DETECTOR) or {"step_times": []}
        except StoreError as exc:
            log.warning("job %s not recalled (%s): its state starts afresh", job, exc)
            return None, []
        self._baselines[job] = (tuple(baseline["step_times"]), self.clock())
        self.reannounced += len(stored)
        for alert in stored:
            self.delivery.announce("alerts", job, alert)
        episode = episode_from_alert(_alert_message(latest[0])) if latest else None
        self.restored_episodes += episode is not None
        what = f"episode {episode.episode_id} open" if episode else "no open episode"
        log.info("job %s recalled: %s, %d unsent alert states sent again", job, what, len(stored))
        return episode, list(baseline["step_times"])

    def _snapshots(self) -> Output:
        """``detector_state`` rows of the jobs whose step times changed, at most one per
        job every ``SNAPSHOT_EVERY_S``."""
        out, now = Output(), self.clock()
        detector = self.service.detector
        for job in detector.jobs():
            times = tuple(detector.step_times(job))
            written, at = self._baselines.get(job, ((), -SNAPSHOT_EVERY_S * NS))
            if times != written and now - at >= SNAPSHOT_EVERY_S * NS:
                out.add("detector_state", snapshot_row(job, DETECTOR, now, {"step_times": times}))
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

    @app.agent(inputs["heartbeats"])
    async def heartbeats(stream: Any) -> None:
        guard.stream(inputs["heartbeats"].get_topic_name(), stream)
        async for event in stream.events():
            guard.handed(event.message)
            state.on_heartbeat(event.value, _source(event.message))

    @app.agent(inputs["stacks"])
    async def stacks(stream: Any) -> None:
        guard.stream(inputs["stacks"].get_topic_name(), stream)
        async for event in stream.events():
            guard.handed(event.message)
            state.on_stacks(event.value, _source(event.message))

    status = StatusReporter(app, settings.status_file, log, guard=guard)

    storing: list[asyncio.Task[None]] = []
    """The running store, if any: one at a time."""

    async def store_and_publish() -> None:
        await flush_in_thread(state.delivery)  # heartbeats are read meanwhile: their
        await publish(state.delivery, out_topics)  # arrival is what says a rank is silent

    @app.timer(interval=settings.tick_s)
    async def tick() -> None:
        """Evaluate the jobs, start a store unless one runs (its rows wait for the next
        one), and write the health file, which a slow store does not hold up."""
        shorten_fetch_wait(app, settings.fetch_wait_ms)
        state.evaluate()
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
