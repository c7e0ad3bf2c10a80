"""A worker asked to stop ends within ``[kafka] stop_wait_s``, even when its broker is
gone (faust then waits for ever on its consumer thread; both workers were still
running a minute after SIGTERM before ``kit.faustapp.serve`` set a deadline).

Each test starts a broker of its own, since it stops it."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.devbroker import DevBroker
from support.hangjob import start_worker
from support.workers import WorkerProcess

STOP_WAIT_S = 4.0
GIVE_UP = "still stopping"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[DevBroker]:
    started = DevBroker(tmp_path / "kafka")
    started.start()
    yield started
    started.stop()


def _start(kind: str, broker: DevBroker, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """The worker of ``kind`` (ops or hang), its log; started and writing its health."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    dsn = f"chdb://{tmp_path / 'chdb'}"
    env = {"RANKWATCH_STOP_WAIT_S": str(STOP_WAIT_S)}
    if kind == "ops":
        worker = WorkerProcess(broker.bootstrap, prefix, dsn, tmp_path, "ops", **env)
        proc, log, status = worker.proc, worker.log, worker.status_file
    else:
        log = tmp_path / "hang.log"
        proc = start_worker(broker.bootstrap, prefix, dsn, log, **env)
        status = log.with_suffix(".status.json")
    deadline = time.monotonic() + 90
    while not status.exists():
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "no health file in 90 s"
        time.sleep(0.2)
    return proc, log


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


@pytest.mark.parametrize("kind", ["ops", "hang"])
def test_a_worker_whose_broker_is_gone_still_stops(
    kind: str, broker: DevBroker, tmp_path: Path
) -> None:
    proc, log = _start(kind, broker, tmp_path)
    broker.stop()
    time.sleep(2.0)  # its consumer has noticed: fetches and heartbeats fail
    rc, took = _stop(proc, STOP_WAIT_S + 20)
    text = log.read_text(errors="replace")
    assert rc == 1, f"exit status {rc} after {took:.1f} s: {text[-3000:]}"
    assert STOP_WAIT_S - 0.5 <= took <= STOP_WAIT_S + 10
    assert GIVE_UP in text  # the log says why it ended


@pytest.mark.parametrize("kind", ["ops", "hang"])
def test_a_worker_with_its_broker_stops_cleanly_before_the_deadline(
    kind: str, broker: DevBroker, tmp_path: Path
) -> None:
    proc, log = _start(kind, broker, tmp_path)
    rc, took = _stop(proc, STOP_WAIT_S + 20)
    text = log.read_text(errors="replace")
    assert rc == 0, f"exit status {rc} after {took:.1f} s: {text[-3000:]}"
    assert took < STOP_WAIT_S
    assert GIVE_UP not in text
