"""The consumer alone: a faust app with the ops worker's consumer settings whose agent
acknowledges each message and does nothing else (``bench_stream.py --cases floor``).

What it costs a core to take a message off Kafka through faust is the floor under the
ops worker's per-message cost: no decoding, assembly, analysis or store can make a
worker cheaper than this. Configured from the same environment as ``rankwatch worker``
(``RANKWATCH_KAFKA``, ``RANKWATCH_TOPIC_PREFIX``, ``RANKWATCH_GROUP``,
``RANKWATCH_STATUS_FILE``); run as ``python benchmarks/faust_floor.py worker -l warn``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from rankwatch.streams.kit.faustapp import input_topic, new_app, shorten_fetch_wait
from rankwatch.streams.kit.health import StatusReporter
from rankwatch.streams.ops.worker import consumer_settings
from rankwatch.streams.ops.worker_state import WorkerSettings


def build(env: dict[str, str]) -> Any:
    settings = WorkerSettings(
        bootstrap=env["RANKWATCH_KAFKA"],
        dsn="-",
        group=env["RANKWATCH_GROUP"],
        topic_prefix=env["RANKWATCH_TOPIC_PREFIX"],
        partitions=1,
        session_timeout_s=float(env.get("RANKWATCH_SESSION_TIMEOUT_S", "6")),
    )
    app = new_app(settings, **consumer_settings(settings))
    status = StatusReporter(app, env.get("RANKWATCH_STATUS_FILE"), logging.getLogger("floor"))
    read = [0]

    @app.agent(input_topic(app, settings.topic_prefix, "ops", 1))
    async def ops(stream: Any) -> None:
        async for event in stream.noack().events():
            read[0] += 1
            event.ack()

    @app.timer(interval=settings.tick_s)
    async def tick() -> None:
        shorten_fetch_wait(app, settings.fetch_wait_ms)
        await status({"messages_read": read[0]})

    return app


if __name__ == "__main__":
    build(dict(os.environ)).main()
