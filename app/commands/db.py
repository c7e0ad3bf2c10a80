"""``rankwatch db migrate``: create or bring up to date the ClickHouse tables."""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_DSN = "chdb://var/chdb"
"""Embedded chDB under ./var/chdb unless --clickhouse or $RANKWATCH_CLICKHOUSE says otherwise."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("db", help="manage the ClickHouse schema")
    actions = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    migrate = actions.add_parser(
        "migrate",
        help="apply the migrations not yet applied (idempotent)",
        description="Create the database and apply, in order, every migration of"
        " rankwatch/schemas/migrations not yet recorded in schema_migrations.",
    )
    migrate.add_argument(
        "--clickhouse",
        metavar="DSN",
        default=os.environ.get("RANKWATCH_CLICKHOUSE", DEFAULT_DSN),
        help="chdb://<dir> (embedded) or http(s)://user:pw@host:port/db"
        f" (default: $RANKWATCH_CLICKHOUSE or {DEFAULT_DSN})",
    )
    migrate.add_argument(
        "--database", default=None, help="database name (default: from the DSN, else rankwatch)"
    )
    migrate.set_defaults(func=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    from rankwatch.errors import UserError
    from rankwatch.streams.store import Store, StoreError

    try:
        with Store.connect(args.clickhouse, args.database) as store:
            applied = store.migrate()
            where = f"{store.where} database {store.database}"
    except StoreError as exc:
        raise UserError(str(exc)) from exc
    for name in applied:
        print(f"applied {name}")
    print(f"{where}: up to date ({len(applied)} migration(s) applied now)")
    return 0
