"""A sample job in ClickHouse, to try the boards and the report without a cluster.

The step tables are filled the real way: a generated PP x DP trace (a straggling worker,
a slow last stage) replayed as the hooks would send it, through the worker's pipeline
and what-if analyser, with one rank's last batch held back so the last step closes as
partial, and the pipeline writes the ``jobs`` row (sizes, hosts); the raw ops go in
through :meth:`Store.insert_ops`. Two hangs (one recovered, one open) come from the
real hang service fed heartbeats and stack dumps. Minder scores, faulty machines and
the straggler / machine alerts are written directly, a few realistic rows each: their
producers (the Minder worker, the alert episodes) need a metrics stream and a longer
run than a sample should take. Times are laid just before
``now_ns`` so they stay inside the tables' TTL; the hang service runs with short
thresholds (seconds, not minutes) to keep the timeline compact.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rankwatch.grafana.macros import ALL, QueryContext
from rankwatch.schemas.codec import encode
from rankwatch.schemas.topics import TOPICS
from rankwatch.sim.trace import JobMeta, Trace
from rankwatch.sim.tracegen import demo_config, generate_trace
from rankwatch.streams.hang.detector import HangConfig
from rankwatch.streams.hang.service import HangService
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.kit.sink import TableSink
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.embedded import run_embedded
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import RANKS_PER_HOST, replay_batches

SPAN_S = 600
"""The sample's rows lie in the ten minutes before now."""
WORLD = 16
NS = 1_000_000_000

_BASE = ["train.py:main", "trainer.py:train_step", "schedules.py:forward_backward"]
WAITER_FRAMES = [*_BASE, "p2p.py:recv_forward", "distributed_c10d.py:recv"]
CULPRIT_FRAMES = [*_BASE, "model.py:forward", "attention.py:forward", "cuda.py:synchronize"]
PUBLISHER_FRAMES = ["threading.py:_bootstrap", "publisher.py:run", "queue.py:get"]
"""Thread stacks, outermost first: the culprit sits in a kernel, the rest in a receive."""


@dataclass(frozen=True)
class Sample:
    job: str
    steps: int
    partial_steps: int
    world_size: int
    first_step: int
    last_step: int
    open_hang: str
    """episode_id of the hang still open."""

    def context(self, now_ns: int) -> QueryContext:
        """The boards' time range and variables as someone looking at this sample (written
        at ``now_ns``) sets them: the last hour, its steps, every worker, metric and host."""
        now = datetime.fromtimestamp(now_ns / 1e9, tz=UTC)
        return QueryContext(
            time_from=now - timedelta(hours=1),
            time_to=now + timedelta(minutes=1),
            interval_s=30.0,
            variables={
                "datasource": "clickhouse",
                "job": self.job,
                "step_from": str(self.first_step),
                "step_to": str(self.last_step),
                "worker": ALL,
                "episode": self.open_hang,
                "metric": ALL,
                "host": ALL,
            },
        )


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
    steps = sorted({int(s) for s in trace.step.tolist()})
    open_hang = _run_hangs(store, job, hosts, origin, steps)
    _fill_machines(store, job, hosts, at, now_ns)
    _fill_signals(store, job, hosts, origin, now_ns)
    _fill_alerts(store, job, at)
    _fill_scenarios(store, job, trace, meta, now_ns)
    return Sample(job, len(steps), 1, world, steps[0], steps[-1], open_hang)


def _run_hangs(store: Store, job: str, hosts: list[str], origin_ns: int, steps: list[int]) -> str:
    """Two hangs through the real hang service: rank 3 stalls at +60 s and recovers,
    rank 6 stalls at +500 s and stays stuck (open). Returns the open episode's id."""
    service = HangService(HangConfig(k=0.05, floor_s=5.0, warmup_s=5.0, silent_after_s=3.0))
    out = Output()
    middle, after = steps[len(steps) // 2], steps[-1] + 1
    _stall(service, out, job, hosts, origin_ns + 60 * NS, 3, middle, recover=True)
    _stall(service, out, job, hosts, origin_ns + 500 * NS, 6, after, recover=False)
    sink = TableSink(store)
    sink.write(out)
    sink.flush()
    (episode,) = service.detector.episodes()
    return episode.episode_id


def _stall(
    service: HangService,
    out: Output,
    job: str,
    hosts: list[str],
    t0: int,
    culprit: int,
    step: int,
    recover: bool,
) -> None:
    """Every rank but ``culprit`` waits in a pipeline receive; heartbeats each second."""
    src = Source(TOPICS["heartbeats"])

    def beat(rank: int, now: int, since: int, optype: str, step: int) -> None:
        message = _heartbeat(job, hosts, rank, now, since, optype, step)
        out.extend(service.on_heartbeat(message, src, now))

    dumped = t0 + NS  # each rank's watchdog, once its op has been in flight a while
    for rank in range(WORLD):
        frames = CULPRIT_FRAMES if rank == culprit else WAITER_FRAMES
        out.extend(service.on_stacks(_stacks(job, hosts, rank, dumped, frames), src, dumped))
    for second in range(1, 9):
        now = t0 + second * NS
        for rank in range(WORLD):
            if rank == culprit:
                beat(rank, now, t0, "forward-compute", step)
            else:
                beat(rank, now, t0 + NS // 2, "forward-recv", step)
        out.extend(service.on_tick(now))
    if recover:
        now = t0 + 10 * NS
        for rank in range(WORLD):
            beat(rank, now, now - NS // 10, "forward-compute", step + 1)
        out.extend(service.on_tick(now))


def _heartbeat(
    job: str, hosts: list[str], rank: int, now: int, since: int, optype: str, step: int
) -> bytes:
    return encode(
        "heartbeats",
        {
            "schema": "heartbeats",
            "version": 1,
            "job": job,
            "host": hosts[rank // RANKS_PER_HOST],
            "rank": rank,
            "dp_rank": rank % 4,
            "pp_rank": rank // 4,
            "tp_rank": 0,
            "cp_rank": 0,
            "sent_ns": now,
            "step": step,
            "pid": 1000 + rank,
            "last_done": None,
            "in_flight": {"optype": optype, "seq_id": 1, "mb_id": 0, "since_ns": since},
        },
    )


def _stacks(job: str, hosts: list[str], rank: int, now: int, main: list[str]) -> bytes:
    def frames(names: list[str]) -> list[dict[str, object]]:
        return [
            {"file": n.split(":")[0], "line": 10 + i, "function": n.split(":")[1]}
            for i, n in enumerate(names)
        ]

    return encode(
        "stacks",
        {
            "schema": "stacks",
            "version": 1,
            "job": job,
            "host": hosts[rank // RANKS_PER_HOST],
            "rank": rank,
            "sent_ns": now,
            "reason": "no progress",
            "threads": [
                {"name": "MainThread", "thread_id": 1, "native": False, "frames": frames(main)},
                {
                    "name": "rankwatch-publisher",
                    "thread_id": 2,
                    "native": False,
                    "frames": frames(PUBLISHER_FRAMES),
                },
            ],
        },
    )


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


def _fill_signals(store: Store, job: str, hosts: list[str], origin: int, version: int) -> None:
    """Per-rank slowdown signals of 4 ranks over 40 steps, rank 1's FLOP/s dropping from
    step 20 (the ``rank_signals`` rows the pipeline writes from ops v2 summaries)."""
    from rankwatch.schemas.tables import CONTRACTS

    rows = []
    for step in range(40):
        for rank in range(4):
            slow = rank == 1 and step >= 20
            rows.append(
                CONTRACTS["rank_signals"].row(
                    {
                        "job": job,
                        "step": step,
                        "rank": rank,
                        "host": hosts[rank % len(hosts)],
                        "dp_rank": rank % 2,
                        "pp_rank": rank // 2,
                        "start_ns": origin + step * 10 * NS,
                        "t_step": 1.3 if slow else 1.0,
                        "t_inter": 0.02,
                        "v_inter": 0.02,
                        "v_minority": 0.05,
                        "throughput": 64.0,
                        "flops_per_s": 1.2e14 if slow else 3.0e14,
                        "busbw": 9.0e10,
                        "gc_s": 0.003,
                        "gc_count": 1,
                        "data_wait_s": 0.01,
                        "issue_p50_us": None,
                        "issue_p99_us": None,
                        "anomalies": ["flops-drop"] if slow and step >= 23 else [],
                    },
                    version=version,
                )
            )
    store.insert("rank_signals", rows)


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
            alert("straggler-1", "straggler", "resolved", "info", 90, "worker 2,1 recovered"),
            alert("straggler-2", "straggler", "firing", "warning", 120, "worker 2,1 S_w 1.19"),
            alert("faulty-1", "faulty_machine", "firing", "warning", 480, "host-1 pcie_bw"),
        ],
    )


def _fill_scenarios(store: Store, job: str, trace: Trace, meta: JobMeta, now_ns: int) -> None:
    """One stored sweep of the inter-host bandwidth, by the real scenario model."""
    from rankwatch.scenario_store import scenario_rows
    from rankwatch.sim.scenario import Hardware, calibrate_trace, run_scenarios, sweep

    hardware = Hardware(gpu="A100", inter_gbps=200, intra_gbps=2400, gpus_per_host=8)
    cal = calibrate_trace(trace, meta, hardware)
    results = run_scenarios(cal, sweep("network.inter_gbps", [100, 200, 400]))
    store.insert("scenarios", scenario_rows(results, job, trace, "network.inter_gbps", now_ns))
