"""The faust stream worker: a thin shell around :class:`WorkerState`.

One agent consumes ``<prefix>.ops`` (keyed by job, so one worker owns a job's open
steps) with acknowledgements under our control: an event is acknowledged only when
what it fed is stored (faust then commits the highest contiguous acknowledged offset
per partition). A timer closes steps whose grace period ran out, stores the buffer,
acknowledges, publishes stored results and writes the health file. All logic is in
:mod:`~rankwatch.streams.ops.worker_state` and the pure core; this module moves bytes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust

from rankwatch.streams.kit.delivery import publish
from rankwatch.streams.kit.faustapp import input_topic, new_app, output_topics, shorten_fetch_wait
from rankwatch.streams.kit.health import StatusReporter
from rankwatch.streams.kit.output import DEAD_LETTERS, Source
from rankwatch.streams.ops.worker_state import WorkerSettings, WorkerState

__all__ = ["WorkerSettings", "WorkerState", "build_app"]

log = logging.getLogger("rankwatch.worker")


def topic_names(settings: WorkerSettings) -> list[str]:
    """The topics the ops worker reads (first) and writes."""
    return [f"{settings.topic_prefix}.{kind}" for kind in ("ops", *OUTPUT_KINDS)]


def build_app(settings: WorkerSettings) -> tuple[faust.App, WorkerState]:
    app = new_app(
        settings,
        consumer_max_fetch_size=settings.fetch_bytes,
        stream_buffer_maxsize=settings.stream_buffer,
        broker_commit_interval=settings.commit_interval_s,
        stream_wait_empty=False,  # unacknowledged events wait for their steps, not rebalances
    )
    state = WorkerState(settings)
    ops_topic = input_topic(app, settings.topic_prefix, "ops", settings.partitions)
    out_topics = output_topics(app, settings.topic_prefix, OUTPUT_KINDS)
    status = StatusReporter(app, settings.status_file, log)

    async def settle() -> None:
        """Store, acknowledge what is stored, announce it (and the dead letters)."""
        for event in state.flush():
            event.ack()
        await publish(state.delivery, out_topics)

    @app.agent(ops_topic)
    async def ops(stream: Any) -> None:
        async for event in stream.noack().events():
            msg = event.message
            batch = state.decode(event.value)
            while state.needs_restore(batch, event.key) and not state.restore(batch):  # type: ignore[arg-type]
                await asyncio.sleep(min(max(state.delivery.retry_in(), 0.05), 5.0))  # store down
            stamp = round(msg.timestamp * 1e9) if msg.timestamp else None
            source = Source(msg.topic, msg.partition, msg.offset, event.key, stamp)
            state.on_message(event, event.value, source, batch)
            while state.full:  # back-pressure: nothing more in memory until it is stored
                await settle()
                if state.full:
                    await asyncio.sleep(min(max(state.delivery.retry_in(), 0.05), 1.0))

    @app.timer(interval=settings.tick_s)
    async def tick() -> None:
        shorten_fetch_wait(app, settings.fetch_wait_ms)
        state.on_tick()
        await settle()
        snapshot = state.snapshot()
        state.input_lag_s = state.delivery.flush_s = 0.0
        await status(snapshot)

    async def on_revoked(sender: Any, revoked: set[Any], **_: Any) -> None:
        await settle()
        state.forget_partitions({(tp.topic, tp.partition) for tp in revoked})

    app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]

    return app, state


OUTPUT_KINDS = ("steps", "alerts", "signals", DEAD_LETTERS)
