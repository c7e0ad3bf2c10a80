"""The shell kit every stream worker is built from.

Shell (I/O): ``faustapp`` (the faust app and its settings), ``topics`` (topic
bootstrap: made or checked before a worker subscribes), ``store`` (ClickHouse through
clickhouse-connect or chDB), ``store_errors`` (what a failed store call means: rows
refused, or the store failing), ``sink`` (batched inserts of an ``Output``), ``delivery``
(store, then publish: retry with backoff, back-pressure, the send and its record; every
worker's guarantees), ``restart``
(the detector snapshots and announced alerts the hang and Minder workers read back),
``health`` (the status file and its check), ``changelog`` (the latest value per key
of a compacted topic's partition: the ops worker's job handover), ``rewind`` (reads a
partition again where faust dropped its records), ``membership`` (whether the worker
still owns what it stores, and whether its broker answers).

Pure: ``output`` (what a core hands its shell: rows, publications, dead letters,
where a message came from), ``deadletter`` (one shape for refused messages),
``acks`` (when a consumed message may be acknowledged; the ops worker's today),
``pacing`` (when a closed step is due for storing: at once, a gap after the last store),
``stalls`` (which partitions the consumer read past while the agent got nothing),
``settings`` (what every worker's settings hold), ``times``, ``versions`` (a row's
version: complete over partial, a newer owner over an older one, then time).
"""

SHELL = (
    "faustapp",
    "topics",
    "store",
    "store_errors",
    "sink",
    "delivery",
    "restart",
    "health",
    "changelog",
    "rewind",
    "membership",
)
