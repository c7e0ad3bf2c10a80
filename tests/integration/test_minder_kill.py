"""kill -9 the Minder worker in the middle of a faulty-machine episode, publish the rest
of the metrics, and let the jobs go on elsewhere: one firing and one resolved alert for
the episode (on the topic and in the store), and every window scored exactly once, with
the scores of an uninterrupted run (docs/detection.md, "After a restart").

Twice: the same worker started again on its embedded chDB path; and a second worker of
the group, joined mid-episode, taking the killed one's jobs over through the store they
share (chDB behind the HTTP endpoint of ``support/chdbhttp.py``: an embedded path
belongs to one process), recalling each job from its latest snapshot.

Real broker, real ``rankwatch minder worker`` subprocesses, real chDB.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from support.chdbhttp import endpoint
from support.devbroker import create_topics
from support.memstore import MemoryStore
from support.workers import read_topic

from rankwatch.agent import KafkaTransport, Outbox, metrics_message
from rankwatch.streams.kit.health import check_status, read_status
from rankwatch.streams.kit.store import Store
from rankwatch.streams.minder.online import OnlineConfig
from rankwatch.streams.minder.worker import MinderSettings, MinderState

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NS = 1_000_000_000
SECONDS, KILL_AT = 240, 110  # the fault lasts from 60 s to 140 s: fired, not resolved


def fleet_messages(job: str, start_ns: int, seconds: int, faulty: str | None) -> list[bytes]:
    """Eight hosts, one sample a second each; ``faulty`` starved of CPU from 60 s to 140 s."""
    rng = np.random.default_rng(len(job))
    out = []
    for s in range(seconds):
        for h in range(8):
            host = f"{job}-node{h}"
            cpu = (
                70
                + 15 * np.sin(s / 15)
                + rng.normal(0, 1.0)
                - (35 if host == faulty and 60 <= s < 140 else 0)
            )
            metrics = {"cpu_util": cpu, "mem_used_bytes": 8e9 + rng.normal(0, 1e7)}
            ts = start_ns + s * NS + int(rng.integers(0, NS // 4))
            out.append(orjson.dumps(metrics_message(job, host, ts, metrics)))
    return out


def start_worker(bootstrap: str, prefix: str, dsn: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RANKWATCH_TOPIC_PREFIX": prefix, "RANKWATCH_GROUP": f"{prefix}-g"}
    env["RANKWATCH_SESSION_TIMEOUT_S"] = "6"  # the killed worker's partitions move on soon
    cmd = [sys.executable, "-m", "rankwatch", "minder", "worker", "--kafka", bootstrap]
    cmd += ["--clickhouse", dsn, "--window", "10", "--continuity", "3"]
    cmd += ["--status-file", str(log.with_suffix(".status.json"))]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=out)


def publish(bootstrap: str, topic: str, messages: list[tuple[str, bytes]]) -> None:
    box = Outbox(KafkaTransport(bootstrap, topic), capacity=10_000)
    for job, value in messages:
        box.put(job.encode(), value)
    box.close(timeout_s=60)
    assert box.counters.sent == len(messages), box.counters


def wait_for_line(log: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"no {text!r} in the worker's log"
        time.sleep(0.1)


def reference(messages: list[tuple[str, bytes]]) -> dict[tuple[str, str, str, int], float]:
    """(job, host, metric, window end ms) -> score of an uninterrupted run in process."""
    online = OnlineConfig(window_s=10, stride_s=10, continuity=3)
    store = MemoryStore()
    state = MinderState(MinderSettings("unused", "chdb://unused", online=online), store=store)  # type: ignore[arg-type]
    for _, value in messages:
        state.on_message(value)
    state.on_tick()
    return {
        (r["job"], r["host"], r["metric"], int(r["time"]) // 10**6): r["score"]  # type: ignore[call-overload]
        for r in store.rows["machine_scores"]
    }


@contextlib.contextmanager
def store_for(after: str, tmp_path: Path) -> Iterator[str]:
    """The workers' store: an embedded path for one worker, an endpoint for two."""
    if after == "restart":
        yield f"chdb://{tmp_path / 'chdb'}"
        return
    with endpoint(tmp_path / "endpoint") as serving:
        yield serving.dsn()


def wait_status(
    status_file: Path, ok: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
) -> None:
    """Until the worker's health file shows ``ok``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ok(read_status(status_file)):
                return
        except (OSError, ValueError):  # not written yet
            pass
        assert time.monotonic() < deadline, f"{status_file.name}: {what} not in {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.parametrize("after", ["restart", "peer"])
def test_kill_9_mid_episode_keeps_one_alert_per_episode(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path, after: str
) -> None:
    with store_for(after, tmp_path) as dsn:
        episode_after_kill(kafka_broker, dsn, artifacts_dir, after)


def episode_after_kill(kafka_broker: str, dsn: str, artifacts_dir: Path, after: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.metrics"], 2))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.alerts"], 1))
    first = artifacts_dir / "minder-worker.log"
    log = first if after == "restart" else artifacts_dir / "minder-peer.log"
    status_file = log.with_suffix(".status.json")
    start = (time.time_ns() - 600 * NS) // NS * NS
    by_job = {
        job: fleet_messages(job, start, SECONDS, faulty)
        for job, faulty in (("sick", "sick-node3"), ("healthy", None))
    }
    per_second = 8  # hosts
    head = [(j, v) for j, vs in by_job.items() for v in vs[: KILL_AT * per_second]]
    tail = [(j, v) for j, vs in by_job.items() for v in vs[KILL_AT * per_second :]]
    topic = f"{prefix}.metrics"

    worker = start_worker(kafka_broker, prefix, dsn, first)
    running = [worker]
    try:
        publish(kafka_broker, topic, head)
        fired = asyncio.run(read_topic(kafka_broker, f"{prefix}.alerts", "alerts", 1, 120))
        assert [a["state"] for a in fired] == ["firing"], first.read_text()[-3000:]
        wait_for_line(first, "alert states sent and recorded", 30)
        if after == "peer":  # joins the group: may take a job over at once, by hand-over
            running.append(start_worker(kafka_broker, prefix, dsn, log))
            wait_status(status_file, lambda s: bool(s.get("assigned")), 60, "a partition")
        time.sleep(1.5)  # a tick or so later: mid-episode, some later windows evaluated
        worker.kill()
        worker.wait(timeout=30)
        publish(kafka_broker, topic, tail)
        if after == "restart":
            running.append(start_worker(kafka_broker, prefix, dsn, log))
        got = asyncio.run(read_topic(kafka_broker, f"{prefix}.alerts", "alerts", 2, 120))
        if after == "peer":  # the killed worker's partition comes once its session ends
            wait_status(status_file, lambda s: s.get("jobs") == 2, 60, "both jobs")
        time.sleep(4)  # more ticks: the last windows' rows stored, a duplicate would show
        got = asyncio.run(read_topic(kafka_broker, f"{prefix}.alerts", "alerts", 3, 3))
        status = read_status(status_file)  # the kit's health file
        assert check_status(status, time.time_ns(), max_age_s=10, max_lag_s=60) == [], status
        assert status["jobs"] == 2 and status["messages_in"], status
        # a peer may recall a job twice: at its join, and again after the kill (faust's
        # rebalances are eager: every partition is revoked and assigned anew)
        restored = status["restored_jobs"]
        assert restored == 2 or (after == "peer" and restored > 2), status
    finally:
        for process in running:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)
    text = log.read_text(errors="replace")
    episode = fired[0]["alert_id"]
    assert [(a["alert_id"], a["state"]) for a in got] == [
        (episode, "firing"),
        (episode, "resolved"),
    ], text[-3000:]
    assert got[0]["evidence"]["host"] == "sick-node3"
    assert "job sick recalled: snapshot, 1 open episodes, 0 unsent" in text
    with Store.connect(dsn) as store:
        stored = store.query("SELECT alert_id, state FROM alerts FINAL ORDER BY ts_ns")
        faults = store.query("SELECT host, alert_id, resolved_at FROM machine_faults FINAL")
        scores = store.query(
            "SELECT job, host, metric, toUnixTimestamp64Milli(time) AS ms, score "
            "FROM machine_scores"  # unmerged: a window scored twice would show
        )
    assert [(a["alert_id"], a["state"]) for a in stored] == [
        (episode, "firing"),
        (episode, "resolved"),
    ]
    assert [(f["host"], f["alert_id"]) for f in faults] == [("sick-node3", episode)]
    assert faults[0]["resolved_at"] is not None
    want = reference(head + tail)
    keys = [(r["job"], r["host"], r["metric"], int(r["ms"])) for r in scores]
    assert len(keys) == len(set(keys)), "a window was scored twice"
    # every window an uninterrupted run scores, scored alike (the last ones are scored
    # only once the stream moves past them, as in the reference)
    assert set(keys) == set(want)
    for r, key in zip(scores, keys, strict=True):
        assert r["score"] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
