"""``rankwatch workload``: the real PyTorch training job (gloo, CPU) with the hooks on.

Its ranks publish to Kafka (``--kafka``) or, by default, spool their messages locally;
then the spooled messages go through the worker's pipeline in-process into the
configured store (chDB under var/chdb by default),
exactly as ``rankwatch demo`` does. Needs the ``torch`` extra.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rankwatch.errors import UserError

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
    from rankwatch.workload.config import WorkloadConfig
    from rankwatch.workload.launch import run_job, torch_available

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
    from rankwatch.ingest import format_step_table, run_embedded_workload

    embedded = run_embedded_workload(cfg, args.dir, dsn=args.clickhouse)
    print(embedded.headline())
    print(format_step_table(embedded.rows))
    return 0
