"""The ClickHouse DDL: migration files, the golden snapshot, and agreement with the
JSON Schemas (column names, nullability, enums, integer ranges)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from rankwatch.schemas import ddl
from rankwatch.schemas.optypes import OPTYPES
from rankwatch.schemas.registry import latest_version, schema
from rankwatch.schemas.tables import CONTRACTS, TableContract

GOLDEN = Path(__file__).parent / "golden" / "ddl.sql"
UPDATE = "RANKWATCH_UPDATE_GOLDEN"

_INT_RANGE = {
    "UInt8": (0, 2**8 - 1),
    "UInt16": (0, 2**16 - 1),
    "UInt32": (0, 2**32 - 1),
    "UInt64": (0, 2**64 - 1),
    "Int16": (-(2**15), 2**15 - 1),
    "Int32": (-(2**31), 2**31 - 1),
    "Int64": (-(2**63), 2**63 - 1),
    "DateTime64(9, 'UTC')": (0, 2**63 - 1),  # ns
    "DateTime64(3, 'UTC')": (0, 2**63 - 1),  # ns in, ms stored
}
_EXPECTED_TABLES = {
    "ops",
    "steps",
    "step_attribution",
    "hangs",
    "stacks",
    "machine_scores",
    "machine_faults",
    "alerts",
    "jobs",
    "dead_letters",
    "detector_state",
    "announced",
    "rank_signals",
    "scenarios",
}


def test_golden_snapshot() -> None:
    """Any DDL change shows in review as a diff of golden/ddl.sql.

    Regenerate with RANKWATCH_UPDATE_GOLDEN=1 after a deliberate change.
    """
    text = ddl.ddl_text()
    if os.environ.get(UPDATE):
        GOLDEN.write_text(text, encoding="utf-8")
    assert GOLDEN.read_text(encoding="utf-8") == text, f"DDL changed: rerun with {UPDATE}=1"


def test_migrations_are_numbered_and_split() -> None:
    found = ddl.migrations()
    assert [m.number for m in found] == list(range(1, len(found) + 1))
    assert all(len(m.checksum) == 64 for m in found)
    assert set(ddl.tables()) == _EXPECTED_TABLES


def test_split_statements() -> None:
    sql = "-- note; not a split\nCREATE TABLE a (x String DEFAULT ';')\n;\n\nSELECT 1\n  ;  \n"
    assert ddl.split_statements(sql) == ("CREATE TABLE a (x String DEFAULT ';')", "SELECT 1")
    with pytest.raises(RuntimeError, match="closing"):
        ddl.split_statements("SELECT 1\n;\nSELECT 2")


@pytest.mark.parametrize("table", sorted(_EXPECTED_TABLES))
def test_tables_are_keyed_by_job_and_timed_in_utc(table: str) -> None:
    declared = ddl.tables()[table]
    if "job" in declared.columns:
        assert declared.order_by[0] == "job"
    assert "ReplacingMergeTree" in declared.clauses["ENGINE"]
    for name, type_ in declared.columns.items():
        if "DateTime" in type_:
            assert re.fullmatch(r"(Nullable\()?DateTime64\([39], 'UTC'\)\)?", type_), name
    assert "time" in declared.columns or table == "jobs"


@pytest.mark.parametrize("contract", CONTRACTS.values(), ids=lambda c: c.table)
def test_table_columns_are_the_message_fields(contract: TableContract) -> None:
    declared = ddl.tables()[contract.table]
    expected = [*contract.stored_columns(), *sorted(contract.bookkeeping)]
    assert sorted(declared.columns) == sorted(expected)


@pytest.mark.parametrize("contract", CONTRACTS.values(), ids=lambda c: c.table)
def test_nullable_exactly_where_the_schema_allows_null(contract: TableContract) -> None:
    declared = ddl.tables()[contract.table]
    for field, prop in _stored_props(contract).items():
        column = contract.renames.get(field, field)
        nullable = "Nullable(" in declared.columns[column]
        assert nullable == _allows_null(contract, field, prop), column


@pytest.mark.parametrize("contract", CONTRACTS.values(), ids=lambda c: c.table)
def test_integer_columns_hold_the_schema_range(contract: TableContract) -> None:
    declared = ddl.tables()[contract.table]
    for field, prop in _stored_props(contract).items():
        if prop.get("type") != "integer":
            continue
        column = contract.renames.get(field, field)
        type_ = re.sub(r"^Nullable\((.*)\)$", r"\1", declared.columns[column])
        low, high = _INT_RANGE[type_]
        assert low <= prop["minimum"] and prop["maximum"] <= high, column


def test_enums_agree() -> None:
    tables = ddl.tables()
    enum8 = tables["ops"].columns["optype"]
    assert re.findall(r"'([^']+)' = (\d+)", enum8) == [
        (name, str(i)) for i, name in enumerate(OPTYPES)
    ]
    dimensions = schema("steps")["$defs"]["dimension"]["enum"]
    assert _in_list(tables["step_attribution"].constraints["dimension_known"]) == dimensions
    alerts = schema("alerts", latest_version("alerts"))["properties"]
    for field in ("kind", "state", "severity"):
        assert _in_list(tables["alerts"].constraints[f"{field}_known"]) == alerts[field]["enum"]


def test_contract_row_renames_and_checks_bookkeeping() -> None:
    from rankwatch.schemas.examples import example

    row = CONTRACTS["steps"].row(example("steps"), version=3, analysed_at=0)
    assert row["time"] == example("steps")["start_ns"]
    assert "top_attribution" not in row and "schema" not in row
    assert row["version"] == 3
    with pytest.raises(ValueError, match="bookkeeping"):
        CONTRACTS["steps"].row(example("steps"), colour="red")


def _stored_props(contract: TableContract) -> dict[str, dict[str, Any]]:
    """Field -> its item schema (ops columns) or property schema (everything else)."""
    raw = schema(contract.kind)
    props: dict[str, dict[str, Any]] = {}
    for field in contract.message_fields():
        if field in contract.omitted:
            continue
        if contract.kind == "ops" and field not in raw["properties"]:
            group = "ops" if field in raw["properties"]["ops"]["properties"] else "extra"
            props[field] = raw["properties"][group]["properties"][field]["items"]
        else:
            props[field] = raw["properties"][field]
    return props


def _allows_null(contract: TableContract, field: str, prop: dict[str, Any]) -> bool:
    if contract.kind == "ops":  # an optional column is NULL where a batch lacks it
        return field in schema("ops")["properties"]["extra"]["properties"]
    types = prop.get("type", [])
    return "null" in types


def _in_list(expr: str) -> list[str]:
    return re.findall(r"'([^']+)'", expr.split(" IN ", 1)[1])


def test_ops_columns_fill_the_ops_table() -> None:
    import numpy as np

    from rankwatch.schemas.examples import example_batch
    from rankwatch.schemas.tables import Repeated, ops_columns

    batches = [example_batch(3, extras=True), example_batch(2, rank=6)]
    columns = ops_columns(batches)
    declared = ddl.tables()["ops"]
    assert set(columns) == set(declared.columns) - CONTRACTS["ops"].bookkeeping
    assert all(len(values) == 5 for values in columns.values())
    assert list(columns["rank"]) == [5, 5, 5, 6, 6]
    job = columns["job"]
    assert isinstance(job, Repeated) and job.values == (batches[0].job,)  # one per job
    assert list(job.expand()) == [batches[0].job] * 5
    assert list(columns["optype"][:2]) == [0, 1]  # the Enum8 values of these names
    assert list(columns["stream"]) == ["compute"] * 3 + [None] * 2
    np.testing.assert_array_equal(columns["time"][:3], batches[0].start_ns)


def test_a_row_is_checked_against_its_table_in_the_migrations() -> None:
    from rankwatch.schemas.tables import table_row

    with pytest.raises(ValueError, match=r"missing \['detector', 'state', 'time', 'version'\]"):
        table_row("detector_state", job="j")
    with pytest.raises(ValueError, match=r"unknown \['colour'\]"):
        table_row("announced", job="j", alert_id="a", state="firing", time=0, colour=1)
    with pytest.raises(ValueError, match="no table"):
        table_row("nowhere", job="j")
    row = {"job": "j", "alert_id": "a", "state": "firing", "time": 0}
    assert table_row("announced", **row) == row
