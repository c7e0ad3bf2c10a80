"""Benchmark of the hooks' overhead: per timed op on the training thread, per real step.

Run from the repo root:

    .venv/bin/python benchmarks/bench_hooks.py [--ops 200000] [--jobs 3] [--steps 20]

Cases:
- ``op``: ``with rw.op("forward-compute", mb=i)`` around nothing, with the publisher
  thread running and a sink that takes each message (so the background encoding
  competes for the GIL as it would in training). Reported: wall ns per op on the
  training thread (median over repeats, and min..max), next to an empty ``with
  nullcontext()`` loop (the floor) and the switched-off hooks (``NOOP``).
- ``publish``: the publisher thread's cost per record (orjson encoding of batches).
- ``signals``: the calls the slowdown signals add on the training thread
  (``work``, ``comm``, ``samples``, ``note_gc``, ``note_data_wait``, ns per call) and
  per step (``step_begin`` + ``step_end`` with its notes, no op in the step), and
  the publisher's per-step summary (sums, union of op intervals, the rank_steps item)
  of a 20-op step.
- ``workload``: the real gloo PP 2 x DP 2 job (workload/), hooks on vs off,
  alternating jobs; median step time of each job (first two steps dropped: handshakes)
  and the median over jobs with min..max; plus a bound that does not drown in noise:
  (timed ops per rank per step x per-op cost) / step time.
- ``workload_in_job``: hooks switched on and off every 2 steps inside each job;
  median on-step time / median off-step time per job (machine noise mostly cancels).

Goals (DESIGN.md): < 5 µs per op, < 1% of step time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from contextlib import nullcontext
from typing import Any

from rankwatch.hooks.identity import Identity
from rankwatch.hooks.publisher import PublisherConfig
from rankwatch.hooks.records import encode_ops, encode_ops_json
from rankwatch.hooks.tracker import NOOP, RankWatch
from rankwatch.hooks.transports import SinkTransport

IDENT = Identity(job="bench", host="h", rank=0, dp_rank=0, pp_rank=0, dp_size=2, pp_size=2)


def per_op_ns(n: int, repeat: int, publisher: bool) -> dict[str, Any]:
    """ns per op on this thread: wall clock, and this thread's CPU time (immune to the
    other processes sharing the cores)."""
    taken = []
    rw = RankWatch(
        IDENT,
        SinkTransport(lambda kind, value: taken.append(len(value))),
        capacity=n * repeat,
        publisher=PublisherConfig(flush_interval_s=0.05, max_batch=20_000),
        start=publisher,
    )
    cases = {
        "empty with (floor)": lambda i: nullcontext(),
        "hooks off (NOOP)": lambda i: NOOP,
        "hooks on": lambda i: rw.op("forward-compute", mb=i),
    }
    out: dict[str, Any] = {}
    for name, make in cases.items():
        wall, cpu = [], []
        for _ in range(repeat):
            rw.step_begin(0)
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            for i in range(n):
                with make(i):
                    pass
            wall.append((time.perf_counter_ns() - t0) / n)
            cpu.append((time.thread_time_ns() - c0) / n)
            rw.step_end()
        out[name] = {"wall": _spread(wall), "thread_cpu": _spread(cpu)}
    stats = rw.close()
    out["records"] = {"put": stats.put, "sent": stats.sent, "dropped": stats.dropped_buffer}
    return out


def publish_ns_per_record(repeat: int = 5) -> dict[str, dict[str, float]]:
    """The publisher thread's encoding, ns per record: ops v3 frames (what the hooks
    send) and v2 JSON, in 20,000-record batches and in SE-sized ones (39 records)."""
    out = {}
    for n in (20_000, 39):
        records = [
            (0, "forward-compute", i, i, 0, 0, 1_700_000_000_000_000_000 + i, 1000)
            for i in range(n)
        ]
        for name, encode in (("v3", encode_ops), ("v2", encode_ops_json)):
            runs = []
            loops = max(1, 20_000 // n)
            for _ in range(repeat):
                t0 = time.perf_counter_ns()
                for _ in range(loops):
                    encode(IDENT, records, batch_seq=0, sent_ns=0, steps_done=[(0, n)])
                runs.append((time.perf_counter_ns() - t0) / n / loops)
            out[f"{name}, {n} records"] = _spread(runs)
    return out


def signal_calls_ns(n: int = 100_000, repeat: int = 5) -> dict[str, Any]:
    """ns per call of the signal notes on the training thread, and per step summary."""
    rw = RankWatch(IDENT, SinkTransport(lambda kind, value: None), start=False)
    rw.step_begin(0)
    calls = {
        "work": lambda: rw.work("forward-compute", 1.5e9),
        "comm": lambda: rw.comm("grads-reduce-scatter", 4096, 2, "all-reduce"),
        "samples": lambda: rw.samples(16),
        "note_gc": lambda: rw.note_gc(1000),
        "note_data_wait": lambda: rw.note_data_wait(1000),
    }
    out: dict[str, Any] = {}
    for name, call in calls.items():
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                call()
            runs.append((time.perf_counter_ns() - t0) / n - _loop_ns(n))
        out[name] = _spread(runs)
    steps = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for s in range(n // 10):
            rw.step_begin(s)
            rw.step_end()
        steps.append((time.perf_counter_ns() - t0) / (n // 10))
        rw.buffer.take_all()
    out["step_begin+step_end"] = _spread(steps)
    out["publisher_summary_per_step"] = _summary_ns(repeat)
    return out


def _loop_ns(n: int) -> float:
    """The bare loop with a lambda call (subtracted: it is not the hooks' cost)."""
    f = lambda: None  # noqa: E731
    t0 = time.perf_counter_ns()
    for _ in range(n):
        f()
    return (time.perf_counter_ns() - t0) / n


def _summary_ns(repeat: int, steps: int = 2000) -> dict[str, float]:
    from rankwatch.hooks.signals import StepNotes, StepSummaries

    runs = []
    for _ in range(repeat):
        book = StepSummaries()
        t0 = time.perf_counter_ns()
        for s in range(steps):
            records = [
                (s, "forward-compute", i, i, 0, 0, s * 10**8 + i * 10**5, 90_000) for i in range(20)
            ]
            book.add_records(records)
            book.add_notes([StepNotes().close(s, s * 10**8 + 10**7, None)])
            book.pop(s)
        runs.append((time.perf_counter_ns() - t0) / steps)
    return _spread(runs)


def workload(jobs: int, steps: int) -> dict[str, Any]:
    from rankwatch.workload.config import WorkloadConfig
    from rankwatch.workload.launch import run_job

    medians: dict[str, list[float]] = {"on": [], "off": []}
    ops_per_rank_step = []
    for _ in range(jobs):
        for mode in ("on", "off"):
            spool = tempfile.mkdtemp(prefix="bench-hooks-")
            cfg = WorkloadConfig(
                dp=2, pp=2, steps=steps, microbatches=4, hooks=mode == "on", spool_dir=spool
            )
            result = run_job(cfg)
            shutil.rmtree(spool)
            medians[mode].append(statistics.median(result.step_times_s()[2:]))
            if mode == "on":
                puts = [s["put"] for s in result.hook_stats()]
                ops_per_rank_step.append(max(puts) / steps)
    on, off = statistics.median(medians["on"]), statistics.median(medians["off"])
    return {
        "step_s_hooks_on": _spread(medians["on"]),
        "step_s_hooks_off": _spread(medians["off"]),
        "on_over_off": on / off,
        "ops_per_rank_per_step": max(ops_per_rank_step),
    }


def workload_in_job(jobs: int, steps: int) -> dict[str, Any]:
    """Hooks switched on and off every 2 steps inside each job (cancels machine noise
    the way the what-if validation does); ratio of median step times per job."""
    from rankwatch.workload.config import WorkloadConfig
    from rankwatch.workload.launch import run_job

    ratios = []
    for _ in range(jobs):
        spool = tempfile.mkdtemp(prefix="bench-hooks-")
        cfg = WorkloadConfig(
            dp=2, pp=2, steps=steps + 2, microbatches=4, hooks_off_every=2, spool_dir=spool
        )
        times = run_job(cfg).step_times_s()
        shutil.rmtree(spool)
        on = [t for s, t in enumerate(times) if s >= 2 and cfg.hooks_on(s)]
        off = [t for s, t in enumerate(times) if s >= 2 and not cfg.hooks_on(s)]
        ratios.append(statistics.median(on) / statistics.median(off))
    return {"on_over_off_per_job": ratios, "on_over_off": _spread(ratios)}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=3, help="workload jobs per mode (0: skip)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "op_ns": per_op_ns(args.ops, args.repeat, publisher=True),
        "op_ns_publisher_paused": per_op_ns(args.ops, args.repeat, publisher=False),
    }
    report["publish_ns_per_record"] = publish_ns_per_record()
    report["signals_ns"] = signal_calls_ns()
    if args.jobs:
        report["workload"] = w = workload(args.jobs, args.steps)
        per_op = report["op_ns"]["hooks on"]["thread_cpu"]["median"]  # the whole op, floor in
        bound = w["ops_per_rank_per_step"] * per_op / 1e9 / w["step_s_hooks_off"]["median"]
        w["bound_fraction_of_step"] = bound
        sig = report["signals_ns"]
        # per step and rank in the workload: 2 work, 1 comm, 1 samples, ~2 GC pauses
        # (the manual collect), 1 data wait, one step_begin/step_end
        extra = (
            2 * sig["work"]["median"]
            + sig["comm"]["median"]
            + sig["samples"]["median"]
            + 2 * sig["note_gc"]["median"]
            + sig["note_data_wait"]["median"]
            + sig["step_begin+step_end"]["median"]
        )
        w["signals_ns_per_step"] = extra
        w["bound_with_signals"] = bound + extra / 1e9 / w["step_s_hooks_off"]["median"]
        report["workload_in_job"] = workload_in_job(args.jobs, 2 * args.steps)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
