"""Where an ops message's CPU goes in the worker's pure core: decoding, taking it in
(with and without the what-if of the steps it closes) and building the raw-ops columns.

Run from the repo root (about a minute; the SE trace from ../shared/data):

    .venv/bin/python benchmarks/bench_ingest_parts.py [--copies 10] [--relay-s 0.05] [--repeat 3]

The messages are the SE trace's, ``--copies`` times as one longer job, cut as the
hooks cut them and bundled by a relay per host (``--relay-s``; 0: one frame a
message), all encoded before timing. Each pass feeds them, in order, to
``decode_ops_members`` and then ``Pipeline.on_members`` (raw ops kept), and builds the
``ops`` table's columns of every 2,000 kept batches (``ops_columns``, as a flush does);
each part is timed by the process's CPU clock around its calls, so a garbage
collection counts where it happens (``--no-gc`` turns the collector off). Passes
alternate without and with the what-if; ``--repeat`` of each: median and range, in µs
a message. No Kafka, faust or store: ``bench_stream.py`` drains the same traffic
through the whole worker.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rankwatch.schemas import joined
from rankwatch.schemas.batching import BatchingRule, RelayRule
from rankwatch.schemas.codec import OpBatch, decode_ops_members, encode_ops
from rankwatch.schemas.tables import ops_columns
from rankwatch.streams.kit.output import Source
from rankwatch.streams.ops.alerts import StragglerAlerts
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import relay_timeline, replay_repeated
from rankwatch.traceio import read_meta, read_trace

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "stragglers"
FLUSH_BATCHES = 2000


def messages(copies: int, relay_s: float, join: bool = True) -> list[tuple[bytes, bytes]]:
    """(key, value) of each message the hooks (through a relay per host) send."""
    trace, meta = read_trace(DATA / "trace-SE.parquet"), read_meta(DATA / "meta-SE.yaml")
    batches = replay_repeated(trace, meta, "bench", time.time_ns(), copies, BatchingRule(), 1.0)
    sent = [(b, encode_ops(b.batch)) for b in batches]
    if relay_s <= 0:
        return [(b.batch.job.encode(), frame) for b, frame in sent]
    out = []
    for m in relay_timeline(sent, RelayRule(linger_s=relay_s, join=join)):
        out.append((m.job.encode(), joined.message(list(m.frames), join)))
    return out


def one_pass(encoded: list[tuple[bytes, bytes]], what_if: bool) -> dict[str, float]:
    """CPU seconds of each part over every message."""
    pipeline = Pipeline(
        assembly=AssemblyConfig(grace_s=1e9),
        analyser=WhatIfAnalyser() if what_if else None,
        alerts=StragglerAlerts() if what_if else None,
        keep_ops=True,
    )
    spent = {"decode": 0.0, "take in": 0.0, "ops columns": 0.0}
    kept: list[Any] = []
    clock = time.process_time
    for key, value in encoded:
        t0 = clock()
        members = decode_ops_members(value)
        t1 = clock()
        out = pipeline.on_members(members, value, Source("ops", key=key), 0)
        t2 = clock()
        spent["decode"] += t1 - t0
        spent["take in"] += t2 - t1
        kept += out.ops
        if len(kept) >= FLUSH_BATCHES:
            t0 = clock()
            ops_columns(kept)
            spent["ops columns"] += clock() - t0
            kept = []
    return spent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument("--relay-s", type=float, default=0.05)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-gc", action="store_true")
    parser.add_argument(
        "--no-join", action="store_true", help="bundles of whole frames (x-bundle), not joined"
    )
    args = parser.parse_args()
    if not DATA.is_dir():
        print(f"skipped: {DATA} is absent")
        return 0
    encoded = messages(args.copies, args.relay_s, join=not args.no_join)
    if args.no_gc:
        gc.disable()
    runs: dict[str, list[dict[str, float]]] = {"without what-if": [], "with what-if": []}
    for _ in range(args.repeat):
        for name, what_if in (("without what-if", False), ("with what-if", True)):
            runs[name].append(one_pass(encoded, what_if))
    n = len(encoded)
    result: dict[str, Any] = {
        "messages": n,
        "records_per_message": _records(encoded) / n,
        "collector": not args.no_gc,
        "joined": not args.no_join,
    }
    for name, passes in runs.items():
        result[name] = {
            part: {
                "median_us_per_message": 1e6 * statistics.median(p[part] for p in passes) / n,
                "range_us_per_message": [
                    1e6 * min(p[part] for p in passes) / n,
                    1e6 * max(p[part] for p in passes) / n,
                ],
            }
            for part in passes[0]
        }
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


def _records(encoded: list[tuple[bytes, bytes]]) -> int:
    members = (got for _, value in encoded for _, got in decode_ops_members(value))
    return sum(len(got) for got in members if isinstance(got, OpBatch))


if __name__ == "__main__":
    sys.exit(main())
