"""Workers board: the SMon heatmap, S_w of every (DP rank, stage) worker."""

IN_RANGE = "job = '${job}' AND $__timeFilter(time) AND step BETWEEN ${step_from} AND ${step_to}"
"""The chosen job, time range and step range."""

ANALYSED_STEPS = f"(SELECT count() FROM steps FINAL WHERE {IN_RANGE} AND t_sim IS NOT NULL)"

WORKERS = """
SELECT DISTINCT `group`
FROM step_attribution
WHERE job = '${job}' AND dimension = 'worker' AND $__timeFilter(time)
ORDER BY `group`
"""
"""The worker variable: ``dp,stage`` of every worker attributed in range."""

WORKER_FILTER = "$__conditionalAll(`group` = '${worker}', $worker)"

GRID = f"""
SELECT toUInt32(splitByChar(',', `group`)[1]) AS dp_rank,
       toUInt32(splitByChar(',', `group`)[2]) AS stage,
       1 + sum(slowdown - 1) / {ANALYSED_STEPS} AS S_w
FROM step_attribution FINAL
WHERE {IN_RANGE} AND dimension = 'worker'
GROUP BY dp_rank, stage
ORDER BY dp_rank, stage
"""
"""S_w per worker over the step range; steps too fast to attribute count as 1."""

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
SELECT `group` AS worker,
       1 + sum(slowdown - 1) / {ANALYSED_STEPS} AS S_w,
       countIf(slowdown >= 1.03) AS steps_blamed
FROM step_attribution FINAL
WHERE {IN_RANGE} AND dimension = 'worker'
GROUP BY worker
ORDER BY S_w DESC
LIMIT 20
"""

OP_TIME = """
SELECT toString(optype) AS optype, sum(duration_ns) / 1e9 / uniqExact(step) AS seconds_per_step
FROM ops
WHERE job = '${job}' AND $__timeFilter(time) AND step BETWEEN ${step_from} AND ${step_to}
  AND $__conditionalAll(concat(toString(dp_rank), ',', toString(pp_rank)) = '${worker}', $worker)
GROUP BY optype
ORDER BY seconds_per_step DESC
"""
"""Where the selected worker's ranks spend a step, by op type (raw ops, kept 7 days)."""
