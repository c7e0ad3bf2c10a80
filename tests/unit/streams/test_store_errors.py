"""What a store error means. Only an error that names the rows as the fault may make a
refusal (dead letters); every other error is a failure the worker waits out with every
row kept, so that a full disk or a busy server taken for a refusal loses nothing."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from rankwatch.streams.kit import store_errors
from rankwatch.streams.kit.store_errors import (
    DATA_FAULT_CODES,
    SERVER_BUSY_CODES,
    is_refusal,
    is_transient,
)


@pytest.mark.parametrize(
    "exc",
    [
        OperationalError("Error HTTPConnectionPool: connection refused"),
        ConnectionResetError("reset by peer"),
        TimeoutError("timed out"),
        DatabaseError("Received ClickHouse exception, code: 252, ...", code=252),
        DatabaseError("Received ClickHouse exception, code: 241, ...", code=241),
        DatabaseError("Code: 202. DB::Exception: Too many simultaneous queries", code=202),
        DatabaseError("HTTP driver received HTTP status 502, server response: Bad Gateway"),
    ],
)
def test_a_busy_or_unreachable_server_is_transient_and_no_refusal(exc: BaseException) -> None:
    assert is_transient(exc) and not is_refusal(exc)


@pytest.mark.parametrize(
    "exc",
    [
        DatabaseError(
            "Code: 243. DB::Exception: Cannot reserve 1.00 MiB (NOT_ENOUGH_SPACE)", code=243
        ),
        DatabaseError("Code: 75. Cannot write to file descriptor", code=75),
        DatabaseError("Code: 164. DB::Exception: Cannot execute query in readonly mode", code=164),
        DatabaseError("Code: 62. DB::Exception: Syntax error", code=62),
        DatabaseError("Code: 60. DB::Exception: Unknown table", code=60),
        DatabaseError("Code: 16. DB::Exception: No such column", code=16),
        DatabaseError("HTTP driver received HTTP status 400"),
        DatabaseError("Code: 1001. std::exception", code=1001),
        RuntimeError("something no one foresaw"),
    ],
)
def test_a_store_that_cannot_take_anything_is_failing_not_refusing(exc: BaseException) -> None:
    """Disk full, read-only, a table or column the rows do not match, an error without a
    code: none says the values are wrong, so none gives a row up."""
    assert not is_refusal(exc)


@pytest.mark.parametrize(
    "exc",
    [
        DatabaseError("Code: 469. DB::Exception: Constraint violated", code=469),
        DatabaseError("Code: 53. DB::Exception: Type mismatch", code=53),
        DatabaseError("Code: 27. Cannot parse input", code=27),
        ValueError("a value the column cannot take"),
        OverflowError("int too big to convert"),
    ],
)
def test_a_value_the_column_cannot_take_is_a_refusal(exc: BaseException) -> None:
    assert is_refusal(exc) and not is_transient(exc)


@pytest.mark.parametrize("codes", [SERVER_BUSY_CODES, DATA_FAULT_CODES], ids=["busy", "data"])
def test_the_codes_are_the_errors_the_docstrings_name(codes: frozenset[int]) -> None:
    """The engine names each code (``errorCodeToName``, in a child process: chDB takes one
    data path per process, and this one's tests open others)."""
    pytest.importorskip("chdb")
    listed = ",".join(str(c) for c in sorted(codes))
    script = (
        "import chdb; print(chdb.query("
        f"'SELECT errorCodeToName(arrayJoin([{listed}]))', 'TSV').bytes().decode())"
    )
    names = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert len(names) == len(codes) and "" not in names
    source = inspect.getsource(store_errors)
    assert [n for n in names if n not in source] == []
    assert not SERVER_BUSY_CODES & DATA_FAULT_CODES
