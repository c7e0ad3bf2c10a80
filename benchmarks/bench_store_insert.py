"""One 10,240-GPU step's raw ops into embedded chDB: the insert's CPU, by engine setting.

Run from the repo root:

    .venv/bin/python benchmarks/bench_store_insert.py --repeat 7 --json

The step: DP 160 x PP 8, 32 microbatches (a 10,240-GPU job with TP 8 reporting from its
tp0 ranks), cut into messages as the hooks cut it
(``replay_repeated``), the ops of its first step as ``Store.insert_ops`` stores them
(233,280 records). Each variant inserts the same columns (``Store.insert_columns``, an
Arrow table) into the ``ops`` table of one fresh chDB directory, in turn with the
others, ``--repeat`` times; figures are the process's CPU time (user + system of every
thread: chDB's insert threads are the cost) and wall time per insert, median and range.
Merges are stopped so that they do not land in one variant's figures. Variants:

- ``collapse``: ClickHouse's default, ``optimize_on_insert=1`` (ReplacingMergeTree
  collapses repeated keys within each insert);
- ``no-collapse``: ``optimize_on_insert=0``, what ``Store.insert_ops`` uses;
- ``no-collapse-1-thread``: also ``max_threads=1, max_insert_threads=1``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from typing import Any

from rankwatch.schemas.batching import BatchingRule
from rankwatch.schemas.tables import ops_columns
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.replay import replay_repeated

VARIANTS: dict[str, dict[str, Any]] = {
    "collapse": {"optimize_on_insert": 1},
    "no-collapse": {"optimize_on_insert": 0},
    "no-collapse-1-thread": {"optimize_on_insert": 0, "max_threads": 1, "max_insert_threads": 1},
}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trace, meta = generate_trace(
        GenConfig(dp=160, pp=8, microbatches=32, steps=2, stragglers=(Straggler(1, 2, 1.4),))
    )
    batches = [
        b.batch for b in replay_repeated(trace, meta, "b", time.time_ns(), 1, BatchingRule(), 1.0)
    ]
    first = int(batches[0].step[0])
    columns = ops_columns([b for b in batches if int(b.step[0]) == first])
    with Store.connect(f"chdb://{tempfile.mkdtemp()}/db", housekeeping_nice=0) as store:
        store.migrate()
        store.query("SYSTEM STOP MERGES ops")
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
        for _ in range(args.repeat):
            for name, settings in VARIANTS.items():
                c0, w0 = _cpu_s(), time.perf_counter()
                store.insert_columns("ops", columns, settings=settings)
                runs[name].append((_cpu_s() - c0, time.perf_counter() - w0))
    out = {"records": len(columns["step"]), "repeat": args.repeat}
    for name, pairs in runs.items():
        cpu = [c for c, _ in pairs]
        out[name] = {
            "cpu_ms_median": 1e3 * statistics.median(cpu),
            "cpu_ms_min": 1e3 * min(cpu),
            "cpu_ms_max": 1e3 * max(cpu),
            "wall_ms_median": 1e3 * statistics.median(w for _, w in pairs),
        }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name in VARIANTS:
        v = out[name]
        print(
            f"{name:22s} CPU {v['cpu_ms_median']:6.1f} ms ({v['cpu_ms_min']:.1f}-"
            f"{v['cpu_ms_max']:.1f}), wall {v['wall_ms_median']:.1f} ms"
        )


if __name__ == "__main__":
    main()
