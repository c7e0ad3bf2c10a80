"""How each message kind maps onto its ClickHouse table, stated once.

A table that stores a message holds the message's fields, less the ones named in
``omitted``, with ``renames`` applied (``*_ns`` times become DateTime64 ``time``
columns), plus ``bookkeeping`` columns the writer adds. Unit tests check every
contract against both the schema file and the DDL, so neither can drift alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from operator import attrgetter
from typing import Any

import numpy as np

from rankwatch.schemas import columns as cols
from rankwatch.schemas import ddl
from rankwatch.schemas.frame import FRAME_FIELDS
from rankwatch.schemas.opbatch import COLUMN_NAMES, HEADER_FIELDS, OpBatch
from rankwatch.schemas.registry import latest_version, schema


@dataclass(frozen=True)
class TableContract:
    table: str
    kind: str
    renames: Mapping[str, str] = field(default_factory=dict)
    omitted: frozenset[str] = frozenset({"schema", "version"})
    bookkeeping: frozenset[str] = frozenset()

    def message_fields(self) -> tuple[str, ...]:
        """Fields of the message as stored: top-level ones; for ops, the columns too."""
        props = schema(self.kind, latest_version(self.kind))["properties"]
        names = [name for name in props if name not in cols.GROUPS or self.kind != "ops"]
        if self.kind == "ops":
            names += [name for group in cols.GROUPS for name in props[group]["properties"]]
        return tuple(names)

    def stored_columns(self) -> tuple[str, ...]:
        """The table columns the message fills (bookkeeping left out)."""
        return tuple(
            self.renames.get(name, name)
            for name in self.message_fields()
            if name not in self.omitted
        )

    def row(self, message: Mapping[str, Any], **bookkeeping: Any) -> dict[str, Any]:
        """A decoded message (plus bookkeeping values) as a row for :meth:`Store.insert`."""
        unknown = set(bookkeeping) - self.bookkeeping
        if unknown:
            raise ValueError(f"{self.table}: {sorted(unknown)} are not bookkeeping columns")
        out = {
            self.renames.get(name, name): message[name]
            for name in self.message_fields()
            if name not in self.omitted and name in message
        }
        return {**out, **bookkeeping}


CONTRACTS: dict[str, TableContract] = {
    "ops": TableContract(
        table="ops",
        kind="ops",
        renames={"start_ns": "time"},
        # job-wide facts (the jobs table holds the sizes) and send-side bookkeeping;
        # batch_seq stays: a restarted worker recognises the batches it stored
        # rank_steps -> rank_signals, derived by the ops worker; records, extra_columns
        # and strings say how a binary frame (ops v3) lays out its columns
        omitted=frozenset(
            {"schema", "version", "sent_ns", "dp_size", "pp_size", "steps_done", "rank_steps"}
            | set(FRAME_FIELDS)
        ),
        bookkeeping=frozenset({"inserted_at"}),
    ),
    "steps": TableContract(
        table="steps",
        kind="steps",
        renames={"start_ns": "time"},
        omitted=frozenset({"schema", "version", "top_attribution"}),  # -> step_attribution
        bookkeeping=frozenset({"analysed_at", "version"}),
    ),
    # ts_ns as it is (a re-sent alert keeps it to the ns), time its ms copy for Grafana
    "alerts": TableContract(table="alerts", kind="alerts", bookkeeping=frozenset({"time"})),
    "rank_signals": TableContract(
        table="rank_signals",
        kind="signals",
        renames={"start_ns": "time"},
        bookkeeping=frozenset({"version"}),
    ),
}
"""Table name -> its contract, for the tables that store a message kind as it is."""


def table_row(table: str, /, **values: Any) -> dict[str, Any]:
    """One row of a table that stores no message as it is (``jobs``, ``hangs``,
    ``machine_scores``, ``detector_state``, ...), checked against the table's columns as
    the migrations declare them (``rankwatch.schemas.ddl``): a column the table lacks, or
    one it needs that is missing (one without a DEFAULT), is a ValueError naming it. So a
    migration and the code that writes its table cannot drift apart unnoticed."""
    columns, required = _columns(table)
    if not (required.issubset(values) and columns.issuperset(values)):
        missing = sorted(required.difference(values))
        unknown = sorted(set(values) - columns)
        raise ValueError(f"{table} row: missing {missing}, unknown {unknown}")
    return values


@cache
def _columns(table: str) -> tuple[frozenset[str], frozenset[str]]:
    """(every column, the columns a row must give) of ``table``."""
    found = ddl.tables().get(table)
    if found is None:
        raise ValueError(f"no table {table!r} in the migrations")
    columns = frozenset(found.columns)
    return columns, columns - found.defaulted


@dataclass(frozen=True, eq=False)  # an array field: no elementwise ==
class Repeated:
    """A column of a few distinct values, as each row's index into them.

    The string header fields of raw ops (job, host) are one value per batch, repeated on
    each of its records. As a column of Python strings they cost the raw-ops insert a
    string per record to make, hand to Arrow and parse again in ClickHouse (Arrow alone
    took ~27 ms per field on a 233,280-record step); as codes they go to the store as an
    Arrow dictionary, which ClickHouse reads into ``LowCardinality`` as it is."""

    values: tuple[Any, ...]
    codes: np.ndarray  # int32, one per row

    def __len__(self) -> int:
        return len(self.codes)

    def expand(self) -> np.ndarray:
        """The column as one object per row (for writers that take no dictionary)."""
        return np.asarray(self.values, dtype=object)[self.codes]


def ops_columns(batches: Sequence[OpBatch]) -> dict[str, np.ndarray | list[Any] | Repeated]:
    """The ``ops`` table columns of some batches, named as the ops contract says: header
    fields repeated per record (strings as :class:`Repeated`), op types as their int8
    codes (the values of the table's Enum8, which the migrations declare from the same
    vocabulary: no name per record), absent extras NULL. A column is read from every
    batch in one pass (a flush holds thousands of small batches: per batch and column,
    Python's cost was most of this function's)."""
    contract = CONTRACTS["ops"]
    sizes = [len(b) for b in batches]
    out: dict[str, np.ndarray | list[Any] | Repeated] = {}
    for name in HEADER_FIELDS:
        if name not in contract.omitted:
            values = list(map(attrgetter(name), batches))
            if all(isinstance(v, str) for v in values):
                out[name] = _repeated(values, sizes)
            else:
                out[name] = np.repeat(np.asarray(values, dtype=_dtype_of(values[0])), sizes)
    for name in COLUMN_NAMES:
        parts = list(map(attrgetter(name), batches))
        if all(p is None for p in parts):
            continue  # an extra no batch sent
        out[contract.renames.get(name, name)] = _concat(
            [[None] * n if p is None else p for p, n in zip(parts, sizes, strict=True)]
        )
    return out


def _repeated(values: list[str], sizes: list[int]) -> Repeated:
    distinct = {v: i for i, v in enumerate(dict.fromkeys(values))}
    codes = np.fromiter((distinct[v] for v in values), dtype=np.int32, count=len(values))
    return Repeated(tuple(distinct), np.repeat(codes, sizes))


def _dtype_of(value: Any) -> type:
    return object if isinstance(value, str) else np.int64


def _concat(parts: list[np.ndarray | list[None]]) -> np.ndarray | list[Any]:
    """Numbers as one array; strings and NULLs as one list (numpy makes an object array
    of those, which the store would not take as it is)."""
    joined: np.ndarray = np.concatenate(parts)  # type: ignore[arg-type]
    if joined.dtype != object:
        return joined
    return [v for p in parts for v in (p.tolist() if isinstance(p, np.ndarray) else p)]
