"""The what-if of one step at a time, as a stream worker runs it, at 1,024 or 10,240 workers.

Run from the repo root:

    .venv/bin/python benchmarks/bench_online_step.py --gpus 10240 --repeat 7

The job of ``bench_offline_memory.py`` (DP 64 or 640 x PP 16, 32 microbatches, 1F1B,
one straggler); its first step, once the graph is inferred (once per job, reported
apart), is analysed ``--repeat`` times after one warm-up, each time as a worker does per
complete step: ``measure_trace``, ``RollingIdeal.push(...).ideal()`` and
``analyse_measured`` with the job's kept ``Workspace``. Wall and CPU time per step,
median (min..max); the process's peak RSS (it holds the whole generated trace too).
No Kafka, no store: the engine's share of the live worker's time per step.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_offline_memory import LAYOUTS, make_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--gpus", type=int, choices=sorted(LAYOUTS), default=1024)
    parser.add_argument("--trace", type=Path, help="trace file to use (generated if missing)")
    args = parser.parse_args()

    from rankwatch.sim import (
        JobMeta,
        RollingIdeal,
        Workspace,
        analyse_measured,
        infer_graph,
        measure_trace,
    )
    from rankwatch.traceio import read_trace

    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace or Path(tmp) / f"trace-{args.gpus}.parquet"
        if not path.exists():
            make_trace(path, args.gpus, steps=2)
        trace = read_trace(path)
    step = trace.select(trace.step == trace.step.min())
    dp, pp = LAYOUTS[args.gpus]
    t = time.perf_counter()
    graph = infer_graph(step, JobMeta(dp_size=dp, pp_size=pp))
    infer_s = time.perf_counter() - t
    workspace = Workspace()
    wall, cpu = [], []
    for _ in range(args.repeat + 1):
        t, c = time.perf_counter(), time.process_time()
        measured = measure_trace(graph, step)
        ideal = RollingIdeal().push(graph, measured).ideal()
        result = analyse_measured(graph, measured, ideal, workspace)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    wall, cpu = wall[1:], cpu[1:]  # the first allocates the workspace
    with open("/proc/self/status") as f:
        peak = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) / 1024  # type: ignore[union-attr]
    print(
        f"{args.gpus} GPUs, one step of {len(step):,} ops, {args.repeat} runs: "
        f"wall median {statistics.median(wall):.3f} s ({min(wall):.3f}..{max(wall):.3f}), "
        f"CPU median {statistics.median(cpu):.3f} s; infer_graph {infer_s:.3f} s once; "
        f"workspace {workspace.nbytes / 2**20:.0f} MiB; peak RSS {peak:.0f} MiB; "
        f"S {result.slowdown:.4f}"
    )


if __name__ == "__main__":
    main()
