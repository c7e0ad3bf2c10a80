"""``rankwatch db migrate``: create or bring up to date the ClickHouse tables."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("db", help="manage the ClickHouse schema")
    actions = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    migrate = actions.add_parser(
        "migrate",
        help="apply the migrations not yet applied (idempotent)",
        description="Create the database if needed and apply, in order, every migration of"
        " rankwatch/schemas/migrations not yet recorded in its schema_migrations table.",
    )
    migrate.add_argument(
        "--clickhouse",
        metavar="DSN",
        help="chdb://<dir> (embedded) or http(s)://user:pw@host:port/db"
        " (default: $RANKWATCH_CLICKHOUSE, else chdb://var/chdb)",
    )
    migrate.add_argument(
        "--database", help="database name (default: $RANKWATCH_DATABASE, else rankwatch)"
    )
    migrate.set_defaults(func=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    from rankwatch.config import load_config
    from rankwatch.errors import UserError
    from rankwatch.streams.kit.store import Store, StoreError

    config = load_config().clickhouse
    try:
        with Store.connect(
            args.clickhouse or config.dsn, args.database or config.database or None
        ) as store:
            applied = store.migrate()
            where = f"{store.where} database {store.database}"
    except StoreError as exc:
        raise UserError(str(exc)) from exc
    for name in applied:
        print(f"applied {name}")
    print(f"{where}: up to date ({len(applied)} migration(s) applied now)")
    return 0
