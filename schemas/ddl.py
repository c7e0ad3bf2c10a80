"""The ClickHouse DDL: numbered migration files, read and split, no database access.

``migrations/NNNN_<name>.sql`` are applied in number order, each once, recorded in the
``schema_migrations`` table (``rankwatch.streams.kit.store.Store.migrate`` does that). A
file's statements are separated by a line holding only ``;``, so a ``;`` inside a
string or comment can never split a statement. Table names are unqualified: the store
runs them inside the configured database. Never edit an applied migration (the store
refuses one whose checksum changed); add the next number instead. Write every statement
so that running it twice is harmless (``IF NOT EXISTS``...): two processes starting at
once against one server may both apply a migration.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
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

    Comment-only lines are dropped; text after the last ``;`` line is an error.
    """
    statements: list[str] = []
    current: list[str] = []
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


@dataclass(frozen=True)
class TableDDL:
    """What the migrations declare for one table (from its CREATE TABLE)."""

    name: str
    columns: dict[str, str]  # name -> ClickHouse type, in order
    defaulted: frozenset[str]  # columns with DEFAULT/MATERIALIZED/ALIAS
    constraints: dict[str, str]  # name -> CHECK expression
    clauses: dict[str, str]  # "ENGINE", "PARTITION BY", "ORDER BY", "TTL" -> text

    @property
    def order_by(self) -> tuple[str, ...]:
        key = self.clauses["ORDER BY"].strip()
        key = key[1:-1] if key.startswith("(") else key
        return tuple(part.strip().strip("`") for part in _split_top(key))


_CREATE = re.compile(
    r"^CREATE TABLE IF NOT EXISTS (?P<name>\w+)\s*\((?P<body>.*)\)\s*(?P<tail>ENGINE.*)$", re.S
)
_COLUMN = re.compile(
    r"^`?(?P<name>\w+)`?\s+(?P<type>.+?)"
    r"(?:\s+(?P<default>DEFAULT|MATERIALIZED|ALIAS)\s+.+?)?(?:\s+COMMENT\s+'.*')?$",
    re.S,
)
_CONSTRAINT = re.compile(r"^CONSTRAINT\s+(?P<name>\w+)\s+CHECK\s+(?P<expr>.+)$", re.S)
_CLAUSES = ("ENGINE =", "PARTITION BY", "ORDER BY", "TTL")


_ADD_COLUMN = re.compile(
    r"^ALTER TABLE (?P<name>\w+) ADD COLUMN IF NOT EXISTS (?P<column>.+)$", re.S
)
_DROP_CONSTRAINT = re.compile(
    r"^ALTER TABLE (?P<name>\w+) DROP CONSTRAINT IF EXISTS (?P<constraint>\w+)$", re.S
)
_ADD_CONSTRAINT = re.compile(
    r"^ALTER TABLE (?P<name>\w+) ADD CONSTRAINT IF NOT EXISTS (?P<constraint>\w+)"
    r"\s+CHECK\s+(?P<expr>.+)$",
    re.S,
)


@cache
def tables() -> dict[str, TableDDL]:
    """Every table as the migrations leave it. Understood: CREATE TABLE, and ALTER TABLE
    ... ADD COLUMN IF NOT EXISTS (appended at the end), DROP CONSTRAINT IF EXISTS and
    ADD CONSTRAINT IF NOT EXISTS ... CHECK (a widened check replaces the old one);
    anything else must extend this parser, and its tests."""
    found: dict[str, TableDDL] = {}
    for migration in migrations():
        for statement in migration.statements:
            if match := _CREATE.match(statement):
                found[match["name"]] = _table(match["name"], match["body"], match["tail"])
            elif (match := _ADD_COLUMN.match(statement)) and match["name"] in found:
                found[match["name"]] = _with_column(found[match["name"]], match["column"])
            elif (match := _DROP_CONSTRAINT.match(statement)) and match["name"] in found:
                table = found[match["name"]]
                kept = {k: v for k, v in table.constraints.items() if k != match["constraint"]}
                found[match["name"]] = replace(table, constraints=kept)
            elif (match := _ADD_CONSTRAINT.match(statement)) and match["name"] in found:
                table = found[match["name"]]
                added = {**table.constraints, match["constraint"]: match["expr"].strip()}
                found[match["name"]] = replace(table, constraints=added)
            else:
                raise RuntimeError(f"{migration.name}: cannot read statement {statement[:60]!r}")
    return found


def _with_column(table: TableDDL, text: str) -> TableDDL:
    column = _COLUMN.match(text.strip())
    if column is None:
        raise RuntimeError(f"table {table.name}: cannot read {text!r}")
    columns = {**table.columns, column["name"]: column["type"].strip()}
    defaulted = table.defaulted | ({column["name"]} if column["default"] else set())
    return replace(table, columns=columns, defaulted=frozenset(defaulted))


def _table(name: str, body: str, tail: str) -> TableDDL:
    columns: dict[str, str] = {}
    defaulted, constraints = set(), {}
    for raw in _split_top(body):
        item = raw.strip()
        if constraint := _CONSTRAINT.match(item):
            constraints[constraint["name"]] = constraint["expr"].strip()
        elif column := _COLUMN.match(item):
            columns[column["name"]] = column["type"].strip()
            if column["default"]:
                defaulted.add(column["name"])
        else:
            raise RuntimeError(f"table {name}: cannot read {item!r}")
    clauses = {}
    for line in tail.splitlines():
        for clause in _CLAUSES:
            if line.startswith(clause):
                clauses[clause.rstrip(" =")] = line[len(clause) :].strip()
    return TableDDL(name, columns, frozenset(defaulted), constraints, clauses)


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses and quotes."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == "'" and text[i - 1 : i] != "\\":
            quoted = not quoted
        elif not quoted and ch in "()":
            depth += 1 if ch == "(" else -1
        elif not quoted and depth == 0 and ch == ",":
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]
