"""What the alert rules cost the ops worker per analysed step: ``StragglerAlerts.observe``
on a step's attributions (one per worker, stage, DP rank and op type), the window full
(docs/detection.md, section 4), and ``SlowdownDetector.observe`` on a step's per-rank
signals, noisy around a level, baselines full (section 3: medians, the noise band, the
symptom rule). Median and min..max of ``--repeats`` passes over ``--steps`` steps per job
shape, and the tracemalloc peak of one pass. ``--noise-k 0`` measures the detector
without its noise band, for the ratio.

    .venv/bin/python benchmarks/bench_alerts.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from functools import partial

from rankwatch.streams.ops.alerts import StragglerAlerts
from rankwatch.streams.slowdown.detector import DetectorConfig, SlowdownDetector
from rankwatch.streams.slowdown.signals import Signals

OPTYPES = ("forward-compute", "backward-compute", "dp-allreduce", "forward-send")


def attributions(dp: int, pp: int, rng: random.Random) -> list[tuple[str, str, float]]:
    out = [("worker", f"{d},{p}", 1 + 0.1 * rng.random()) for d in range(dp) for p in range(pp)]
    out += [("stage", str(p), 1.05) for p in range(pp)]
    out += [("dp_rank", str(d), 1.05) for d in range(dp)]
    return out + [("optype", o, 1.02) for o in OPTYPES]


def one_pass(steps: list[list[tuple[str, str, float]]]) -> float:
    alerts = StragglerAlerts()
    start = time.perf_counter()
    for i, attrs in enumerate(steps):
        alerts.observe("j", i, i, 1.1, attrs)
    return (time.perf_counter() - start) / len(steps)


def signals(dp: int, pp: int, step: int, rng: random.Random) -> list[Signals]:
    """One step's signals of every rank: each value a factor of noise around its level."""

    def noisy(level: float) -> float:
        return level * rng.lognormvariate(0.0, 0.3)

    return [
        Signals(
            job="j",
            step=step,
            rank=d + dp * p,
            host=f"h{d}",
            dp_rank=d,
            pp_rank=p,
            start_ns=step * 10**8,
            t_step=0.1,
            t_inter=0.002,
            v_inter=0.02,
            v_minority=noisy(0.03),
            throughput=noisy(300.0),
            flops_per_s=noisy(1e12),
            busbw=noisy(1e10),
            gc_s=noisy(0.001),
            gc_count=1,
            data_wait_s=noisy(0.002),
            issue_p50_us=None,
            issue_p99_us=None,
        )
        for p in range(pp)
        for d in range(dp)
    ]


def detector_pass(steps: list[list[Signals]], noise_k: float) -> float:
    detector = SlowdownDetector(DetectorConfig(noise_k=noise_k))
    for warm in steps[:30]:  # baselines full before the clock starts
        detector.observe(warm)
    start = time.perf_counter()
    for step in steps[30:]:
        detector.observe(step)
    return (time.perf_counter() - start) / (len(steps) - 30)


def report(name: str, runs: list[float], peak: int) -> None:
    print(
        f"{name}: {statistics.median(runs):8.0f} us/step"
        f" (min {min(runs):.0f}, max {max(runs):.0f}), peak {peak / 2**20:.2f} MiB"
    )


def peak_of(call: Callable[[], object]) -> int:
    tracemalloc.start()
    call()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--noise-k", type=float, default=DetectorConfig().noise_k)
    args = parser.parse_args()
    rng = random.Random(1)
    for dp, pp in ((2, 2), (32, 4), (128, 8)):
        steps = [attributions(dp, pp, rng) for _ in range(args.steps)]
        runs = [one_pass(steps) * 1e6 for _ in range(args.repeats)]
        peak = peak_of(partial(one_pass, steps))
        report(f"straggler {dp * pp:5d} workers ({dp}x{pp})", runs, peak)
    for dp, pp in ((2, 2), (32, 4), (128, 8)):
        steps_s = [signals(dp, pp, n, rng) for n in range(min(args.steps, 130))]
        runs = [detector_pass(steps_s, args.noise_k) * 1e6 for _ in range(args.repeats)]
        peak = peak_of(partial(detector_pass, steps_s, args.noise_k))
        report(f"signals   {dp * pp:5d} ranks   ({dp}x{pp}), noise_k {args.noise_k:g}", runs, peak)


if __name__ == "__main__":
    main()
