"""Benchmark of the scenario model (rankwatch.sim.scenario): sweeps over a 1,024-GPU job.

Run on one core, from the repo root:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_scenarios.py

The job: one step of a generated DP 64 x PP 16 job (32 microbatches, interleaved VPP 2,
1,024 workers, 8 GPUs per host), calibrated once (graph inference + calibration,
reported apart). Cases, each ``run_scenarios`` with the baseline:

- ``sweep-network``: ``network.inter_gbps`` = 100, 200, 400 (one simulation pass);
- ``sweep-gpu``: ``gpu.model`` = A100, H100, H200;
- ``sweep-microbatches``: 16, 32, 64 (re-shaped: the schedule builder and the
  inference run per shape);
- ``sweep-dp``: ``parallel.dp`` = 32, 64, 128.

Timings: wall-clock median and min..max over ``--repeat`` runs after one warm-up, the
median CPU time, and the tracemalloc peak of one more run.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import resource
import time
from typing import Any

from timing import measure  # benchmarks/timing.py (scripts run from this folder)

SWEEPS = {
    "sweep-network": ("network.inter_gbps", [100, 200, 400]),
    "sweep-gpu": ("gpu.model", ["A100", "H100", "H200"]),
    "sweep-microbatches": ("microbatches", [16, 32, 64]),
    "sweep-dp": ("parallel.dp", [32, 64, 128]),
}


def main() -> None:
    from rankwatch.sim.scenario import Hardware, calibrate_trace, run_scenarios, sweep
    from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cfg = GenConfig(
        dp=64, pp=16, microbatches=32, vpp=2, schedule="interleaved", steps=1,
        stragglers=(Straggler(7, 11, 1.5),),
    )  # fmt: skip
    trace, meta = generate_trace(cfg)
    hardware = Hardware(gpu="A100", inter_gbps=200, intra_gbps=2400, gpus_per_host=8)
    t0 = time.perf_counter()
    cal = calibrate_trace(trace, meta, hardware)
    calibrate_ms = 1e3 * (time.perf_counter() - t0)
    out: dict[str, Any] = {
        "ops": len(trace),
        "graph_ops": cal.graph.size,
        "calibrate_ms": calibrate_ms,
    }
    for name, (key, values) in SWEEPS.items():
        scenarios = sweep(key, values)
        result = measure(lambda s=scenarios: run_scenarios(cal, s), args.repeat)
        result["step_s"] = [r.step_time_s for r in run_scenarios(cal, scenarios)]
        out[name] = result
    out["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["load"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"{out['ops']} ops, {out['graph_ops']} in the model; calibration {calibrate_ms:.0f} ms; "
        f"max RSS {out['max_rss_mib']:.0f} MiB; load {out['load']:.2f}"
    )
    for name in SWEEPS:
        r = out[name]
        print(
            f"{name:<20} median {r['median_ms']:7.1f} ms  ({r['min_ms']:.1f}..{r['max_ms']:.1f})"
            f"  cpu {r['cpu_median_ms']:.1f} ms  peak {r['peak_mib']:.0f} MiB  "
            f"steps {', '.join(f'{s:.3f}' for s in r['step_s'])} s"
        )


if __name__ == "__main__":
    main()
