"""The live what-if of a job's steps analysed together against one at a time.

Run on one core, from the repo root:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_steps_together.py [--repeat 5]

The worker's own analyser (``WhatIfAnalyser``, window 20) over every step of the shipped
SE and ST traces, in order, in passes of ``K`` steps (``analyse_many``; K = 1 is one
step at a time, as the worker did before it deferred closed steps to its next store):
CPU per step, median (min..max) over ``--repeat`` runs after one warm-up, each run with
a fresh analyser (the graph inferred once, counted). Every pass size must give the
numbers of K = 1 exactly, or the script fails. No Kafka, no store: what the analysis
alone saves when a worker closed several steps of a job since its last store
(docs/whatif.md, "Offline and live figures").
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "stragglers"
PASSES = (1, 2, 4, 8, 26)
"""26: the SE steps of the worker's bound (``DEFER_OPS``, 65,536 ops)."""


def steps_of(name: str) -> list[Any]:
    from rankwatch.streams.ops.assembly import AssembledStep
    from rankwatch.traceio import read_meta, read_trace

    trace, meta = read_trace(DATA / f"trace-{name}.parquet"), read_meta(DATA / f"meta-{name}.yaml")
    layout = (meta.dp_size, meta.pp_size)
    return [
        AssembledStep(name, s, 0, trace.select(trace.step == s), False, (), layout)
        for s in np.unique(trace.step).tolist()
    ]


def run(steps: list[Any], k: int) -> list[Any]:
    from rankwatch.streams.ops.analyser import WhatIfAnalyser

    analyser = WhatIfAnalyser()
    out: list[Any] = []
    for first in range(0, len(steps), k):
        out += analyser.analyse_many(steps[first : first + k])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for name in ("SE", "ST"):
        if not (DATA / f"trace-{name}.parquet").exists():
            print(f"skip {name}: {DATA} absent")
            continue
        steps = steps_of(name)
        alone = run(steps, 1)
        for k in PASSES:
            if run(steps, k) != alone:
                raise SystemExit(f"{name}: passes of {k} steps changed a number")
            cpu = []
            for _ in range(args.repeat + 1):
                c = time.process_time()
                run(steps, k)
                cpu.append((time.process_time() - c) / len(steps))
            cpu = cpu[1:]
            print(
                f"{name} ({len(steps)} steps, {len(steps[0].trace):,} ops a step), passes of "
                f"{k:2d}: {1e3 * statistics.median(cpu):.3f} ms CPU a step "
                f"({1e3 * min(cpu):.3f}..{1e3 * max(cpu):.3f})"
            )


if __name__ == "__main__":
    main()
