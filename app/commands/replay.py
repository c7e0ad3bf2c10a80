"""``rankwatch replay``: send a recorded trace as the hooks would, to Kafka or embedded."""

from __future__ import annotations

import argparse
import time
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "replay", help="replay a trace (parquet) as per-rank op batches, to Kafka or embedded"
    )
    parser.add_argument("trace", help="trace-*.parquet")
    parser.add_argument("--meta", required=True, help="meta-*.yaml with the parallel sizes")
    parser.add_argument("--job", required=True, help="job id the batches carry")
    parser.add_argument("--kafka", help="bootstrap servers; without it, replay embedded")
    parser.add_argument("--clickhouse", help="DSN for the embedded replay (default from config)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwatch.config import load_config
    from rankwatch.streams.ops.replay import replay_batches, span_ns
    from rankwatch.traceio import read_meta, read_trace

    trace, meta = read_trace(args.trace), read_meta(args.meta)
    # the replayed job ends now: its rows must not lie in the future
    batches = replay_batches(trace, meta, args.job, origin_ns=time.time_ns() - span_ns(trace))
    config = load_config()
    if args.kafka:
        from rankwatch.streams.ops.publish import publish

        topic = f"{config.kafka.topic_prefix}.ops"  # RANKWATCH_TOPIC_PREFIX, as the worker
        sent = publish(args.kafka, batches, topic=topic)
        print(f"sent {sent} op batches ({len(trace)} ops) of job {args.job} to {topic}")
        return 0

    from rankwatch.ingest import configured_pipeline
    from rankwatch.stores import open_store
    from rankwatch.streams.kit.sink import TableSink
    from rankwatch.streams.ops.embedded import run_embedded

    with open_store(args.clickhouse, migrate=True) as store:
        dsn = store.where
        pipeline = configured_pipeline()  # the worker's: the same alerts and rows
        fed = run_embedded(batches, pipeline, TableSink(store))
    c = pipeline.assembler.counters
    print(
        f"replayed {fed} op batches ({len(trace)} ops) of job {args.job} into {dsn}: "
        f"{c.steps_complete} complete and {c.steps_partial} partial steps"
    )
    return 0
