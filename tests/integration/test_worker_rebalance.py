"""Jobs move between workers mid-run: a worker joins the group, a worker leaves it
(SIGTERM), a worker is killed (SIGKILL). Each worker with its own chDB store, and (a
join and a kill) both sharing one store over HTTP as a deployment's share a server
(chDB behind ``support/chdbhttp.py``), where the new owner also reads what the old one
stored. The job's new owner restores it from its ``jobstate`` message, or from the
shared store when that holds a newer step (docs/sizing.md, "Moving jobs between
workers"), and the union of the stores holds what one uninterrupted worker stores:

- joining and leaving: every step row, straggler alert row and raw op of every job
  exactly once over both stores (unmerged), with the figures (S, T, ideal, the
  attributions) and alerts of an uninterrupted run;
- a kill: at least once, and a step stored twice is stored identically (the killed
  worker stored it and died before its jobstate message went out; its re-analysis by
  the new owner, from the same handed-over window, gives the same row), so deduplicating
  on (job, step), and on (alert_id, state) for alerts, gives the uninterrupted run.

Real broker, real ``rankwatch worker`` subprocesses, real chDB.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.chdbhttp import endpoint
from support.devbroker import create_topics
from support.workers import (
    STEP_FIELDS,
    WorkerProcess,
    assert_same_numbers,
    read_topic,
    reference_run,
    spread_jobs,
    wait_committed,
)

from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.alerts import AlertConfig
from rankwatch.streams.ops.publish import publish
from rankwatch.streams.ops.replay import ReplayedBatch, replay_batches

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PARTITIONS = 4
STEPS = 16
FIRST, DURING = 0.4, 0.75
"""The batches are sent in three parts: up to FIRST before the move (steps 0-6 of
each job: their straggler episodes open, some steps half in), up to DURING while the
group rebalances, the rest once it has (so every job has steps left after the move)."""


ALERT_WINDOW = 4
"""Steps a straggler alert reads (20 by default): the 5-step episodes fire within it."""
ALERTS = AlertConfig(window=ALERT_WINDOW)


def jobs(names: list[str], origin_ns: int) -> list[ReplayedBatch]:
    """Four jobs whose straggler slows steps 1-5: each job's alert fires before the move
    and resolves after it, so the episode must cross the move."""
    out: list[ReplayedBatch] = []
    for i, job in enumerate(names):
        slow = Straggler(i % 2, (i // 2) % 2, 1.8 + 0.1 * i, steps=(1, 2, 3, 4, 5))
        cfg = GenConfig(dp=2, pp=2, microbatches=4, steps=STEPS, stragglers=(slow,), seed=i)
        trace, meta = generate_trace(cfg)
        out += replay_batches(trace, meta, job, origin_ns)
    out.sort(key=lambda b: (b.sent_ns, b.batch.job, b.batch.rank))
    return out


def owned_in(status: dict[str, Any], topic: str) -> set[str]:
    return {tp for tp in status.get("assigned", []) if tp.startswith(f"{topic}:")}


def owned(worker: WorkerProcess, topic: str) -> set[str]:
    return owned_in(worker.status(), topic)


def wait_split(workers: list[WorkerProcess], topic: str, timeout_s: float = 90) -> None:
    """Until every worker owns ops partitions and together they own all of them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        parts = [owned(w, topic) for w in workers]
        if (
            all(parts)
            and len(set().union(*parts)) == PARTITIONS
            and sum(map(len, parts)) == PARTITIONS
        ):
            return
        time.sleep(0.3)
    pytest.fail(f"partitions never split: {[w.tail(1500) for w in workers]}")


def send_paced(bootstrap: str, batches: list[ReplayedBatch], topic: str) -> threading.Thread:
    """Send ``batches`` in small groups over a few seconds, from a thread (the group
    rebalances while they arrive)."""

    def run() -> None:
        for i in range(0, len(batches), 8):
            publish(bootstrap, batches[i : i + 8], topic=topic)
            time.sleep(0.15)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def union(dsns: list[str]) -> dict[str, Any]:
    """Steps, attributions, straggler alerts and the raw ops count over every distinct
    store (unmerged: a row stored twice shows twice)."""
    out: dict[str, Any] = {"steps": [], "attributions": [], "alerts": [], "ops": 0}
    for dsn in dict.fromkeys(dsns):
        with Store.connect(dsn) as store:
            out["steps"] += store.query(f"SELECT {', '.join(STEP_FIELDS)} FROM steps")
            out["attributions"] += store.query(
                "SELECT job, step, dimension, group, slowdown FROM step_attribution"
            )
            out["alerts"] += store.query(
                "SELECT alert_id, state, ts_ns, evidence FROM alerts WHERE kind = 'straggler'"
            )
            out["ops"] += store.query("SELECT count() AS n FROM ops")[0]["n"]
    return out


def check(
    got: dict[str, Any], batches: list[ReplayedBatch], exactly_once: bool, report: Path
) -> None:
    reference = reference_run(batches, alerts=ALERTS)
    expected = {(r["job"], r["step"]): r for r in reference.rows["steps"]}
    keys = Counter((r["job"], r["step"]) for r in got["steps"])
    doubled = sorted(k for k, n in keys.items() if n > 1)
    alert_keys = Counter((a["alert_id"], a["state"]) for a in got["alerts"])
    figures = {
        "steps_stored": sum(keys.values()),
        "steps_doubled": len(doubled),
        "alerts_doubled": sum(n - 1 for n in alert_keys.values()),
        "ops_rows": got["ops"],
        "ops_records": sum(len(b.batch) for b in batches),
    }
    report.write_text(json.dumps(figures))
    print(f"moved jobs, {report.stem}: {json.dumps(figures)}")  # pytest -s shows it
    assert set(keys) == set(expected)  # nothing lost
    assert_same_numbers(got["steps"], expected)  # a doubled step: the same row twice
    want = Counter(
        (r["job"], r["step"], r["dimension"], r["group"], r["slowdown"])
        for r in reference.rows["step_attribution"]
    )
    have = Counter(
        (r["job"], r["step"], r["dimension"], r["group"], r["slowdown"])
        for r in got["attributions"]
    )
    assert set(have) == set(want)  # the attributions of an uninterrupted run, to the bit
    ref_alerts = {(a["alert_id"], a["state"]): a for a in reference.rows["alerts"]}
    assert len(ref_alerts) == 8, "every job's episode fires before the move, resolves after"
    assert set(alert_keys) == set(ref_alerts)  # no alert lost, no episode split
    for a in got["alerts"]:
        ref = ref_alerts[(a["alert_id"], a["state"])]
        assert a["ts_ns"] == ref["ts_ns"] and json.loads(a["evidence"]) == json.loads(
            ref["evidence"]
        )
    if exactly_once:
        assert not doubled, f"steps stored twice: {doubled}"
        assert sum(have.values()) == sum(want.values())
        assert all(n == 1 for n in alert_keys.values()), alert_keys
        assert got["ops"] == sum(len(b.batch) for b in batches)  # raw ops once
    else:
        assert got["ops"] >= sum(len(b.batch) for b in batches)


def announced(bootstrap: str, prefix: str) -> set[tuple[str, str]]:
    messages = asyncio.run(read_topic(bootstrap, f"{prefix}.alerts", "alerts", 999, 5))
    return {(m["alert_id"], m["state"]) for m in messages if m["kind"] == "straggler"}


def setup(bootstrap: str) -> tuple[str, str]:
    prefix = f"r{uuid.uuid4().hex[:10]}"
    asyncio.run(create_topics(bootstrap, [f"{prefix}.ops"], PARTITIONS))
    return prefix, f"{prefix}.ops"


@pytest.mark.parametrize(
    ("how", "layout"),
    [("join", "own"), ("leave", "own"), ("kill", "own"), ("join", "shared"), ("kill", "shared")],
)
def test_jobs_moved_mid_run_are_stored_as_by_one_uninterrupted_worker(
    how: str, layout: str, kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    if layout == "own":
        moved(
            how, [f"chdb://{tmp_path / name}" for name in ("a", "b")], kafka_broker, artifacts_dir
        )
        return
    with endpoint(tmp_path / "endpoint") as serving:
        moved(how, [serving.dsn()] * 2, kafka_broker, artifacts_dir)


def moved(how: str, dsns: list[str], kafka_broker: str, artifacts_dir: Path) -> None:
    """Move jobs ``how`` between two workers storing into ``dsns``; check the stores."""
    names = spread_jobs(4, PARTITIONS)
    batches = jobs(names, origin_ns=time.time_ns())
    cut, late = round(len(batches) * FIRST), round(len(batches) * DURING)
    prefix, topic = setup(kafka_broker)
    group = f"{prefix}-workers"
    shared = dsns[0] == dsns[1]

    def start(i: int) -> WorkerProcess:
        name = f"{how}-{'ab'[i]}"
        return WorkerProcess(
            kafka_broker,
            prefix,
            dsns[i],
            artifacts_dir,
            name,
            RANKWATCH_ALERT_WINDOW=str(ALERT_WINDOW),
        )

    workers = [start(0)] if how == "join" else [start(0), start(1)]
    try:
        if how == "join":
            workers[0].wait_for(lambda s: len(owned_in(s, topic)) == PARTITIONS, 90, "all four")
        else:
            wait_split(workers, topic)
        publish(kafka_broker, batches[:cut], topic=topic)
        for w in workers:  # every worker stored steps of its jobs before the move
            w.wait_for(lambda s: s.get("steps_analysed", 0) >= 8, 90, "steps stored")
        if how == "join":
            workers.append(start(1))
        during = send_paced(kafka_broker, batches[cut:late], topic)
        if how == "join":
            wait_split(workers, topic)
        elif how == "leave":
            workers[1].stop()
            assert workers[1].proc.returncode == 0, workers[1].tail()
        else:
            workers[1].kill()
        during.join(timeout=120)
        publish(kafka_broker, batches[late:], topic=topic)
        wait_committed(kafka_broker, group, topic, PARTITIONS, timeout_s=120)
        live = [w for w in workers if w.proc.poll() is None]
        statuses = [w.settled() for w in live]
    finally:
        for w in workers:
            w.stop()

    read_again = sum(s.get("partitions_read_again", 0) for s in statuses)
    restored = [(s["restored_jobs"], s["restored_from_jobstate"]) for s in statuses]
    print(  # pytest -s shows it (partitions read again: docs/running.md)
        f"moved jobs, {how}{' (shared store)' if shared else ''}: partitions read again"
        f" {read_again}; jobs restored, of them from jobstate, per live worker {restored}"
    )
    taker = statuses[-1] if how == "join" else statuses[0]
    if shared and how == "kill":  # the store may hold steps the jobstate never told
        assert taker["restored_jobs"] >= 1, "the new owner restored a moved job"
    else:
        assert taker["restored_from_jobstate"] >= 1, "the new owner restored a moved job"
    assert all(s["jobstates_bad"] == 0 for s in statuses)
    got = union(dsns)
    report = artifacts_dir / f"{how}{'-shared' if shared else ''}.json"
    check(got, batches, exactly_once=how != "kill", report=report)
    reference_alerts = {
        (a["alert_id"], a["state"]) for a in reference_run(batches, alerts=ALERTS).rows["alerts"]
    }
    assert reference_alerts <= announced(kafka_broker, prefix)  # each at least once
