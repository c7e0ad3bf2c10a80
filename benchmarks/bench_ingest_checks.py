"""What the ingest-side trust checks cost: job identity and storage deduplication.

Every op batch a worker takes is now checked against its job's fixed identity
(``rankwatch.streams.ops.identity``: key, sizes, rank coordinates, step window), and the
pipeline works out which of its steps are already stored (late records and batches
stored before a restart are not stored again). This times the worker's pipeline
in-process (decode, checks, assembly, raw-ops rows; the what-if analysis off, so the
checks' share is not diluted by the heaviest stage) with the checks on and off, runs
interleaved in one process so machine noise hits both alike:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_ingest_checks.py --repeat 9

``--analyse`` adds the what-if analysis (the worker's full per-message work). Traces:
SE (shipped, when ../shared/data is there) and GEN (generated DP 16 x PP 8).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankwatch.schemas.codec import encode_ops
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.output import Source
from rankwatch.streams.ops.alerts import StragglerAlerts
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig, StepAssembler, _Job
from rankwatch.streams.ops.identity import JobIdentities
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import replay_batches
from rankwatch.traceio import read_meta, read_trace

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "stragglers"


class _NoIdentity:
    """The identity checks switched off (what the pipeline did before them)."""

    def check(self, batch: Any, key: Any = None) -> None:
        return None

    def accept(self, batch: Any) -> None:
        return None


def _traces() -> dict[str, tuple[Any, Any]]:
    out = {}
    if (DATA / "trace-SE.parquet").exists():
        out["SE"] = (read_trace(DATA / "trace-SE.parquet"), read_meta(DATA / "meta-SE.yaml"))
    cfg = GenConfig(dp=16, pp=8, microbatches=32, steps=8, stragglers=(Straggler(3, 5, 1.4),))
    out["GEN"] = generate_trace(cfg)
    return out


def _pipeline(checks: bool, analyse: bool) -> Pipeline:
    pipeline = Pipeline(
        assembly=AssemblyConfig(grace_s=1e9),
        analyser=WhatIfAnalyser() if analyse else None,
        alerts=StragglerAlerts() if analyse else None,
        keep_ops=True,
    )
    if not checks:
        pipeline.identity = _NoIdentity()  # type: ignore[assignment]
        pipeline.assembler._late_steps = lambda job, batch: frozenset()  # type: ignore[method-assign]
    return pipeline


def _run(messages: list[tuple[bytes, bytes]], checks: bool, analyse: bool) -> float:
    pipeline = _pipeline(checks, analyse)
    gc.collect()
    began = time.perf_counter()
    for key, value in messages:
        pipeline.on_message(value, Source("ops", 0, -1, key), 0)
    pipeline.flush(0)
    return time.perf_counter() - began


def _checks_alone(batches: list[Any], repeat: int) -> dict[str, float]:
    """The checks by themselves, per batch: identity check + accept, and the late-step
    lookup against a job with 4,096 closed steps. Minimum over repeats: noise on a
    shared machine only ever adds."""
    job = _Job(layout=(batches[0].dp_size, batches[0].pp_size))
    job.closed.update(dict.fromkeys(range(10**6, 10**6 + 4096)))
    identity, late = [], []
    for _ in range(repeat):
        ids = JobIdentities()
        _forget_spans(batches)
        began = time.perf_counter()
        for b in batches:
            ids.check(b, b.job.encode())
            ids.accept(b)
        identity.append(time.perf_counter() - began)
        _forget_spans(batches)
        began = time.perf_counter()
        for b in batches:
            StepAssembler._late_steps(job, b)
        late.append(time.perf_counter() - began)
    n = len(batches)
    return {
        "identity_us_per_batch_min": round(min(identity) / n * 1e6, 2),
        "late_steps_us_per_batch_min": round(min(late) / n * 1e6, 2),
    }


def _forget_spans(batches: list[Any]) -> None:
    """Each check pays for its batch's step span, as a batch fresh off the wire does
    (``OpBatch.step_span`` is worked out once and kept on the batch)."""
    for b in batches:
        b.__dict__.pop("step_span", None)


def _peak_mib(run: Callable[[], float]) -> float:
    tracemalloc.start()
    run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def measure(trace: Any, meta: Any, repeat: int, analyse: bool) -> dict[str, Any]:
    batches = list(replay_batches(trace, meta, "job-bench", origin_ns=1_700_000_000 * 10**9))
    messages = [(b.batch.job.encode(), encode_ops(b.batch)) for b in batches]
    records = sum(len(b.batch) for b in batches)
    walls: dict[bool, list[float]] = {True: [], False: []}
    _run(messages, True, analyse)  # warm-up
    for _ in range(repeat):
        for checks in (False, True):  # interleaved: noise hits both alike
            walls[checks].append(_run(messages, checks, analyse))
    out: dict[str, Any] = {"records": records, "messages": len(messages)}
    for checks, name in ((False, "without_checks"), (True, "with_checks")):
        w = walls[checks]
        out[name] = {
            "records_per_s_median": round(records / statistics.median(w)),
            "records_per_s_min_max": [round(records / max(w)), round(records / min(w))],
            "wall_s_median": round(statistics.median(w), 4),
            "peak_mib": round(_peak_mib(lambda c=checks: _run(messages, c, analyse)), 1),
        }
    out["checks_alone"] = _checks_alone([b.batch for b in batches], repeat)
    out["pipeline_us_per_batch_min"] = {
        name: round(min(walls[c]) / len(messages) * 1e6, 1)
        for c, name in ((False, "without_checks"), (True, "with_checks"))
    }
    ratios = [a / b for a, b in zip(walls[True], walls[False], strict=True)]
    out["cost_ratio_median"] = round(statistics.median(ratios), 3)
    out["cost_ratio_min_max"] = [round(min(ratios), 3), round(max(ratios), 3)]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--analyse", action="store_true", help="with the what-if analysis")
    args = parser.parse_args()
    result = {
        name: measure(trace, meta, args.repeat, args.analyse)
        for name, (trace, meta) in _traces().items()
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
