"""Minder's injected-fault lab as the docs deploy it: hosts, one agent per host, the real
worker at its defaults.

Each host is a network namespace and a cgroup (cpu, cpuacct, memory) holding two
stand-in ranks (``tests/integration/minder_rank_proc.py``); one ``rankwatch agent
--cgroup`` per host runs inside the host's network namespace (``nsenter``), so it sees
that host's CPU, throttling, memory and network and nothing of the others. One ``rankwatch minder
worker`` with no flags beyond where its broker and store are (``--worker-args`` to try
others) reads ``<prefix>.metrics``; its alerts are read back from ``<prefix>.alerts``.

Plumbing that is the lab's, not the product's: the broker advertises a loopback address
the namespaces cannot reach, so each agent writes its messages to stdout
(``--stdout``) and the harness puts them on the metrics topic unchanged, keyed by job as
the agent's own Kafka transport keys them.

Fault runs: after a warm-up, host 1's CPU is held to 0.1% of a CPU (a CFS quota), then
host 3's link is slowed to 64 kbit/s, then one rank of host 4 leaks 16 MiB/s; each for
``--hold`` seconds, ``--stagger`` seconds apart. Right: each fault named on its host
within ``--within`` seconds of its start (the delay is recorded), and no firing alert
on any host outside its own fault (plus ``--grace``). Healthy runs: the same hosts with
no fault; right when nothing fires.

    scripts/kafka.sh start
    .venv/bin/python benchmarks/study_minder_lab.py --set NAME --runs 1 [--healthy]
        [--worker-args "--window 20 --continuity 3"]

Needs root, iproute2 (ip, tc), nsenter and cgroup v1 cpu, cpuacct and memory controllers. Each
run's verdict is appended to ``var/study-minder-lab/<set>/runs.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.minderlab import LAB_SHARES, namespaces, sink, slow_link

from rankwatch.agent import KafkaTransport, Outbox
from rankwatch.schemas.codec import decode

REPO = Path(__file__).resolve().parents[1]
RANK = REPO / "tests" / "integration" / "minder_rank_proc.py"
ROOT = REPO / "var" / "study-minder-lab"
CGROUP = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "cpuacct", "memory")
NS = 1_000_000_000
FAULTS = ((1, "cpu"), (3, "network"), (4, "memory"))
"""(host, fault), in the order they are switched on."""


@contextmanager
def host_cgroups(tag: str, hosts: int) -> Iterator[str]:
    """``rankwatch-lab-<tag>/host<i>`` in each controller; the parent outweighs the box."""
    parent = f"rankwatch-lab-{tag}"
    made: list[Path] = []
    try:
        for c in CONTROLLERS:
            (CGROUP / c / parent).mkdir()
            made.append(CGROUP / c / parent)
            for i in range(hosts):
                (CGROUP / c / parent / f"host{i}").mkdir()
                made.append(CGROUP / c / parent / f"host{i}")
        (CGROUP / "cpu" / parent / "cpu.shares").write_text(str(LAB_SHARES))
        yield parent
    finally:
        for d in reversed(made):
            d.rmdir()


def born_in(procs_files: list[Path], cmd: list[str]) -> list[str]:
    """``cmd``, started in the host's cgroups as a container's processes start in theirs
    (memory is charged where it is allocated): a shell joins them, then execs it."""
    join = "; ".join(f"echo $$ > {shlex.quote(str(f))}" for f in procs_files)
    return ["sh", "-c", f'{join}; exec "$@"', "sh", *cmd]


def starve(parent: str, host: int, on: bool) -> None:
    """0.1% of a CPU (1 ms per 1 s period) for the host's cgroup, or no quota."""
    d = CGROUP / "cpu" / parent / f"host{host}"
    if on:
        (d / "cpu.cfs_period_us").write_text("1000000")
        (d / "cpu.cfs_quota_us").write_text("1000")
    else:
        (d / "cpu.cfs_quota_us").write_text("-1")


def forward(stream: IO[bytes], box: Outbox) -> None:
    """The agent's JSON lines onto the metrics topic, keyed by job."""
    for line in stream:
        if line.startswith(b"{"):
            box.put(json.loads(line)["job"].encode(), line.rstrip(b"\n"))


async def read_alerts(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    got: list[dict[str, Any]] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=3000)
            if not batch:
                return got
            got += [decode("alerts", r.value) for rs in batch.values() for r in rs]
    finally:
        await consumer.stop()


class Lab:
    def __init__(self, args: argparse.Namespace, directory: Path) -> None:
        self.args, self.directory = args, directory

    def schedule(self) -> list[tuple[float, bool, int, str]]:
        a = self.args
        if a.healthy:
            return []
        out = []
        for n, (host, fault) in enumerate(FAULTS):
            on = a.warmup + n * a.stagger
            out += [(on, True, host, fault), (on + a.hold, False, host, fault)]
        return sorted(out)

    def duration(self) -> float:
        a = self.args
        return a.warmup + (len(FAULTS) - 1) * a.stagger + a.hold + a.grace

    def one(self, run: int) -> dict[str, Any]:
        a = self.args
        tag = uuid.uuid4().hex[:4]
        prefix, job = f"lab{tag}", f"lab-{run}"
        env = {**os.environ, "RANKWATCH_TOPIC_PREFIX": prefix, "RANKWATCH_GROUP": f"{prefix}-g"}
        store = self.directory / f"chdb-{run}-{tag}"
        log = (self.directory / f"worker-{run}-{tag}.log").open("wb")
        worker_cmd = [sys.executable, "-m", "rankwatch", "minder", "worker", "--kafka", a.kafka]
        worker_cmd += ["--clickhouse", f"chdb://{store}", *shlex.split(a.worker_args)]
        switched: dict[str, list[float]] = {}
        procs: list[subprocess.Popen[bytes]] = []
        with ExitStack() as stack:
            port = stack.enter_context(sink())
            net = stack.enter_context(namespaces(tag, a.hosts))
            parent = stack.enter_context(host_cgroups(tag, a.hosts))
            worker = subprocess.Popen(worker_cmd, env=env, stdout=log, stderr=log)
            ranks: dict[int, list[subprocess.Popen[bytes]]] = {}
            try:
                for i in range(a.hosts):
                    inside = ["ip", "netns", "exec", f"rw{tag}{i}"]
                    ranks[i] = []
                    home = [CGROUP / c / parent / f"host{i}" / "cgroup.procs" for c in CONTROLLERS]
                    for _ in range(2):
                        rank = [*inside, sys.executable, str(RANK), f"{net}.{i}.1", str(port)]
                        p = subprocess.Popen(born_in(home, rank))
                        ranks[i].append(p)
                    procs += ranks[i]
                    # nsenter, not ip netns exec: that remounts /sys, hiding the cgroups
                    enter = ["nsenter", f"--net=/var/run/netns/rw{tag}{i}"]
                    agent = [*enter, sys.executable, "-m", "rankwatch", "agent", "--job", job]
                    agent += ["--host", f"host{i}", "--cgroup", f"{parent}/host{i}"]
                    agent += ["--stdout", "--no-gpu", "--no-sweep"]
                    ap = subprocess.Popen(agent, env=env, stdout=subprocess.PIPE)
                    procs.append(ap)
                    box = Outbox(KafkaTransport(a.kafka, f"{prefix}.metrics"), capacity=10_000)
                    assert ap.stdout is not None
                    threading.Thread(target=forward, args=(ap.stdout, box), daemon=True).start()
                start_ns = time.time_ns()
                pending = self.schedule()
                while time.time_ns() - start_ns < self.duration() * NS:
                    now_s = (time.time_ns() - start_ns) / NS
                    while pending and pending[0][0] <= now_s:
                        _, on, host, fault = pending.pop(0)
                        self.switch(fault, on, tag, parent, host, ranks[host][0])
                        switched.setdefault(fault, []).append(
                            round((time.time_ns() - start_ns) / NS, 1)
                        )
                    time.sleep(0.2)
                alive = all(p.poll() is None for p in procs)
            finally:
                for p in procs:
                    p.send_signal(signal.SIGTERM)
                for p in procs:
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                time.sleep(5)  # the worker's last windows
                alerts = asyncio.run(read_alerts(a.kafka, f"{prefix}.alerts"))
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                log.close()
        return self.verdict(run, alerts, start_ns, switched, alive)

    def switch(self, fault: str, on: bool, tag: str, parent: str, host: int, rank: Any) -> None:
        if fault == "cpu":
            starve(parent, host, on)
        elif fault == "network":
            slow_link(tag, host, on)
        else:
            os.kill(rank.pid, signal.SIGUSR1 if on else signal.SIGUSR2)

    def verdict(
        self,
        run: int,
        alerts: list[dict[str, Any]],
        start_ns: int,
        switched: dict[str, list[float]],
        alive: bool,
    ) -> dict[str, Any]:
        a = self.args
        firing = [
            (round((x["ts_ns"] - start_ns) / NS, 1), x["evidence"]["host"], x["evidence"]["metric"])
            for x in alerts
            if x["state"] == "firing"
        ]
        faults = (
            {fault: (host, *switched.get(fault, [])) for host, fault in FAULTS}
            if not a.healthy
            else {}
        )
        delays: dict[str, float | None] = {}
        wrong = []
        for t, host, metric in firing:
            mine = [
                f for f, (h, *onoff) in faults.items()
                if f"host{h}" == host and len(onoff) == 2 and onoff[0] <= t <= onoff[1] + a.grace
            ]  # fmt: skip
            if not mine:
                wrong.append((t, host, metric))
        for fault, (host, *onoff) in faults.items():
            hits = [
                t for t, h, _ in firing if h == f"host{host}" and len(onoff) == 2 and t >= onoff[0]
            ]
            delays[fault] = round(min(hits) - onoff[0], 1) if hits else None
        named = all(d is not None and d <= a.within for d in delays.values())
        return {
            "run": run,
            "kind": "healthy" if a.healthy else "faults",
            "right": alive and named and not wrong,
            "alive": alive,
            "delays_s": delays,
            "wrong": wrong,
            "firing": firing,
            "switched_s": switched,
            "worker_args": a.worker_args,
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", required=True)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--first-run", type=int, default=0)
    p.add_argument("--healthy", action="store_true", help="no fault")
    p.add_argument("--hosts", type=int, default=6)
    p.add_argument("--warmup", type=float, default=90.0, metavar="S")
    p.add_argument("--stagger", type=float, default=75.0, metavar="S")
    p.add_argument("--hold", type=float, default=150.0, metavar="S")
    p.add_argument("--grace", type=float, default=30.0, metavar="S")
    p.add_argument("--within", type=float, default=120.0, metavar="S")
    p.add_argument("--kafka", default="127.0.0.1:9092")
    p.add_argument("--worker-args", default="", help="flags for the Minder worker")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still cleans up
    directory = (ROOT / args.set).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    lab = Lab(args, directory)
    with (directory / "runs.jsonl").open("a") as f:
        for run in range(args.first_run, args.first_run + args.runs):
            row = lab.one(run)
            print(json.dumps(row), flush=True)
            f.write(json.dumps(row) + "\n")
            f.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
