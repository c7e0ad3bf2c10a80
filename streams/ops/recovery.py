"""What the store remembers of a job, read when a worker first meets the job.

A restarted worker (or one a partition moved to) re-reads messages from the last
committed offset: batches of steps already stored must count as late (a second, partial
row would replace the good one), the rolling windows must hold the same steps an
uninterrupted run had, and an open alert episode must stay open. All of that is in
ClickHouse already: the ``steps`` rows, and the raw ``ops`` of the latest analysed steps
(from which their window summaries are recomputed exactly: the same records in the same
canonical order give the same numbers).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import numpy as np
import orjson

from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.alerts import Alert, StepMark, mark_of
from rankwatch.streams.ops.assembly import AssembledStep, step_from_columns
from rankwatch.streams.ops.identity import Coordinates
from rankwatch.streams.ops.pipeline import JobHistory
from rankwatch.streams.slowdown.detector import KINDS as SLOWDOWN_KINDS
from rankwatch.streams.slowdown.signals import Signals

_CLOSED = (
    "SELECT step, slowdown FROM steps FINAL WHERE job = {job:String} "
    "ORDER BY step DESC LIMIT {n:UInt32}"
)
_OPS = (
    "SELECT step, rank, dp_rank, pp_rank AS stage, CAST(optype, 'Int8') AS optype, seq_id, "
    "mb_id, chunk, gmc, toUnixTimestamp64Nano(time) AS start_ns, duration_ns "
    "FROM ops FINAL WHERE job = {job:String} AND tp_rank = 0 AND cp_rank = 0 "
    "AND step IN {steps:Array(UInt64)}"
)
_LAST_ALERT = (
    "SELECT alert_id, job, state, severity, ts_ns, "
    "summary, evidence FROM alerts FINAL WHERE job = {job:String} AND kind = 'straggler' "
    "ORDER BY time DESC, state = 'resolved' DESC LIMIT 1"
)
_JOB = (
    "SELECT count() AS n, toUnixTimestamp64Nano(min(first_seen)) AS first_seen_ns, "
    "groupUniqArrayArray(hosts) AS hosts, argMax(dp_size, version) AS dp_size, "
    "argMax(pp_size, version) AS pp_size FROM jobs WHERE job = {job:String}"
)
_ATTRIBUTIONS = (
    "SELECT step, dimension, `group`, slowdown FROM step_attribution FINAL "
    "WHERE job = {job:String} AND step IN {steps:Array(UInt64)}"
)
_STORED_BATCHES = (
    "SELECT DISTINCT rank, batch_seq, step FROM ops WHERE job = {job:String} "
    "AND step >= {low:UInt64} AND step NOT IN {closed:Array(UInt64)}"
)
_COORDINATES = (
    "SELECT DISTINCT rank, dp_rank, pp_rank, tp_rank, cp_rank FROM ops "
    "WHERE job = {job:String} AND step = {step:UInt64}"
)
_SIGNAL_FIELDS = ", ".join(f.name for f in fields(Signals) if f.name != "start_ns")
_SIGNALS = (
    f"SELECT {_SIGNAL_FIELDS}, toUnixTimestamp64Nano(time) AS start_ns, anomalies "
    "FROM rank_signals FINAL WHERE job = {job:String} AND step >= "
    "(SELECT greatest(max(step), {n:UInt32}) FROM rank_signals WHERE job = {job:String}) "
    "- {n:UInt32} "
    "ORDER BY step, rank"
)
_SLOWDOWN_ALERTS = (
    "SELECT alert_id, job, kind, state, ts_ns, evidence FROM alerts FINAL "
    "WHERE job = {job:String} AND kind IN {kinds:Array(String)} "
    "ORDER BY time, state = 'resolved'"
)
SIGNAL_STEPS = 60
"""Stored steps replayed into the slowdown detector (3 rank baseline windows; the job's
throughput baseline, 100 steps long, comes back with at most 50 of them, each value
entering it ``open_within`` steps late: a shorter
median, which a handed-over jobstate message does not cut)."""
_COLUMNS = (
    *("step", "rank", "dp_rank", "stage", "optype", "seq_id"),
    *("mb_id", "chunk", "gmc", "start_ns", "duration_ns"),
)


_NEWEST = "SELECT max(step) AS step, count() AS n FROM steps WHERE job = {job:String}"
_HISTORY_TABLES = ("steps", "ops", "jobs", "alerts", "rank_signals")
"""Every table :func:`load_history` reads a job's rows from (``step_attribution`` only
for steps that ``steps`` holds)."""
ANY_ROW = "SELECT count() AS n FROM ({})".format(
    " UNION ALL ".join(
        f"(SELECT 1 FROM {table} WHERE job = {{job:String}} LIMIT 1)" for table in _HISTORY_TABLES
    )
)


def newest_stored_step(store: Store, job: str) -> int | None:
    """The job's newest stored step (None: the store has none)."""
    rows = store.query(_NEWEST, {"job": job})
    return int(rows[0]["step"]) if rows and rows[0]["n"] else None


def load_history(
    store: Store,
    job: str,
    layout: tuple[int, int],
    closed_memory: int,
    window: int,
    alert_window: int,
) -> JobHistory:
    """The job's stored closed steps, its latest analysed steps rebuilt from their ops,
    its latest slowdowns and its firing straggler alert (if any). A job the store holds
    no row of (every new job) costs one query, not six: on a server each is a round
    trip inside the job's first step."""
    seen = store.query(ANY_ROW, {"job": job})
    if not (seen and seen[0]["n"]):
        return JobHistory()
    rows = store.query(_CLOSED, {"job": job, "n": closed_memory})
    closed = [int(r["step"]) for r in rows]
    analysed = [(int(r["step"]), float(r["slowdown"])) for r in rows if r["slowdown"] is not None]
    slowdowns = dict(analysed[:alert_window])  # the straggler alerts' history
    steps = [s for s, _ in analysed[:window]]
    alert = store.query(_LAST_ALERT, {"job": job})
    stored_job: dict[str, Any] = next(iter(store.query(_JOB, {"job": job})), {"n": 0, "hosts": []})
    known = bool(stored_job["n"])
    return JobHistory(
        closed_steps=closed,
        analysed=_rebuild(store, job, steps, layout) if steps else [],
        marks=_marks(store, job, slowdowns),
        last_alert=_stored_alert(alert[0]) if alert else None,
        first_seen_ns=int(stored_job["first_seen_ns"]) if known else None,
        hosts=frozenset(stored_job["hosts"]),
        layout=(int(stored_job["dp_size"]), int(stored_job["pp_size"])) if known else None,
        coordinates=_coordinates(store, job, max(closed)) if closed else {},
        stored_batches=stored_open_batches(store, job, closed, closed_memory),
        signals=_signals(store, job),
        slowdown_alerts=_slowdown_alerts(store, job),
    )


def _signals(store: Store, job: str) -> list[tuple[list[Signals], dict[int, list[str]]]]:
    """The job's latest stored ``rank_signals`` steps, oldest first (slowdown detector)."""
    out: dict[int, tuple[list[Signals], dict[int, list[str]]]] = {}
    for row in store.query(_SIGNALS, {"job": job, "n": SIGNAL_STEPS}):
        anomalies = list(row.pop("anomalies"))
        signals, open_now = out.setdefault(int(row["step"]), ([], {}))
        signals.append(Signals(**row))
        if anomalies:
            open_now[int(row["rank"])] = anomalies
    return [out[step] for step in sorted(out)]


def _slowdown_alerts(store: Store, job: str) -> list[dict[str, Any]]:
    """The job's slowdown alerts whose latest stored state is firing."""
    latest: dict[str, dict[str, Any]] = {}
    for row in store.query(_SLOWDOWN_ALERTS, {"job": job, "kinds": list(SLOWDOWN_KINDS)}):
        if row["kind"] in SLOWDOWN_KINDS:
            latest[row["alert_id"]] = row
    return [
        {**row, "ts_ns": int(row["ts_ns"]), "evidence": orjson.loads(row["evidence"])}
        for row in latest.values()
        if row["state"] == "firing"
    ]


def _marks(store: Store, job: str, slowdowns: dict[int, float]) -> dict[int, StepMark]:
    """The straggler alerts' mark of each step in ``slowdowns``, from its stored S and
    attributions, as the live run made it (a step stored without attributions, its S
    under what is worth attributing, is blamed on nothing, as it was live)."""
    rows: dict[int, list[tuple[str, str, float]]] = {}
    steps = list(slowdowns)
    for row in store.query(_ATTRIBUTIONS, {"job": job, "steps": steps}) if steps else []:
        rows.setdefault(int(row["step"]), []).append(
            (str(row["dimension"]), str(row["group"]), float(row["slowdown"]))
        )
    return {step: mark_of(value, rows.get(step, [])) for step, value in slowdowns.items()}


def stored_open_batches(
    store: Store, job: str, closed: list[int], closed_memory: int
) -> frozenset[tuple[int, int, int]]:
    """(rank, batch_seq, step) stored for the job's steps not in ``closed`` (open when
    the worker stopped): at most ``closed_memory`` steps behind the newest closed step.
    The step tells a batch from one a restarted training process numbered the same
    (``OpBatch.delivery_key``). A job restored from its jobstate message needs these
    too: the batches of its open steps stored after the message was sent are in no
    message (docs/sizing.md, "Moving jobs between workers")."""
    low = max(0, max(closed) - closed_memory) if closed else 0
    rows = store.query(_STORED_BATCHES, {"job": job, "low": low, "closed": closed})
    return frozenset((int(r["rank"]), int(r["batch_seq"]), int(r["step"])) for r in rows)


def _coordinates(store: Store, job: str, step: int) -> dict[int, Coordinates]:
    """rank -> (dp, pp, tp, cp) as stored for the job's newest step: the ranks' fixed
    coordinates survive a restart (a rank absent from that step is fixed anew)."""
    rows = store.query(_COORDINATES, {"job": job, "step": step})
    return {
        int(r["rank"]): (int(r["dp_rank"]), int(r["pp_rank"]), int(r["tp_rank"]), int(r["cp_rank"]))
        for r in rows
    }


def _stored_alert(row: dict[str, Any]) -> Alert:
    """A stored straggler alert row back as the alert (ts_ns to the ns, as first sent)."""
    evidence = row["evidence"]
    return Alert(
        alert_id=row["alert_id"],
        job=row["job"],
        state=row["state"],
        severity=row["severity"],
        ts_ns=int(row["ts_ns"]),
        summary=row["summary"],
        evidence=orjson.loads(evidence) if isinstance(evidence, str | bytes) else evidence,
    )


def _rebuild(
    store: Store, job: str, steps: list[int], layout: tuple[int, int]
) -> list[AssembledStep]:
    rows = store.query(_OPS, {"job": job, "steps": steps})
    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), []).append(row)
    out = []
    for step, records in sorted(by_step.items()):
        columns = {c: np.array([r[c] for r in records], dtype=np.int64) for c in _COLUMNS}
        out.append(step_from_columns(job, step, columns, layout))
    return out
