"""The report of one job for people without Grafana: ``rankwatch report JOB``.

The numbers come from the boards' own queries (expanded with :mod:`rankwatch.grafana.macros`
over all time), so the report and the Job and Workers boards cannot disagree.
:func:`collect` reads them from a store; :func:`format_text` is the terminal form and
:mod:`rankwatch.grafana.report_html` the self-contained HTML one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import numpy as np

from rankwatch.grafana.macros import ALL, QueryContext, expand
from rankwatch.grafana.queries import fleet, hangs, job, workers

TOP = 5


class Queryable(Protocol):
    def query(self, sql: str, parameters: Any = None) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class JobReport:
    job: str
    steps: int
    analysed: int
    partial: int
    first_step: int
    last_step: int
    first_time: datetime
    last_time: datetime
    slowdown: float | None
    waste: float | None
    gpu_hours_wasted: float | None
    mean_recorded_s: float
    mean_simulated_s: float | None
    mean_ideal_s: float | None
    top: dict[str, list[tuple[str, float]]]
    """dimension (optype, stage, dp_rank, worker) -> (group, S_g), largest first."""
    grid: np.ndarray | None
    """S_w per (DP rank, stage); None when no step was slow enough to attribute."""
    open_alerts: list[dict[str, Any]] = field(default_factory=list)
    open_hangs: list[dict[str, Any]] = field(default_factory=list)


class NoSuchJob(LookupError):
    """The job has no steps in the store."""


def context(job_id: str, now: datetime | None = None) -> QueryContext:
    """All of the job's rows: the epoch to a day from now, all workers and steps."""
    now = now or datetime.now(UTC)
    return QueryContext(
        time_from=datetime(1970, 1, 1, tzinfo=UTC),
        time_to=now + timedelta(days=1),
        interval_s=3600.0,
        variables={"job": job_id, "step_from": "0", "step_to": str(2**63), "worker": ALL},
    )


def collect(store: Queryable, job_id: str, now: datetime | None = None) -> JobReport:
    ctx = context(job_id, now)

    def rows(sql: str) -> list[dict[str, Any]]:
        return store.query(expand(sql, ctx))

    summary = store.query(_SUMMARY, {"job": job_id})[0]
    if not summary["steps"]:
        raise NoSuchJob(job_id)
    top = {
        "optype": [(r["optype"], r["S_g"]) for r in rows(job.TOP_OPTYPES)][:TOP],
        "stage": [(r["stage"], r["S_g"]) for r in rows(job.TOP_STAGES)][:TOP],
        "dp_rank": [(r["dp_rank"], r["S_g"]) for r in rows(job.TOP_DP_RANKS)][:TOP],
        "worker": [(r["worker"], r["S_w"]) for r in rows(workers.TOP_WORKERS)][:TOP],
    }
    alerts = [a for a in rows(fleet.OPEN_ALERTS) if a["job"] == job_id]
    return JobReport(
        job=job_id,
        steps=summary["steps"],
        analysed=summary["analysed"],
        partial=rows(job.PARTIAL_STEPS)[0]["partial_steps"],
        first_step=summary["first_step"],
        last_step=summary["last_step"],
        first_time=summary["first_time"],
        last_time=summary["last_time"],
        slowdown=rows(job.SLOWDOWN)[0]["S"] if summary["analysed"] else None,
        waste=rows(job.WASTE)[0]["W"] if summary["analysed"] else None,
        gpu_hours_wasted=rows(job.GPU_HOURS_WASTED)[0]["gpu_hours_wasted"],
        mean_recorded_s=summary["recorded"],
        mean_simulated_s=summary["simulated"],
        mean_ideal_s=summary["ideal"],
        top=top,
        grid=_grid(rows(workers.GRID)),
        open_alerts=alerts,
        open_hangs=[h for h in rows(hangs.EPISODE_TABLE) if h["state"] == "open"],
    )


_SUMMARY = """
SELECT count() AS steps, countIf(t_sim IS NOT NULL) AS analysed,
       min(step) AS first_step, max(step) AS last_step,
       min(time) AS first_time, max(time) AS last_time,
       avg(t_base) AS recorded, avg(t_sim) AS simulated, avg(t_ideal) AS ideal
FROM steps FINAL
WHERE job = {job:String}
"""


def _grid(rows: list[dict[str, Any]]) -> np.ndarray | None:
    if not rows:
        return None
    dp = max(int(r["dp_rank"]) for r in rows) + 1
    pp = max(int(r["stage"]) for r in rows) + 1
    grid = np.full((dp, pp), np.nan)
    for r in rows:
        grid[int(r["dp_rank"]), int(r["stage"])] = r["S_w"]
    return grid


# -- the terminal form -------------------------------------------------------------------

DIMENSION_NAMES = {
    "optype": "op type",
    "stage": "pipeline stage",
    "dp_rank": "DP rank",
    "worker": "worker (dp,stage)",
}


def key_numbers(r: JobReport) -> list[tuple[str, str]]:
    """(label, value) of the headline numbers, shared by the text and the HTML."""
    return [
        ("Steps", f"{r.steps} ({r.first_step}..{r.last_step}), {r.analysed} analysed"),
        ("Partial steps", str(r.partial)),
        ("Slowdown S", _num(r.slowdown, "{:.3f}")),
        ("Waste W", _num(r.waste, "{:.1%}")),
        ("GPU-hours wasted", _num(r.gpu_hours_wasted, "{:.3f}", "unknown (no world size)")),
        (
            "Mean step time",
            f"recorded {r.mean_recorded_s:.4f} s, simulated "
            f"{_num(r.mean_simulated_s, '{:.4f} s')}, ideal {_num(r.mean_ideal_s, '{:.4f} s')}",
        ),
        ("Time", f"{r.first_time:%Y-%m-%d %H:%M:%S} .. {r.last_time:%H:%M:%S} UTC"),
    ]


def method_line(r: JobReport) -> str:
    """What the figures are over and how they were computed, in one line: the stored
    figures are live ones (docs/whatif.md, "Offline and live figures")."""
    left_out = f"; {r.partial} partial step(s) left out" if r.partial else ""
    return (
        f"S over the {r.analysed} analysed step(s) {r.first_step}..{r.last_step}{left_out};"
        " each step against ideal costs from the latest analysed steps up to it (rolling"
        " window, as the live worker computes it)"
    )


def format_text(r: JobReport) -> str:
    lines = [f"rankwatch report: job {r.job}", f"  ({method_line(r)})", ""]
    width = max(len(label) for label, _ in key_numbers(r))
    lines += [f"  {label:<{width}}  {value}" for label, value in key_numbers(r)]
    lines += ["", "Who is to blame (S_g: the slowdown if only that group kept its real times):"]
    for dim, groups in r.top.items():
        shown = ", ".join(f"{g} {s:.3f}" for g, s in groups) or "-"
        lines.append(f"  by {DIMENSION_NAMES[dim]}: {shown}")
    if r.grid is not None:
        lines += ["", "S_w per worker (rows: DP rank, columns: stage):", *_grid_text(r.grid)]
    lines += ["", f"Open hangs: {len(r.open_hangs)}"]
    lines += [f"  {h['episode_id']}: {h['summary']}" for h in r.open_hangs]
    lines += [f"Open alerts: {len(r.open_alerts)}"]
    lines += [f"  [{a['severity']}] {a['kind']}: {a['summary']}" for a in r.open_alerts]
    return "\n".join(lines)


def _grid_text(grid: np.ndarray) -> list[str]:
    header = "      " + "".join(f"{p:>8}" for p in range(grid.shape[1]))
    body = [f"  {d:>3} " + "".join(f"{v:>8.3f}" for v in row) for d, row in enumerate(grid)]
    return [header, *body]


def _num(value: float | None, fmt: str, missing: str = "-") -> str:
    return missing if value is None else fmt.format(value)
