"""``rankwatch diagnose JOB``: what kind of slowdown a job has, in one screen.

Reads the job's ``rank_signals`` rows and its what-if slowdown from the store and prints
the verdict of :func:`rankwatch.streams.slowdown.diagnosis.diagnose`: stragglers,
everyone-slow compute or network, hidden CPU work, GC or the input pipeline, with the
numbers behind it (docs/detection.md, section 3).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rankwatch.stores import add_store_arguments

if TYPE_CHECKING:
    from rankwatch.streams.kit.store import Store
    from rankwatch.streams.slowdown.diagnosis import Diagnosis, StragglerAlert, WhatIf

SIGNALS_SQL = (
    "SELECT step, rank, t_step, t_inter, flops_per_s, busbw, gc_s, data_wait_s,"
    " issue_p99_us, anomalies FROM rank_signals FINAL WHERE job = {job:String}"
    " ORDER BY step, rank"
)
WHATIF_SQL = (
    "SELECT avg(slowdown) AS s, count() AS n FROM (SELECT slowdown FROM steps FINAL"
    " WHERE job = {job:String} AND slowdown IS NOT NULL ORDER BY step DESC LIMIT 10)"
)
STRAGGLER_SQL = (
    "SELECT argMax(state, time) AS latest, argMaxIf(evidence, time, state = 'firing') AS"
    " fired FROM alerts FINAL WHERE job = {job:String} AND kind = 'straggler'"
    " GROUP BY alert_id ORDER BY max(time) DESC LIMIT 1"
)
BLAME_SQL = (
    "SELECT group, count() AS led FROM (SELECT step, argMax(group, slowdown) AS group"
    " FROM step_attribution FINAL WHERE job = {job:String} AND dimension = 'worker'"
    " GROUP BY step ORDER BY step DESC LIMIT 10) GROUP BY group ORDER BY led DESC LIMIT 1"
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="what kind of slowdown a job has (stragglers, compute, network, CPU, GC, input)",
        description="Read a job's per-rank slowdown signals and what-if figures from"
        " ClickHouse and name the kind of slowdown, with its ranks and numbers.",
    )
    parser.add_argument("job", help="job id")
    add_store_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwatch.errors import UserError
    from rankwatch.stores import open_store, require_job

    with open_store(args.clickhouse, args.database) as store:
        require_job(store, args.job)
        found = diagnose_stored(store, args.job)
    if found is None:
        raise UserError(
            f"job {args.job!r} has no slowdown signals and no analysed step (its hooks"
            " predate ops v2?)"
        )
    print(found.text())
    return 0


def diagnose_stored(store: Store, job: str) -> Diagnosis | None:
    """The diagnosis of ``job`` from its stored rows (None: no signals stored)."""
    from rankwatch.streams.slowdown.diagnosis import diagnose

    rows = store.query(SIGNALS_SQL, {"job": job})
    whatif = _whatif(store, job)
    if not rows and whatif is None:
        return None
    return diagnose(job, rows, whatif, _straggler(store, job))


def _straggler(store: Store, job: str) -> StragglerAlert | None:
    import json

    from rankwatch.streams.slowdown.diagnosis import StragglerAlert

    found = store.query(STRAGGLER_SQL, {"job": job})
    if not found or not found[0]["fired"]:
        return None
    evidence = json.loads(found[0]["fired"])
    blame = evidence.get("blame") or {}
    if blame.get("dimension") not in ("worker", "stage", "dp_rank"):
        return None  # spread, or an alert of the rule before blame groups
    return StragglerAlert(
        dimension=str(blame.get("dimension", "")),
        group=str(blame.get("group", "")),
        cause=str(evidence.get("cause", "")),
        ranks=[int(r) for r in evidence.get("ranks") or []],
        hosts=[str(h) for h in evidence.get("hosts") or []],
        firing=found[0]["latest"] == "firing",
    )


def _whatif(store: Store, job: str) -> WhatIf | None:
    from rankwatch.streams.slowdown.diagnosis import WhatIf

    (row,) = store.query(WHATIF_SQL, {"job": job})
    if not row["n"] or row["s"] is None:
        return None
    blame = store.query(BLAME_SQL, {"job": job})
    top = f"worker {blame[0]['group']} (led {blame[0]['led']} steps)" if blame else ""
    return WhatIf(float(row["s"]), int(row["n"]), top)
