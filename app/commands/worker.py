"""``rankwatch worker``: the faust stream worker.

Its settings are the config tree's ``[kafka]``, ``[clickhouse]``, ``[assembly]`` and
``[worker]`` sections (``rankwatch.config``; ``rankwatch config show`` prints them).
``rankwatch worker --health FILE`` checks a running worker (exit 0 healthy, 1 not).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rankwatch.topics import make_topics


def register(sub: Any) -> None:
    parser = sub.add_parser("worker", help="run the faust stream worker (or check its health)")
    parser.add_argument("--config", help="TOML config file (see README)")
    parser.add_argument("--kafka", help="bootstrap servers (overrides config and env)")
    parser.add_argument("--clickhouse", help="ClickHouse DSN (overrides config and env)")
    parser.add_argument("--status-file", help="health file the worker writes every tick")
    parser.add_argument(
        "--health", metavar="FILE", help="check the worker that writes FILE, and exit"
    )
    parser.add_argument("--max-age", type=float, default=30.0, help="for --health, seconds")
    parser.add_argument("--max-lag", type=float, default=120.0, help="for --health, seconds")
    parser.add_argument("--loglevel", default="info")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.health:
        return _health(args)
    from rankwatch.config import load_config, service_settings, with_flags
    from rankwatch.streams.kit.faustapp import serve
    from rankwatch.streams.ops.worker import (
        JOBSTATE_TOPIC_CONFIG,
        WorkerSettings,
        build_app,
        jobstate_topic_name,
        topic_names,
    )

    config = with_flags(
        load_config(args.config),
        {
            "kafka.bootstrap": args.kafka,
            "clickhouse.dsn": args.clickhouse,
            "worker.status_file": args.status_file,
        },
    )
    worker = config.worker
    settings = WorkerSettings(
        **service_settings(config),
        assembly=config.assembly,
        slowdown=config.slowdown,
        alerts=worker.alerts(),
        window=worker.window,
        keep_ops=worker.keep_ops,
        max_message_bytes=worker.max_message_bytes,
        fetch_bytes=worker.fetch_bytes,
        fetch_wait_ms=worker.fetch_wait_ms,
        tick_s=worker.tick_s,
        store_gap_s=worker.store_gap_s,
        commit_interval_s=worker.commit_interval_s,
        retire_after_s=worker.retire_after_s,
        status_file=worker.status_file or None,
    )
    report = make_topics(config.kafka, topic_names(settings))
    # the jobs' handover states: compacted, one partition per input partition
    ops_partitions = report.partitions[topic_names(settings)[0]]
    handover = make_topics(
        config.kafka, [jobstate_topic_name(settings)], ops_partitions, JOBSTATE_TOPIC_CONFIG
    )
    app, state = build_app(settings)
    state.topics = {**report.partitions, **handover.partitions}
    serve(app, args.loglevel, settings.stop_wait_s)
    return 0


def _health(args: argparse.Namespace) -> int:
    from rankwatch.streams.kit.health import check_status, read_status

    try:
        status = read_status(args.health)
    except (OSError, ValueError) as exc:
        print(f"unhealthy: cannot read {args.health}: {exc}")
        return 1
    problems = check_status(status, time.time_ns(), args.max_age, args.max_lag)
    keys = ("records_in", "steps_analysed", "steps_partial", "dead_letters", "sink_lag_s")
    print(" ".join(f"{k}={status.get(k)}" for k in keys))
    for problem in problems:
        print(f"unhealthy: {problem}")
    return 1 if problems else 0
