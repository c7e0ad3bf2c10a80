"""Fleet board: every job, ranked by the GPU-hours its stragglers wasted, and open alerts."""

JOBS = """
SELECT s.job AS job,
       count() AS steps,
       sum(s.t_sim) / sum(s.t_ideal) AS S,
       1 - sum(s.t_ideal) / sum(s.t_sim) AS W,
       sum(s.t_base * s.waste) * any(j.world_size) / 3600 AS gpu_hours_wasted,
       countIf(s.partial = 1) AS partial_steps,
       max(s.time) AS last_step
FROM steps AS s FINAL
LEFT JOIN (
    SELECT job, nullIf(max(world_size), 0) AS world_size FROM jobs FINAL GROUP BY job
) AS j ON j.job = s.job
WHERE $__timeFilter(s.time)
GROUP BY s.job
ORDER BY gpu_hours_wasted DESC NULLS LAST, W DESC
"""
"""Wasted GPU-hours need the job's world size (jobs table); without it the job sorts last."""

WASTE_BY_JOB = """
SELECT s.job AS job, sum(s.t_base * s.waste) * any(j.world_size) / 3600 AS gpu_hours_wasted
FROM steps AS s FINAL
LEFT JOIN (
    SELECT job, nullIf(max(world_size), 0) AS world_size FROM jobs FINAL GROUP BY job
) AS j ON j.job = s.job
WHERE $__timeFilter(s.time)
GROUP BY s.job
ORDER BY gpu_hours_wasted DESC NULLS LAST
LIMIT 20
"""

_LATEST = """
    SELECT job, alert_id,
           argMax(kind, time) AS latest_kind,
           argMax(state, time) AS latest_state,
           argMax(severity, time) AS latest_severity,
           minIf(time, state = 'firing') AS since,
           argMax(summary, time) AS latest_summary
    FROM alerts
    GROUP BY job, alert_id
"""
"""Each alert's latest state (alerts is a log of state changes)."""

OPEN_ALERTS = f"""
SELECT since, job, latest_kind AS kind, latest_severity AS severity,
       latest_summary AS summary, alert_id
FROM ({_LATEST})
WHERE latest_state = 'firing'
ORDER BY indexOf(['critical', 'warning', 'info'], latest_severity), since DESC
"""

OPEN_ALERT_COUNTS = f"""
SELECT countIf(latest_severity = 'critical') AS critical,
       countIf(latest_severity = 'warning') AS warning,
       countIf(latest_severity = 'info') AS info
FROM ({_LATEST})
WHERE latest_state = 'firing'
"""

FLEET_WASTE = """
SELECT $__timeInterval(time) AS time, 1 - sum(t_ideal) / sum(t_sim) AS W
FROM steps FINAL
WHERE $__timeFilter(time) AND t_sim IS NOT NULL
GROUP BY time
ORDER BY time
"""
"""Share of all analysed GPU time lost to stragglers, across jobs."""

FLOPS_BY_HOST = """
SELECT $__timeInterval(time) AS time, host, avg(flops_per_s) AS flops
FROM rank_signals FINAL
WHERE $__timeFilter(time) AND flops_per_s IS NOT NULL
GROUP BY time, host
ORDER BY time
"""
"""Achieved FLOP/s of every job's ranks, by machine: a throttled machine shows in any job."""

BUSBW_BY_HOST = """
SELECT $__timeInterval(time) AS time, host, avg(busbw) AS bus_bandwidth
FROM rank_signals FINAL
WHERE $__timeFilter(time) AND busbw IS NOT NULL
GROUP BY time, host
ORDER BY time
"""
