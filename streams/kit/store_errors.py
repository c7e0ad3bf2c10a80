"""What a failed store call means: the rows were refused, or the store failed.

The two call for opposite answers. A row the engine refuses for what it holds (a value
its column cannot take, a constraint it breaks) will be refused again however long the
worker waits: it becomes a dead letter, and the rest goes on. A store that cannot take
anything now (disk full, read-only, over quota, too many parts, a timeout, a lost
connection, a table that does not match the rows) may take everything later: the worker
keeps the rows, acknowledges nothing they feed, reports itself unhealthy, and retries.

Taking a failure for a refusal loses data for good (a full disk once cost 112,066 rows
that way), while taking a refusal for a failure only stalls a worker, loudly. So a
refusal is never assumed: :func:`is_refusal` accepts only errors that name the *data*
as the fault, every other error is a failure, and the delivery then narrows a refusal
down to the rows that are refused alone while the store goes on taking the others
(:meth:`~rankwatch.streams.kit.sink.TableSink.isolate`). Those two checks together
decide by what the error means, not by a list of codes that says when to give up.
"""

from __future__ import annotations

import re
import struct

SERVER_BUSY_CODES: frozenset[int] = frozenset(
    {159, 201, 202, 203, 209, 210, 241, 242, 244, 252, 279, 285, 289, 319, 369, 394, 439}
    | {745, 999}
)
"""ClickHouse error codes that say the server cannot take a statement *now*, not that the
statement or its data is wrong: waiting helps. By name (the engine's own
``errorCodeToName``): TIMEOUT_EXCEEDED, QUOTA_EXCEEDED, TOO_MANY_SIMULTANEOUS_QUERIES,
NO_FREE_CONNECTION, SOCKET_TIMEOUT, NETWORK_ERROR, MEMORY_LIMIT_EXCEEDED,
TABLE_IS_READ_ONLY, UNEXPECTED_ZOOKEEPER_ERROR, TOO_MANY_PARTS,
ALL_CONNECTION_TRIES_FAILED, TOO_FEW_LIVE_REPLICAS, REPLICA_IS_NOT_IN_QUORUM,
UNKNOWN_STATUS_OF_INSERT, ALL_REPLICAS_ARE_STALE, QUERY_WAS_CANCELLED (a server shutting
down), CANNOT_SCHEDULE_TASK, SERVER_OVERLOADED, KEEPER_EXCEPTION. They only set how a
failure is reported (``transient``: waiting is expected to help); any error that is not
a refusal is waited out, these and every other."""

DATA_FAULT_CODES: frozenset[int] = frozenset(
    {6, 27, 38, 41, 53, 69, 70, 72, 117, 131, 190, 321, 349, 469, 691}
)
"""ClickHouse error codes that name a value or a row as the fault, by name:
CANNOT_PARSE_TEXT, CANNOT_PARSE_INPUT_ASSERTION_FAILED, CANNOT_PARSE_DATE,
CANNOT_PARSE_DATETIME, TYPE_MISMATCH, ARGUMENT_OUT_OF_BOUND, CANNOT_CONVERT_TYPE,
CANNOT_PARSE_NUMBER, INCORRECT_DATA, TOO_LARGE_STRING_SIZE, SIZES_OF_ARRAYS_DONT_MATCH,
VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE, CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN,
VIOLATED_CONSTRAINT, UNKNOWN_ELEMENT_OF_ENUM. Only these can make a refusal, and only
for the rows that still fail once isolated."""

_GATEWAY = re.compile(r"HTTP status 50[234]\b")
"""A proxy in front of the server (502, 503, 504) answering for it."""

_ENCODING_ERRORS: tuple[type[BaseException], ...] = (
    TypeError,
    ValueError,
    OverflowError,
    struct.error,
)
"""What the client raises when a value cannot be written as its column's type, before
anything is sent (pyarrow's errors derive from these too)."""


class StoreError(RuntimeError):
    """ClickHouse unreachable, a chDB path held by another process, a failed statement
    or an insert the store did not take.

    ``refused`` is True only when the engine (or the client, before sending) refused the
    rows for what they hold: the store works, these rows will never fit. Anything else
    is a failure of the store, to be waited out without losing a row. ``transient`` says
    whether waiting is expected to help (connection lost, server busy, path held), for
    messages and for commands that give up rather than wait.
    """

    def __init__(self, message: str, *, transient: bool = False, refused: bool = False) -> None:
        super().__init__(message)
        self.transient = transient
        self.refused = refused


def is_transient(exc: BaseException) -> bool:
    """Whether waiting is expected to help: the connection failed (clickhouse-connect's
    OperationalError, which also covers its own retries of 429, 503 and 504), the server
    said it is busy (:data:`SERVER_BUSY_CODES`), or a proxy answered 5xx for it."""
    from clickhouse_connect.driver.exceptions import OperationalError

    if isinstance(exc, OperationalError | ConnectionError | TimeoutError):
        return True
    # clickhouse-connect sets ``code`` on its errors, over HTTP and from chDB alike
    return getattr(exc, "code", None) in SERVER_BUSY_CODES or bool(_GATEWAY.search(str(exc)))


def is_refusal(exc: BaseException) -> bool:
    """Whether an insert's error names the rows as the fault: a data-fault code from the
    engine (:data:`DATA_FAULT_CODES`), or a value the client could not encode as its
    column's type. A failure of the store is never one, whatever it says besides."""
    if is_transient(exc):
        return False
    code = getattr(exc, "code", None)
    if code is not None:
        return code in DATA_FAULT_CODES
    return isinstance(exc, _ENCODING_ERRORS) or _is_arrow_error(exc)


def _is_arrow_error(exc: BaseException) -> bool:
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - the stream extra has it
        return False
    return isinstance(exc, pa.ArrowInvalid | pa.ArrowTypeError | pa.ArrowNotImplementedError)


def why(exc: BaseException) -> str:
    """An error's text on one line, at most 500 characters."""
    text = " ".join(str(exc).split())
    return text[:500] or type(exc).__name__


def store_error(what: str, exc: BaseException) -> StoreError:
    """``exc`` from the client, as a :class:`StoreError` for ``what`` was attempted."""
    return StoreError(f"{what}: {why(exc)}", transient=is_transient(exc), refused=is_refusal(exc))
