"""A sample job in ClickHouse, to try the boards and the report without a cluster.

The step tables are filled the real way: a generated PP x DP trace (a straggling worker,
a slow last stage) replayed as the hooks would send it, through the worker's pipeline
and what-if analyser, with one rank's last batch held back so the last step closes as
partial; the raw ops go in through :meth:`Store.insert_ops`. Hangs, stacks, Minder
scores, faulty machines and alerts have no producer yet, so a few realistic rows are
written for them directly, shaped like what the detectors will write. Times are laid
just before ``now_ns`` so they stay inside the tables' TTL.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rankwatch.sim.tracegen import demo_config, generate_trace
from rankwatch.streams.analyser import WhatIfAnalyser
from rankwatch.streams.embedded import run_embedded
from rankwatch.streams.pipeline import Pipeline
from rankwatch.streams.replay import RANKS_PER_HOST, replay_batches
from rankwatch.streams.sink import TableSink
from rankwatch.streams.store import Store

HANG_OPEN = "hang-open-1"
HANG_PAST = "hang-past-1"
SPAN_S = 600
"""The sample's rows lie in the ten minutes before now."""

_STACK_BASE = "train.py:<module>;train.py:main;trainer.py:train_step;schedules.py:forward_backward"
STACKS = (
    (f"{_STACK_BASE};p2p.py:recv_forward;distributed_c10d.py:recv", 0, "0-5,7-15"),
    (f"{_STACK_BASE};model.py:forward;attention.py:forward;cuda:synchronize", 0, "6"),
    ("threading.py:_bootstrap;hooks.py:publisher_loop;queue.py:get", 0, "0-15"),
)
"""(folded stack, native, ranks): rank 6 is stuck in a kernel, the rest wait on it."""


@dataclass(frozen=True)
class Sample:
    job: str
    steps: int
    partial_steps: int
    world_size: int
    first_step: int
    last_step: int


def fill(store: Store, job: str, now_ns: int, seed: int = 0) -> Sample:
    """Write the sample job ``job`` into a migrated store; returns what was written."""
    trace, meta = generate_trace(demo_config(seed=seed))
    origin = now_ns - SPAN_S * 10**9
    batches = list(replay_batches(trace, meta, job, origin_ns=origin))
    last = max(int(b.batch.step.max()) for b in batches)
    held = next(b for b in batches if b.batch.rank == 0 and int(b.batch.step.max()) == last)
    sent = [b for b in batches if b is not held]
    run_embedded(sent, Pipeline(analyser=WhatIfAnalyser()), TableSink(store))
    store.insert_ops([b.batch for b in sent])
    world = meta.dp_size * meta.pp_size
    hosts = [f"host-{i}" for i in range((world + RANKS_PER_HOST - 1) // RANKS_PER_HOST)]
    at = datetime.fromtimestamp(origin / 1e9, tz=UTC)
    store.insert("jobs", [_job_row(job, meta.dp_size, meta.pp_size, hosts, at, now_ns)])
    _fill_hangs(store, job, at, now_ns)
    _fill_machines(store, job, hosts, at, now_ns)
    _fill_alerts(store, job, at)
    steps = sorted({int(s) for s in trace.step.tolist()})
    return Sample(job, len(steps), 1, world, steps[0], steps[-1])


def _job_row(
    job: str, dp: int, pp: int, hosts: list[str], at: datetime, version: int
) -> dict[str, object]:
    return {
        "job": job,
        "dp_size": dp,
        "pp_size": pp,
        "tp_size": 1,
        "cp_size": 1,
        "vpp_size": 1,
        "world_size": dp * pp,
        "schedule": "1f1b",
        "hosts": hosts,
        "first_seen": at,
        "last_seen": at + timedelta(seconds=SPAN_S),
        "version": version,
    }


def _fill_hangs(store: Store, job: str, at: datetime, version: int) -> None:
    base = {"job": job, "culprit_hosts": ["host-0"], "silent_ranks": [], "version": version}
    open_ = {
        **base,
        "episode_id": HANG_OPEN,
        "time": at + timedelta(seconds=500),
        "last_progress": at + timedelta(seconds=380),
        "resolved_at": None,
        "step": 112,
        "culprit_ranks": [6],
        "waiting_ranks": [r for r in range(16) if r != 6],
        "culprit_where": "cuda:synchronize in attention.py:forward",
        "summary": "rank 6 stopped in a kernel; 15 ranks wait in recv from it",
    }
    past = {
        **base,
        "episode_id": HANG_PAST,
        "time": at + timedelta(seconds=60),
        "last_progress": at + timedelta(seconds=10),
        "resolved_at": at + timedelta(seconds=140),
        "step": 104,
        "culprit_ranks": [3],
        "waiting_ranks": [0, 1, 2],
        "silent_ranks": [3],
        "culprit_where": "gc",
        "summary": "rank 3 paused in garbage collection; heartbeats stopped for 50 s",
    }
    store.insert("hangs", [open_, past])
    rows = []
    for episode in (HANG_OPEN, HANG_PAST):
        for stack, native, ranks_text in STACKS:
            ranks = _ranks(ranks_text)
            rows.append(
                {
                    "job": job,
                    "episode_id": episode,
                    "time": at + timedelta(seconds=500),
                    "stack": stack,
                    "native": native,
                    "ranks": ranks,
                    "ranks_text": ranks_text,
                    "absent_ranks_text": _text(sorted(set(range(16)) - set(ranks))),
                    "n_ranks": len(ranks),
                    "version": version,
                }
            )
    store.insert("stacks", rows)


def _fill_machines(store: Store, job: str, hosts: list[str], at: datetime, version: int) -> None:
    rows = []
    for minute in range(10):
        for metric in ("cpu_util", "pcie_bw"):
            for i, host in enumerate(hosts):
                bad = i == 1 and metric == "pcie_bw" and minute >= 5
                rows.append(
                    {
                        "job": job,
                        "host": host,
                        "time": at + timedelta(minutes=minute),
                        "metric": metric,
                        "score": 3.5 + 0.1 * minute if bad else 0.4 + 0.05 * i,
                        "candidate": int(bad),
                    }
                )
    store.insert("machine_scores", rows)
    fault = {
        "job": job,
        "host": hosts[1 % len(hosts)],
        "metric": "pcie_bw",
        "score": 4.2,
        "version": version,
    }
    store.insert(
        "machine_faults",
        [
            {
                **fault,
                "time": at + timedelta(minutes=8),
                "first_seen": at + timedelta(minutes=5),
                "alert_id": "faulty-1",
                "resolved_at": None,
            },
            {
                **fault,
                "time": at + timedelta(minutes=2),
                "first_seen": at + timedelta(minutes=1),
                "alert_id": "faulty-0",
                "resolved_at": at + timedelta(minutes=3),
            },
        ],
    )


def _fill_alerts(store: Store, job: str, at: datetime) -> None:
    def alert(
        alert_id: str, kind: str, state: str, severity: str, seconds: int, summary: str
    ) -> dict[str, object]:
        return {
            "job": job,
            "alert_id": alert_id,
            "kind": kind,
            "state": state,
            "severity": severity,
            "time": at + timedelta(seconds=seconds),
            "summary": summary,
            "evidence": '{"source": "sample"}',
        }

    store.insert(
        "alerts",
        [
            alert("straggler-1", "straggler", "firing", "warning", 30, "worker 2,1 S_w 1.19"),
            alert(HANG_PAST, "hang", "firing", "critical", 60, "rank 3 stopped (gc)"),
            alert(HANG_PAST, "hang", "resolved", "critical", 140, "job progresses again"),
            alert(HANG_OPEN, "hang", "firing", "critical", 500, "rank 6 stopped in a kernel"),
            alert("faulty-1", "faulty_machine", "firing", "warning", 480, "host-1 pcie_bw"),
        ],
    )


def _ranks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _text(ranks: list[int]) -> str:
    """Ranks as ranges: ``0-5,7``."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(parts)
