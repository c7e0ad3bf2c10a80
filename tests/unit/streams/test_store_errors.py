"""Which store failures are worth waiting out: a worker keeps the rows of a transient one
and retries, and drops the rows of one the store refuses for good, so a busy server
taken for a refusal loses data."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from rankwatch.streams.kit import store
from rankwatch.streams.kit.store import SERVER_BUSY_CODES, _transient


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
def test_a_busy_or_unreachable_server_is_transient(exc: BaseException) -> None:
    assert _transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        DatabaseError("Code: 62. DB::Exception: Syntax error", code=62),
        DatabaseError("Code: 60. DB::Exception: Unknown table", code=60),
        DatabaseError("Code: 53. DB::Exception: Type mismatch"),
        DatabaseError("HTTP driver received HTTP status 400"),
        ValueError("a value the column cannot take"),
    ],
)
def test_a_wrong_statement_or_value_is_not(exc: BaseException) -> None:
    assert not _transient(exc)


def test_the_codes_are_the_errors_the_docstring_names() -> None:
    """The engine names each code (``errorCodeToName``, in a child process: chDB takes one
    data path per process, and this one's tests open others)."""
    pytest.importorskip("chdb")
    codes = ",".join(str(c) for c in sorted(SERVER_BUSY_CODES))
    script = (
        "import chdb; print(chdb.query("
        f"'SELECT errorCodeToName(arrayJoin([{codes}]))', 'TSV').bytes().decode())"
    )
    names = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert len(names) == len(SERVER_BUSY_CODES) and "TOO_MANY_PARTS" in names
    source = inspect.getsource(store)
    assert [n for n in names if n not in source] == []
