"""What the straggler-alert rule costs the ops worker per analysed step (docs/detection.md,
section 4): ``StragglerAlerts.observe`` on a step's attributions (one per worker, stage,
DP rank and op type), the window full. Median and min..max of ``--repeats`` passes over
``--steps`` steps per job shape, and the tracemalloc peak of one pass.

    .venv/bin/python benchmarks/bench_alerts.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

from rankwatch.streams.ops.alerts import StragglerAlerts

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(1)
    for dp, pp in ((2, 2), (32, 4), (128, 8)):
        steps = [attributions(dp, pp, rng) for _ in range(args.steps)]
        runs = [one_pass(steps) * 1e6 for _ in range(args.repeats)]
        tracemalloc.start()
        one_pass(steps)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(
            f"{dp * pp:5d} workers ({dp}x{pp}): {statistics.median(runs):6.0f} us/step"
            f" (min {min(runs):.0f}, max {max(runs):.0f}), peak {peak / 2**20:.2f} MiB"
        )


if __name__ == "__main__":
    main()
