"""Benchmark of the what-if engine (rankwatch.sim): offline whole traces, one online step.

Run on one core, from the repo root:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_whatif.py

Cases:
- ``SE``/``ST`` offline: ``analyse(trace, meta)`` on the shipped traces (read once
  beforehand; S, launch slowdown, all attributions, S_w, M_W and M_S included);
  skipped when ``../shared/data/stragglers`` is absent.
- ``online-1024``: one step of a generated DP 64 x PP 16 job (32 microbatches,
  interleaved VPP 2, 1,024 workers): ``measure_trace`` + ``RollingIdeal.push`` +
  ``analyse_measured``, the work a stream worker does per complete step (the graph is
  inferred once per job, its time reported apart; the scratch ``Workspace`` is kept
  across steps, as a worker keeps it per job).

Timings: wall-clock median and spread (min..max) over ``--repeat`` runs after one
warm-up, and the median CPU time of the process (what the run costs when other
processes share the core: the wall clock then includes their time slices).
Peak memory: tracemalloc peak of one extra run (numpy reports its buffers to it), and
the process's max RSS at the end.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import resource
import time
from pathlib import Path

from timing import measure  # benchmarks/timing.py (scripts run from this folder)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "stragglers"


def offline_cases(repeat: int) -> dict[str, dict[str, float]]:
    from rankwatch.sim import analyse
    from rankwatch.traceio import read_meta, read_trace

    out = {}
    for name in ("SE", "ST"):
        path = DATA / f"trace-{name}.parquet"
        if not path.exists():
            print(f"skip {name}: {path} absent")
            continue
        trace, meta = read_trace(path), read_meta(DATA / f"meta-{name}.yaml")
        result = measure(lambda t=trace, m=meta: analyse(t, m), repeat)
        result["ops"] = len(trace)
        out[f"offline-{name}"] = result
    return out


def online_case(repeat: int) -> dict[str, dict[str, float]]:
    from rankwatch.sim import (
        RollingIdeal,
        Workspace,
        analyse_measured,
        infer_graph,
        measure_trace,
    )
    from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace

    cfg = GenConfig(
        dp=64,
        pp=16,
        microbatches=32,
        vpp=2,
        schedule="interleaved",
        steps=2,
        stragglers=(Straggler(7, 11, 1.5),),
    )
    trace, meta = generate_trace(cfg)
    step0, step1 = (trace.select(trace.step == s) for s in (0, 1))
    t0 = time.perf_counter()
    graph = infer_graph(step0, meta)
    infer_ms = 1e3 * (time.perf_counter() - t0)
    window = RollingIdeal().push(graph, measure_trace(graph, step0))
    workspace = Workspace()  # a worker keeps one per job, like the graph

    def one_step() -> object:
        measured = measure_trace(graph, step1)
        ideal = window.push(graph, measured).ideal()
        return analyse_measured(graph, measured, ideal, workspace)

    result = measure(one_step, repeat)
    result["ops"] = len(step1)
    result["graph_ops"] = graph.size
    result["levels"] = len(graph.levels)
    result["infer_graph_ms"] = infer_ms
    return {"online-1024": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    t0 = time.perf_counter()
    import rankwatch.sim  # noqa: F401  (import time is not part of the figures)

    import_ms = 1e3 * (time.perf_counter() - t0)
    results = {**offline_cases(args.repeat), **online_case(args.repeat)}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.json:
        print(json.dumps({"import_ms": import_ms, "max_rss_mib": rss, **results}, indent=2))
        return
    load = os.getloadavg()[0]
    print(
        f"import rankwatch.sim: {import_ms:.0f} ms; process max RSS {rss:.0f} MiB; load {load:.2f}"
    )
    for name, r in results.items():
        extra = ", ".join(
            f"{k} {v:.0f}"
            for k, v in r.items()
            if k in ("ops", "graph_ops", "levels", "infer_graph_ms")
        )
        print(
            f"{name:12s} median {r['median_ms']:7.1f} ms  (min {r['min_ms']:.1f}, "
            f"max {r['max_ms']:.1f}, {r['runs']:.0f} runs; CPU median {r['cpu_median_ms']:.1f} ms)"
            f"  peak {r['peak_mib']:.0f} MiB  [{extra}]"
        )


if __name__ == "__main__":
    main()
