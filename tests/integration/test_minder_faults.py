"""Faults injected into real processes: six stand-in ranks (``minder_rank_proc.py``),
each in its own network namespace and treated as a machine, sampled by the real agent
(``ProcessSampler``: /proc/<pid> and its namespace's /proc/<pid>/net/dev) and fed to
Minder's online monitor. In turn, one rank is CPU-starved (cgroup v1 CPU quota of 1%),
has its network slowed (a tbf rate limit on its namespace's link: this kernel has no
netem), and leaks memory; between faults and before the first one, the job is healthy.

Minder must name the right rank for each fault and raise nothing for the others or
during the healthy phase. Needs root, iproute2 and a cgroup v1 cpu controller; skipped
where they are missing (the reason says which).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rankwatch.hooks.agent import Agent, AgentConfig, ProcessSampler
from rankwatch.schemas.codec import decode
from rankwatch.streams.minder.online import JobMonitor, OnlineConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RANK = Path(__file__).with_name("minder_rank_proc.py")
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
RANKS = 6
HEALTHY_S = 30
# (start s, end s, rank, fault)
FAULTS = ((30, 55, 1, "cpu"), (75, 100, 3, "network"), (120, 145, 4, "memory"))
END_S = 160


def missing_privileges() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, cgroups)"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs iproute2 (ip, tc)"
    if not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
        return "needs a cgroup v1 cpu controller at /sys/fs/cgroup/cpu"
    return None


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


class Drain(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while self.request.recv(65536):
            pass


@contextmanager
def lab(tag: str) -> Iterator[tuple[list[subprocess.Popen[bytes]], Path]]:
    """Namespaces, links, a sink server, a CPU cgroup and the rank processes."""
    server = socketserver.ThreadingTCPServer(("0.0.0.0", 0), Drain)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    cgroup = CPU_CGROUP / f"rankwatch-minder-{tag}"
    net = f"10.{200 + int(tag, 16) % 50}"  # two runs at once must not share subnets
    procs: list[subprocess.Popen[bytes]] = []
    made: list[int] = []
    try:
        for i in range(RANKS):
            ns, host, peer = f"rw{tag}{i}", f"rw{tag}{i}h", f"rw{tag}{i}c"
            sh("ip", "netns", "add", ns)
            made.append(i)
            sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "addr", "add", f"{net}.{i}.1/24", "dev", host)
            sh("ip", "link", "set", host, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.{i}.2/24", "dev", peer)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", peer, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        cgroup.mkdir()
        (cgroup / "cpu.cfs_period_us").write_text("100000")
        (cgroup / "cpu.cfs_quota_us").write_text("1000")
        for i in range(RANKS):
            cmd = ["ip", "netns", "exec", f"rw{tag}{i}", sys.executable, str(RANK)]
            procs.append(subprocess.Popen([*cmd, f"{net}.{i}.1", str(port)]))
        yield procs, cgroup
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if cgroup.exists():
            cgroup.rmdir()
        for i in made:
            subprocess.run(["ip", "link", "del", f"rw{tag}{i}h"], check=False, capture_output=True)
            subprocess.run(["ip", "netns", "del", f"rw{tag}{i}"], check=False, capture_output=True)
        server.shutdown()
        server.server_close()


def inject(fault: str, on: bool, tag: str, rank: int, pid: int, cgroup: Path) -> None:
    if fault == "cpu":
        target = cgroup if on else CPU_CGROUP
        (target / "cgroup.procs").write_text(str(pid))
    elif fault == "network":
        ns, dev = f"rw{tag}{rank}", f"rw{tag}{rank}c"
        if on:
            tbf = ["tbf", "rate", "64kbit", "burst", "16kbit", "latency", "400ms"]
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", *tbf)
        else:
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root")
    else:
        os.kill(pid, signal.SIGUSR1 if on else signal.SIGUSR2)


class MonitorSink:
    """The agent's messages, decoded as the worker decodes them, into the monitor."""

    def __init__(self, monitor: JobMonitor) -> None:
        self.monitor = monitor

    def put(self, key: bytes, value: bytes) -> None:
        msg = decode("metrics", value)
        self.monitor.add(msg["host"], msg["ts_ns"], msg["metrics"])


def test_injected_faults_name_the_right_process(artifacts_dir: Path) -> None:
    why = missing_privileges()
    if why:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:4]
    config = OnlineConfig(window_s=5, stride_s=5, continuity=3, resolve_after=2)
    monitor = JobMonitor("lab", config)
    events: list[dict[str, Any]] = []
    with lab(tag) as (procs, cgroup):
        sink = MonitorSink(monitor)
        agents = [
            Agent(AgentConfig(job="lab", host=f"rank{i}"), [ProcessSampler(p.pid)], sink)
            for i, p in enumerate(procs)
        ]
        start = time.monotonic()
        for second in range(END_S):
            for begin, end, rank, fault in FAULTS:
                if second in (begin, end):
                    inject(fault, second == begin, tag, rank, procs[rank].pid, cgroup)
            now = time.time_ns()
            for agent in agents:
                agent.tick(now)
            for alert in monitor.evaluate().alerts:
                events.append({"second": second, **alert})
            time.sleep(max(0.0, start + second + 1 - time.monotonic()))
        alive = [p.poll() is None for p in procs]
    summary = [
        (e["second"], e["state"], e["evidence"]["host"], e["evidence"]["metric"]) for e in events
    ]
    (artifacts_dir / "events.json").write_text(json.dumps(summary, indent=1))
    print("minder fault injection:", summary)
    assert all(alive), "a rank died"
    firing = [e for e in events if e["state"] == "firing"]
    assert not [e for e in firing if e["second"] < HEALTHY_S], summary
    for begin, end, rank, fault in FAULTS:
        mine = [e for e in firing if begin <= e["second"] <= end + 10]
        assert [e["evidence"]["host"] for e in mine] == [f"rank{rank}"], (fault, summary)
    assert len(firing) == len(FAULTS), summary
