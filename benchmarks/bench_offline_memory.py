"""Offline what-if at 1,024 or 10,240 workers: wall time and memory per op, in a fresh process.

Run from the repo root:

    .venv/bin/python benchmarks/bench_offline_memory.py --repeat 7
    .venv/bin/python benchmarks/bench_offline_memory.py --gpus 10240 --repeat 5

The job: DP 64 x PP 16 (``--gpus 1024``) or DP 640 x PP 16 (``--gpus 10240``, every
GPU records its ops), 32 microbatches, 1F1B, 8 steps (``--steps``), one straggler. At
1,024 GPUs that is 1,557,504 ops, the size of the published straggler artifact's
1,024-worker case (the artifact's source is not in this repository; its figures, 11.38 s
and 801 MiB, are the recorded ones); at 10,240, 15,575,040 ops.
The trace is generated once into a temporary parquet file (or ``--trace FILE``, written
there if missing). Each run is a new process
(BLAS single-threaded) that imports rankwatch, reads the file (``rankwatch.traceio``)
and analyses it (``rankwatch.sim.analyse``), as ``rankwatch whatif`` does; it reports
the read and analyse wall times, the process's CPU time over both (user + system: less
sensitive to other work on the machine) and its peak RSS (VmHWM). Bytes per op: the peak RSS
above the RSS after the imports (interpreter, numpy, pyarrow), over the op count.
``--other DIR`` also measures the rankwatch package found under DIR (e.g. a link tree of
an older commit, benchmarks/README.md) with the same script, run for run alternating with
this one, so both see the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RUN = """
import json, re, sys, time
import pyarrow.parquet  # noqa: F401  (import cost is not part of the figures)
from rankwatch.traceio import read_trace
from rankwatch.sim import analyse
from rankwatch.sim.trace import JobMeta

def hwm():  # VmHWM: this process's own peak (ru_maxrss keeps the parent's across exec)
    with open("/proc/self/status") as f:
        return 1024 * int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1))

base = hwm()
c0 = time.process_time()
t0 = time.perf_counter()
trace = read_trace(sys.argv[1])
t1 = time.perf_counter()
read_peak = hwm()
dp, pp = int(sys.argv[2]), int(sys.argv[3])
result = analyse(trace, JobMeta(dp_size=dp, pp_size=pp, vpp_size=1, world_size=dp * pp))
t2 = time.perf_counter()
c2 = time.process_time()
peak = hwm()
print(json.dumps({"ops": len(trace), "read_s": t1 - t0, "analyse_s": t2 - t1, "cpu_s": c2 - c0,
                  "base_rss": base, "read_peak_rss": read_peak, "peak_rss": peak,
                  "slowdown": float(result.slowdown)}))
"""


LAYOUTS = {1024: (64, 16), 10240: (640, 16)}
"""GPUs -> (DP, PP) of the benchmark's job."""


def make_trace(path: Path, gpus: int = 1024, steps: int = 8) -> int:
    from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
    from rankwatch.traceio import write_trace

    dp, pp = LAYOUTS[gpus]
    cfg = GenConfig(dp=dp, pp=pp, microbatches=32, steps=steps, stragglers=(Straggler(7, 11, 1.5),))
    trace, _ = generate_trace(cfg)
    write_trace(trace, path)
    return len(trace)


def one_run(path: Path, gpus: int = 1024, pythonpath: str | None = None) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    dp, pp = LAYOUTS[gpus]
    out = subprocess.run(
        [sys.executable, "-c", RUN, str(path), str(dp), str(pp)],
        env=env,
        check=True,
        capture_output=True,
    )
    return json.loads(out.stdout)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    mib = 2**20
    ops = runs[0]["ops"]
    return {
        "ops": ops,
        "runs": len(runs),
        "read_s": spread([r["read_s"] for r in runs]),
        "analyse_s": spread([r["analyse_s"] for r in runs]),
        "total_s": spread([r["read_s"] + r["analyse_s"] for r in runs]),
        "cpu_s": spread([r["cpu_s"] for r in runs]),
        "base_rss_mib": spread([r["base_rss"] / mib for r in runs]),
        "read_peak_rss_mib": spread([r["read_peak_rss"] / mib for r in runs]),
        "peak_rss_mib": spread([r["peak_rss"] / mib for r in runs]),
        "bytes_per_op": spread([(r["peak_rss"] - r["base_rss"]) / ops for r in runs]),
        "slowdown": runs[0]["slowdown"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--gpus", type=int, choices=sorted(LAYOUTS), default=1024)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--trace", type=Path, help="trace file to use (generated if missing)")
    parser.add_argument("--other", help="also measure the rankwatch under this directory")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    trees = {"this": None, **({"other": args.other} if args.other else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace or Path(tmp) / f"trace-{args.gpus}.parquet"
        if not path.exists():
            make_trace(path, args.gpus, args.steps)
        for tree in trees.values():
            one_run(path, args.gpus, tree)  # warm-up: page cache, byte-compiled modules
        for i in range(args.repeat):
            order = list(trees.items())
            for name, tree in order if i % 2 == 0 else reversed(order):
                runs[name].append(one_run(path, args.gpus, tree))
    results = {name: summary(r) for name, r in runs.items()}
    if args.json:
        print(json.dumps(results if args.other else results["this"], indent=2))
        return
    print(f"load {os.getloadavg()[0]:.2f}")
    for name, result in results.items():
        print(
            f"{name}: {result['ops']:,} ops, {result['runs']} runs, slowdown {result['slowdown']}"
        )
        for key in ("read_s", "analyse_s", "total_s", "cpu_s"):
            r = result[key]
            print(f"  {key:10s} median {r['median']:.3f} s  ({r['min']:.3f}..{r['max']:.3f})")
        for key in ("base_rss_mib", "read_peak_rss_mib", "peak_rss_mib"):
            r = result[key]
            print(f"  {key:18s} median {r['median']:.0f} MiB  ({r['min']:.0f}..{r['max']:.0f})")
        b = result["bytes_per_op"]
        print(f"  bytes/op above the imports: {b['median']:.0f} ({b['min']:.0f}..{b['max']:.0f})")


if __name__ == "__main__":
    main()
