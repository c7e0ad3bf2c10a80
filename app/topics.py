"""The workers' start-up step: make their topics exist as the configuration says."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rankwatch.errors import UserError

if TYPE_CHECKING:
    from rankwatch.config import KafkaConfig
    from rankwatch.streams.kit.topics import TopicReport


def make_topics(
    kafka: KafkaConfig,
    names: Sequence[str],
    partitions: int | None = None,
    config: Mapping[str, str] | None = None,
) -> TopicReport:
    """Create the missing topics (configured partitions, replication, retention; or
    ``partitions`` and extra topic ``config``) and wait for their leaders; a one-line
    error when the broker stays out of reach."""
    from rankwatch.streams.kit.topics import TopicError, TopicPlan, prepare_topics

    retention_ms = round(kafka.retention_hours * 3600 * 1000)
    plan = TopicPlan(
        partitions or kafka.partitions, kafka.replication, retention_ms, dict(config or {})
    )
    try:
        return prepare_topics(kafka.bootstrap, names, plan, wait_s=kafka.connect_wait_s)
    except TopicError as exc:
        raise UserError(str(exc)) from exc
