"""A stored job's latest analysed steps as a trace, for ``rankwatch scenario JOB``.

The raw ``ops`` rows of the job's newest analysed steps are read back and put in the
same canonical order the live analyser used (``step_from_columns``), with the sizes
from the ``jobs`` table.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

import numpy as np

from rankwatch.errors import UserError

if TYPE_CHECKING:
    from rankwatch.sim import JobMeta, Trace
    from rankwatch.sim.scenario import ScenarioResult

_STEPS = (
    "SELECT step FROM steps FINAL WHERE job = {job:String} AND t_sim IS NOT NULL "
    "ORDER BY step DESC LIMIT {n:UInt32}"
)
_OPS = (
    "SELECT step, rank, dp_rank, pp_rank AS stage, CAST(optype, 'Int8') AS optype, seq_id, "
    "mb_id, chunk, gmc, toUnixTimestamp64Nano(time) AS start_ns, duration_ns "
    "FROM ops FINAL WHERE job = {job:String} AND tp_rank = 0 AND cp_rank = 0 "
    "AND step IN {steps:Array(UInt64)} ORDER BY step"
)
_SIZES = (
    "SELECT argMax(dp_size, version) AS dp, argMax(pp_size, version) AS pp, "
    "argMax(tp_size, version) AS tp, argMax(cp_size, version) AS cp, "
    "argMax(vpp_size, version) AS vpp FROM jobs WHERE job = {job:String}"
)
_COLUMNS = (
    *("step", "rank", "dp_rank", "stage", "optype", "seq_id"),
    *("mb_id", "chunk", "gmc", "start_ns", "duration_ns"),
)


def read_job(job: str, steps: int, dsn: str | None, database: str | None) -> tuple[Trace, JobMeta]:
    """The records of the job's ``steps`` latest analysed steps, and its sizes."""
    from rankwatch.stores import open_store, require_job

    with open_store(dsn, database) as store:
        require_job(store, job)
        chosen = [int(r["step"]) for r in store.query(_STEPS, {"job": job, "n": steps})]
        if not chosen:
            raise UserError(f"job {job!r} has no analysed step in {store.where}")
        rows = store.query(_OPS, {"job": job, "steps": chosen})
        sizes = store.query(_SIZES, {"job": job})
    if not rows:
        raise UserError(
            f"job {job!r}: no raw ops stored for its steps {chosen[-1]}..{chosen[0]} (the ops "
            "worker keeps them 7 days; the embedded demo and replay keep none: give their "
            "exported trace file instead)"
        )
    return _trace(job, rows, sizes[0] if sizes else {}), _meta(sizes[0] if sizes else {}, rows)


def _trace(job: str, rows: list[dict[str, Any]], sizes: dict[str, Any]) -> Trace:
    from rankwatch.sim import Trace
    from rankwatch.streams.ops.assembly import step_from_columns

    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), []).append(row)
    layout = (int(sizes.get("dp") or 1), int(sizes.get("pp") or 1))
    traces = []
    for step, records in sorted(by_step.items()):
        columns = {c: np.array([r[c] for r in records], dtype=np.int64) for c in _COLUMNS}
        traces.append(step_from_columns(job, step, columns, layout).trace)
    names = [f.name for f in fields(Trace)]
    return Trace(**{n: np.concatenate([getattr(t, n) for t in traces]) for n in names})


def _meta(sizes: dict[str, Any], rows: list[dict[str, Any]]) -> JobMeta:
    from rankwatch.sim import JobMeta

    dp = int(sizes.get("dp") or max(int(r["dp_rank"]) for r in rows) + 1)
    pp = int(sizes.get("pp") or max(int(r["stage"]) for r in rows) + 1)
    return JobMeta(
        dp_size=dp,
        pp_size=pp,
        tp_size=max(int(sizes.get("tp") or 1), 1),
        dsp_size=max(int(sizes.get("cp") or 1), 1),
        vpp_size=max(int(sizes.get("vpp") or 1), max(int(r["chunk"]) for r in rows) + 1),
    )


def write_results(
    results: list[ScenarioResult],
    job: str,
    trace: Trace,
    swept: str | None,
    dsn: str | None,
    database: str | None,
) -> str:
    """Store one run's scenarios (``scenarios`` table); returns the store's name."""
    import time

    from rankwatch.stores import open_store

    rows = scenario_rows(results, job, trace, swept, time.time_ns())
    with open_store(dsn, database, migrate=True) as store:
        store.insert("scenarios", rows)
        return store.where


def scenario_rows(
    results: list[ScenarioResult], job: str, trace: Trace, swept: str | None, now_ns: int
) -> list[dict[str, Any]]:
    """The ``scenarios`` rows of one run (one new run id, the same time)."""
    import uuid

    import orjson

    from rankwatch.schemas.tables import table_row

    run_id = uuid.uuid4().hex
    steps = np.unique(trace.step)
    return [
        table_row(
            "scenarios",
            job=job,
            time=now_ns,
            run_id=run_id,
            position=i,
            name=r.scenario.name,
            settings=orjson.dumps(dict(r.scenario.settings)).decode(),
            swept_key=swept or "",
            swept_value=_number(r.scenario.settings.get(swept)) if swept else None,
            step_time_s=r.step_time_s,
            baseline_s=r.baseline_s,
            speedup=r.speedup,
            steps=int(steps.size),
            last_step=int(steps.max()),
        )
        for i, r in enumerate(results)
    ]


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
