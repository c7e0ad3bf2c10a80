"""kill -9 the hang worker in the middle of an episode, start it again while the job
stays hung, then let the job move on: exactly one firing and one resolved alert for
the episode, on the topic and in the store (docs/detection.md, "After a restart").

Real broker, real ``rankwatch hang worker`` subprocesses, real chDB. The heartbeats are
written by the test (four ranks, rank 1 stuck in compute, the others waiting in a
collective), so that the job is hung for exactly as long as the test says.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from support.devbroker import create_topics
from support.hangjob import Ranks, start_worker
from support.workers import read_topic

from rankwatch.streams.kit.health import check_status, read_status
from rankwatch.streams.kit.store import Store

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def wait_for_line(log: Path, text: str, timeout_s: float) -> None:
    """Until the worker logs ``text`` (here: the firing alert recorded as sent, so the
    kill falls after it; the kill between the send and its record is
    ``tests/unit/hang/test_hang_worker_state.py``'s)."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"no {text!r} in the worker's log"
        time.sleep(0.1)


def alerts_of(bootstrap: str, prefix: str, want: int, timeout_s: float) -> list[tuple[str, str]]:
    got = asyncio.run(read_topic(bootstrap, f"{prefix}.alerts", "alerts", want, timeout_s))
    return [(a["alert_id"], a["state"]) for a in got]


def test_kill_9_mid_episode_keeps_one_alert_per_episode(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    prefix = f"t.hangkill.{uuid.uuid4().hex[:8]}"
    kinds = ("heartbeats", "stacks", "alerts", "dead-letters")
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.{k}" for k in kinds], 1))
    dsn = f"chdb://{tmp_path / 'chdb'}"
    log = artifacts_dir / "hang-worker.log"
    ranks = Ranks(kafka_broker, f"{prefix}.heartbeats", "job-h")
    worker = start_worker(kafka_broker, prefix, dsn, log)
    try:
        fired = alerts_of(kafka_broker, prefix, 1, 90)
        assert [s for _, s in fired] == ["firing"], log.read_text()[-3000:]
        wait_for_line(log, "alert states sent and recorded", 30)
        worker.kill()  # SIGKILL mid-episode: the job is still hung
        worker.wait(timeout=30)
        worker = start_worker(kafka_broker, prefix, dsn, log)
        # hung for longer than the restarted worker needs to join (session 6 s) and to
        # declare the episode afresh (floor 3 s) had it forgotten it
        time.sleep(20)
        assert worker.poll() is None, log.read_text()[-3000:]
        assert alerts_of(kafka_broker, prefix, 2, 3) == fired, "declared again after the restart"
        status = read_status(log.with_suffix(".status.json"))  # the kit's health file
        assert check_status(status, time.time_ns(), max_age_s=10, max_lag_s=60) == [], status
        assert status["restored_episodes"] == 1 and status["open_episodes"] == 1, status
        ranks.move_on()
        got = alerts_of(kafka_broker, prefix, 2, 60)
        time.sleep(2)  # a few more ticks: a duplicate would show
        got = alerts_of(kafka_broker, prefix, 3, 3)
    finally:
        ranks.stop()
        worker.terminate()
        worker.wait(timeout=30)
    (episode,) = {a for a, _ in fired}
    assert got == [(episode, "firing"), (episode, "resolved")], log.read_text()[-3000:]
    with Store.connect(dsn) as store:
        stored = store.query("SELECT alert_id, state FROM alerts FINAL ORDER BY ts_ns")
        hangs = store.query("SELECT episode_id, resolved_at FROM hangs FINAL")
        sent = store.query("SELECT alert_id, state FROM announced FINAL ORDER BY time")
    assert f"recalled: episode {episode} open, 0 unsent" in log.read_text()
    assert [(a["alert_id"], a["state"]) for a in stored] == got
    assert [h["episode_id"] for h in hangs] == [episode] and hangs[0]["resolved_at"] is not None
    assert [(a["alert_id"], a["state"]) for a in sent] == got  # both recorded as sent
