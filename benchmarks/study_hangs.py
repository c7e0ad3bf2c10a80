"""Hang alerts at the product's defaults: how soon a stopped rank is alerted, and that
healthy jobs pausing for announced checkpoints raise nothing.

Deploys what a user deploys: one broker (the project's ``scripts/kafka.sh``), one
``rankwatch hang worker`` with no flags beyond where its broker and store are (its
defaults, or ``--worker-args`` to try others), and the real gloo workload (DP 2 x PP 2,
4 ranks on CPU) with the hooks at their defaults (``--heartbeat`` to try another
period). Cases, one job each:

- ``stop``: rank 1 is stopped with SIGSTOP once every rank reported step 8 (past the
  warm-up bound), then let go on after the alert. Right: exactly one firing alert naming
  rank 1 the culprit, resolved after SIGCONT; the delay from the stop to the firing
  alert's ``ts_ns`` is recorded.
- ``checkpoint``: a 30-step job whose rank 0 pauses 15 s after steps 14 and 29,
  each pause announced as a ``checkpoint-save`` phase (bound 60 s), its peers waiting
  for it. Right: no alert of the job.
- ``pause``: the same pauses unannounced. Right: one alert per pause, on rank 0 (a job
  silenced longer than the step bound with no word of why is what a hang looks like).

``--busy`` keeps one core spinning meanwhile. ``--parallel 2`` runs two jobs at once
(the worker watches both, as it watches every job of a cluster).

    .venv/bin/python benchmarks/study_hangs.py --set defaults --runs 10 --cases stop
    .venv/bin/python benchmarks/study_hangs.py --set defaults --runs 10 \\
        --cases checkpoint pause --parallel 2 [--busy]

Each run's verdict is appended to ``var/study-hangs/<set>/runs.jsonl``; the summary of
every run of the set is printed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# the dev broker is a test helper (tests/support), not in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.devbroker import DevBroker, create_topics

from rankwatch.schemas.codec import decode
from rankwatch.workload.config import WorkloadConfig
from rankwatch.workload.launch import _spawn, free_port, run_job

ROOT = Path("var/study-hangs")
NS = 1_000_000_000
STOPPED = 1
PAUSE = {"pause_every": 15, "pause_s": 15.0, "pause_rank": 0, "pause_bound_s": 60.0}
KINDS = ("ops", "heartbeats", "stacks", "alerts", "dead-letters")


def consume(
    bootstrap: str, topic: str, until: Callable[[list[dict[str, Any]]], bool], timeout_s: float
) -> list[bytes]:
    """Messages of ``topic`` from its start until ``until(decoded)`` or the timeout."""
    import orjson
    from aiokafka import AIOKafkaConsumer

    async def run() -> list[bytes]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
        )
        await consumer.start()
        values: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                got = await consumer.getmany(timeout_ms=300)
                values += [m.value for batch in got.values() for m in batch]
                if until([orjson.loads(v) for v in values]):
                    break
        finally:
            await consumer.stop()
        return values

    return asyncio.run(run())


class Study:
    def __init__(self, args: argparse.Namespace, bootstrap: str, directory: Path) -> None:
        self.args, self.bootstrap, self.dir = args, bootstrap, directory
        self.prefix = f"study.hang.{int(time.time())}"
        asyncio.run(create_topics(bootstrap, [f"{self.prefix}.{k}" for k in KINDS], 1))
        self.worker = self._start_worker()

    def _start_worker(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "RANKWATCH_TOPIC_PREFIX": self.prefix}
        cmd = [sys.executable, "-m", "rankwatch", "hang", "worker", "--kafka", self.bootstrap]
        cmd += ["--clickhouse", f"chdb://{self.dir / 'chdb'}", "--offset-reset", "earliest"]
        cmd += self.args.worker_args.split()
        out = (self.dir / "hang-worker.log").open("ab")
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=out)

    def stop(self) -> None:
        self.worker.send_signal(signal.SIGTERM)
        try:
            self.worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.worker.kill()

    def workload(self, job: str, **given: Any) -> WorkloadConfig:
        cfg = {"dp": 2, "pp": 2, "microbatches": 2, "kafka": self.bootstrap}
        return WorkloadConfig(**{**cfg, "topic_prefix": self.prefix, "job": job, **given})

    def alerts(
        self, until: Callable[[list[dict[str, Any]]], bool], timeout_s: float
    ) -> list[dict[str, Any]]:
        values = consume(self.bootstrap, f"{self.prefix}.alerts", until, timeout_s)
        return [decode("alerts", v) for v in values]

    # -- cases ---------------------------------------------------------------------

    def stop_case(self, job: str) -> dict[str, Any]:
        cfg = self.workload(job, steps=3000, slow_rank=STOPPED, slow_matmuls=60)
        (self.dir / job).mkdir(parents=True, exist_ok=True)
        proc = _spawn(cfg, free_port(), self.dir / job)
        try:
            pids = self._ranks_at(job, cfg.world, step=8)
            stopped_ns = time.time_ns()
            os.kill(pids[STOPPED], signal.SIGSTOP)
            firing = self.alerts(_of(job, "firing"), timeout_s=120)
            os.kill(pids[STOPPED], signal.SIGCONT)
            done = self.alerts(_of(job, "resolved"), timeout_s=60)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        fired = [a for a in done if a["job"] == job and a["state"] == "firing"]
        resolved = [a for a in done if a["job"] == job and a["state"] == "resolved"]
        delay = (fired[0]["ts_ns"] - stopped_ns) / NS if fired else None
        right = (
            len(fired) == 1
            and fired[0]["evidence"]["culprits"] == [STOPPED]
            and [a["alert_id"] for a in resolved] == [fired[0]["alert_id"]]
        )
        del firing
        return {"delay_s": delay, "right": right, "alerts": _summaries(done, job)}

    def pause_case(self, job: str, announced: bool) -> dict[str, Any]:
        phase = {} if announced else {"pause_phase": ""}
        cfg = self.workload(job, steps=30, **PAUSE, **phase)
        run_job(cfg, self.dir / job, timeout_s=600)
        time.sleep(15)  # past the bound a stall at the job's end would need
        alerts = [a for a in self.alerts(lambda a: False, timeout_s=3) if a["job"] == job]
        fired = [a for a in alerts if a["state"] == "firing"]
        if announced:
            right = alerts == []
        else:
            right = len(fired) == 2 and all(a["evidence"]["culprits"] == [0] for a in fired)
        return {"right": right, "alerts": _summaries(alerts, job)}

    def _ranks_at(self, job: str, n: int, step: int) -> dict[int, int]:
        pids: dict[int, int] = {}

        def ready(beats: list[dict[str, Any]]) -> bool:
            for b in beats:
                if b["job"] == job and b["step"] >= step:
                    pids[b["rank"]] = b["pid"]
            return len(pids) == n

        consume(self.bootstrap, f"{self.prefix}.heartbeats", ready, timeout_s=180)
        if len(pids) != n:
            raise RuntimeError(f"{job}: ranks past step {step}: {sorted(pids)}")
        return pids

    def one(self, case: str, run: int) -> dict[str, Any]:
        job = f"{case}-{run}"
        started = time.time()
        if case == "stop":
            result = self.stop_case(job)
        else:
            result = self.pause_case(job, announced=case == "checkpoint")
        return {"case": case, "run": run, "busy": self.args.busy, "job": job,
                "started": started, "load": os.getloadavg()[0], **result}  # fmt: skip


def _of(job: str, state: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda alerts: any(a["job"] == job and a["state"] == state for a in alerts)


def _summaries(alerts: list[dict[str, Any]], job: str) -> list[str]:
    return [f"{a['state']}: {a['summary']}" for a in alerts if a["job"] == job]


def summary(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | busy | runs | right | delay (s): median, max |", "|---|---|---|---|---|"]
    for case in ("stop", "checkpoint", "pause"):
        for busy in (False, True):
            mine = [r for r in rows if r["case"] == case and r["busy"] == busy]
            if not mine:
                continue
            delays = [r["delay_s"] for r in mine if r.get("delay_s") is not None]
            spread = f"{statistics.median(delays):.2f}, {max(delays):.2f}" if delays else "-"
            right = sum(r["right"] for r in mine)
            lines.append(f"| {case} | {busy} | {len(mine)} | {right} | {spread} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", required=True, help="where the runs go (var/study-hangs/SET)")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--first-run", type=int, default=0)
    p.add_argument("--cases", nargs="+", default=["stop", "checkpoint", "pause"])
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--busy", action="store_true", help="one core spinning meanwhile")
    p.add_argument("--heartbeat", type=float, help="RANKWATCH_HEARTBEAT_S for the ranks")
    p.add_argument("--worker-args", default="", help="more flags for the hang worker")
    p.add_argument("--kafka", help="a running broker (default: start one)")
    args = p.parse_args()
    directory = (ROOT / args.set).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if args.heartbeat:
        os.environ["RANKWATCH_HEARTBEAT_S"] = str(args.heartbeat)
    broker = None if args.kafka else DevBroker(directory / "broker")
    bootstrap = args.kafka or broker.start()  # type: ignore[union-attr]
    spinner = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if args.busy else None
    study = Study(args, bootstrap, directory)
    jobs = [(c, r) for r in range(args.first_run, args.first_run + args.runs) for c in args.cases]
    try:
        with ThreadPoolExecutor(args.parallel) as pool, (directory / "runs.jsonl").open("a") as f:
            for row in pool.map(lambda cr: study.one(*cr), jobs):
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row) + "\n")
                f.flush()
    finally:
        study.stop()
        if spinner:
            spinner.kill()
        if broker:
            broker.stop()
    rows = [json.loads(line) for line in (directory / "runs.jsonl").read_text().splitlines()]
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
