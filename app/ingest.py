"""A whole job's op-batch messages through the ops worker's pipeline, into the store.

What ``rankwatch demo`` and the embedded ``rankwatch workload`` share (the loop itself
is the embedded runner's, :func:`rankwatch.streams.ops.embedded.feed`): the messages
(as the hooks sent them, with their send times as the clock) are assembled into steps,
analysed live (rolling ideal, as in a cluster) and stored in the configured store,
replacing any earlier rows of the same job id. The analysed steps come back as one
trace, exactly as the analyser saw them, so the offline engine (and ``rankwatch
whatif`` on the exported file) reads the same input the stored figures came from.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.errors import UserError

if TYPE_CHECKING:
    from rankwatch.sim import JobMeta, Trace
    from rankwatch.streams.ops.assembly import AssembledStep
    from rankwatch.streams.ops.pipeline import Pipeline
    from rankwatch.workload.config import WorkloadConfig
    from rankwatch.workload.launch import JobResult

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
    from rankwatch.stores import forget_job, open_store
    from rankwatch.streams.kit.sink import TableSink
    from rankwatch.streams.ops.embedded import feed

    with open_store(dsn, migrate=True) as store:
        forget_job(store, job)
        steps: list[AssembledStep] = []
        started = time.perf_counter()
        fed = feed(messages, configured_pipeline(), TableSink(store), steps)
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


def configured_pipeline() -> Pipeline:
    """The ops worker's pipeline with the configured settings (config file and
    environment, as ``rankwatch worker`` reads them): an embedded run raises the alerts,
    and stores the signals and raw ops, that a worker would (``diagnose`` and
    ``scenario`` read them)."""
    from rankwatch.config import load_config
    from rankwatch.streams.ops.analysing import analysing_pipeline

    config = load_config()
    worker = config.worker
    return analysing_pipeline(
        assembly=config.assembly,
        window=worker.window,
        alerts=worker.alerts(),
        slowdown=config.slowdown,
        keep_ops=worker.keep_ops,
        max_message_bytes=worker.max_message_bytes,
    )


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


@dataclass(frozen=True)
class EmbeddedRun:
    config: WorkloadConfig
    result: JobResult
    stored: StoredJob
    """The job as stored: its ``steps`` rows and the analysed steps' records."""

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.stored.rows

    @property
    def trace(self) -> Trace:
        return self.stored.trace

    @property
    def meta(self) -> JobMeta:
        return self.stored.meta

    def headline(self) -> str:
        cfg, stored = self.config, self.stored
        return (
            f"job {cfg.job}: real PyTorch training, DP {cfg.dp} x PP {cfg.pp} "
            f"({cfg.schedule}, {cfg.microbatches} microbatches), {len(stored.trace)} ops in "
            f"{stored.messages} batches from the hooks, {len(stored.rows)} steps assembled in "
            f"{stored.elapsed_s:.2f} s; stored in {stored.where}"
        )


def run_embedded_workload(
    cfg: WorkloadConfig, directory: Path, skip_steps: int = 0, dsn: str | None = None
) -> EmbeddedRun:
    """Train with every rank spooling its messages under ``directory``, then feed the
    spooled bytes through the pipeline into the store (``dsn``, default the configured
    one). Steps below ``skip_steps`` (process group warm-up) are left out."""
    from dataclasses import replace

    from rankwatch.workload.launch import run_job

    spool = directory / "spool"
    for path in (spool, directory / "out"):
        if path.exists():
            shutil.rmtree(path)  # a run starts clean
    directory.mkdir(parents=True, exist_ok=True)
    result = run_job(replace(cfg, spool_dir=str(spool), kafka=""), directory / "out")
    stored = store_job(spooled_ops(spool, skip_steps), cfg.job, dsn)
    return EmbeddedRun(cfg, result, stored)


def spooled_ops(spool: Path, skip_steps: int) -> list[tuple[bytes, int]]:
    """(message, sent_ns) of every op batch the ranks spooled, in send order, less the
    records of steps below ``skip_steps`` (a message may hold several steps: the hooks
    batch short ones)."""
    from dataclasses import replace

    from rankwatch.schemas.codec import decode_ops, encode_ops
    from rankwatch.schemas.spool import Spool

    values = []
    for path in sorted(spool.glob("*.spool")):
        for message in Spool(path).read():
            if message.kind != "ops":
                continue
            batch = decode_ops(message.value)
            if int(batch.step.min()) >= skip_steps:
                values.append((message.value, batch.sent_ns))
            elif int(batch.step.max()) >= skip_steps:
                keep = batch.step >= skip_steps
                fields: dict[str, Any] = {n: c[keep] for n, c in batch.columns().items()}
                fields["steps_done"] = tuple(d for d in batch.steps_done if d[0] >= skip_steps)
                fields["rank_steps"] = tuple(r for r in batch.rank_steps if r["step"] >= skip_steps)
                later = replace(batch, **fields)
                values.append((encode_ops(later), batch.sent_ns))
    return sorted(values, key=lambda v: v[1])


def format_step_table(rows: list[dict[str, Any]]) -> str:
    """The stored ``steps`` rows as the table ``rankwatch demo`` and ``workload`` print."""
    header = f"{'step':>6} {'T recorded':>11} {'T simulated':>12} {'T ideal':>9} {'S':>6}  status"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['step']:>6} {r['t_base']:>10.4f}s {_secs(r['t_sim']):>12} "
            f"{_secs(r['t_ideal']):>9} "
            f"{_times(r['slowdown']):>6}  {'partial' if r['partial'] else 'complete'}"
        )
    return "\n".join(lines)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}s"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
