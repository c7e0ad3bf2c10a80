"""Faults injected into real processes: six stand-in ranks (``minder_rank_proc.py``),
each in its own network namespace and treated as a machine, sampled by the real agent
(``ProcessSampler``: /proc/<pid> and its namespace's /proc/<pid>/net/dev) and fed to
Minder's online monitor. In turn, one rank is CPU-starved (a cgroup v1 CPU quota of
0.1% of a CPU, a tenth of what a rank needs), has its network slowed (a tbf rate limit
on its namespace's link: this kernel has no netem), and leaks memory; between faults
and before the first one, the job is healthy. A second run has no fault at all.

Minder must name the right rank for each fault and raise nothing for the others, during
the healthy phase or in the healthy run. Needs root, iproute2 and a cgroup v1 cpu
controller; skipped where they are missing (the reason says which).

The box these tests run on is shared (two cores, other tests, other users), and the
ranks are machines only by convention: left to the scheduler, one rank shares a core
with a busy neighbour and really does use more CPU, wait longer and get preempted more
than its peers, which Minder rightly reports. So the lab gives the ranks alike
machines: they run in one cgroup that outweighs everything else on the box
(``cpu.shares``), so each gets the little CPU it asks for whatever else runs; the
CPU-starved rank is moved into a child of that cgroup with the quota. Time is read
from the samples and alerts (their ``ts_ns``), never from a count of sleeps: a tick
the harness could not take on time is skipped, and which fault an alert belongs to is
decided by when the fault was injected.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.minderlab import LAB_SHARES, namespaces, sink, slow_link

from rankwatch.agent import Agent, AgentConfig, ProcessSampler
from rankwatch.schemas.codec import decode
from rankwatch.streams.minder.online import FUSED_ROW, NS, JobMonitor, OnlineConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RANK = Path(__file__).with_name("minder_rank_proc.py")
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
RANKS = 6
STARVE_PERIOD_US, STARVE_QUOTA_US = 1_000_000, 1_000
"""0.1% of a CPU (the smallest quota the kernel takes, over its longest period): a
rank needs about 1%, so the fault bites on a CPU ten times faster than this one."""
# (start s, end s, rank, fault)
FAULTS = ((30, 55, 1, "cpu"), (75, 100, 3, "network"), (120, 145, 4, "memory"))
END_S = 160
HEALTHY_RUN_S = 90
GRACE_S = 10
"""An alert of a fault may come up to this long after the fault ended (continuity
needs three windows of evidence)."""


def missing_privileges() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, cgroups)"
    if not (shutil.which("ip") and shutil.which("tc")):
        return "needs iproute2 (ip, tc)"
    if not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
        return "needs a cgroup v1 cpu controller at /sys/fs/cgroup/cpu"
    return None


@contextmanager
def cpu_cgroups(tag: str) -> Iterator[Path]:
    """The ranks' cgroup (outweighing the rest of the box) and its ``starved`` child."""
    lab = CPU_CGROUP / f"rankwatch-minder-{tag}"
    starved = lab / "starved"
    lab.mkdir()
    try:
        (lab / "cpu.shares").write_text(str(LAB_SHARES))
        starved.mkdir()
        (starved / "cpu.cfs_period_us").write_text(str(STARVE_PERIOD_US))
        (starved / "cpu.cfs_quota_us").write_text(str(STARVE_QUOTA_US))
        yield lab
    finally:
        for group in (starved, lab):
            if group.exists():
                group.rmdir()  # empty by now: the caller has reaped the ranks


@contextmanager
def lab(tag: str) -> Iterator[tuple[list[subprocess.Popen[bytes]], Path]]:
    """Namespaces, links, a sink server, the CPU cgroups and the rank processes."""
    procs: list[subprocess.Popen[bytes]] = []
    with sink() as port, namespaces(tag, RANKS) as net, cpu_cgroups(tag) as cgroup:
        try:
            for i in range(RANKS):
                cmd = ["ip", "netns", "exec", f"rw{tag}{i}", sys.executable, str(RANK)]
                procs.append(subprocess.Popen([*cmd, f"{net}.{i}.1", str(port)]))
                (cgroup / "cgroup.procs").write_text(str(procs[-1].pid))
            yield procs, cgroup
        finally:
            stop(procs)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def inject(fault: str, on: bool, tag: str, rank: int, pid: int, cgroup: Path) -> None:
    if fault == "cpu":
        target = cgroup / "starved" if on else cgroup
        (target / "cgroup.procs").write_text(str(pid))
    elif fault == "network":
        slow_link(tag, rank, on)
    else:
        os.kill(pid, signal.SIGUSR1 if on else signal.SIGUSR2)


class MonitorSink:
    """The agent's messages, decoded as the worker decodes them, into the monitor."""

    def __init__(self, monitor: JobMonitor) -> None:
        self.monitor = monitor

    def put(self, key: bytes, value: bytes) -> None:
        msg = decode("metrics", value)
        self.monitor.add(msg["host"], msg["ts_ns"], msg["metrics"])


def throttled_s(cgroup: Path) -> float:
    stat = dict(line.split()[:2] for line in (cgroup / "cpu.stat").read_text().splitlines())
    return int(stat["throttled_time"]) / NS


def ticks(end_s: int) -> Iterator[int]:
    """Whole seconds since the start, on time; a tick the harness could not take on
    time is skipped, not replayed (two samples a moment apart would make noisy rates)."""
    start = time.monotonic()
    due = 0
    while due < end_s:
        time.sleep(max(0.0, start + due - time.monotonic()))
        yield due
        due = max(due + 1, int(time.monotonic() - start) + 1)


@dataclass
class LabRun:
    alerts: list[dict[str, Any]] = field(default_factory=list)
    injected_ns: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per fault, when it was switched on and off (wall clock, as the samples)."""
    alive: bool = True
    throttled_s: float = 0.0
    """How long the starved cgroup was held back by its quota."""
    fused: list[tuple[int, str, float]] = field(default_factory=list)
    """(window end ns, host, fused score) of every scored window (residual scoring)."""

    def firing(self) -> list[dict[str, Any]]:
        return [a for a in self.alerts if a["state"] == "firing"]

    def healthy_peak(self, faults: tuple[tuple[int, int, int, str], ...]) -> float:
        """The highest fused score of a rank no fault was injected into: the margin to
        the threshold that the healthy ranks kept."""
        faulted = {f"rank{rank}" for _, _, rank, _ in faults}
        return max(
            (score for _, host, score in self.fused if host not in faulted),
            default=float("nan"),
        )

    def summary(self, start_ns: int) -> list[tuple[float, str, str, str]]:
        return [
            (
                round((a["ts_ns"] - start_ns) / NS, 1),
                a["state"],
                a["evidence"]["host"],
                a["evidence"]["metric"],
            )
            for a in self.alerts
        ]


def run_lab(faults: tuple[tuple[int, int, int, str], ...], end_s: int) -> tuple[LabRun, int]:
    """Run the ranks for ``end_s`` seconds, injecting ``faults``; sample every second."""
    tag = uuid.uuid4().hex[:4]
    monitor = JobMonitor("lab", OnlineConfig(window_s=5, stride_s=5, continuity=3, resolve_after=2))
    run = LabRun()
    switches = sorted(
        (s, on, rank, fault) for b, e, rank, fault in faults for s, on in ((b, True), (e, False))
    )
    start_ns = time.time_ns()
    with lab(tag) as (procs, cgroup):
        sink = MonitorSink(monitor)
        agents = [
            Agent(AgentConfig(job="lab", host=f"rank{i}"), [ProcessSampler(p.pid)], sink)
            for i, p in enumerate(procs)
        ]
        for second in ticks(end_s):
            while switches and switches[0][0] <= second:
                _, on, rank, fault = switches.pop(0)
                inject(fault, on, tag, rank, procs[rank].pid, cgroup)
                was = run.injected_ns.get(fault, (0, 0))
                run.injected_ns[fault] = (time.time_ns(), 0) if on else (was[0], time.time_ns())
            for agent in agents:
                agent.tick(time.time_ns())  # each sample stamped when it was taken
            out = monitor.evaluate()
            run.alerts += out.alerts
            run.fused += [
                (r["time"], r["host"], r["score"])
                for r in out.rows.get("machine_scores", [])
                if r["metric"] == FUSED_ROW
            ]
        run.alive = all(p.poll() is None for p in procs)
        run.throttled_s = throttled_s(cgroup / "starved")
    return run, start_ns


def record(
    artifacts_dir: Path,
    run: LabRun,
    start_ns: int,
    faults: tuple[tuple[int, int, int, str], ...] = (),
) -> list[tuple[float, str, str, str]]:
    summary = run.summary(start_ns)
    injected = {f: [(t - start_ns) / NS for t in ts] for f, ts in run.injected_ns.items()}
    peak = run.healthy_peak(faults)
    (artifacts_dir / "events.json").write_text(
        json.dumps({"alerts": summary, "injected_s": injected, "healthy_peak": peak}, indent=1)
    )
    print("minder fault injection:", summary, injected, f"healthy peak fused score {peak:.2f}")
    return summary


def test_injected_faults_name_the_right_process(artifacts_dir: Path) -> None:
    why = missing_privileges()
    if why:
        pytest.skip(why)
    run, start_ns = run_lab(FAULTS, END_S)
    summary = record(artifacts_dir, run, start_ns, FAULTS)
    assert run.alive, "a rank died"
    cpu_s = FAULTS[0][1] - FAULTS[0][0]
    assert run.throttled_s > cpu_s / 2, f"the CPU quota held rank 1 back {run.throttled_s:.1f} s"
    firing = run.firing()
    first_fault_ns = min(on for on, _ in run.injected_ns.values())
    assert not [a for a in firing if a["ts_ns"] < first_fault_ns], summary
    for _, _, rank, fault in FAULTS:
        on, off = run.injected_ns[fault]
        mine = [a for a in firing if on <= a["ts_ns"] <= off + GRACE_S * NS]
        assert [a["evidence"]["host"] for a in mine] == [f"rank{rank}"], (fault, summary)
    assert len(firing) == len(FAULTS), summary


def test_healthy_ranks_raise_nothing(artifacts_dir: Path) -> None:
    why = missing_privileges()
    if why:
        pytest.skip(why)
    run, start_ns = run_lab((), HEALTHY_RUN_S)
    summary = record(artifacts_dir, run, start_ns)
    assert run.alive, "a rank died"
    assert run.alerts == [], summary
