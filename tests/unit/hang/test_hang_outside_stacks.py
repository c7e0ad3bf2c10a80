"""Stacks from outside: a rank's beacon, and the host agent dumping a silent rank.

Real processes and the real py-spy (an extra of the project): a Python child stopped
with SIGSTOP, its beacon written as the hooks write it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from rankwatch.agent.stacks import StackTaker, StackTakerConfig
from rankwatch.hooks.clock import Clock
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.publisher import PublisherConfig
from rankwatch.hooks.tracker import RankWatch
from rankwatch.hooks.transports import SinkTransport
from rankwatch.schemas.beacon import Beacon, read_beacon
from rankwatch.schemas.codec import decode
from rankwatch.schemas.examples import example
from rankwatch.schemas.stackdump import process_state, py_spy

IDENT = Identity(job="job-1", host="node-3", rank=5, dp_rank=1, pp_rank=2, dp_size=2, pp_size=4)
STUCK = """
import time
def stuck_here():
    print("ready", flush=True)
    time.sleep(600)
stuck_here()
"""


def test_the_hooks_keep_a_beacon_of_their_latest_heartbeat_and_remove_it_at_the_end(
    tmp_path: Path,
) -> None:
    beacon = Beacon(tmp_path, IDENT.job, IDENT.rank, "pfx")
    rw = RankWatch(
        IDENT,
        SinkTransport(lambda kind, value: None),
        clock=Clock(),
        publisher=PublisherConfig(heartbeat_s=1000.0),
        beacon=beacon,
        start=False,
    )
    rw.step_begin(7)
    rw.publisher.step_once(now=0.0)
    beat = read_beacon(beacon.path)
    assert beat.topic_prefix == "pfx" and beat.heartbeat["step"] == 7
    assert beat.heartbeat["pid"] == os.getpid() and beacon.path.name.endswith(".beat")
    rw.close()
    assert list(tmp_path.iterdir()) == []  # a clean end leaves no beacon


@pytest.fixture
def stopped() -> Iterator[subprocess.Popen[bytes]]:
    """A Python process stopped (SIGSTOP) inside ``stuck_here``."""
    child = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    time.sleep(0.2)  # into its sleep
    child.send_signal(signal.SIGSTOP)
    _wait_stopped(child.pid)  # delivery is asynchronous: on a busy box it takes a while
    yield child
    child.kill()
    child.wait()


def _wait_stopped(pid: int, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while process_state(pid) != "T":
        assert time.monotonic() < deadline, f"pid {pid} not stopped after {within_s} s"
        time.sleep(0.01)


def _beacon_of(folder: Path, pid: int, written_s_ago: float) -> Path:
    hb = {**example("heartbeats"), "pid": pid, "sent_ns": time.time_ns()}
    hb.pop("phase")
    path = folder / f"job-1.rank5.{pid}.beat"
    path.write_bytes(b'{"topic_prefix": "pfx"}\n' + orjson.dumps(hb))
    then = time.time() - written_s_ago
    os.utime(path, (then, then))
    return path


@pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed")
def test_the_agent_dumps_a_stopped_rank_once_with_its_python_frames(
    tmp_path: Path, stopped: subprocess.Popen[bytes]
) -> None:
    sent: list[tuple[str, bytes]] = []
    taker = StackTaker(
        tmp_path,
        lambda topic, items: sent.extend((topic, v) for _, v in items),
        StackTakerConfig(silent_s=0.3),  # its beacon must be younger than the process
    )
    _beacon_of(tmp_path, stopped.pid, written_s_ago=0.5)
    assert process_state(stopped.pid) == "T"
    first = taker.scan()
    if first == 0 and os.geteuid() != 0:  # ptrace rights are root's (or CAP_SYS_PTRACE)
        pytest.skip(f"py-spy may not attach without root: {taker._told}")
    assert first == 1, taker._told
    assert taker.scan() == 0  # once per silence
    ((topic, value),) = sent
    message = decode("stacks", value)
    assert topic == "pfx.stacks" and (message["job"], message["rank"]) == ("job-1", 5)
    assert "from outside by the host agent" in message["reason"]
    assert "state T" in message["reason"] and "Python frames only" in message["reason"]
    (thread,) = message["threads"]
    assert [f["function"] for f in thread["frames"]][-1] == "stuck_here"
    assert thread["native"] is False


def test_a_fresh_beacon_a_gone_process_or_junk_is_left_alone(tmp_path: Path) -> None:
    sent: list[object] = []
    dumps: list[int] = []

    def dump(pid: int, timeout: float) -> tuple[list[dict], str]:
        dumps.append(pid)
        return [], ""

    config = StackTakerConfig(silent_s=1.0)
    taker = StackTaker(tmp_path, lambda t, items: sent.append(items), config, dump)
    _beacon_of(tmp_path, os.getpid(), written_s_ago=0.2)  # beats: alive and well
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, check=True)  # fmt: skip
    _beacon_of(tmp_path, int(done.stdout), written_s_ago=60)  # its process is gone
    (tmp_path / "junk.beat").write_bytes(b"not a beacon")
    assert taker.scan() == 0 and dumps == [] and sent == []
    assert taker.scan() == 0 and taker.counters.unreadable == 1  # counted once
    gone = _beacon_of(tmp_path, int(done.stdout), written_s_ago=7200)  # left long ago
    assert taker.scan() == 0 and not gone.exists() and taker.counters.forgotten == 1


def test_a_dump_that_fails_is_counted_and_not_sent(
    tmp_path: Path, stopped: subprocess.Popen[bytes]
) -> None:
    sent: list[object] = []
    taker = StackTaker(
        tmp_path,
        lambda t, items: sent.append(items),
        StackTakerConfig(silent_s=0.2),
        dump=lambda pid, t: ([], "py-spy failed"),
    )
    _beacon_of(tmp_path, stopped.pid, written_s_ago=0.3)  # silent, says its file
    assert taker.scan() == 0 and sent == [] and taker.counters.dumps_failed == 1
