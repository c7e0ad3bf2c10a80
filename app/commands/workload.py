"""``rankwatch workload``: the real PyTorch training job (gloo, CPU) with the hooks on.

Its ranks publish to Kafka (``--kafka``) or, by default, spool their messages locally;
then the spooled messages go through the worker's pipeline in-process into the
configured store (chDB under var/chdb by default),
exactly as ``rankwatch demo`` does. Needs the ``torch`` extra.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.errors import UserError

if TYPE_CHECKING:
    from rankwatch.hooks.workload.config import WorkloadConfig
    from rankwatch.hooks.workload.launch import JobResult
    from rankwatch.ingest import StoredJob
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
    parser.add_argument(
        "--clickhouse", metavar="DSN", help="store of the embedded analysis (default from config)"
    )
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

    embedded = run_embedded_workload(cfg, args.dir, dsn=args.clickhouse)
    print(embedded.headline())
    print(format_step_table(embedded.rows))
    return 0


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

    from rankwatch.hooks.workload.launch import run_job
    from rankwatch.ingest import store_job

    spool = directory / "spool"
    for path in (spool, directory / "out"):
        if path.exists():
            shutil.rmtree(path)  # a run starts clean
    directory.mkdir(parents=True, exist_ok=True)
    result = run_job(replace(cfg, spool_dir=str(spool), kafka=""), directory / "out")
    stored = store_job(_spooled_ops(spool, skip_steps), cfg.job, dsn)
    return EmbeddedRun(cfg, result, stored)


def _spooled_ops(spool: Path, skip_steps: int) -> list[tuple[bytes, int]]:
    """(message, sent_ns) of every op batch the ranks spooled, in send order."""
    from rankwatch.hooks.spool import Spool
    from rankwatch.schemas.codec import decode_ops

    values = []
    for path in sorted(spool.glob("*.spool")):
        for message in Spool(path).read():
            if message.kind != "ops":
                continue
            batch = decode_ops(message.value)
            if int(batch.step.min()) >= skip_steps:
                values.append((message.value, batch.sent_ns))
    return sorted(values, key=lambda v: v[1])
