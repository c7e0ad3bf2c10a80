"""Kafka topic of each message kind (one JSON Schema per kind, ``<kind>.v1.schema.json``)."""

from __future__ import annotations

TOPICS: dict[str, str] = {
    "ops": "rankwatch.ops",
    "heartbeats": "rankwatch.heartbeats",
    "stacks": "rankwatch.stacks",
    "metrics": "rankwatch.metrics",
    "steps": "rankwatch.steps",
    "alerts": "rankwatch.alerts",
}
"""Message kind -> topic. Messages are keyed by job, so one worker owns a job's state."""

DEAD_LETTER_TOPIC = "rankwatch.dead-letters"
"""Where a worker may republish a message it could not decode (the ``dead_letters`` table
holds the same)."""
