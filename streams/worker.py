"""The faust stream worker: a thin shell around :class:`Pipeline` and :class:`TableSink`.

One agent consumes ``rankwatch.ops`` (keyed by job, so one worker owns a job's
open steps); a timer closes steps whose grace period ran out and flushes the sink.
All logic is in the pipeline; this module only moves bytes and rows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import faust

from rankwatch.schemas.codec import encode
from rankwatch.streams.analyser import WhatIfAnalyser
from rankwatch.streams.assembly import AssemblyConfig
from rankwatch.streams.pipeline import Output, Pipeline, Source
from rankwatch.streams.sink import TableSink
from rankwatch.streams.store import Store

log = logging.getLogger("rankwatch.worker")


@dataclass(frozen=True)
class WorkerSettings:
    bootstrap: str
    dsn: str
    database: str | None = None
    """None: the DSN's database, else ``rankwatch``."""
    group: str = "rankwatch-worker"
    topic_prefix: str = "rankwatch"
    """Topics are ``<prefix>.<kind>``; tests use a fresh prefix each."""
    partitions: int = 8
    tick_s: float = 1.0
    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)


class WorkerState:
    """The pipeline and the sink of one worker process; the store opens on first use."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.pipeline = Pipeline(assembly=settings.assembly, analyser=WhatIfAnalyser())
        self._sink: TableSink | None = None
        self._unpublished: list[tuple[str, str, dict[str, Any]]] = []

    @property
    def sink(self) -> TableSink:
        if self._sink is None:
            store = Store.connect(self.settings.dsn, database=self.settings.database)
            store.migrate()
            self._sink = TableSink(store)
        return self._sink

    def on_message(self, value: bytes, source: Source) -> None:
        self._write(self.pipeline.on_message(value, source, time.time_ns()))

    def on_tick(self) -> list[tuple[str, str, bytes]]:
        """Close expired steps, store everything buffered, and return the messages that
        may be published now (only results that are stored are announced)."""
        self._write(self.pipeline.on_tick(time.time_ns()))
        self.sink.flush()
        ready, self._unpublished = self._unpublished, []
        return [(kind, key, encode(kind, message)) for kind, key, message in ready]

    def _write(self, out: Output) -> None:
        self.sink.write(out)
        self._unpublished.extend(out.messages)

    def counters(self) -> dict[str, Any]:
        c = self.pipeline.assembler.counters
        return {**vars(c), "dead_letters": self.pipeline.dead_letters}


def build_app(settings: WorkerSettings) -> tuple[faust.App, WorkerState]:
    app = faust.App(
        settings.group,
        broker=f"kafka://{settings.bootstrap}",
        store="memory://",
        web_enabled=False,
        topic_replication_factor=1,
        topic_partitions=settings.partitions,
        consumer_auto_offset_reset="earliest",
    )
    state = WorkerState(settings)
    ops_topic = app.topic(
        f"{settings.topic_prefix}.ops",
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.partitions,
    )

    @app.agent(ops_topic)
    async def ops(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            state.on_message(event.value, Source(msg.topic, msg.partition, msg.offset, event.key))

    out_topics = {
        kind: app.topic(
            f"{settings.topic_prefix}.{kind}", key_serializer="raw", value_serializer="raw"
        )
        for kind in ("steps", "alerts")
    }

    @app.timer(interval=settings.tick_s)
    async def tick() -> None:
        for kind, key, value in state.on_tick():
            await out_topics[kind].send(key=key.encode(), value=value)
        log.info("counters %s", state.counters())

    return app, state
