"""The ClickHouse DDL: numbered migration files, read and split, no database access.

``migrations/NNNN_<name>.sql`` are applied in number order, each once, recorded in the
``schema_migrations`` table (``rankwatch.streams.store.Store.migrate`` does that). A
file's statements are separated by a line holding only ``;``, so a ``;`` inside a
string or comment can never split a statement. Table names are unqualified: the store
runs them inside the configured database. Never edit an applied migration (the store
refuses one whose checksum changed); add the next number instead.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_NAME = re.compile(r"^(?P<number>[0-9]{4})_[a-z0-9_]+$")

BOOKKEEPING_TABLE = "schema_migrations"
BOOKKEEPING_DDL = f"""CREATE TABLE IF NOT EXISTS {BOOKKEEPING_TABLE}
(
    name String,
    checksum String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = MergeTree
ORDER BY name"""


@dataclass(frozen=True)
class Migration:
    """One migration file: its name (the file stem), text and statements."""

    name: str
    sql: str

    @property
    def number(self) -> int:
        return int(self.name[:4])

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    @property
    def statements(self) -> tuple[str, ...]:
        return split_statements(self.sql)


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration in order; numbers must run 1, 2, 3... with no gap or repeat."""
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        if not _NAME.match(path.stem):
            raise RuntimeError(f"migration file name {path.name!r} is not NNNN_name.sql")
        found.append(Migration(path.stem, path.read_text(encoding="utf-8")))
    numbers = [m.number for m in found]
    if numbers != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration numbers must run 1..n without gaps: {numbers}")
    return tuple(found)


def split_statements(sql: str) -> tuple[str, ...]:
    """Statements of a migration: text between lines that hold only ``;``.

    Comment-only lines are dropped; a trailing part with no statement is ignored.
    """
    statements, current = [], []
    for line in sql.splitlines():
        if line.strip() == ";":
            statements.append("\n".join(current).strip())
            current = []
        elif not line.lstrip().startswith("--"):
            current.append(line)
    if "\n".join(current).strip():
        raise RuntimeError("a migration's last statement lacks its closing ';' line")
    return tuple(s for s in statements if s)


def ddl_text() -> str:
    """The whole schema as one reviewable text: bookkeeping table, then every statement."""
    parts = [BOOKKEEPING_DDL]
    for migration in migrations():
        first, *rest = migration.statements
        parts += [f"-- {migration.name}\n{first}", *rest]
    return "\n;\n\n".join(parts) + "\n;\n"
