"""The faust agent of the faulty-machine detector: ``<prefix>.metrics`` in, Minder out.

A thin shell around :class:`rankwatch.streams.minder.online.JobMonitor` (one per job;
metrics are keyed by job, so one worker owns a job): each message is decoded and
validated (a bad one becomes a ``dead_letters`` row), handed to its job's monitor; a
timer evaluates the monitors, stores ``machine_scores``, ``machine_faults`` and
``alerts`` rows, and only then publishes the alerts on ``<prefix>.alerts``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
import numpy as np

from rankwatch.schemas.codec import InvalidMessage, decode, encode
from rankwatch.streams.alerts import alert_row
from rankwatch.streams.deadletter import dead_letter_row
from rankwatch.streams.faustapp import new_app
from rankwatch.streams.minder.detector import MinderModel
from rankwatch.streams.minder.online import JobMonitor, MonitorOutput, OnlineConfig
from rankwatch.streams.minder.serial import model_from_arrays
from rankwatch.streams.pipeline import Source
from rankwatch.streams.store import Store

log = logging.getLogger("rankwatch.minder")


@dataclass(frozen=True)
class MinderSettings:
    bootstrap: str
    dsn: str
    database: str | None = None
    group: str = "rankwatch-minder"
    topic_prefix: str = "rankwatch"
    partitions: int = 8
    tick_s: float = 1.0
    online: OnlineConfig = field(default_factory=OnlineConfig)
    model_path: str = ""
    """A model written by ``rankwatch minder train`` (denoisers, priority, thresholds);
    empty: no denoising, metrics in name order, the default threshold."""


def load_model(path: str) -> MinderModel | None:
    if not path:
        return None
    with np.load(Path(path), allow_pickle=False) as arrays:
        return model_from_arrays(dict(arrays))


class MinderState:
    """Monitors of the jobs this worker owns, and the store they write to."""

    def __init__(self, settings: MinderSettings, store: Store | None = None) -> None:
        self.settings = settings
        self.model = load_model(settings.model_path)
        self.monitors: dict[str, JobMonitor] = {}
        self._store = store
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.dead_letters = 0

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.connect(self.settings.dsn, database=self.settings.database)
            self._store.migrate()
        return self._store

    def on_message(
        self, value: bytes, topic: str = "", partition: int = -1, offset: int = -1
    ) -> None:
        try:
            msg = decode("metrics", value)
        except InvalidMessage as exc:
            self.dead_letters += 1
            self.pending.setdefault("dead_letters", []).append(
                dead_letter_row(
                    value, Source(topic, partition, offset), time.time_ns(), exc.reason, exc.detail
                )
            )
            return
        monitor = self.monitors.get(msg["job"])
        if monitor is None:
            monitor = self.monitors[msg["job"]] = JobMonitor(
                msg["job"], self.settings.online, self.model
            )
        monitor.add(msg["host"], msg["ts_ns"], msg["metrics"])

    def on_tick(self) -> list[tuple[str, bytes]]:
        """Evaluate every job, store the rows, return the alerts to publish (job, bytes)."""
        alerts: list[dict[str, Any]] = []
        for monitor in self.monitors.values():
            out: MonitorOutput = monitor.evaluate()
            for table, rows in out.rows.items():
                self.pending.setdefault(table, []).extend(rows)
            self.pending.setdefault("alerts", []).extend(alert_row(a) for a in out.alerts)
            alerts.extend(out.alerts)
        for table in [t for t, rows in self.pending.items() if rows]:
            self.store.insert(table, self.pending[table])
            del self.pending[table]
        return [(a["job"], encode("alerts", a)) for a in alerts]


def build_minder_app(settings: MinderSettings) -> tuple[faust.App, MinderState]:
    app = new_app(settings.group, settings.bootstrap, settings.partitions)
    state = MinderState(settings)
    metrics = app.topic(
        f"{settings.topic_prefix}.metrics",
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.partitions,
    )
    alerts = app.topic(
        f"{settings.topic_prefix}.alerts", key_serializer="raw", value_serializer="raw"
    )

    @app.agent(metrics)
    async def consume(stream: Any) -> None:
        async for event in stream.events():
            m = event.message
            state.on_message(event.value, m.topic, m.partition, m.offset)

    @app.timer(interval=settings.tick_s)
    async def tick() -> None:
        for job, value in state.on_tick():
            await alerts.send(key=job.encode(), value=value)

    return app, state
