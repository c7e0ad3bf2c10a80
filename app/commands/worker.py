"""``rankwatch worker``: the faust stream worker, configured from file and environment.

Worker settings beyond the shared configuration come from the environment (until the
shared config file has a ``[worker]`` section):

- ``RANKWATCH_STATUS_FILE``: health file written every tick (``--status-file``)
- ``RANKWATCH_ALERT_SLOWDOWN`` / ``RANKWATCH_ALERT_CLEAR``: rolling job-level S at which
  a straggler alert fires / resolves (defaults 1.10 / 1.05)
- ``RANKWATCH_WINDOW``: steps in the rolling ideal window (default 20)
- ``RANKWATCH_MAX_MESSAGE_BYTES``: larger op-batch messages are dead letters (8 MiB)
- ``RANKWATCH_FETCH_BYTES``: bytes per partition and fetch (4 MiB)
- ``RANKWATCH_FETCH_WAIT_MS``: longest a fetch waits at the broker for new data (50)
- ``RANKWATCH_TICK_S``: seconds between stores of the buffer (and grace checks), 1
- ``RANKWATCH_SESSION_TIMEOUT_S``: Kafka group session timeout (default 30)
- ``RANKWATCH_COMMIT_INTERVAL_S``: how often stored offsets are committed (default 1)
- ``RANKWATCH_KEEP_OPS``: ``0`` to not store raw op records (windows are then not
  restored after a restart)

``rankwatch worker --health FILE`` checks a running worker (exit 0 healthy, 1 not).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from typing import Any

from rankwatch.errors import UserError
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
    from faust.worker import Worker

    from rankwatch.config import load_config
    from rankwatch.streams.alerts import AlertConfig
    from rankwatch.streams.worker import WorkerSettings, build_app, topic_names

    config = load_config(args.config)
    if args.kafka:
        config = replace(config, kafka=replace(config.kafka, bootstrap=args.kafka))
    if args.clickhouse:
        config = replace(config, clickhouse=replace(config.clickhouse, dsn=args.clickhouse))
    env = os.environ
    alerts = AlertConfig(
        fire_at=_number(env, "RANKWATCH_ALERT_SLOWDOWN", AlertConfig.fire_at),
        clear_below=_number(env, "RANKWATCH_ALERT_CLEAR", AlertConfig.clear_below),
    )
    settings = WorkerSettings(
        bootstrap=config.kafka.bootstrap,
        dsn=config.clickhouse.dsn,
        database=config.clickhouse.database or None,
        group=config.kafka.group,
        topic_prefix=config.kafka.topic_prefix,
        partitions=config.kafka.partitions,
        assembly=config.assembly,
        alerts=alerts,
        window=int(_number(env, "RANKWATCH_WINDOW", 20)),
        keep_ops=env.get("RANKWATCH_KEEP_OPS", "1") != "0",
        max_message_bytes=int(_number(env, "RANKWATCH_MAX_MESSAGE_BYTES", 8 * 1024 * 1024)),
        fetch_bytes=int(_number(env, "RANKWATCH_FETCH_BYTES", 4 * 1024 * 1024)),
        fetch_wait_ms=int(_number(env, "RANKWATCH_FETCH_WAIT_MS", 50)),
        tick_s=_number(env, "RANKWATCH_TICK_S", 1.0),
        session_timeout_s=_number(env, "RANKWATCH_SESSION_TIMEOUT_S", 30.0),
        commit_interval_s=_number(env, "RANKWATCH_COMMIT_INTERVAL_S", 1.0),
        status_file=args.status_file or env.get("RANKWATCH_STATUS_FILE") or None,
    )
    report = make_topics(config.kafka, topic_names(settings))
    app, state = build_app(settings)
    state.topics = dict(report.partitions)
    Worker(app, loglevel=args.loglevel, quiet=True).execute_from_commandline()
    return 0


def _number(env: Any, name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None:
        return float(default)
    try:
        return float(raw)
    except ValueError as exc:
        raise UserError(f"{name} must be a number: {raw!r}") from exc


def _health(args: argparse.Namespace) -> int:
    from rankwatch.streams.health import check_status, read_status

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
