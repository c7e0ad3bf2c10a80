"""What the hang and Minder workers read back when they first meet a job after a
restart (or after a rebalance moved the job to them), and the rows that make it possible.

Two tables (``schemas/migrations/0003_detector_state.sql``): ``detector_state`` holds
a detector's JSON snapshot per job, replaced by each newer one; ``announced`` records
each alert state after it was sent on ``<prefix>.alerts``. An alert is stored before it
is sent and recorded as sent after: a worker killed between the two finds the stored
state without its ``announced`` row and sends it again (docs/detection.md, "After a
restart"), so an alert state is never lost and is sent twice only when the kill falls
between the send and the record of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from rankwatch.schemas.tables import table_row
from rankwatch.streams.kit.store import Store
from rankwatch.streams.kit.times import utc
from rankwatch.streams.kit.versions import row_version

_SNAPSHOT = (
    "SELECT state FROM detector_state FINAL "
    "WHERE job = {job:String} AND detector = {detector:String} LIMIT 1"
)
RESEND_HORIZON_S = 3600
"""Stored alert states at most this much older than the job's newest one are looked at
(an alert stored but never sent is one of the latest few; older ones without an
``announced`` row predate the table)."""
# the job's recent stored alert states of a kind that were never recorded as sent
_UNANNOUNCED = (
    "SELECT alert_id, job, kind, state, severity, ts_ns, summary, evidence "
    "FROM alerts FINAL WHERE job = {job:String} AND kind = {kind:String} "
    "AND ts_ns >= (SELECT max(ts_ns) FROM alerts WHERE job = {job:String} "
    "AND kind = {kind:String}) - {horizon:Int64} "
    "AND (alert_id, state) NOT IN (SELECT alert_id, state FROM announced "
    "WHERE job = {job:String}) ORDER BY ts_ns, alert_id, state = 'resolved'"
)


def load_snapshot(store: Store, job: str, detector: str) -> dict[str, Any] | None:
    """The latest stored snapshot of ``detector`` for ``job`` (None: never stored)."""
    rows = store.query(_SNAPSHOT, {"job": job, "detector": detector})
    return orjson.loads(rows[0]["state"]) if rows else None


def snapshot_row(
    job: str, detector: str, now_ns: int, state: Mapping[str, Any], generation: int = 0
) -> dict[str, Any]:
    """A detector's snapshot of ``job``; ``generation``: of the writer's assignment (a
    later owner's snapshot wins, :mod:`~rankwatch.streams.kit.versions`)."""
    return table_row(
        "detector_state",
        job=job,
        detector=detector,
        time=utc(now_ns),
        state=orjson.dumps(state).decode(),
        version=row_version(now_ns, generation=generation),
    )


def unannounced(store: Store, job: str, kind: str) -> list[dict[str, Any]]:
    """The job's recent stored ``kind`` alert states (within ``RESEND_HORIZON_S`` of
    its newest) that were not recorded as sent, back as ``alerts`` messages, oldest
    first (ts_ns as first stored)."""
    params = {"job": job, "kind": kind, "horizon": RESEND_HORIZON_S * 1_000_000_000}
    return [_message(row) for row in store.query(_UNANNOUNCED, params)]


def announced_row(alert: Mapping[str, Any], now_ns: int) -> dict[str, Any]:
    """The ``announced`` row of an alert message that was just sent."""
    return table_row(
        "announced",
        job=alert["job"],
        alert_id=alert["alert_id"],
        state=alert["state"],
        time=utc(now_ns),
    )


def _message(row: Mapping[str, Any]) -> dict[str, Any]:
    evidence = row["evidence"]
    return {
        "schema": "alerts",
        "version": 1,
        "alert_id": row["alert_id"],
        "job": row["job"],
        "kind": row["kind"],
        "state": row["state"],
        "severity": row["severity"],
        "ts_ns": int(row["ts_ns"]),
        "summary": row["summary"],
        "evidence": orjson.loads(evidence) if isinstance(evidence, str | bytes) else evidence,
    }
