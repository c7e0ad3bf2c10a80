"""Fault: one of two ops workers on a shared store is paused (SIGSTOP) for longer than
its group session and its steps' grace, while its jobs go on; the other takes its
partitions and stores everything; then the paused one runs again (SIGCONT).

On main the paused worker stored 6 stale step rows at SIGCONT before it noticed it had
left the group, one of them a step as *partial* that the other had stored complete, and
with the later wall-time version that partial row won ``FINAL``. Now the paused worker
stores nothing for the partitions it lost (it asks the group's coordinator before a
store, and drops what it held when the partitions turn out to be lost), and a partial or
older owner's row could not win anyway (row versions: complete, then owner, then time).
The store holds exactly what a clean run stores, no op record twice."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest
from support.chdbhttp import ChdbHttp
from support.faults import assert_stored_as_clean, clean_run
from support.workers import (
    WorkerProcess,
    several_jobs,
    spread_jobs,
    until,
    wait_committed,
)

from rankwatch.schemas.codec import encode_ops
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.publish import publish
from rankwatch.streams.ops.replay import ReplayedBatch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4
STEPS = 14
HALF_STEP = 6
"""The step half published before the pause: open on the paused worker when it stops."""


def _count(dsn: str, sql: str) -> int:
    try:
        with Store.connect(dsn) as store:
            return int(store.query(sql)[0]["n"])
    except Exception:  # the tables may not be there yet
        return -1


def _mine(status: dict[str, object], topic: str) -> int:
    """Partitions of ``topic`` a worker's status says it was assigned."""
    return sum(1 for tp in status.get("assigned", []) or [] if str(tp).startswith(f"{topic}:"))


def _parts(batches: list[ReplayedBatch]) -> tuple[list[ReplayedBatch], list[ReplayedBatch]]:
    """Before the pause: every step below ``HALF_STEP`` and half the ranks of it; after:
    the rest, in the order it was made."""

    def before(b: ReplayedBatch) -> bool:
        step = b.batch.step_span[0]
        return step < HALF_STEP or (step == HALF_STEP and b.batch.rank % 2 == 0)

    return [b for b in batches if before(b)], [b for b in batches if not before(b)]


def test_a_paused_worker_stores_nothing_stale_and_no_partial_row_wins(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    jobs = spread_jobs(PARTITIONS, PARTITIONS)
    batches = several_jobs(jobs, steps=STEPS, origin_ns=time.time_ns())
    clean = clean_run(encode_ops(b.batch) for b in batches)
    first, rest = _parts(batches)
    prefix = f"f{uuid.uuid4().hex[:10]}"
    topic, group = f"{prefix}.ops", f"{prefix}-workers"
    server = ChdbHttp(tmp_path / "store").start()
    dsn = server.dsn()
    env = {"RANKWATCH_PARTITIONS": str(PARTITIONS), "RANKWATCH_GRACE_S": "5"}
    paused = WorkerProcess(kafka_broker, prefix, dsn, artifacts_dir, "paused", **env)
    other = WorkerProcess(kafka_broker, prefix, dsn, artifacts_dir, "other", **env)
    try:
        for worker in (paused, other):
            worker.wait_for(lambda s: _mine(s, topic) == PARTITIONS // 2, 120, "a share")
        publish(kafka_broker, first, topic=topic)
        stored_before = len(jobs) * HALF_STEP
        until(lambda: _count(dsn, "SELECT count() AS n FROM steps FINAL") >= stored_before, 60,
              "the steps before the pause")  # fmt: skip
        paused.wait_for(lambda s: s.get("open_steps", 0) > 0, 30, "an open step")

        paused.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        publish(kafka_broker, rest, topic=topic)
        every = len(clean.steps)
        complete = "SELECT count() AS n FROM steps FINAL WHERE NOT partial"
        until(lambda: _count(dsn, complete) == every, 120, "the other worker storing every step")
        time.sleep(max(0.0, 15 - (time.monotonic() - stopped)))  # past grace and session
        paused.proc.send_signal(signal.SIGCONT)

        until(lambda: _mine(paused.status(), topic) == PARTITIONS // 2
              and paused.status().get("written_ns", 0) > time.time_ns() - 2e9, 90,
              "the paused worker back in the group")  # fmt: skip
        wait_committed(kafka_broker, group, topic, PARTITIONS, timeout_s=120)
        for worker in (paused, other):
            worker.settled(60)
        woke = paused.status()
    finally:
        for worker in (paused, other):
            worker.proc.send_signal(signal.SIGCONT)
            worker.stop()
    log = paused.tail(10**7)
    try:
        assert "Traceback" not in log, log[-4000:]
        assert _count(dsn, "SELECT count() AS n FROM steps WHERE partial") == 0
        assert_stored_as_clean(dsn, clean)
        # On waking, the worker either ticks first (the pause restarted its open steps'
        # grace: a blind tick) or learns first that its partitions were lost in the pause
        # and drops their open steps (nothing left to restart): a clean-clone CI run on
        # a loaded box (2026-12-04) went the second way, with every row right.
        lost_first = "partitions lost, not handed over" in log
        assert woke["blind_ticks"] >= 1 or lost_first, woke
    finally:
        server.stop()
