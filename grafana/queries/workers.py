"""Workers board: the SMon heatmap, S_w of every (DP rank, stage) worker."""

IN_RANGE = "job = '${job}' AND $__timeFilter(time) AND step BETWEEN ${step_from} AND ${step_to}"
"""The chosen job, time range and step range."""

ANALYSED = f"SELECT step, t_ideal FROM steps FINAL WHERE {IN_RANGE} AND t_sim IS NOT NULL"
"""The analysed steps in range with their ideal time (the weight of their S_w)."""

IDEAL_SUM = f"(SELECT sum(t_ideal) FROM ({ANALYSED}))"

S_W = f"1 + sum((a.slowdown - 1) * s.t_ideal) / {IDEAL_SUM}"
"""S_w over the range: per-step S_w weighted by the step's ideal time, steps too fast to
attribute counting as 1 (the same aggregation as the Job board's S_g)."""

ATTRIBUTED = f"""step_attribution AS a FINAL
INNER JOIN ({ANALYSED}) AS s ON s.step = a.step"""

WORKERS = """
SELECT DISTINCT `group`
FROM step_attribution
WHERE job = '${job}' AND dimension = 'worker' AND $__timeFilter(time)
ORDER BY `group`
"""
"""The worker variable: ``dp,stage`` of every worker attributed in range."""

WORKER_FILTER = "$__conditionalAll(`group` = '${worker}', $worker)"

GRID = f"""
SELECT toUInt32(splitByChar(',', a.`group`)[1]) AS dp_rank,
       toUInt32(splitByChar(',', a.`group`)[2]) AS stage,
       {S_W} AS S_w
FROM {ATTRIBUTED}
WHERE a.job = '${{job}}' AND a.dimension = 'worker'
GROUP BY dp_rank, stage
ORDER BY dp_rank, stage
"""
"""S_w per worker over the step range."""

PER_STEP = f"""
SELECT time, `group` AS worker, slowdown AS S_w
FROM step_attribution FINAL
WHERE {IN_RANGE} AND dimension = 'worker' AND {WORKER_FILTER}
ORDER BY time, worker
"""

WORKER_VS_STEP = f"""
SELECT s.time AS time, s.slowdown AS S, a.S_w AS S_w
FROM steps AS s FINAL
LEFT JOIN (
    SELECT step, max(slowdown) AS S_w
    FROM step_attribution FINAL
    WHERE {IN_RANGE} AND dimension = 'worker' AND {WORKER_FILTER}
    GROUP BY step
) AS a ON a.step = s.step
WHERE s.job = '${{job}}' AND $__timeFilter(s.time)
  AND s.step BETWEEN ${{step_from}} AND ${{step_to}} AND s.t_sim IS NOT NULL
ORDER BY time
"""
"""The step's S against the selected worker's S_w (the worst worker's when All)."""

TOP_WORKERS = f"""
SELECT a.`group` AS worker,
       {S_W} AS S_w,
       countIf(a.slowdown >= 1.03) AS steps_blamed
FROM {ATTRIBUTED}
WHERE a.job = '${{job}}' AND a.dimension = 'worker'
GROUP BY worker
ORDER BY S_w DESC
LIMIT 20
"""

OP_TIME = """
SELECT toString(optype) AS optype, sum(duration_ns) / 1e9 / uniqExact(step) AS seconds_per_step
FROM ops FINAL
WHERE job = '${job}' AND $__timeFilter(time) AND step BETWEEN ${step_from} AND ${step_to}
  AND $__conditionalAll(concat(toString(dp_rank), ',', toString(pp_rank)) = '${worker}', $worker)
GROUP BY optype
ORDER BY seconds_per_step DESC
"""
"""Where the selected worker's ranks spend a step, by op type (raw ops, kept 7 days).
``FINAL``: a retried or repeated insert stores a record twice until a merge, and a
sum would count it twice (``tests/integration/test_grafana_repeated.py``)."""
