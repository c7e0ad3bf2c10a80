"""The topics a worker reads and writes, made to exist before it subscribes.

Why: a consumer subscribed to a topic the broker does not have yet is told nothing
about it until its next metadata refresh (faust: five minutes), and a broker with
``auto.create.topics.enable`` makes it on first use with ``num.partitions`` (often 1),
not what the worker is configured for. So every worker, at start, creates the topics it
needs through the admin client with the configured partitions, replication and
retention, waits until every partition has a leader, and only then starts consuming;
with ``auto.offset.reset = earliest`` it then reads records produced before and after
it started. A topic that exists with another partition count is kept (changing it
would move jobs between partitions) and reported: keys then map to other partitions
than the configuration says, which is harmless for one worker group but worth knowing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # aiokafka is loaded only when topics are made
    from aiokafka.admin import AIOKafkaAdminClient

log = logging.getLogger("rankwatch.topics")

_TOPIC_ALREADY_EXISTS = 36
"""Kafka error code: creating is idempotent for us (two workers may start at once)."""


class TopicError(RuntimeError):
    """The topics could not be made or described (broker unreachable, not authorised)."""


@dataclass(frozen=True)
class TopicPlan:
    """How the topics a worker creates are made."""

    partitions: int = 8
    replication: int = 1
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    """None: the broker's default."""
    config: Mapping[str, str] = field(default_factory=dict)

    def topic_config(self) -> dict[str, str]:
        out = dict(self.config)
        if self.retention_ms is not None:
            out.setdefault("retention.ms", str(self.retention_ms))
        return out


@dataclass(frozen=True)
class TopicReport:
    created: tuple[str, ...]
    partitions: Mapping[str, int]
    """Every named topic's partition count as the broker has it."""
    mismatched: tuple[str, ...]
    """Topics that existed with another partition count than planned."""


async def ensure_topics(
    bootstrap: str, names: Sequence[str], plan: TopicPlan, timeout_s: float = 30.0
) -> TopicReport:
    """Create the missing ``names`` as ``plan`` says, wait for their leaders, and say
    what is there. Raises :class:`TopicError` when the broker cannot be reached or
    refuses (a clear message, for the worker's log and exit)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError, for_code

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
    except (TimeoutError, KafkaError, OSError) as exc:
        raise TopicError(f"cannot reach Kafka at {bootstrap}: {exc or type(exc).__name__}") from exc
    try:
        config = plan.topic_config()
        new = [NewTopic(n, plan.partitions, plan.replication, topic_configs=config) for n in names]
        response = await admin.create_topics(new)
        created = []
        for topic, code, *rest in response.topic_errors:
            if code == 0:
                created.append(topic)
            elif code != _TOPIC_ALREADY_EXISTS:
                why = rest[0] if rest and rest[0] else for_code(code).__name__
                raise TopicError(f"cannot create topic {topic} on {bootstrap}: {why}")
        counts = await _wait_for_leaders(admin, names, timeout_s)
        await _wait_for_controller(admin, timeout_s)
    except KafkaError as exc:
        raise TopicError(f"topics on {bootstrap}: {exc}") from exc
    finally:
        await admin.close()
    mismatched = tuple(n for n in names if counts[n] != plan.partitions)
    report = TopicReport(tuple(created), counts, mismatched)
    _log(report, plan)
    return report


def _log(report: TopicReport, plan: TopicPlan) -> None:
    if report.created:
        log.info(
            "created topics %s (%d partitions, replication %d)",
            ", ".join(report.created),
            plan.partitions,
            plan.replication,
        )
    for name in report.mismatched:
        log.warning(
            "topic %s has %d partitions, the configuration says %d (kept as it is: "
            "jobs hash onto the partitions the topic has)",
            name,
            report.partitions[name],
            plan.partitions,
        )


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, names: Sequence[str], timeout_s: float
) -> dict[str, int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        described = await admin.describe_topics(list(names))
        if all(_has_leaders(topic) for topic in described):
            return {t["topic"]: len(t["partitions"]) for t in described}
        if loop.time() > deadline:
            raise TopicError(f"topics {list(names)} have no leaders after {timeout_s:.0f}s")
        await asyncio.sleep(0.1)


async def _wait_for_controller(admin: AIOKafkaAdminClient, timeout_s: float) -> None:
    """Until the cluster's metadata names its brokers and a controller. A broker just
    started can answer before it does, and faust's first topic declaration (its leader
    topic) then fails the worker's start with "Controller node not found" (seen once in
    ten fresh-broker runs of test_minder_slow_store on a loaded box)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        cluster = await admin.describe_cluster()
        controller = cluster.get("controller_id")
        if cluster.get("brokers") and isinstance(controller, int) and controller >= 0:
            return
        if loop.time() > deadline:
            raise TopicError(f"the cluster names no controller after {timeout_s:.0f}s")
        await asyncio.sleep(0.1)


def _has_leaders(topic: Mapping[str, Any]) -> bool:
    parts = topic.get("partitions")
    return (
        topic.get("error_code") == 0
        and isinstance(parts, list)
        and bool(parts)
        and all(p["leader"] >= 0 for p in parts)
    )


def prepare_topics(
    bootstrap: str, names: Sequence[str], plan: TopicPlan, wait_s: float = 120.0
) -> TopicReport:
    """:func:`ensure_topics` for a worker about to start (no event loop running yet):
    retried every 2 s while the broker cannot be reached, for up to ``wait_s`` (a worker
    and its broker often start together), then :class:`TopicError`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return asyncio.run(ensure_topics(bootstrap, names, plan))
        except TopicError as exc:
            if time.monotonic() >= deadline:
                raise
            log.warning("%s; retrying for %.0fs more", exc, deadline - time.monotonic())
            time.sleep(2.0)
