"""Job board: how much slower than ideal the job runs, and who is to blame."""

ANALYSED = "job = '${job}' AND $__timeFilter(time) AND t_sim IS NOT NULL"
"""Steps of the job in range that the what-if engine simulated (partial ones are not)."""

IDEAL_SUM = f"(SELECT sum(t_ideal) FROM steps FINAL WHERE {ANALYSED})"
"""Ideal time of the analysed steps in range: the weight attributions are shared by."""

WORLD_SIZE = "(SELECT nullIf(max(world_size), 0) FROM jobs FINAL WHERE job = '${job}')"
"""GPUs of the job, from the jobs table (NULL, so 'no data', when the job is unknown)."""

SLOWDOWN = f"""
SELECT sum(t_sim) / sum(t_ideal) AS S
FROM steps FINAL
WHERE {ANALYSED}
"""

WASTE = f"""
SELECT 1 - sum(t_ideal) / sum(t_sim) AS W
FROM steps FINAL
WHERE {ANALYSED}
"""

GPU_HOURS_WASTED = f"""
SELECT sum(t_base * waste) * {WORLD_SIZE} / 3600 AS gpu_hours_wasted
FROM steps FINAL
WHERE {ANALYSED}
"""

PARTIAL_STEPS = """
SELECT countIf(partial = 1) AS partial_steps
FROM steps FINAL
WHERE job = '${job}' AND $__timeFilter(time)
"""

STEP_TIMES = """
SELECT time, t_base AS recorded, t_sim AS simulated, t_ideal AS ideal
FROM steps FINAL
WHERE job = '${job}' AND $__timeFilter(time)
ORDER BY time
"""

SLOWDOWN_OVER_TIME = f"""
SELECT $__timeInterval(time) AS time,
       sum(t_sim) / sum(t_ideal) AS S,
       1 - sum(t_ideal) / sum(t_sim) AS W
FROM steps FINAL
WHERE {ANALYSED}
GROUP BY time
ORDER BY time
"""

GPU_HOURS_OVER_TIME = f"""
SELECT $__timeInterval(time) AS time,
       sum(t_base * waste) * {WORLD_SIZE} / 3600 AS gpu_hours_wasted
FROM steps FINAL
WHERE {ANALYSED}
GROUP BY time
ORDER BY time
"""

STEP_COUNTS_OVER_TIME = """
SELECT $__timeInterval(time) AS time,
       countIf(partial = 1) AS partial_steps,
       countIf(partial = 0) AS complete_steps
FROM steps FINAL
WHERE job = '${job}' AND $__timeFilter(time)
GROUP BY time
ORDER BY time
"""


def top_attribution(dimension: str, label: str) -> str:
    """S_g per group over the analysed steps in range, largest first.

    ``1 + sum((S_g,i - 1) * T_ideal,i) / sum(T_ideal,i)``: the per-step S_g weighted by
    the step's ideal time, which is ``sum(T_g) / sum(T_ideal)``, the same ratio of sums as
    the Slowdown S panel (docs/whatif.md, "Offline and live figures"). step_attribution
    holds rows only for steps slow enough to attribute (S >= 1.03); the other steps count
    as S_g = 1. ``rankwatch.streams.ops.live`` computes the same in Python (a test holds the two
    equal).
    """
    return f"""
SELECT a.`group` AS {label},
       1 + sum((a.slowdown - 1) * s.t_ideal) / {IDEAL_SUM} AS S_g
FROM step_attribution AS a FINAL
INNER JOIN (SELECT step, t_ideal FROM steps FINAL WHERE {ANALYSED}) AS s ON s.step = a.step
WHERE a.job = '${{job}}' AND a.dimension = '{dimension}' AND $__timeFilter(a.time)
GROUP BY {label}
ORDER BY S_g DESC
LIMIT 10
"""


TOP_OPTYPES = top_attribution("optype", "optype")
TOP_STAGES = top_attribution("stage", "stage")
TOP_DP_RANKS = top_attribution("dp_rank", "dp_rank")

STEPS = """
SELECT step, time, t_base AS recorded_s, t_sim AS simulated_s, t_ideal AS ideal_s,
       slowdown AS S, waste AS W, if(partial = 1, 'partial', 'complete') AS status,
       arrayStringConcat(missing_workers, ' ') AS missing_workers, n_ops
FROM steps FINAL
WHERE job = '${job}' AND $__timeFilter(time)
ORDER BY step DESC
LIMIT 500
"""

ALERTS = """
SELECT time, kind, state, severity, summary, alert_id
FROM alerts FINAL
WHERE job = '${job}' AND $__timeFilter(time)
ORDER BY time DESC
LIMIT 200
"""
"""The job's alert log; ``FINAL``, so a state change stored twice shows once."""

SIGNALS = "job = '${job}' AND $__timeFilter(time)"
"""The job's per-rank slowdown signals in range (docs/detection.md, section 3)."""

FLOPS_BY_RANK = f"""
SELECT $__timeInterval(time) AS time, concat('rank ', toString(rank)) AS rank,
       avg(flops_per_s) AS flops
FROM rank_signals FINAL
WHERE {SIGNALS} AND flops_per_s IS NOT NULL
GROUP BY time, rank
ORDER BY time
"""

BUSBW_BY_RANK = f"""
SELECT $__timeInterval(time) AS time, concat('rank ', toString(rank)) AS rank,
       avg(busbw) AS bus_bandwidth
FROM rank_signals FINAL
WHERE {SIGNALS} AND busbw IS NOT NULL
GROUP BY time, rank
ORDER BY time
"""

STEP_SHARES = f"""
SELECT $__timeInterval(time) AS time,
       avg(v_inter) AS between_steps,
       avg(v_minority) AS untimed_inside,
       avg(gc_s / t_step) AS gc,
       avg(data_wait_s / t_step) AS data_wait
FROM rank_signals FINAL
WHERE {SIGNALS} AND t_step > 0
GROUP BY time
ORDER BY time
"""

THROUGHPUT = f"""
SELECT $__timeInterval(time) AS time, median(throughput) AS samples_per_s
FROM rank_signals FINAL
WHERE {SIGNALS} AND throughput IS NOT NULL
GROUP BY time
ORDER BY time
"""

SIGNAL_ANOMALIES = f"""
SELECT time, step, rank, host, arrayStringConcat(anomalies, ', ') AS open,
       t_step, flops_per_s, busbw, gc_s, data_wait_s, t_inter
FROM rank_signals FINAL
WHERE {SIGNALS} AND notEmpty(anomalies)
ORDER BY step DESC, rank
LIMIT 200
"""

SCENARIOS = """
SELECT name AS scenario, step_time_s, speedup
FROM scenarios FINAL
WHERE job = '${job}' AND run_id = (
    SELECT argMax(run_id, time) FROM scenarios
    WHERE job = '${job}' AND $__timeFilter(time)
)
ORDER BY position
"""
