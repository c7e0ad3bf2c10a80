"""``rankwatch worker``: the faust stream worker, configured from file and environment."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser("worker", help="run the faust stream worker")
    parser.add_argument("--config", help="TOML config file (see README)")
    parser.add_argument("--kafka", help="bootstrap servers (overrides config and env)")
    parser.add_argument("--clickhouse", help="ClickHouse DSN (overrides config and env)")
    parser.add_argument("--loglevel", default="info")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from faust.worker import Worker

    from rankwatch.config import load_config
    from rankwatch.streams.worker import WorkerSettings, build_app

    config = load_config(args.config)
    if args.kafka:
        config = replace(config, kafka=replace(config.kafka, bootstrap=args.kafka))
    if args.clickhouse:
        config = replace(config, clickhouse=replace(config.clickhouse, dsn=args.clickhouse))
    settings = WorkerSettings(
        bootstrap=config.kafka.bootstrap,
        dsn=config.clickhouse.dsn,
        database=config.clickhouse.database or None,
        group=config.kafka.group,
        topic_prefix=config.kafka.topic_prefix,
        partitions=config.kafka.partitions,
        assembly=config.assembly,
    )
    app, _state = build_app(settings)
    Worker(app, loglevel=args.loglevel, quiet=True).execute_from_commandline()
    return 0
