"""A faust-streaming app that loses records the way faust 0.15.3 does after a rebalance,
for test_faust_stalls.py, run as a worker process.

At its assignment it moves the Kafka client's position on partition 0 of ``SOURCE`` to
``SKIP_TO``, under faust (as a fetch dropped by faust leaves it: faust's recovery then
seeks only partitions with a committed offset, and this group has none). The agent
counts the records it gets; the rankwatch :class:`StallGuard` runs at each tick through
the status reporter, as in the workers, and the status file says what the agent got.

Run: ``BOOTSTRAP=... APP_ID=x SOURCE=a PARTITIONS=2 SKIP_TO=30 STATUS=/tmp/s.json
DATADIR=/tmp/x python faust_stall_app.py worker --without-web``.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Any

import faust

from rankwatch.streams.kit.health import StatusReporter
from rankwatch.streams.kit.rewind import StallGuard

log = logging.getLogger("stall-app")


def build_app(env: dict[str, str]) -> faust.App:
    app = faust.App(
        env["APP_ID"],
        broker=f"kafka://{env['BOOTSTRAP']}",
        store="memory://",
        datadir=env["DATADIR"],
        web_enabled=False,
        topic_replication_factor=1,
        topic_partitions=int(env["PARTITIONS"]),
        broker_commit_interval=0.5,
        consumer_auto_offset_reset="earliest",
    )
    source = app.topic(env["SOURCE"], key_serializer="raw", value_serializer="raw")
    guard = StallGuard(app, [env["SOURCE"]], log, wait_s=float(env.get("WAIT_S", "2")))
    status = StatusReporter(app, env["STATUS"], log, guard=guard)
    got: Counter[int] = Counter()
    offsets: dict[int, set[int]] = {}

    @app.agent(source)
    async def count(stream: Any) -> None:
        guard.stream(env["SOURCE"], stream)
        async for event in stream.events():
            guard.handed(event.message)
            got[event.message.partition] += 1
            offsets.setdefault(event.message.partition, set()).add(event.message.offset)

    async def skip(sender: Any, assigned: set[Any], **_: Any) -> None:
        for tp in assigned:
            if tp.topic == env["SOURCE"] and tp.partition == 0:
                kafka = app.consumer._thread._consumer  # type: ignore[attr-defined]
                kafka.seek(tp, int(env["SKIP_TO"]))
                log.warning("moved %s to offset %s under faust", tp, env["SKIP_TO"])

    app.on_partitions_assigned.connect(skip)  # type: ignore[arg-type]

    @app.timer(interval=0.5)
    async def tick() -> None:
        distinct = {str(p): len(v) for p, v in offsets.items()}
        await status({"got": {str(p): n for p, n in got.items()}, "distinct": distinct})

    return app


if __name__ == "__main__":
    build_app(dict(os.environ)).main()
