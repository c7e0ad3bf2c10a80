"""A worker asked to stop ends within ``[kafka] stop_wait_s``, even when its broker is
gone (faust then waits for ever on its consumer thread; both workers were still
running a minute after SIGTERM before ``kit.faustapp.serve`` set a deadline).

Each test starts a broker of its own, since it stops it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.devbroker import DevBroker
from support.hangjob import start_worker
from support.lifetime import tied
from support.workers import WorkerProcess, until

from rankwatch.streams.kit.health import read_status

GONE_WAIT_S = 4.0
"""The deadline when the broker is gone: the stop nearly always runs into it (once in
about forty runs, the ops worker's stop ended cleanly in 1.2 s: faust does not always
wait for ever, and a clean stop before the deadline is right too)."""
CLEAN_WAIT_S = 20.0
"""The deadline with the broker up: far above a clean stop (1-3 s), even on a busy CI."""
GIVE_UP = "still stopping"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[DevBroker]:
    started = DevBroker(tmp_path / "kafka")
    started.start()
    yield started
    started.stop()


def _start(
    kind: str, broker: DevBroker, tmp_path: Path, stop_wait_s: float
) -> tuple[subprocess.Popen[bytes], Path]:
    """The worker of ``kind`` (ops, hang or minder) and its log, once its health file
    says it has its partitions."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    dsn = f"chdb://{tmp_path / 'chdb'}"
    env = {"RANKWATCH_STOP_WAIT_S": str(stop_wait_s)}
    log = tmp_path / f"{kind}.log"
    status = log.with_suffix(".status.json")
    if kind == "ops":
        worker = WorkerProcess(broker.bootstrap, prefix, dsn, tmp_path, "ops", **env)
        proc, log, status = worker.proc, worker.log, worker.status_file
    elif kind == "hang":
        proc = start_worker(broker.bootstrap, prefix, dsn, log, **env)
    else:
        env |= {"RANKWATCH_TOPIC_PREFIX": prefix, "RANKWATCH_GROUP": f"{prefix}-g"}
        cmd = [sys.executable, "-m", "rankwatch", "minder", "worker"]
        cmd += ["--kafka", broker.bootstrap, "--clickhouse", dsn, "--status-file", str(status)]
        with log.open("ab") as out:
            proc = subprocess.Popen(tied(cmd), env={**os.environ, **env}, stdout=out, stderr=out)
    until(lambda: _assigned(status) or proc.poll() is not None, 90, "partitions assigned")
    assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
    return proc, log


def _assigned(status: Path) -> bool:
    try:
        return bool(read_status(status).get("assigned"))
    except (OSError, ValueError):
        return False


def _stop(proc: subprocess.Popen[bytes], within_s: float) -> tuple[int | None, float]:
    """SIGTERM; (exit status or None if still running ``within_s`` later, seconds)."""
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, time.monotonic() - began
    return rc, time.monotonic() - began


@pytest.mark.parametrize("kind", ["ops", "hang", "minder"])
def test_a_worker_whose_broker_is_gone_still_stops(
    kind: str, broker: DevBroker, tmp_path: Path
) -> None:
    proc, log = _start(kind, broker, tmp_path, GONE_WAIT_S)
    broker.stop()
    time.sleep(2.0)  # its consumer has noticed: fetches and heartbeats fail
    rc, took = _stop(proc, GONE_WAIT_S + 20)
    print(f"{kind} worker, broker gone: exit status {rc} {took:.1f} s after SIGTERM")
    text = log.read_text(errors="replace")
    assert rc is not None, f"still running {took:.1f} s after SIGTERM: {text[-3000:]}"
    if rc == 0:  # faust stopped on its own this time, before the deadline
        assert took < GONE_WAIT_S and GIVE_UP not in text
        return
    assert rc == 1, f"exit status {rc} after {took:.1f} s: {text[-3000:]}"
    assert GONE_WAIT_S - 0.5 <= took <= GONE_WAIT_S + 10
    assert GIVE_UP in text  # the log says why it ended


@pytest.mark.parametrize("kind", ["ops", "hang", "minder"])
def test_a_worker_with_its_broker_stops_cleanly_before_the_deadline(
    kind: str, broker: DevBroker, tmp_path: Path
) -> None:
    proc, log = _start(kind, broker, tmp_path, CLEAN_WAIT_S)
    rc, took = _stop(proc, CLEAN_WAIT_S + 20)
    print(f"{kind} worker, broker up: exit status {rc} {took:.1f} s after SIGTERM")
    text = log.read_text(errors="replace")
    assert rc == 0, f"exit status {rc} after {took:.1f} s: {text[-3000:]}"
    assert took < CLEAN_WAIT_S
    assert GIVE_UP not in text
