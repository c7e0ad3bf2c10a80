"""Minder over the real services: the agent publishes to a real Kafka broker, and the
Minder worker (a separate process, ``rankwatch minder worker``) turns a job's metrics
into machine_scores / machine_faults rows in chDB and one alert per episode."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
import pytest
from support.devbroker import create_topics

from rankwatch.agent import (
    Agent,
    AgentConfig,
    HostSampler,
    KafkaTransport,
    Outbox,
    metrics_message,
    run_agents,
)
from rankwatch.schemas.codec import decode
from rankwatch.streams.kit.store import Store

pytestmark = pytest.mark.integration
NS = 1_000_000_000


async def consume(bootstrap: str, topic: str, kind: str, until: object, timeout_s: float) -> list:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    got: list[dict] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not until(got) and time.monotonic() < deadline:  # type: ignore[operator]
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got += [decode(kind, r.value) for r in records]
    finally:
        await consumer.stop()
    return got


def test_agent_publishes_real_host_metrics(kafka_broker: str, unique_topic: str) -> None:
    box = Outbox(KafkaTransport(kafka_broker, unique_topic))
    agent = Agent(AgentConfig(job="job-a", host="node-1"), [HostSampler()], box)
    assert run_agents([agent], 0.2, threading.Event(), count=4) == 4
    box.close()
    assert box.counters.sent == 4, box.counters
    got = asyncio.run(consume(kafka_broker, unique_topic, "metrics", lambda g: len(g) >= 4, 30))
    assert [m["host"] for m in got] == ["node-1"] * 4
    utils = [m["metrics"].get("cpu_util") for m in got]
    assert all(u is not None and 0 <= u <= 100 for u in utils[1:]), utils
    assert all(m["metrics"]["mem_used_bytes"] > 0 for m in got)


def fleet_messages(
    job: str, start_ns: int, seconds: int, faulty: str | None, hosts: int = 8
) -> list[bytes]:
    rng = np.random.default_rng(abs(hash(job)) % 2**32)
    out = []
    for s in range(seconds):
        for h in range(hosts):
            host = f"{job}-node{h}"
            cpu = 70 + 15 * np.sin(s / 15) + rng.normal(0, 1.0)
            if host == faulty and 60 <= s < 140:
                cpu -= 35  # starved: its ranks wait on the others
            metrics = {"cpu_util": cpu, "mem_used_bytes": 8e9 + rng.normal(0, 1e7)}
            ts = start_ns + s * NS + int(rng.integers(0, NS // 4))
            out.append(orjson.dumps(metrics_message(job, host, ts, metrics)))
    return out


def test_worker_reports_the_faulty_machine_once(kafka_broker: str, tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.metrics"], 2))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.alerts"], 1))
    dsn = f"chdb://{tmp_path / 'chdb'}"
    log = tmp_path / "minder.log"
    env = {
        **os.environ,
        "RANKWATCH_TOPIC_PREFIX": prefix,
        "RANKWATCH_GROUP": f"{prefix}-g",
    }
    cmd = [sys.executable, "-m", "rankwatch", "minder", "worker", "--kafka", kafka_broker]
    status = tmp_path / "minder.status.json"
    cmd += ["--clickhouse", dsn, "--window", "10", "--continuity", "3"]
    cmd += ["--status-file", str(status)]
    with log.open("wb") as out:
        worker = subprocess.Popen(cmd, env=env, stdout=out, stderr=out)
    start = time.time_ns() - 300 * NS
    box = Outbox(KafkaTransport(kafka_broker, f"{prefix}.metrics"), capacity=10_000)
    try:
        for job, faulty in (("sick", "sick-node3"), ("healthy", None)):
            for value in fleet_messages(job, start, 240, faulty):
                box.put(job.encode(), value)
        for value in fleet_messages("lone", start, 240, None, hosts=1):  # nothing to compare
            box.put(b"lone", value)
        box.close(timeout_s=60)
        assert box.counters.sent == 2 * 240 * 8 + 240, box.counters
        alerts = asyncio.run(
            consume(kafka_broker, f"{prefix}.alerts", "alerts", lambda g: len(g) >= 2, 120)
        )
        time.sleep(3)  # one more tick: the rows of the last windows are stored
        health = orjson.loads(status.read_bytes())
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    assert [(a["job"], a["state"], a["evidence"]["host"]) for a in alerts] == [
        ("sick", "firing", "sick-node3"),
        ("sick", "resolved", "sick-node3"),
    ], log.read_text()[-3000:]
    assert alerts[0]["evidence"]["metric"] == "cpu_util"
    with Store.connect(dsn) as store:
        faults = store.query("SELECT host, metric, resolved_at FROM machine_faults FINAL")
        scores = store.query(
            "SELECT job, count() AS n, countIf(candidate = 1) AS c FROM machine_scores "
            "GROUP BY job ORDER BY job"
        )
        stored = store.query("SELECT state FROM alerts FINAL WHERE kind = 'faulty_machine'")
    assert [(f["host"], f["metric"]) for f in faults] == [("sick-node3", "cpu_util")]
    assert faults[0]["resolved_at"] is not None
    assert {r["job"] for r in scores} == {"healthy", "sick"}
    assert [r["c"] for r in scores if r["job"] == "healthy"] == [0]
    assert sorted(r["state"] for r in stored) == ["firing", "resolved"]
    # the one-host job: no row, and the health file and the log say why
    why = health["unscored_jobs"]
    assert set(why) == {"lone"} and "1 of 1 machines" in why["lone"], why
    assert "job lone: nothing scored: " in log.read_text()


def test_agent_command_publishes_to_the_prefixed_topic(kafka_broker: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.metrics"], 1))
    env = {**os.environ, "RANKWATCH_TOPIC_PREFIX": prefix}
    cmd = [sys.executable, "-m", "rankwatch", "agent", "--job", "job-c", "--host", "n1"]
    cmd += ["--kafka", kafka_broker, "--count", "3", "--interval", "0.3", "--no-gpu"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "3 sent, 0 dropped" in done.stderr
    got = asyncio.run(
        consume(kafka_broker, f"{prefix}.metrics", "metrics", lambda g: len(g) >= 3, 30)
    )
    assert [(m["job"], m["host"]) for m in got] == [("job-c", "n1")] * 3
