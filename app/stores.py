"""The store every command reads and writes: one default, one place to change it.

The DSN is the configuration's (``[clickhouse] dsn``, overridden by
``RANKWATCH_CLICKHOUSE``, default ``chdb://var/chdb``) unless a command's
``--clickhouse`` flag names another, so ``rankwatch demo`` stores where ``rankwatch
report`` and ``rankwatch hang report`` look. Store failures (a chDB path that another
process holds, an unreachable server) become one-line :class:`UserError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rankwatch.errors import UserError

if TYPE_CHECKING:
    from rankwatch.streams.kit.store import Store

JOB_TABLES = ("jobs", "steps", "hangs")
"""Tables whose rows make a job known to the store (a hang-only job has no steps)."""


def add_store_arguments(parser: Any) -> None:
    """``--clickhouse`` and ``--database`` of a command that reads a job's results."""
    parser.add_argument(
        "--clickhouse",
        metavar="DSN",
        help="chdb://<dir> or http(s)://user:pw@host:port/db"
        " (default: $RANKWATCH_CLICKHOUSE, else chdb://var/chdb)",
    )
    parser.add_argument("--database", help="database (default: $RANKWATCH_DATABASE)")


def resolve_dsn(flag: str | None = None) -> tuple[str, str | None]:
    """(DSN, database or None): the flag's DSN, else the configured one."""
    from rankwatch.config import load_config

    config = load_config().clickhouse
    return flag or config.dsn, config.database or None


@contextmanager
def open_store(
    dsn: str | None = None, database: str | None = None, *, migrate: bool = False
) -> Iterator[Store]:
    """The store at ``dsn`` (default: the configured one), migrated when asked."""
    from rankwatch.streams.kit.store import Store, StoreError

    default_dsn, default_database = resolve_dsn(dsn)
    try:
        with Store.connect(default_dsn, database or default_database) as store:
            if migrate:
                store.migrate()
            yield store
    except StoreError as exc:
        raise UserError(str(exc)) from exc


def require_job(store: Store, job: str) -> None:
    """Raise a UserError naming the store and the jobs it does hold when ``job`` is not
    one of them (or when nothing was ever stored there)."""
    tables = {
        r["name"]
        for r in store.query("SELECT name FROM system.tables WHERE database = currentDatabase()")
    }
    if not set(JOB_TABLES) <= tables:
        raise UserError(
            f"unknown job {job!r}: nothing is stored in {store.where} yet"
            " (rankwatch demo or rankwatch replay store a job there)"
        )
    known = known_jobs(store)
    if job not in known:
        listed = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "") or "none"
        raise UserError(f"unknown job {job!r} in {store.where} (jobs there: {listed})")


def known_jobs(store: Store) -> list[str]:
    union = " UNION ALL ".join(f"SELECT DISTINCT job FROM {t}" for t in JOB_TABLES)
    return [r["job"] for r in store.query(f"SELECT DISTINCT job FROM ({union}) ORDER BY job")]


def forget_job(store: Store, job: str) -> None:
    """Delete every row of ``job`` (a rerun of the demo replaces its job, nothing else)."""
    tables = store.query(
        "SELECT DISTINCT table FROM system.columns"
        " WHERE database = currentDatabase() AND name = 'job' ORDER BY table"
    )
    for row in tables:
        store.query(f"DELETE FROM {row['table']} WHERE job = {{job:String}}", {"job": job})
