"""What the slowdown signals cost the ops worker per closed step (docs/detection.md, §3).

One step of a job of ``--ranks`` ranks (64 DP groups of 16 stages by default), each rank
with forward, backward and a reduce-scatter in its summary: ``step_signals`` (group
times, FLOP/s, bus bandwidth, shares) and ``SlowdownDetector.observe`` (baselines,
episodes, alerts). Steps after the warm-up are timed; median and min..max over
``--steps``, and the tracemalloc peak of one more step.

    flock /work/helpers/measure.lock .venv/bin/python benchmarks/bench_slowdown.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from typing import Any

from rankwatch.streams.slowdown.detector import SlowdownDetector
from rankwatch.streams.slowdown.signals import RankStep, step_signals

MS = 1_000_000


def summary(step: int) -> dict[str, Any]:
    t0 = step * 100 * MS
    return {
        "step": step,
        "begin_ns": t0 + 10 * MS,
        "end_ns": t0 + 100 * MS,
        "prev_end_ns": t0,
        "covered_ns": 80 * MS,
        "samples": 32,
        "gc_ns": 1000,
        "gc_count": 1,
        "data_wait_ns": 1000,
        "issue": None,
        "ops": [
            {"optype": "forward-compute", "n": 32, "time_ns": 30 * MS, "flops": 1e12},
            {"optype": "backward-compute", "n": 32, "time_ns": 50 * MS, "flops": 2e12},
            {
                "optype": "grads-reduce-scatter",
                "n": 1,
                "time_ns": 10 * MS,
                "bytes": 10**9,
                "group": 64,
                "algo": "reduce-scatter",
            },
        ],
    }


def one_step(detector: SlowdownDetector, ranks: int, step: int) -> float:
    item = summary(step)
    held = [RankStep("bench", r, f"h{r // 8}", r % 64, r // 64, item) for r in range(ranks)]
    t0 = time.perf_counter()
    detector.observe(step_signals(held))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    detector = SlowdownDetector()
    times = [one_step(detector, args.ranks, s) for s in range(args.warmup + args.steps)]
    timed = times[args.warmup :]
    tracemalloc.start()
    one_step(detector, args.ranks, args.warmup + args.steps)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(
        json.dumps(
            {
                "ranks": args.ranks,
                "ms_per_step": {
                    "median": statistics.median(timed) * 1e3,
                    "min": min(timed) * 1e3,
                    "max": max(timed) * 1e3,
                },
                "tracemalloc_peak_mib": peak / 2**20,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
