"""``rankwatch grafana build|publish|env``: the boards as code.

``build`` regenerates ``grafana/dashboards/*.json`` from the builders (``--check`` only
says whether they are up to date); ``publish`` pushes them to an existing Grafana;
``env`` prints the variables the datasource provisioning file reads, from a DSN.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("grafana", help="build, publish and provision the boards")
    actions = parser.add_subparsers(dest="grafana_command", metavar="ACTION", required=True)
    build = actions.add_parser("build", help="write the boards' JSON from the builders")
    build.add_argument("--out", type=Path, help="directory (default: grafana/dashboards)")
    build.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a board is stale"
    )
    build.set_defaults(func=run_build)
    publish = actions.add_parser(
        "publish",
        help="push the boards to a Grafana (idempotent: same uids, a new version only"
        " when a board changed)",
    )
    publish.add_argument("--url", required=True, help="Grafana base URL")
    publish.add_argument("--token", required=True, help="service account token")
    publish.add_argument("--folder", default="rankwatch", help="folder title (created if new)")
    publish.set_defaults(func=run_publish)
    env = actions.add_parser(
        "env", help="print the datasource provisioning variables for a ClickHouse DSN"
    )
    env.add_argument("--clickhouse", metavar="DSN", help="default: $RANKWATCH_CLICKHOUSE")
    env.set_defaults(func=run_env)


def run_build(args: argparse.Namespace) -> int:
    from rankwatch.grafana.build import DASHBOARD_DIR, build_all, stale

    out = args.out or DASHBOARD_DIR
    if args.check:
        names = stale(out)
        for name in names:
            print(f"{out / name}.json is out of date: run rankwatch grafana build")
        return 1 if names else 0
    for path in build_all(out):
        print(path)
    return 0


def run_publish(args: argparse.Namespace) -> int:
    from rankwatch.errors import UserError
    from rankwatch.grafana.publish import PublishError, publish

    try:
        results = publish(args.url, args.token, folder=args.folder)
    except PublishError as exc:
        raise UserError(str(exc)) from exc
    for result in results:
        print(f"{result.uid}: {result.action} (version {result.version}) {result.url}")
    return 0


def run_env(args: argparse.Namespace) -> int:
    from rankwatch.config import load_config
    from rankwatch.errors import UserError
    from rankwatch.grafana.provisioning import datasource_env

    dsn = args.clickhouse or load_config().clickhouse.dsn
    try:
        variables = datasource_env(dsn)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    for name, value in variables.items():
        sys.stdout.write(f"export {name}={_quote(value)}\n")
    return 0


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"
