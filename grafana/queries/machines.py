"""Machines board: Minder's per-host scores and the faulty-machine episodes."""

SELECTED = (
    "job = '${job}' AND $__timeFilter(time)"
    " AND $__conditionalAll(metric = '${metric}', $metric)"
    " AND $__conditionalAll(host = '${host}', $host)"
)

METRICS = """
SELECT DISTINCT metric FROM machine_scores
WHERE job = '${job}' AND $__timeFilter(time)
ORDER BY metric
"""

HOSTS = """
SELECT DISTINCT host FROM machine_scores
WHERE job = '${job}' AND $__timeFilter(time)
ORDER BY host
"""

SCORES_BY_HOST = f"""
SELECT $__timeInterval(time) AS time, host, max(score) AS score
FROM machine_scores
WHERE {SELECTED}
GROUP BY time, host
ORDER BY time, host
"""
"""One series per host: its worst score over the selected metrics."""

SCORES_BY_METRIC = f"""
SELECT $__timeInterval(time) AS time, metric, max(score) AS score
FROM machine_scores
WHERE {SELECTED}
GROUP BY time, metric
ORDER BY time, metric
"""
"""One series per metric: the worst score over the selected hosts."""

CANDIDATES = f"""
SELECT host, metric, argMax(score, time) AS score, max(time) AS last_seen,
       uniqExact(time) AS windows
FROM machine_scores
WHERE {SELECTED} AND candidate = 1
GROUP BY host, metric
ORDER BY score DESC
"""
"""Machines flagged in range; ``windows``: distinct scored windows, so that a score
stored twice (a retried insert, before a merge) is counted once."""

FAULTY_NOW = """
SELECT count() AS faulty_machines
FROM machine_faults FINAL
WHERE job = '${job}' AND resolved_at IS NULL
"""

FAULTS = """
SELECT first_seen, time AS reported, if(resolved_at IS NULL, 'open', 'resolved') AS state,
       host, metric, score, resolved_at, alert_id
FROM machine_faults FINAL
WHERE job = '${job}' AND ($__timeFilter(time) OR resolved_at IS NULL)
ORDER BY resolved_at IS NULL DESC, first_seen DESC
"""
