"""Helpers for testing stream workers against a real broker and store (used by the
integration tests and the stream benchmark; not part of the wheel).

A worker runs as a real ``rankwatch worker`` subprocess; the test follows it through
its health file (a chDB path belongs to one process, so the test cannot query an
embedded store while the worker runs; one behind ``chdbhttp.py`` it can) and through the
consumer group's committed offsets.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rankwatch.schemas.codec import decode, encode_ops
from rankwatch.streams.kit.health import read_status
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.ops.alerts import AlertConfig, StragglerAlerts
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import ReplayedBatch
from support.lifetime import tied

STEP_FIELDS = ("job", "step", "t_base", "t_sim", "t_ideal", "slowdown", "partial", "n_ops")


class WorkerProcess:
    """``rankwatch worker`` in a subprocess, with its log and health file."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        dsn: str,
        workdir: Path,
        name: str = "worker",
        argv: list[str] | None = None,
        **env: str,
    ) -> None:
        """``argv``: another program to run with the worker's environment (default
        ``python -m rankwatch worker``). It runs in ``workdir``, where faust puts its
        data directory."""
        self.status_file = workdir / f"{name}.status.json"
        self.log = workdir / f"{name}.log"
        full_env = {
            **os.environ,
            "RANKWATCH_KAFKA": bootstrap,
            "RANKWATCH_TOPIC_PREFIX": prefix,
            "RANKWATCH_GROUP": f"{prefix}-workers",
            "RANKWATCH_CLICKHOUSE": dsn,
            "RANKWATCH_GRACE_S": "60",
            "RANKWATCH_STATUS_FILE": str(self.status_file),
            "RANKWATCH_SESSION_TIMEOUT_S": "6",
            **env,
        }
        self.status_file.unlink(missing_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                tied(argv or [sys.executable, "-m", "rankwatch", "worker"]),
                env=full_env,
                cwd=workdir,
                stdout=out,
                stderr=out,
            )

    def status(self) -> dict[str, Any]:
        try:
            return read_status(self.status_file)
        except (OSError, ValueError):
            return {}

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited ({self.proc.returncode}): {self.tail()}")
            status = self.status()
            if status and predicate(status):
                return status
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {self.status()}\n{self.tail()}")

    def settled(self, timeout_s: float = 30) -> dict[str, Any]:
        """The first status written after this call with nothing left to store. The
        worker writes its status at each tick, but stores, acknowledges (so offsets get
        committed) and restores between ticks: a status read just after the offsets were
        committed may predate the very restore or store that led to the commit."""
        since = time.time_ns()
        return self.wait_for(
            lambda s: s.get("written_ns", 0) > since and s.get("buffered_rows") == 0,
            timeout_s,
            "a status written after the wait, with an empty buffer",
        )

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, nothing is flushed or committed."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


async def _lag(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await admin.start()
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = await consumer.end_offsets(tps)
        offsets = await admin.list_consumer_group_offsets(group)
        committed = {
            tp.partition: max(om.offset, 0) for tp, om in offsets.items() if tp.topic == topic
        }
        return sum(ends[tp] - committed.get(tp.partition, 0) for tp in tps)
    finally:
        await consumer.stop()
        await admin.close()


async def records_until(
    bootstrap: str, topic: str, until: Callable[[list[Any]], bool], timeout_s: float
) -> list[Any]:
    """Records (key, value, headers...) of ``topic`` from its start, read until
    ``until(records)`` holds or ``timeout_s`` passed."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not until(got) and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                got += records
    finally:
        await consumer.stop()
    return got


async def read_topic(
    bootstrap: str, topic: str, kind: str, want: int, timeout_s: float
) -> list[dict[str, Any]]:
    """Decoded messages of ``topic`` from its start: ``want`` of them, or what came in
    ``timeout_s``."""
    records = await records_until(bootstrap, topic, lambda got: len(got) >= want, timeout_s)
    return [decode(kind, r.value) for r in records]


async def send_in_order(
    bootstrap: str, topic: str, messages: Iterable[tuple[bytes | None, bytes]]
) -> None:
    """(key, value) messages, each acknowledged before the next is sent: the order a
    test builds is the order the worker reads."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 * 1024 * 1024)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``done`` every 50 ms until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def uncommitted(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """Messages of ``topic`` past the group's committed offsets (0: all committed)."""
    return asyncio.run(_lag(bootstrap, group, topic, partitions))


def wait_committed(
    bootstrap: str, group: str, topic: str, partitions: int, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    left = -1
    from aiokafka.errors import KafkaError

    while time.monotonic() < deadline:
        try:
            left = uncommitted(bootstrap, group, topic, partitions)
        except KafkaError:  # the group does not exist yet
            left = -1
        if left == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"{left} messages of {topic} still uncommitted by {group}")


def reference_run(
    batches: Iterable[ReplayedBatch],
    window: int = 20,
    assembly: AssemblyConfig | None = None,
    alerts: AlertConfig | None = None,
) -> Output:
    """Everything an uninterrupted in-process run produces (worker defaults: rolling
    window, straggler alerts)."""
    pipeline = Pipeline(
        assembly=assembly or AssemblyConfig(grace_s=1e9),
        analyser=WhatIfAnalyser(window=window),
        alerts=StragglerAlerts(alerts or AlertConfig()),
    )
    out = Output()
    source = Source(topic="ops")
    for item in batches:
        out.extend(pipeline.on_message(encode_ops(item.batch), source, item.sent_ns))
    out.extend(pipeline.flush(0))
    return out


def reference_rows(
    batches: Iterable[ReplayedBatch], window: int = 20, assembly: AssemblyConfig | None = None
) -> dict[tuple[str, int], dict[str, Any]]:
    """Step rows of an uninterrupted in-process run, by (job, step)."""
    out = reference_run(batches, window, assembly)
    return {(r["job"], r["step"]): r for r in out.rows.get("steps", [])}


def spread_jobs(n_jobs: int, partitions: int) -> list[str]:
    """Job ids whose keys land on distinct partitions first (as Kafka's default
    partitioner places them), so that every partition of a test topic gets work."""
    from aiokafka.partitioner import murmur2

    by_partition: dict[int, list[str]] = {}
    i = 0
    while sum(len(v) for v in by_partition.values()) < n_jobs:
        name = f"job-{i}"
        part = (murmur2(name.encode()) & 0x7FFFFFFF) % partitions
        if len(by_partition.get(part, [])) < -(-n_jobs // partitions):
            by_partition.setdefault(part, []).append(name)
        i += 1
    return sorted(name for names in by_partition.values() for name in names)


def several_jobs(jobs: list[str], steps: int, origin_ns: int) -> list[ReplayedBatch]:
    """Generated traces of ``jobs`` (each with a different straggler), replayed at once:
    their batches interleaved in send-time order. One message per rank and step (the
    hooks would put several of these 0.1-s steps in one; the tests that use this count
    messages per step)."""
    from rankwatch.schemas.batching import BatchingRule
    from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
    from rankwatch.streams.ops.replay import replay_batches

    out: list[ReplayedBatch] = []
    for i, job in enumerate(jobs):
        cfg = GenConfig(
            dp=2,
            pp=2,
            microbatches=4,
            steps=steps,
            stragglers=(Straggler(i % 2, (i // 2) % 2, 1.3 + 0.1 * i),),
            seed=i,
        )
        trace, meta = generate_trace(cfg)
        out += replay_batches(trace, meta, job, origin_ns, rule=BatchingRule(window_s=0.0))
    out.sort(key=lambda b: (b.sent_ns, b.batch.job, b.batch.rank))
    return out


def stored_steps(dsn: str) -> list[dict[str, Any]]:
    """The ``steps`` rows in ``dsn`` (unmerged: duplicates would show)."""
    from rankwatch.streams.kit.store import Store

    with Store.connect(dsn) as store:
        return store.query(f"SELECT {', '.join(STEP_FIELDS)} FROM steps ORDER BY job, step")


def assert_same_numbers(rows: list[dict[str, Any]], expected: dict[tuple[str, int], Any]) -> None:
    """Each row equals the uninterrupted run's row of its step (floats to 1e-12)."""
    import math

    for row in rows:
        want = expected[(row["job"], row["step"])]
        for name in STEP_FIELDS[2:]:
            got, ref = row[name], want[name]
            same = got == ref or (
                got is not None and ref is not None and math.isclose(got, ref, rel_tol=1e-12)
            )
            assert same, f"{row['job']} step {row['step']} {name}: {got} != {ref}"
