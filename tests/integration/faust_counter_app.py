"""A minimal faust-streaming app that test_faust_on_broker.py runs as a worker process.

Configured from the environment so the test can give it a fresh broker address, app id
(= consumer group) and topics. The agent counts records per key in a table backed by the
in-memory store (its changelog topic in Kafka is what survives a restart) and sends
``<value>|<count>`` to the sink topic under the same key.

Run: ``BOOTSTRAP=127.0.0.1:9092 APP_ID=x SOURCE=a SINK=b PARTITIONS=2 DATADIR=/tmp/x
python faust_counter_app.py worker -l info`` (the arguments are the faust CLI's).
"""

from __future__ import annotations

import os

import faust


def build_app(env: dict[str, str]) -> faust.App:
    app = faust.App(
        env["APP_ID"],
        broker=f"kafka://{env['BOOTSTRAP']}",
        store="memory://",
        datadir=env["DATADIR"],
        web_enabled=False,
        topic_replication_factor=1,
        topic_partitions=int(env["PARTITIONS"]),
        processing_guarantee="at_least_once",
        # Commit consumed offsets every 0.5 s instead of 2.8 s so the test sees them soon.
        broker_commit_interval=0.5,
        # One worker: a standby replica of each table would only double the reading.
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
    )
    source = app.topic(env["SOURCE"], key_serializer="raw", value_serializer="raw")
    sink = app.topic(env["SINK"], key_serializer="raw", value_serializer="raw")
    # key_type=bytes makes the changelog key serializer "raw". Left out, faust picks "json"
    # for the table but writes bytes keys unencoded, and the next worker's recovery fails
    # to decode them ("Error in recovery ... expected a JSON value") and never finishes.
    counts = app.Table("counts", default=int, key_type=bytes, value_type=int)

    @app.agent(source)
    async def count(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            key = event.key
            counts[key] += 1
            await sink.send(key=key, value=b"%s|%d" % (event.value, counts[key]))

    return app


if __name__ == "__main__":
    build_app(dict(os.environ)).main()
