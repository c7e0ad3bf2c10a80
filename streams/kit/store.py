"""ClickHouse access for every part of rankwatch, through clickhouse-connect.

One DSN picks the engine, nothing else changes:

- ``chdb://<dir>`` — chDB, ClickHouse embedded in this process (clickhouse-connect's
  ``chdb`` interface), data under ``<dir>``; ``chdb://memory`` keeps it in memory.
  **One process owns a chDB data path.** chDB itself allows one path per process;
  across processes the store takes an exclusive lock on ``<dir>/rankwatch.lock`` and
  fails with :class:`StoreError` naming the path and the holder when it is taken. Stores
  of one process may share a path (they share the engine).
- ``http(s)://user:password@host:port[/database]`` — a ClickHouse server.

Column lists come from the tables themselves (``DESCRIBE``, cached), never restated
here: an insert naming an unknown column, or leaving out one that has neither a
default nor NULL, fails before it reaches the engine. Integers given for DateTime64
columns are nanoseconds since the Unix epoch (what every message carries); datetimes
must be timezone-aware. Results come back with timezone-aware UTC datetimes.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import orjson

from rankwatch.schemas import ddl
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.tables import Repeated, ops_columns
from rankwatch.streams.kit.housekeeping import DEFAULT_NICE, Housekeeping
from rankwatch.streams.kit.settings import DEFAULT_TIMEOUT_S
from rankwatch.streams.kit.store_errors import StoreError, store_error, why

DEFAULT_DATABASE = "rankwatch"
LOCK_FILE = "rankwatch.lock"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DATETIME64 = re.compile(r"DateTime64\((\d)")
_MEMORY = ("", "memory", ":memory:")


ColumnValues = Sequence[Any] | np.ndarray | Repeated
"""One column of an insert."""


CONNECT_TIMEOUT_S = 10.0
"""Of which, at most, to open a connection (clickhouse-connect's default)."""


@dataclass(frozen=True)
class Column:
    """A table column as ``DESCRIBE`` reports it."""

    name: str
    type: str
    default_kind: str  # "", "DEFAULT", "MATERIALIZED", "ALIAS", "EPHEMERAL"

    @property
    def insertable(self) -> bool:
        return self.default_kind not in ("MATERIALIZED", "ALIAS")

    @property
    def optional(self) -> bool:
        """May be left out of an insert: it has a default or is Nullable."""
        return bool(self.default_kind) or self.type.removeprefix("LowCardinality(").startswith(
            "Nullable("
        )

    @property
    def ns_divisor(self) -> int | None:
        """For a DateTime64(p) column: ns per tick; None for any other type."""
        match = _DATETIME64.search(self.type)
        return 10 ** (9 - int(match[1])) if match else None


class Store:
    """A connection to one rankwatch database. Use as a context manager or ``close()``."""

    def __init__(
        self,
        client: Any,
        database: str,
        lock: _PathLock | None,
        where: str,
        housekeeping: Housekeeping | None = None,
    ) -> None:
        self._client = client
        self._lock = lock
        self._serial = threading.Lock()
        """One request at a time: a worker may insert from a thread while its event loop
        queries (a server refuses concurrent requests in one session; chDB serialises
        them anyway)."""
        self.housekeeping = housekeeping
        """Embedded chDB only: its background threads' priority, kept low after inserts."""
        self._columns: dict[str, tuple[Column, ...]] = {}
        self.database = database
        self.where = where  # the DSN without its password, for messages

    # -- lifecycle ----------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        dsn: str,
        database: str | None = None,
        housekeeping_nice: int = DEFAULT_NICE,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> Store:
        """Open ``dsn`` (see the module doc). The database is ``database``, else the one
        in an HTTP DSN's path, else ``rankwatch``; it is created if missing.
        ``housekeeping_nice``: embedded chDB's merges and other background threads run at
        this nice value (0: as the process; :mod:`~rankwatch.streams.kit.housekeeping`).
        ``timeout_s``: a server's longest silence on one request (see
        :data:`~rankwatch.streams.kit.settings.DEFAULT_TIMEOUT_S`)."""
        scheme = urlsplit(dsn).scheme
        if scheme == "chdb":
            return cls._connect_chdb(dsn[len("chdb://") :], database, housekeeping_nice)
        if scheme in ("http", "https"):
            return cls._connect_http(dsn, database, timeout_s)
        raise StoreError(
            f"ClickHouse DSN {dsn!r}: use chdb://<dir> or http(s)://user:pw@host:port/db"
        )

    @classmethod
    def _connect_chdb(cls, location: str, database: str | None, nice: int) -> Store:
        import clickhouse_connect

        database = _identifier(database or DEFAULT_DATABASE)
        location = location.partition("?")[0]
        path = None if location in _MEMORY else str(Path(location).resolve())
        lock = _PathLock.acquire(Path(path)) if path else None
        try:
            client = clickhouse_connect.get_client(
                interface="chdb", path=path, tz_mode="aware", settings={}
            )
        except Exception as exc:
            if lock:
                lock.release()
            text = why(exc)
            if "already initialized with path" in text:
                text = f"this process already has chDB open at another path ({text})"
            raise StoreError(f"cannot open chDB at {path or ':memory:'}: {text}") from exc
        where = f"chdb://{path or 'memory'}"
        return cls(client, database, lock, where, Housekeeping(nice))._created()

    @classmethod
    def _connect_http(cls, dsn: str, database: str | None, timeout_s: float) -> Store:
        import clickhouse_connect

        parts = urlsplit(dsn)
        where = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        database = _identifier(database or parts.path.strip("/") or DEFAULT_DATABASE)
        try:
            client = clickhouse_connect.get_client(
                dsn=dsn,
                database="default",
                tz_mode="aware",
                connect_timeout=min(timeout_s, CONNECT_TIMEOUT_S),
                send_receive_timeout=timeout_s,
            )
        except Exception as exc:
            raise store_error(f"cannot reach ClickHouse at {where}", exc) from exc
        return cls(client, database, None, where)._created()

    def _created(self) -> Store:
        """Make sure the database exists, so queries work before :meth:`migrate`."""
        try:
            self._run(f"CREATE DATABASE IF NOT EXISTS {self.database}", use_database=False)
        except StoreError:
            self.close()
            raise
        _load_insert_modules()
        return self

    def close(self) -> None:
        """Close the connection and release a chDB path lock (idempotent)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- schema -------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply every migration not yet applied, in order.

        Returns the names applied now (empty when up to date). Refuses to go on when an
        applied migration's file has changed since.
        """
        self._run(ddl.BOOKKEEPING_DDL)
        rows = self.query(f"SELECT name, checksum FROM {ddl.BOOKKEEPING_TABLE}")
        applied = {row["name"]: row["checksum"] for row in rows}
        done = []
        for migration in ddl.migrations():
            if migration.name in applied:
                if applied[migration.name] != migration.checksum:
                    raise StoreError(
                        f"migration {migration.name} changed after it was applied to"
                        f" {self.where}/{self.database}; add a new migration instead"
                    )
                continue
            for statement in migration.statements:
                self._run(statement)
            self.insert(
                ddl.BOOKKEEPING_TABLE, [{"name": migration.name, "checksum": migration.checksum}]
            )
            done.append(migration.name)
        self._columns = self._all_columns()
        return done

    def _all_columns(self) -> dict[str, tuple[Column, ...]]:
        """Every table's columns in one query: ``DESCRIBE`` of each table at its first
        insert was a round trip per table inside a new worker's first flush."""
        rows = self.query(
            "SELECT table, name, type, default_kind FROM system.columns"
            " WHERE database = {database:String} ORDER BY table, position",
            {"database": self.database},
        )
        out: dict[str, list[Column]] = {}
        for row in rows:
            out.setdefault(row["table"], []).append(
                Column(row["name"], row["type"], row["default_kind"])
            )
        return {table: tuple(columns) for table, columns in out.items()}

    def columns(self, table: str) -> tuple[Column, ...]:
        """The columns of ``table``: read for every table at :meth:`migrate`, else by
        ``DESCRIBE`` at first use; cached for the life of the store."""
        if table not in self._columns:
            rows = self.query(f"DESCRIBE TABLE {_identifier(table)}")
            if not rows:
                raise StoreError(f"table {table!r} has no columns in {self.database}")
            self._columns[table] = tuple(
                Column(row["name"], row["type"], row["default_type"]) for row in rows
            )
        return self._columns[table]

    # -- data ---------------------------------------------------------------------------

    def insert(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert rows (mappings with the same keys) in one batch."""
        if not rows:
            return
        names = list(rows[0])
        if any(row.keys() != rows[0].keys() for row in rows):
            raise StoreError(f"insert into {table}: rows must all have the same columns")
        self.insert_columns(table, {name: [row[name] for row in rows] for name in names})

    def insert_columns(
        self,
        table: str,
        columns: Mapping[str, ColumnValues],
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        """Insert equal-length columns (lists, numpy arrays or :class:`Repeated` codes) in
        one batch, with these query ``settings``.

        When every column is a numpy array of a type Arrow carries as it is (integers,
        floats, strings, ns times) the batch goes to the engine as one Arrow table: the
        engine parses it in C++, where clickhouse-connect's own encoder walks
        LowCardinality and narrower integer columns value by value in Python (about half
        the cost of storing raw ops). Anything else takes clickhouse-connect's path.
        """
        known = {c.name: c for c in self.columns(table)}
        unknown = [name for name in columns if name not in known or not known[name].insertable]
        missing = [c.name for c in known.values() if c.insertable and not c.optional]
        missing = [name for name in missing if name not in columns]
        if unknown or missing:
            raise StoreError(
                f"insert into {table}: unknown columns {unknown}, missing columns {missing}"
            )
        lengths = {len(values) for values in columns.values()}
        if len(lengths) > 1:
            raise StoreError(f"insert into {table}: columns differ in length {sorted(lengths)}")
        if lengths == {0}:
            return
        arrow = _arrow_table(known, columns)
        settings = dict(settings) if settings else None  # the client's own copy
        try:
            with self._serial:
                self._send_insert(table, known, columns, arrow, settings)
        except Exception as exc:
            raise store_error(f"insert into {table} at {self.where}", exc) from exc
        if self.housekeeping is not None:  # inserts are what start merges
            self.housekeeping()

    def _send_insert(
        self,
        table: str,
        known: Mapping[str, Column],
        columns: Mapping[str, ColumnValues],
        arrow: Any | None,
        settings: dict[str, Any] | None,
    ) -> None:
        """The client's insert call (under ``_serial``)."""
        if arrow is not None:
            self._client.insert_arrow(
                _identifier(table), arrow, database=self.database, settings=settings
            )
            return
        data = [_to_engine(known[name], values) for name, values in columns.items()]
        self._client.insert(
            _identifier(table),
            data,
            column_names=list(columns),
            # the types we know: clickhouse-connect otherwise asks with a DESCRIBE
            # per insert (~1 ms of a 1-row insert's 3-5 in chDB)
            column_type_names=[known[name].type for name in columns],
            column_oriented=True,
            database=self.database,
            settings=settings,
        )

    def insert_ops(self, batches: Sequence[OpBatch]) -> None:
        """Op batches into the ``ops`` table, in one insert (header fields repeated).

        Without ClickHouse's collapse of repeated keys within the insert
        (``optimize_on_insert``): a quarter of the insert's CPU on a 10,240-GPU step
        (``benchmarks/bench_store_insert.py``), spent on what almost never occurs, one
        record twice in one flush. Copies collapse at the part merges and under
        ``FINAL``, as those of different inserts always have."""
        if batches:
            self.insert_columns("ops", ops_columns(batches), settings=_OPS_INSERT)

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows as dicts. Bind values with ``{name:Type}`` placeholders and ``parameters``."""
        if self._client is None:
            raise StoreError("the store is closed")
        try:
            with self._serial:
                self._use_database()
                result = self._client.query(sql, parameters=dict(parameters or {}))
                return list(result.named_results())
        except Exception as exc:
            raise store_error(f"query at {self.where}", exc) from exc

    def _run(self, statement: str, use_database: bool = True) -> None:
        if self._client is None:
            raise StoreError("the store is closed")
        try:
            with self._serial:
                if use_database:
                    self._use_database()
                self._client.command(statement)
        except Exception as exc:
            raise store_error(f"{statement.splitlines()[0]} at {self.where}", exc) from exc

    def _use_database(self) -> None:
        if self._client.database != self.database:
            self._client.database = self.database


def _to_engine(column: Column, values: ColumnValues) -> Sequence[Any] | np.ndarray:
    """Values in the form clickhouse-connect writes for ``column``'s type."""
    if isinstance(values, Repeated):
        values = values.expand()
    divisor = column.ns_divisor
    if divisor is not None:
        return _ticks(column, values, divisor)
    if isinstance(values, np.ndarray):
        return values.tolist() if values.dtype == object else values
    if _base_type(column.type) == "String":
        return [orjson.dumps(v).decode() if isinstance(v, dict | list) else v for v in values]
    return values


_OPS_INSERT = {"optimize_on_insert": 0}


def _load_insert_modules() -> None:
    """Import now what the first insert would otherwise import: pyarrow (our columns) and
    pandas, which clickhouse-connect resolves on its first insert (to test whether the
    data is a DataFrame) when it is installed, as chDB installs it. At the first insert
    that was 0.3 s of a core inside a new worker's first flush (benchmarks/README.md,
    "Another VM, a new job's first step, a hung server"); at connect it is part of
    starting up."""
    import pyarrow  # noqa: F401

    try:
        from clickhouse_connect.driver import options
    except ImportError:  # another layout of the client: its first insert imports them
        return
    getattr(options, "pd", None)  # the module resolves it lazily, on first access


_ARROW_NUMBERS = {
    **{f"Int{bits}": f"int{bits}" for bits in (8, 16, 32, 64)},
    **{f"UInt{bits}": f"uint{bits}" for bits in (8, 16, 32, 64)},
    "Float32": "float32",
    "Float64": "float64",
}
_ARROW_TIME_UNITS = {1: "ns", 1_000: "us", 1_000_000: "ms", 1_000_000_000: "s"}


def _arrow_table(known: Mapping[str, Column], columns: Mapping[str, ColumnValues]) -> Any | None:
    """``columns`` as an Arrow table typed as the table's columns, or None when one of
    them is not a numpy array Arrow can take as it is (lists of rows, datetimes)."""
    import pyarrow as pa

    arrays = {}
    for name, values in columns.items():
        array = _arrow_array(known[name], values)
        if array is None:
            return None
        arrays[name] = array
    return pa.table(arrays)


def _arrow_array(column: Column, values: ColumnValues) -> Any | None:
    """One column as Arrow (None: not as it is). :class:`Repeated` strings go as an Arrow
    dictionary, with no string per row."""
    import pyarrow as pa

    if isinstance(values, Repeated):
        if _base_type(column.type) == "String":
            codes = pa.array(values.codes, type=pa.int32())
            return pa.DictionaryArray.from_arrays(codes, pa.array(values.values, pa.string()))
        values = values.expand()
    if not isinstance(values, np.ndarray):
        return None
    try:
        return _arrow_of_numpy(pa, column, values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:  # out of range, bad type
        # a value out of its column's range, or of another type: the rows are at fault
        raise StoreError(f"column {column.name} ({column.type}): {why(exc)}", refused=True) from exc


def _arrow_of_numpy(pa: Any, column: Column, values: np.ndarray) -> Any | None:
    base = _base_type(column.type)
    if values.dtype == object and (base == "String" or base.startswith("Enum")):
        return pa.array(values, type=pa.string())
    if base in _ARROW_NUMBERS and values.dtype.kind in "iuf":
        return pa.array(values, type=getattr(pa, _ARROW_NUMBERS[base])())
    if base.startswith(("Enum8(", "Enum16(")) and values.dtype.kind in "iu":
        # the enum's values as they are: no name per row to parse
        return pa.array(values, type=pa.int8() if "8" in base[:6] else pa.int16())
    if column.ns_divisor in _ARROW_TIME_UNITS and values.dtype.kind in "iu":
        divisor = column.ns_divisor
        ticks = pa.array(values.astype(np.int64) // divisor, type=pa.int64())
        return ticks.cast(pa.timestamp(_ARROW_TIME_UNITS[divisor], tz="UTC"))
    return None


def _base_type(type_: str) -> str:
    """``LowCardinality(Nullable(String))`` -> ``String``."""
    for wrapper in ("LowCardinality(", "Nullable("):
        if type_.startswith(wrapper):
            type_ = type_[len(wrapper) : -1]
    return type_


def _ticks(column: Column, values: Sequence[Any] | np.ndarray, divisor: int) -> list[Any]:
    """DateTime64 values as ticks: ints are ns since the epoch; datetimes must be aware.
    Both become ticks, as rows may give either: clickhouse-connect takes a column as all
    ticks or all datetimes, and failed on a column of both."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return (values.astype(np.int64) // divisor).tolist()
    out: list[Any] = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, dt.datetime):
            if v.tzinfo is None:
                raise StoreError(f"column {column.name}: naive datetime {v}; give it a timezone")
            out.append(_ns(v) // divisor)
        elif isinstance(v, int | np.integer) and not isinstance(v, bool):
            out.append(int(v) // divisor)
        else:
            raise StoreError(f"column {column.name}: {v!r} is neither ns since epoch nor datetime")
    return out


def _ns(moment: dt.datetime) -> int:
    """An aware datetime as ns since the epoch, exactly (no float on the way)."""
    return (moment - _EPOCH) // dt.timedelta(microseconds=1) * 1_000


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _identifier(name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise StoreError(f"{name!r} is not a plain ClickHouse identifier")
    return name


class _PathLock:
    """An exclusive lock on a chDB data path, shared by the stores of this process."""

    _held: dict[Path, _PathLock] = {}  # noqa: RUF012 - process-wide registry
    _guard = threading.Lock()

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.users = 1

    @classmethod
    def acquire(cls, path: Path) -> _PathLock:
        with cls._guard:
            held = cls._held.get(path)
            if held is not None:
                held.users += 1
                return held
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise StoreError(
                    f"chDB data path {path} is in use by another process (pid {holder});"
                    " one process owns a chDB path: stop it, or use another path, or a"
                    " ClickHouse server (http://...) to share data",
                    transient=True,
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            cls._held[path] = lock = cls(path, fd)
            return lock

    def release(self) -> None:
        with self._guard:
            self.users -= 1
            if self.users == 0:
                self._held.pop(self.path, None)
                os.close(self.fd)  # closing drops the flock
