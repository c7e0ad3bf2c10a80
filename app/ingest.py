"""A whole job's op-batch messages through the ops worker's pipeline, into the store.

What ``rankwatch demo`` and the embedded ``rankwatch workload`` share: the messages
(as the hooks sent them, with their send times as the clock) are assembled into steps,
analysed live (rolling ideal, as in a cluster) and stored in the configured store,
replacing any earlier rows of the same job id. The analysed steps come back as one
trace, exactly as the analyser saw them, so the offline engine (and ``rankwatch
whatif`` on the exported file) reads the same input the stored figures came from.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.errors import UserError

if TYPE_CHECKING:
    from rankwatch.sim import JobMeta, Trace

STEPS_SQL = (
    "SELECT step, t_base, t_sim, t_ideal, slowdown, partial, n_ops "
    "FROM steps FINAL WHERE job = {job:String} ORDER BY step"
)


@dataclass(frozen=True)
class StoredJob:
    job: str
    rows: list[dict[str, Any]]
    """The job's ``steps`` table, read back from the store."""
    trace: Trace
    """Every analysed step's records, as the analyser read them."""
    meta: JobMeta
    messages: int
    elapsed_s: float
    where: str
    """The store, as a DSN without password."""


def store_job(
    messages: Iterable[tuple[bytes, int]],
    job: str,
    dsn: str | None = None,
    meta: JobMeta | None = None,
) -> StoredJob:
    """Feed ``(message, sent_ns)`` pairs (send order) through a fresh pipeline into the
    store at ``dsn`` (default: the configured one). ``meta``: the job's sizes when known
    (else taken from the assembled steps)."""
    from rankwatch.schemas.topics import TOPICS
    from rankwatch.stores import forget_job, open_store
    from rankwatch.streams.analyser import WhatIfAnalyser
    from rankwatch.streams.pipeline import Pipeline, Source
    from rankwatch.streams.sink import TableSink

    with open_store(dsn, migrate=True) as store:
        forget_job(store, job)
        pipeline = Pipeline(analyser=WhatIfAnalyser())
        sink = TableSink(store)
        source = Source(topic=TOPICS["ops"])
        steps = []
        fed = now_ns = 0
        started = time.perf_counter()
        for value, now_ns in messages:
            out = pipeline.on_message(value, source, now_ns)
            out.extend(pipeline.on_tick(now_ns))
            sink.write(out)
            steps += out.steps
            fed += 1
        out = pipeline.flush(now_ns)
        sink.write(out)
        sink.flush()
        steps += out.steps
        elapsed = time.perf_counter() - started
        rows = store.query(STEPS_SQL, {"job": job})
        where = store.where
    analysed = [s for s in steps if not s.partial]
    if not analysed:
        raise UserError(f"job {job}: no complete step was assembled")
    trace = _concat([s.trace for s in analysed])
    if meta is None:
        from rankwatch.sim import JobMeta

        dp, pp = analysed[0].layout
        meta = JobMeta(dp_size=dp, pp_size=pp, vpp_size=int(trace.mc.max()) + 1)
    return StoredJob(job, rows, trace, meta, fed, elapsed, where)


def export(stored: StoredJob, directory: Path) -> tuple[Path, Path]:
    """Write the analysed trace and its sizes as ``trace.parquet`` and ``meta.yaml``
    (the input of ``rankwatch whatif``)."""
    import yaml

    from rankwatch.traceio import write_trace

    directory.mkdir(parents=True, exist_ok=True)
    trace_path, meta_path = directory / "trace.parquet", directory / "meta.yaml"
    write_trace(stored.trace, trace_path)
    sizes = {f.name: getattr(stored.meta, f.name) for f in fields(stored.meta)}
    meta_path.write_text(yaml.safe_dump({"job": stored.job, **sizes}, sort_keys=False))
    return trace_path, meta_path


def _concat(traces: list[Trace]) -> Trace:
    import numpy as np

    from rankwatch.sim import Trace

    names = [f.name for f in fields(Trace)]
    return Trace(**{n: np.concatenate([getattr(t, n) for t in traces]) for n in names})
