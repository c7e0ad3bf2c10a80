"""Benchmark of the stream worker: Kafka -> faust worker -> chDB, on one core.

Run from the repo root (starts its own dev broker; takes a few minutes):

    .venv/bin/python benchmarks/bench_stream.py [--trace SE|ST|GEN] [--copies 10] [--rate R]

Cases:
- ``core``: the worker's pipeline in-process, no Kafka and no store (decode, assemble,
  analyse, rows, alerts) on the whole trace: records/s, and the streaming overhead
  ratio against ``rankwatch.sim.analyse`` of the same trace offline.
- ``shell``: ``--copies`` copies through the ops worker's state in-process, into chDB,
  storing as the worker does, without Kafka and faust: set against ``kafka-Nx`` (the
  same records), what the consumer costs per core; and where a record's time goes
  (``parts_us_per_record``: decoding, the rest of taking a message in, of which the
  what-if of the steps it closed, storing and handing over, the 1-s ticks; wall µs).
- ``kafka-1x`` / ``kafka-Nx``: the trace (and N copies back to back, as one longer
  job) published to a one-partition topic first, then one ``rankwatch worker``
  subprocess pinned to one core (``taskset``) drains it into chDB: records/s from the
  worker's group assignment to the last offset committed (committed = stored), and the
  worker's peak RSS (VmHWM): bounded memory means the N-times-longer replay peaks
  within a small constant of the 1x one. The worker's CPU counts embedded chDB's threads
  (inserts, merges); ``records_per_interpreter_cpu_s`` leaves them out
  (``timing.ThreadCpu``): an estimate of the worker's own cost with the store
  elsewhere, which still counts the insert's work on the calling thread and leaves out
  what sending to a ClickHouse server would cost. ``--store http`` measures that: the
  workers store over HTTP into chDB in a process of its own (``support/chdbhttp.py``,
  pinned to the first core), and the drain reports what was stored (``stored_ops``,
  ``stored_steps``, unmerged); ``--store-dsn`` names your own ClickHouse server instead.
- ``floor``: the same ``--copies`` drained the same way by ``faust_floor.py``, a faust
  app with the worker's consumer settings that only acknowledges each message: CPU
  per message with nothing done, the floor under any faust worker's per-message cost.
- ``group``: horizontal scale. Four jobs (the trace under four names whose keys land
  on the four partitions of the topic), ``--copies`` long each, drained by one worker
  and by two workers in one consumer group, each worker pinned to its own core:
  records/s from the first send to the last offset committed, and records per second
  of the workers' CPU (all of them together), ``--repeats`` times each, alternating,
  median and range, and the two-worker median over the one-worker one.
- ``latency``: a live replay sent on the job's own timeline, in real time (``--step-s``
  or ``--rate`` choose the pace: the trace's op times scaled, as ``--time-scale``
  does); per step, from its end on its last rank (its last op end) to its announcement
  on ``<prefix>.steps`` (sent right after the row is stored; the broker's timestamp):
  p50 / p95 / max. A step the hooks hold for the next one pays the hold here. The
  worker runs with its own default timer (``tick_s``) unless ``--tick-s`` sets it
  (figures recorded before 2026-11-25 19:00 UTC ran it at 0.2 s).

Messages are cut as the hooks cut them (``rankwatch.schemas.batching``, applied by the
replay to the trace's timeline: one message per rank and step when steps are longer
than the 0.25-s window, several steps per message when they are shorter;
``--time-scale`` replays the job with every op that fraction of its recorded time) and
encoded as the hooks encode them (ops v3 frames; ``--ops-version 2`` for JSON).

Figures go to stdout as one JSON object (``--json``) or a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rankwatch.schemas import joined
from rankwatch.schemas.batching import BatchingRule, RelayRule
from rankwatch.schemas.codec import decode, encode_ops
from rankwatch.sim import analyse
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.output import Source
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.alerts import StragglerAlerts
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import (
    Relayed,
    ReplayedBatch,
    relay_timeline,
    replay_repeated,
    span_ns,
)
from rankwatch.traceio import read_meta, read_trace

# the dev broker and the worker helpers are test helpers (tests/support), not in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.chdbhttp import ChdbHttp
from support.devbroker import DevBroker, create_topics
from support.workers import WorkerProcess, spread_jobs, uncommitted
from timing import ThreadCpu, process_cpu_s  # benchmarks/timing.py (run from this folder)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "stragglers"
OPS_VERSION = 3
"""What the messages are encoded as (``--ops-version``)."""


def _encode(batch: Any) -> bytes:
    return encode_ops(batch, version=OPS_VERSION)


SERVER: str | None = None
"""The workers' ClickHouse server, ``http(s)://user:password@host:port`` without a
database: ``--store http`` (chDB behind an HTTP endpoint in its own process, pinned to
the first core, away from the worker's) or ``--store-dsn`` (yours); None: embedded."""


def _dsn(work: Path, name: str) -> str:
    """Where worker ``name`` stores: its own chDB path, or its own database on the
    server."""
    if SERVER is None:
        return f"chdb://{work / name}"
    return f"{SERVER}/bench_{name}_{RUN}"


RUN = uuid.uuid4().hex[:8]
"""Names this invocation's databases on a server (runs must not share one)."""


RELAY: RelayRule | None = None
"""``--relay-s``: messages pass through each host's relay (bundles) in every Kafka case."""


def _relayed(batches: list[ReplayedBatch]) -> list[Relayed]:
    """The messages the hooks send for ``batches``, through each host's relay when
    ``RELAY`` is set (one message per batch otherwise), in the order they leave."""
    sent = [(b, _encode(b.batch)) for b in batches]
    if RELAY is None:
        return [Relayed(b.sent_ns, b.batch.job, (f,), (b.batch,)) for b, f in sent]
    return relay_timeline(sent, RELAY)


def _value(message: Relayed) -> bytes:
    """What the relay sends (``RelayRule.join``: joined when the frames can be)."""
    return joined.message(list(message.frames), RELAY is None or RELAY.join)


def _encoded(batches: list[ReplayedBatch]) -> list[tuple[bytes, bytes]]:
    """(key, value) of each message the hooks (and relays) send for ``batches``."""
    return [(m.job.encode(), _value(m)) for m in _relayed(batches)]


def core(batches: list[ReplayedBatch], trace: Any, meta: Any, repeat: int = 3) -> dict[str, float]:
    """Best of ``repeat`` runs each (a fresh pipeline each time): single runs of well
    under a second swung by 1.5x on this shared VM."""
    messages = [_encode(b.batch) for b in batches]
    walls, cpus, offlines = [], [], []
    for _ in range(repeat):
        pipeline = Pipeline(
            assembly=AssemblyConfig(grace_s=1e9),
            analyser=WhatIfAnalyser(),
            alerts=StragglerAlerts(),
            keep_ops=True,
        )
        t0, c0 = time.perf_counter(), time.process_time()
        for m in messages:
            pipeline.on_message(m, Source("ops"), 0)
        pipeline.flush(0)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        t0 = time.perf_counter()
        analyse(trace, meta)
        offlines.append(time.perf_counter() - t0)
    wall, cpu, offline = min(walls), min(cpus), min(offlines)
    records = sum(len(b.batch) for b in batches)
    return {
        "records": records,
        "messages": len(messages),
        "records_per_s": records / wall,
        "cpu_records_per_s": records / cpu,
        "seconds": wall,
        "offline_seconds": offline,
        "overhead_ratio": wall / offline,
    }


def shell(batches: list[ReplayedBatch], work: Path, repeat: int = 3) -> dict[str, Any]:
    """The ops worker's state fed in-process: what ``kafka-Nx``'s worker does per message
    (decode, checks, assembly, what-if, rows, acknowledgements, a store into chDB when a
    step closes or the 1-s tick is due, the jobstate messages encoded) without Kafka and
    faust, so the two cases' ratio is what the consumer costs. Median and range of
    ``repeat`` runs, each into a fresh chDB directory; CPU includes chDB's threads.
    "of which what-if" is part of "store": the worker analyses the steps closed since
    its last store before each store (it was part of "take in" before that)."""
    from rankwatch.streams.ops.worker_state import WorkerSettings, WorkerState, first_batch

    encoded = _encoded(batches)
    records = sum(len(b.batch) for b in batches)
    rates, cpu_rates, parts = [], [], []
    for run in range(repeat):
        state = WorkerState(WorkerSettings(bootstrap="-", dsn=f"chdb://{work / f'shell{run}'}"))
        state.delivery.store()  # connected and migrated before the clock starts
        spent = dict.fromkeys(("decode", "take in", "of which what-if", "store", "ticks"), 0.0)
        _time_analyses(state.pipeline.analyser, spent)
        t0, c0 = time.perf_counter(), time.process_time()
        tick_at = time.monotonic() + state.settings.tick_s
        produced = time.time_ns()  # all of it at once, as kafka-Nx sends it before the drain
        lap = _Laps(spent)
        for offset, (key, value) in enumerate(encoded):
            lap(None)
            members = state.decode(value)
            batch = first_batch(members)
            lap("decode")
            if state.needs_restore(batch, key):
                assert batch is not None and state.restore(batch)
            state.on_message(offset, value, Source("ops", 0, offset, key, produced), members)
            lap("take in")
            ticked = time.monotonic() >= tick_at
            if ticked:
                state.on_tick()
                tick_at = time.monotonic() + state.settings.tick_s
            lap("ticks")
            if ticked or state.full or state.settle_in() == 0:
                _settle(state)
                lap("store")
        state.on_tick()
        _settle(state)
        rates.append(records / (time.perf_counter() - t0))
        cpu_rates.append(records / (time.process_time() - c0))
        parts.append({name: 1e6 * s / records for name, s in spent.items()})
        state.delivery.sink.store.close()  # type: ignore[union-attr]  # one chDB path a process
    return {
        "records": records,
        "messages": len(encoded),
        "records_per_s": statistics.median(rates),
        "cpu_records_per_s": statistics.median(cpu_rates),
        "cpu_records_per_s_runs": [round(r) for r in cpu_rates],
        "parts_us_per_record": {
            name: round(statistics.median(p[name] for p in parts), 3) for name in parts[0]
        },
    }


class _Laps:
    """``lap(name)`` adds the wall time since the last lap to ``spent[name]`` (None: to
    nothing)."""

    def __init__(self, spent: dict[str, float]) -> None:
        self.spent, self.last = spent, time.perf_counter()

    def __call__(self, name: str | None) -> None:
        now = time.perf_counter()
        if name is not None:
            self.spent[name] += now - self.last
        self.last = now


def _time_analyses(analyser: Any, spent: dict[str, float]) -> None:
    """Add the wall time of the what-if to ``spent`` (this instance only): the
    pipeline's seam, ``analyse_many`` (a message's closed steps, or a store's)."""
    analyse_many = analyser.analyse_many

    def timed(steps: Any) -> Any:
        t = time.perf_counter()
        try:
            return analyse_many(steps)
        finally:
            spent["of which what-if"] += time.perf_counter() - t

    analyser.analyse_many = timed


def _settle(state: Any) -> None:
    """The worker's settle without the broker: store, encode the jobstate messages,
    release the acknowledgements."""
    tokens = state.flush()
    if state.stored:
        state.handed_over(state.handover(), ok=True)
    state.release(tokens, state.stored)


def drain(
    broker: str,
    batches: list[ReplayedBatch],
    work: Path,
    name: str,
    argv: list[str] | None = None,
    **env: str,
) -> dict[str, Any]:
    """Time one pinned worker taking a replay into chDB: the worker joins an empty
    topic, then the (pre-encoded) replay is sent as fast as the producer goes.
    ``argv``: another consumer to time the same way (``faust_floor.py``)."""
    prefix = f"b{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.ops"
    asyncio.run(create_topics(broker, [topic], 1))
    asyncio.run(create_topics(broker, [f"{prefix}.steps", f"{prefix}.alerts"], 1))
    records = sum(len(b.batch) for b in batches)
    encoded = _encoded(batches)
    worker = _pinned(WorkerProcess(broker, prefix, _dsn(work, name), work, name, argv, **env))
    try:
        worker.wait_for(
            lambda s: any(a.startswith(topic) for a in s.get("assigned", [])), 120, "join"
        )
        t0, cpu0 = time.monotonic(), process_cpu_s(worker.proc.pid)
        threads = ThreadCpu(worker.proc.pid)
        asyncio.run(_send_all(broker, topic, encoded))
        sent_s = time.monotonic() - t0
        while uncommitted(broker, f"{prefix}-workers", topic, 1) > 0:
            if time.monotonic() - t0 > 900:
                raise RuntimeError(f"{name}: not drained in 900 s: {worker.status()}")
            threads.sample()
            time.sleep(0.25)
        seconds = time.monotonic() - t0
        cpu = process_cpu_s(worker.proc.pid) - cpu0
        threads.sample()
        own = threads.seconds()
        status = worker.status()
        peak = _vmhwm_mib(worker.proc.pid)
    finally:
        worker.stop()
    return {
        "records": records,
        **(_stored(work, name) if argv is None else {}),  # the floor app stores nothing
        "messages": len(encoded),
        "steps": status.get("steps_analysed"),
        "flushes": status.get("flushes"),  # as of the last health file: one a tick or so
        "jobstates_sent": status.get("jobstates_sent"),
        "gc": {k: status.get(k) for k in ("gc_s", "gc_collections", "gc_frozen")},
        "send_seconds": sent_s,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "worker_cpu_s": cpu,
        "records_per_cpu_s": records / cpu,
        "interpreter_cpu_s": own,
        "records_per_interpreter_cpu_s": records / own if own else None,
        "cpu_us_per_message": 1e6 * cpu / len(encoded),
        "peak_rss_mib": peak,
    }


def _stored(work: Path, name: str) -> dict[str, int]:
    """What worker ``name`` stored (op records, steps) when its store is a server, which
    this process may read (an embedded path is one process's; not read); unmerged, so a
    record or step stored twice counts twice."""
    if SERVER is None:
        return {}
    with Store.connect(_dsn(work, name)) as store:
        ops = store.query("SELECT count() AS n FROM ops")[0]["n"]
        steps = store.query("SELECT count() AS n FROM steps")[0]["n"]
    return {"stored_ops": int(ops), "stored_steps": int(steps)}


FLOOR_APP = [sys.executable, str(Path(__file__).with_name("faust_floor.py")), "worker"]
"""The consumer alone (``faust_floor.py``), drained like a worker: the ``floor`` case."""


def group(
    broker: str, batches: list[ReplayedBatch], work: Path, workers: int, name: str
) -> dict[str, Any]:
    """Time ``workers`` workers of one consumer group, worker i pinned to core i (with
    one worker: the last core, as ``drain``), taking four jobs from a four-partition
    topic into their own chDB stores: the group joins the empty topic and splits it,
    then the replay is sent as fast as the producer goes."""
    prefix = f"g{uuid.uuid4().hex[:8]}"
    topic, partitions = f"{prefix}.ops", 4
    asyncio.run(create_topics(broker, [topic], partitions))
    records = sum(len(b.batch) for b in batches)
    encoded = [(b.batch.job.encode(), encode_ops(b.batch)) for b in batches]
    cores = os.cpu_count() or 1
    procs = [
        _pinned(
            WorkerProcess(broker, prefix, _dsn(work, f"{name}{i}"), work, f"{name}{i}"),
            core=(i if workers > 1 else cores - 1) % cores,
        )
        for i in range(workers)
    ]
    try:
        deadline = time.monotonic() + 120
        while True:  # every worker owns partitions, together all of them
            owned = [
                {a for a in w.status().get("assigned", []) if a.startswith(f"{topic}:")}
                for w in procs
            ]
            if all(owned) and len(set().union(*owned)) == partitions:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: the group never split the partitions")
            time.sleep(0.25)
        t0, cpu0 = time.monotonic(), [process_cpu_s(w.proc.pid) for w in procs]
        asyncio.run(_send_all(broker, topic, encoded))
        while uncommitted(broker, f"{prefix}-workers", topic, partitions) > 0:
            if time.monotonic() - t0 > 900:
                raise RuntimeError(f"{name}: not drained in 900 s")
            time.sleep(0.25)
        seconds = time.monotonic() - t0
        cpu = [process_cpu_s(w.proc.pid) - c for w, c in zip(procs, cpu0, strict=True)]
        statuses = [w.status() for w in procs]
    finally:
        for w in procs:
            w.stop()
    return {
        "records": records,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "records_per_worker": [s.get("records_in", 0) for s in statuses],
        "worker_cpu_s": cpu,
        "records_per_worker_cpu_s": records / sum(cpu),
    }


def group_case(
    broker: str, trace: Any, meta: Any, copies: int, repeats: int, work: Path
) -> dict[str, Any]:
    """One worker against two on the same four jobs, alternated ``repeats`` times."""
    origin = time.time_ns()
    batches = [
        b for job in spread_jobs(4, 4) for b in replay_repeated(trace, meta, job, origin, copies)
    ]
    batches.sort(key=lambda b: (b.sent_ns, b.batch.job, b.batch.rank))
    runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for r in range(repeats):
        for n in (1, 2):
            runs[n].append(group(broker, batches, work, n, f"g{n}r{r}-"))
    out: dict[str, Any] = {"jobs": 4, "copies": copies, "records": runs[1][0]["records"]}
    for n, results in runs.items():
        rates = [x["records_per_s"] for x in results]
        per_cpu = [x["records_per_worker_cpu_s"] for x in results]
        out[f"{n}-worker"] = {
            "records_per_s_median": statistics.median(rates),
            "records_per_s_min": min(rates),
            "records_per_s_max": max(rates),
            "records_per_worker_cpu_s_median": statistics.median(per_cpu),
            "records_per_worker_cpu_s_min": min(per_cpu),
            "records_per_worker_cpu_s_max": max(per_cpu),
            "runs": results,
        }
    out["ratio_2_over_1"] = (
        out["2-worker"]["records_per_s_median"] / out["1-worker"]["records_per_s_median"]
    )
    return out


async def _send_all(broker: str, topic: str, encoded: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=broker,
        linger_ms=5,
        acks="all",
        max_request_size=8 * 1024 * 1024,
        max_batch_size=1024 * 1024,  # the 16 KiB default holds one GEN message per request
    )
    await producer.start()
    try:
        for key, value in encoded:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


def latency(
    broker: str,
    batches: list[ReplayedBatch],
    origin_ns: int,
    work: Path,
    tick_s: float | None = None,
) -> dict[str, Any]:
    """The live case; ``tick_s``: the worker's timer (None: its own default)."""
    prefix = f"l{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.ops"
    asyncio.run(create_topics(broker, [topic], 1))
    asyncio.run(create_topics(broker, [f"{prefix}.steps", f"{prefix}.alerts"], 1))
    env = {} if tick_s is None else {"RANKWATCH_TICK_S": str(tick_s)}
    worker = _pinned(WorkerProcess(broker, prefix, _dsn(work, "lat"), work, "lat", **env))
    try:
        worker.wait_for(
            lambda s: any(a.startswith(topic) for a in s.get("assigned", [])), 120, "join"
        )
        t0 = time.monotonic()
        step_end, last_sent = asyncio.run(_paced(broker, topic, batches, origin_ns))
        achieved = sum(len(b.batch) for b in batches) / (time.monotonic() - t0)
        announced = asyncio.run(_announced(broker, f"{prefix}.steps", len(step_end), 120))
        peak = _vmhwm_mib(worker.proc.pid)
    finally:
        worker.stop()
    lat = sorted(announced[k] - step_end[k] for k in announced if k in step_end)
    after = sorted(announced[k] - last_sent[k] for k in announced if k in last_sent)
    return {
        "achieved_records_per_s": achieved,
        "steps": len(lat),
        "p50_s": statistics.median(lat) if lat else None,
        "p95_s": lat[int(0.95 * (len(lat) - 1))] if lat else None,
        "max_s": lat[-1] if lat else None,
        "latencies_s": [round(x, 3) for x in lat],
        # in step order: a job's first step also pays for meeting the job (its restore
        # check reads the jobstate topic and the store; its plan is built)
        "by_step_s": [
            round(announced[k] - step_end[k], 3) for k in sorted(announced) if k in step_end
        ],
        # from the step's last closing message handed to the producer: the worker's part
        # (and the broker's), without the benchmark's own sending of the step's burst
        "after_last_send_p50_s": statistics.median(after) if after else None,
        "after_last_send_max_s": after[-1] if after else None,
        "after_last_send_s": [round(x, 3) for x in after],
        "peak_rss_mib": peak,
    }


async def _paced(
    broker: str, topic: str, batches: list[ReplayedBatch], origin_ns: int
) -> tuple[dict[int, float], dict[int, float]]:
    """Send each message at its time on the replay's timeline (``origin_ns`` now), in
    real time; returns the wall time each step ended on its last rank, and when the
    last message that closes it was handed to the producer."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=broker, linger_ms=2, acks="all", max_batch_size=1024 * 1024
    )
    await producer.start()
    messages = _relayed(batches)  # encoded before, not on the paced path
    values = [_value(m) for m in messages]
    ends: dict[int, int] = {}
    sent: dict[int, float] = {}
    for item in batches:
        b = item.batch
        for step in {s for s, _ in b.steps_done}:
            last = int((b.start_ns + b.duration_ns)[b.step == step].max())
            ends[step] = max(ends.get(step, 0), last)
    try:
        t0, wall0 = time.monotonic(), time.time()
        for message, value in zip(messages, values, strict=True):
            ahead = (message.sent_ns - origin_ns) / 1e9 - (time.monotonic() - t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
            await producer.send(topic, value, key=message.job.encode())
            for step in {s for b in message.batches for s, _ in b.steps_done}:
                sent[step] = time.time()
        await producer.flush()
    finally:
        await producer.stop()
    return {step: wall0 + (end - origin_ns) / 1e9 for step, end in ends.items()}, sent


async def _announced(broker: str, topic: str, want: int, timeout_s: float) -> dict[int, float]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker, auto_offset_reset="earliest")
    await consumer.start()
    got: dict[int, float] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < want and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    got[decode("steps", r.value)["step"]] = r.timestamp / 1e3
    finally:
        await consumer.stop()
    return got


def _job_shape(trace: Any, batches: list[ReplayedBatch], time_scale: float) -> dict[str, Any]:
    """The replayed job's size: reporting ranks, steps, records per step and message."""
    records = sum(len(b.batch) for b in batches)
    steps = len({s for b in batches for s, _ in b.batch.steps_done})
    ranks = len({b.batch.rank for b in batches})
    ends = sum(len(b.batch.steps_done) for b in batches)
    return {
        "ranks": ranks,
        "steps": steps,
        "records": records,
        "records_per_step": records / max(steps, 1),
        "messages": len(batches),
        "records_per_message": records / max(len(batches), 1),
        "step_ends_per_message": ends / max(len(batches), 1),
        "step_s": span_ns(trace, time_scale) / 1e9 / max(steps, 1),
        "time_scale": time_scale,
        "ops_version": OPS_VERSION,
        "bytes_per_record": sum(len(_encode(b.batch)) for b in batches) / max(records, 1),
        "relay_s": RELAY.linger_s if RELAY is not None else 0.0,
        "relay_join": RELAY is not None and RELAY.join,
        "relayed_messages": len(_relayed(batches)) if RELAY is not None else len(batches),
    }


def _pinned(worker: WorkerProcess, core: int | None = None) -> WorkerProcess:
    """Pin the worker (and its threads) to ``core`` (default: the last one), when
    taskset exists."""
    _pin(worker.proc.pid, (os.cpu_count() or 1) - 1 if core is None else core)
    return worker


def _pin(pid: int, core: int) -> None:
    """Pin process ``pid`` and its threads to ``core``, when taskset exists."""
    if shutil.which("taskset"):
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(pid)], check=False,
                       capture_output=True)  # fmt: skip


def _vmhwm_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trace",
        default="SE",
        choices=("SE", "ST", "GEN"),
        help="a shipped trace, or GEN: generated DP 16 x PP 8, 32 microbatches, 8 steps",
    )
    parser.add_argument(
        "--gen",
        default="16x8x32x8",
        metavar="DPxPPxMBxSTEPS",
        help="the GEN job: DP ranks, stages, microbatches, steps (one straggler)",
    )
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--rate", type=float, default=0.0, help="latency case (0: 70%% of 1x)")
    parser.add_argument(
        "--step-s",
        type=float,
        default=0.0,
        help="latency case: one step every STEP_S seconds (the job's pace; overrides --rate)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="replay every op at this fraction of its recorded time (shorter steps: the "
        "hooks then put several in a message); all cases",
    )
    parser.add_argument(
        "--window-s",
        type=float,
        default=BatchingRule().window_s,
        help="the hooks' batching window (0: one message per rank and step, as before ops v3)",
    )
    parser.add_argument(
        "--partial-s",
        type=float,
        default=BatchingRule().partial_s,
        help="how long records of a running step wait before they leave without its end "
        "(the hooks' partial_flush_s; ops v2's hooks used 0.5)",
    )
    parser.add_argument("--ops-version", type=int, default=3, choices=(2, 3))
    parser.add_argument(
        "--relay-s",
        type=float,
        default=0.0,
        help="messages pass through a relay per host that bundles its ranks' frames, "
        "holding a bundle's first frame up to RELAY_S seconds (0: no relay, as the hooks "
        "send without one); shell and the Kafka cases",
    )
    parser.add_argument(
        "--no-join",
        action="store_true",
        help="the relay sends bundles of whole frames (x-bundle), not joined (x-joined)",
    )
    parser.add_argument(
        "--tick-s",
        type=float,
        default=None,
        help="latency case: the worker's timer (RANKWATCH_TICK_S; default: the worker's "
        "own). Figures recorded before 2026-11-25 19:00 UTC used 0.2",
    )
    parser.add_argument(
        "--cases",
        default="core,kafka-1x,kafka-Nx,latency",
        help="comma-separated subset of core, shell, floor, kafka-1x, kafka-Nx, latency, group",
    )
    parser.add_argument(
        "--store",
        default="chdb",
        choices=("chdb", "http"),
        help="the Kafka cases' workers store into embedded chDB (their own process), or "
        "through HTTP into chDB in a process of its own (tests/support/chdbhttp.py)",
    )
    parser.add_argument(
        "--store-dsn",
        help="the Kafka cases' workers store into this ClickHouse server instead "
        "(http(s)://user:password@host:port, no database: each worker gets its own, "
        "bench_<case>_<run>, left there)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="group case: runs of each")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--without-ops", action="store_true", help="also drain 1x with raw ops not stored"
    )
    args = parser.parse_args()
    global OPS_VERSION, RELAY, SERVER
    OPS_VERSION = args.ops_version
    RELAY = RelayRule(linger_s=args.relay_s, join=not args.no_join) if args.relay_s > 0 else None
    cases = set(args.cases.split(","))
    if args.trace == "GEN":
        dp, pp, mb, steps = (int(v) for v in args.gen.lower().split("x"))
        trace, meta = generate_trace(
            GenConfig(
                dp=dp, pp=pp, microbatches=mb, steps=steps, stragglers=(Straggler(1, 2, 1.4),)
            )
        )
    elif DATA.is_dir():
        trace = read_trace(DATA / f"trace-{args.trace}.parquet")
        meta = read_meta(DATA / f"meta-{args.trace}.yaml")
    else:
        print(f"skipped: {DATA} is absent")
        return 0
    scale, rule = args.time_scale, BatchingRule(window_s=args.window_s, partial_s=args.partial_s)
    one = list(replay_repeated(trace, meta, "bench", time.time_ns(), 1, rule, scale))
    results: dict[str, Any] = {"trace": args.trace, "job": _job_shape(trace, one, scale)}
    if args.trace == "GEN":
        results["gen"] = args.gen
    if "core" in cases:
        results["core"] = core(one, trace, meta)
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    if "shell" in cases:
        many = list(replay_repeated(trace, meta, "bench", time.time_ns(), args.copies, rule, scale))
        results[f"shell-{args.copies}x"] = shell(many, work)
        del many
    broker, endpoint = DevBroker(work / "kafka"), None
    try:
        bootstrap = broker.start()
        if args.store_dsn:
            SERVER = args.store_dsn.rstrip("/")
        elif args.store == "http":
            endpoint = ChdbHttp(work / "endpoint").start()
            _pin(endpoint.process.pid if endpoint.process else 0, 0)
            SERVER = endpoint.dsn(database="").rstrip("/")
        results["store"] = "server" if args.store_dsn else args.store
        if "kafka-1x" in cases or ("latency" in cases and not (args.rate or args.step_s)):
            results["kafka-1x"] = drain(bootstrap, one, work, "x1")
        if "kafka-Nx" in cases or "floor" in cases:
            many = list(
                replay_repeated(trace, meta, "bench", time.time_ns(), args.copies, rule, scale)
            )
            if "floor" in cases:
                results[f"floor-{args.copies}x"] = drain(bootstrap, many, work, "f", FLOOR_APP)
            if "kafka-Nx" in cases:
                results[f"kafka-{args.copies}x"] = drain(bootstrap, many, work, f"x{args.copies}")
            del many
        if args.without_ops:
            results["kafka-1x-without-ops"] = drain(
                bootstrap, one, work, "n1", RANKWATCH_KEEP_OPS="0"
            )
        if "group" in cases:
            results["group"] = group_case(bootstrap, trace, meta, args.copies, args.repeats, work)
        if "latency" in cases:
            # the pace: a job whose ops take `live_scale` of their recorded time
            per_step_s = results["job"]["step_s"]
            if args.step_s:
                live_scale = scale * args.step_s / per_step_s
            else:
                rate = args.rate or 0.7 * results["kafka-1x"]["records_per_s"]
                live_scale = scale * results["job"]["records_per_step"] / rate / per_step_s
            origin = time.time_ns()
            live = list(replay_repeated(trace, meta, "live", origin, 3, rule, live_scale))
            results["latency"] = {
                "time_scale": live_scale,
                "records_per_message": sum(len(b.batch) for b in live) / len(live),
                "tick_s": args.tick_s,
                **latency(bootstrap, live, origin, work, args.tick_s),
            }
    finally:
        if endpoint is not None:
            endpoint.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0]
    results["load_average_1m"] = load
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, figures in results.items():
            print(f"{name}: {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
