"""Kafka topic of each message kind (one JSON Schema per kind, ``<kind>.v1.schema.json``)."""

from __future__ import annotations

TOPICS: dict[str, str] = {
    "ops": "rankwatch.ops",
    "heartbeats": "rankwatch.heartbeats",
    "stacks": "rankwatch.stacks",
    "metrics": "rankwatch.metrics",
    "steps": "rankwatch.steps",
    "alerts": "rankwatch.alerts",
    "signals": "rankwatch.signals",
    "jobstate": "rankwatch.jobstate",
}
"""Message kind -> topic. Messages are keyed by job, so one worker owns a job's state.
``jobstate`` is the ops workers' own changelog (compacted: the latest message per job),
read by the worker a job's partition moves to."""

DEAD_LETTER_TOPIC = "rankwatch.dead-letters"
"""Where a worker republishes every message it refused, keyed by job, the value the
original bytes (the ``dead_letters`` table holds the same, its payload cut to 4 KiB)."""

DEAD_LETTER_HEADERS: tuple[str, ...] = (
    "rankwatch-reason",
    "rankwatch-detail",
    "rankwatch-source-topic",
    "rankwatch-source-partition",
    "rankwatch-source-offset",
)
"""Kafka headers of a dead letter (UTF-8 values): why it was refused and where it was read."""
