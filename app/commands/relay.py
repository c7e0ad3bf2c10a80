"""``rankwatch relay``: one per host; bundles the host's ranks' small op messages."""

from __future__ import annotations

import argparse
from typing import Any

from rankwatch.commands.agent import add_spool_arguments, start_sweeper

DESCRIPTION = """\
Take the small op messages of this host's ranks on a Unix datagram socket and send
them to <prefix>.ops in bundles, one per job and moment (what the stream worker pays
per message is then paid once for the host's ranks, not once per rank). The ranks'
hooks use it when RANKWATCH_RELAY names the socket (and RANKWATCH_KAFKA is set); they
send to Kafka themselves whenever the relay is not there or not keeping up.
docs/running.md, "A relay per host"."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "relay",
        help="per-host relay: bundles the ranks' small op messages (RANKWATCH_RELAY)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--socket", required=True, help="the socket path the ranks send to")
    parser.add_argument("--config", help="rankwatch.toml (kafka section)")
    parser.add_argument("--kafka", help="bootstrap servers (default: config / RANKWATCH_KAFKA)")
    parser.add_argument(
        "--linger", type=float, default=None, metavar="SECONDS",
        help="longest a bundle's first message waits for others (default 0.05)",
    )  # fmt: skip
    parser.add_argument(
        "--no-join", action="store_true",
        help="send bundles of whole frames, not joined (for workers older than x-joined)",
    )  # fmt: skip
    parser.add_argument("--status-file", help="write the counters here as JSON, each second")
    add_spool_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import signal
    import sys
    import threading
    from pathlib import Path

    from rankwatch.agent import KafkaTransport
    from rankwatch.agent.relay import KafkaSender, Relay, RelayCounters, bind
    from rankwatch.config import load_config
    from rankwatch.errors import UserError
    from rankwatch.schemas.batching import RelayRule

    config = load_config(args.config)
    bootstrap = args.kafka or config.kafka.bootstrap
    if not bootstrap:
        raise UserError("rankwatch relay: no Kafka (give --kafka, or set RANKWATCH_KAFKA)")
    rule = RelayRule(join=not args.no_join)
    if args.linger is not None:
        rule = dataclasses.replace(rule, linger_s=args.linger)
    topic = f"{config.kafka.topic_prefix}.ops"
    producer = KafkaSender(KafkaTransport(bootstrap, topic, linger_ms=0))
    try:
        sock = bind(args.socket)
    except OSError as exc:
        raise UserError(f"rankwatch relay: cannot listen on {args.socket}: {exc}") from None

    def report(counters: RelayCounters) -> None:
        if args.status_file:
            path = Path(args.status_file)
            path.with_suffix(".tmp").write_text(json.dumps(dataclasses.asdict(counters)))
            path.with_suffix(".tmp").replace(path)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    close_sweeper = start_sweeper(args, config, bootstrap, stop)
    try:
        counters = Relay(sock, producer, rule).run(stop, report)
    finally:
        stop.set()
        sock.close()
        Path(args.socket).unlink(missing_ok=True)
        producer.close()
        if close_sweeper is not None:
            close_sweeper()
    print(f"rankwatch relay: {json.dumps(dataclasses.asdict(counters))}", file=sys.stderr)
    return 0
