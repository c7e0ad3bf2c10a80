"""Memory per op record in the ops worker's pipeline, in-process (issue 19's "B/op").

Run from the repo root:

    .venv/bin/python benchmarks/bench_worker_memory.py --gen 128x8x16x24
    .venv/bin/python benchmarks/bench_worker_memory.py --gen 160x8x32x24 [--ops-version 2]

A generated 1F1B job (one straggler) is replayed as the hooks send it (ops v3 frames, or
v2 JSON with ``--ops-version 2``; these jobs' steps are longer than the hooks' batching
window, so one message per rank and step) into the worker's pipeline with raw ops kept,
as ``rankwatch worker`` runs it. The first ``window`` + 1 steps fill the rolling ideal
window; then, for each measured step, Python's allocator is traced (``tracemalloc``:
numpy's buffers are traced too) while its messages are decoded, assembled, analysed and
turned into rows.
The worker keeps a step's raw messages (the faust events waiting for their
acknowledgement) and its output (the sink's buffer) until the step is stored, so this
holds both until the step closes. Reported, per record of the step:

- ``peak_b_per_op``: the largest extra memory while the step was in flight;
- ``retained_b_per_op``: what stays once the step is stored (windows, counters), which
  bounds the worker's steady growth.

Figures: benchmarks/README.md, "Worker memory per op".
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from typing import Any

import numpy as np

from rankwatch.schemas.codec import encode_ops
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.ops.alerts import StragglerAlerts
from rankwatch.streams.ops.analyser import DEFAULT_WINDOW, WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import replay_batches


def messages_by_step(
    gen: str, version: int = 3
) -> tuple[dict[int, list[bytes]], dict[int, int], int]:
    """The encoded messages of each step, its record count, and the reporting ranks."""
    dp, pp, mb, steps = (int(v) for v in gen.lower().split("x"))
    trace, meta = generate_trace(
        GenConfig(dp=dp, pp=pp, microbatches=mb, steps=steps, stragglers=(Straggler(1, 2, 1.4),))
    )
    by_step: dict[int, list[bytes]] = {}
    records: dict[int, int] = {}
    for b in replay_batches(trace, meta, "bench", time.time_ns()):
        step = int(np.min(b.batch.step))
        if len(b.batch.steps_done) != 1:
            raise SystemExit(f"{gen}: steps shorter than the batching window, not measured here")
        by_step.setdefault(step, []).append(encode_ops(b.batch, version=version))
        records[step] = records.get(step, 0) + len(b.batch)
    return by_step, records, dp * pp


def run(gen: str, window: int, version: int = 3) -> dict[str, Any]:
    by_step, records, ranks = messages_by_step(gen, version)
    steps = sorted(by_step)
    if len(steps) <= window + 2:
        raise SystemExit(f"--gen needs more than {window + 2} steps (window {window})")
    pipeline = Pipeline(
        assembly=AssemblyConfig(grace_s=1e9),
        analyser=WhatIfAnalyser(window=window),
        alerts=StragglerAlerts(),
        keep_ops=True,
    )
    peaks, retained = [], []
    for step in steps:
        measured = step > window
        if measured:
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
        held_messages, held = list(by_step.pop(step)), Output()
        for m in held_messages:  # the events wait for their step to be stored
            held.extend(pipeline.on_message(m, Source("ops"), 0))
        if measured:
            peak = tracemalloc.get_traced_memory()[1] - before
        del held_messages, held  # stored: acknowledged, the buffer flushed
        if measured:
            retained.append((tracemalloc.get_traced_memory()[0] - before) / records[step])
            peaks.append(peak / records[step])
            tracemalloc.stop()
    return {
        "gen": gen,
        "ops_version": version,
        "reporting_ranks": ranks,
        "records_per_step": statistics.median(records.values()),
        "window": window,
        "measured_steps": len(peaks),
        "peak_b_per_op_median": round(statistics.median(peaks), 1),
        "peak_b_per_op_max": round(max(peaks), 1),
        "retained_b_per_op_median": round(statistics.median(retained), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gen", default="128x8x16x24", metavar="DPxPPxMBxSTEPS")
    parser.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    parser.add_argument("--ops-version", type=int, default=3, choices=(2, 3))
    args = parser.parse_args()
    print(json.dumps(run(args.gen, args.window, args.ops_version)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
