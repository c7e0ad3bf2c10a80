"""Hangs board: open and past episodes, who stopped first, and the merged stacks."""


def _ranks(column: str) -> str:
    return f"arrayStringConcat(arrayMap(r -> toString(r), {column}), ',')"


EPISODES = """
SELECT episode_id
FROM hangs FINAL
WHERE job = '${job}' AND ($__timeFilter(time) OR resolved_at IS NULL)
ORDER BY time DESC
"""
"""The episode variable, newest first."""

OPEN_HANGS = """
SELECT count() AS open_hangs
FROM hangs FINAL
WHERE job = '${job}' AND resolved_at IS NULL
"""

HANGS_OVER_TIME = """
SELECT $__timeInterval(time) AS time, count() AS hangs
FROM hangs FINAL
WHERE job = '${job}' AND $__timeFilter(time)
GROUP BY time
ORDER BY time
"""

EPISODE_TABLE = f"""
SELECT time, if(resolved_at IS NULL, 'open', 'resolved') AS state, episode_id, step,
       {_ranks("culprit_ranks")} AS culprit_ranks,
       arrayStringConcat(culprit_hosts, ',') AS culprit_hosts,
       culprit_where,
       length(waiting_ranks) AS n_waiting,
       {_ranks("waiting_ranks")} AS waiting_ranks,
       {_ranks("silent_ranks")} AS silent_ranks,
       dateDiff('second', last_progress, coalesce(resolved_at, now64(3))) AS stalled_s,
       resolved_at, summary
FROM hangs FINAL
WHERE job = '${{job}}' AND ($__timeFilter(time) OR resolved_at IS NULL)
ORDER BY resolved_at IS NULL DESC, time DESC
"""
"""Open episodes first, then past ones; stalled_s runs until now while open."""

FLAME = """
SELECT length(path) - 1 AS level,
       sum(n) AS value,
       sumIf(n, leaf) AS self,
       path[-1] AS label
FROM (
    SELECT arraySlice(frames, 1, k) AS path, n_ranks AS n, k = length(frames) AS leaf
    FROM (
        SELECT arrayConcat(['all stacks'], splitByChar(';', stack)) AS frames, n_ranks
        FROM stacks FINAL
        WHERE job = '${job}' AND episode_id = '${episode}'
    )
    ARRAY JOIN arrayEnumerate(frames) AS k
)
GROUP BY path
ORDER BY path
"""
"""The merged stacks as the flame graph panel's nested set: one row per call-path prefix,
depth first (a prefix sorts right before its extensions), value = ranks through it,
self = ranks whose innermost frame it is."""

STACK_TABLE = """
SELECT n_ranks, ranks_text AS ranks, absent_ranks_text AS absent_ranks,
       if(native = 1, 'native', 'python') AS kind, stack
FROM stacks FINAL
WHERE job = '${job}' AND episode_id = '${episode}'
ORDER BY n_ranks ASC, stack
"""
"""Fewest ranks first: the odd one out is usually the culprit."""
