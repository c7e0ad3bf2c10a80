"""``rankwatch workload``: the real PyTorch training job (gloo, CPU) with the hooks on.

Its ranks publish to Kafka (``--kafka``) or, by default, spool their messages locally;
then the spooled messages go through the worker's pipeline in-process (chDB store),
exactly as ``rankwatch demo`` does. Needs the ``torch`` extra.
"""

from __future__ import annotations

import argparse
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.errors import UserError

if TYPE_CHECKING:
    from rankwatch.hooks.workload.config import WorkloadConfig
    from rankwatch.hooks.workload.launch import JobResult
    from rankwatch.sim import JobMeta, Trace

DEFAULT_DIR = Path("var/workload")


def register(sub: Any) -> None:
    parser = sub.add_parser("workload", help="run the real PyTorch workload with the hooks on")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="data directory")
    parser.add_argument("--job", default="workload", help="job id the records carry")
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe", "interleaved"))
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--slow-rank", type=int, default=-1, help="rank given extra compute")
    parser.add_argument("--slow-matmuls", type=int, default=0, help="extra matmuls per forward")
    parser.add_argument("--kafka", help="bootstrap servers; without it, analyse embedded")
    parser.add_argument("--topic-prefix", default="rankwatch")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwatch.hooks.workload.config import WorkloadConfig
    from rankwatch.hooks.workload.launch import run_job, torch_available

    if not torch_available():
        raise UserError("the workload needs PyTorch: pip install 'rankwatch[torch]'")
    cfg = WorkloadConfig(
        dp=args.dp,
        pp=args.pp,
        schedule=args.schedule,
        microbatches=args.microbatches,
        steps=args.steps,
        job=args.job,
        slow_rank=args.slow_rank,
        slow_matmuls=args.slow_matmuls,
        kafka=args.kafka or "",
        topic_prefix=args.topic_prefix,
    )
    if args.kafka:
        result = run_job(cfg, args.dir / "out")
        sent = sum(s["messages_sent"] for s in result.hook_stats())
        print(f"job {args.job}: {cfg.world} ranks, {cfg.steps} steps, {sent} messages sent")
        return 0
    from rankwatch.commands.demo import format_step_table

    embedded = run_embedded_workload(cfg, args.dir)
    print(embedded.headline())
    print(format_step_table(embedded.rows))
    return 0


@dataclass(frozen=True)
class EmbeddedRun:
    config: WorkloadConfig
    result: JobResult
    rows: list[dict[str, Any]]
    """The ``steps`` table read back from chDB."""
    trace: Trace
    """Every analysed step's records, as the what-if engine reads them."""
    meta: JobMeta
    messages: int
    elapsed_s: float
    store: str

    def headline(self) -> str:
        cfg = self.config
        return (
            f"job {cfg.job}: real PyTorch training, DP {cfg.dp} x PP {cfg.pp} "
            f"({cfg.schedule}, {cfg.microbatches} microbatches), {len(self.trace)} ops in "
            f"{self.messages} batches from the hooks, {len(self.rows)} steps assembled in "
            f"{self.elapsed_s:.2f} s; stored in {self.store}"
        )


def run_embedded_workload(cfg: WorkloadConfig, directory: Path, skip_steps: int = 0) -> EmbeddedRun:
    """Train with every rank spooling its messages, then feed the spooled bytes through
    the pipeline into chDB. Steps below ``skip_steps`` (process group warm-up) are left
    out of the analysis."""
    from dataclasses import replace

    from rankwatch.hooks.workload.launch import run_job
    from rankwatch.streams.store import Store

    spool = directory / "spool"
    chdb_dir = directory / "chdb"
    for path in (spool, chdb_dir, directory / "out"):
        if path.exists():
            shutil.rmtree(path)  # a run starts clean; one process owns the chDB path
    directory.mkdir(parents=True, exist_ok=True)
    result = run_job(replace(cfg, spool_dir=str(spool), kafka=""), directory / "out")
    values = _spooled_ops(spool, skip_steps)
    started = time.perf_counter()
    with Store.connect(f"chdb://{chdb_dir}") as store:
        store.migrate()
        trace, meta = _analyse(values, store)
        rows = store.query(
            "SELECT step, t_base, t_sim, t_ideal, slowdown, partial, n_ops "
            "FROM steps FINAL WHERE job = {job:String} ORDER BY step",
            {"job": cfg.job},
        )
    elapsed = time.perf_counter() - started
    return EmbeddedRun(cfg, result, rows, trace, meta, len(values), elapsed, f"chdb://{chdb_dir}")


def _spooled_ops(spool: Path, skip_steps: int) -> list[bytes]:
    from rankwatch.hooks.spool import Spool
    from rankwatch.schemas.codec import decode_ops

    values = []
    for path in sorted(spool.glob("*.spool")):
        for message in Spool(path).read():
            if message.kind == "ops" and int(decode_ops(message.value).step.min()) >= skip_steps:
                values.append(message.value)
    return sorted(values, key=lambda v: decode_ops(v).sent_ns)


def _analyse(values: list[bytes], store: Any) -> tuple[Trace, JobMeta]:
    """The worker's pipeline over the hooks' bytes, rows into ``store``; returns the
    assembled steps as one trace for the offline report."""
    import numpy as np

    from rankwatch.schemas.codec import decode_ops
    from rankwatch.schemas.topics import TOPICS
    from rankwatch.sim import JobMeta, Trace
    from rankwatch.streams.analyser import WhatIfAnalyser
    from rankwatch.streams.pipeline import Pipeline, Source
    from rankwatch.streams.sink import TableSink

    pipeline = Pipeline(analyser=WhatIfAnalyser())
    sink = TableSink(store)
    source = Source(topic=TOPICS["ops"])
    steps = []
    now_ns = 0
    for value in values:
        now_ns = decode_ops(value).sent_ns
        out = pipeline.on_message(value, source, now_ns)
        out.extend(pipeline.on_tick(now_ns))
        sink.write(out)
        steps += out.steps
    out = pipeline.flush(now_ns)
    sink.write(out)
    sink.flush()
    steps += out.steps
    if not steps:
        raise UserError("the workload produced no complete step")
    traces = [s.trace for s in steps if not s.partial]
    trace = Trace(**{f: np.concatenate([getattr(t, f) for t in traces]) for f in _fields()})
    dp, pp = steps[0].layout
    return trace, JobMeta(dp_size=dp, pp_size=pp, vpp_size=int(trace.mc.max()) + 1)


def _fields() -> tuple[str, ...]:
    from dataclasses import fields

    from rankwatch.sim import Trace

    return tuple(f.name for f in fields(Trace))
