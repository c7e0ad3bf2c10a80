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
    parser.add_argument(
        "--spool-dir",
        metavar="DIR",
        help="with --kafka: where the ranks spool what the broker does not take (default:"
        " RANKWATCH_HOOKS_SPOOL, else $TMPDIR/rankwatch-<uid>/spool; 'off': no spool)",
    )
    parser.add_argument(
        "--relay",
        metavar="SOCKET",
        help="with --kafka: the host relay's socket (default: RANKWATCH_RELAY, else none)",
    )
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
        spool_dir=args.spool_dir or "",
        relay=args.relay or "",
    )
    if args.kafka:
        result = run_job(cfg, args.dir / "out")
        return report_delivery(args.job, cfg.world, cfg.steps, result.hook_stats())
    from rankwatch.ingest import format_step_table, run_embedded_workload

    embedded = run_embedded_workload(cfg, args.dir, dsn=args.clickhouse)
    print(embedded.headline())
    print(format_step_table(embedded.rows))
    return 0


def report_delivery(job: str, world: int, steps: int, stats: list[dict[str, int]]) -> int:
    """Say what the ranks' hooks did with their records; non-zero when any was lost (a
    broker that was away and no spool, or a full one): the job's data is incomplete."""
    total = {k: sum(s.get(k, 0) for s in stats) for k in ("put", "sent", "resent", "in_spool")}
    dropped = sum(s.get("dropped_buffer", 0) + s.get("dropped_send", 0) for s in stats)
    messages = sum(s.get("messages_sent", 0) for s in stats)
    print(
        f"job {job}: {world} ranks, {steps} steps, {messages} messages sent; records:"
        f" {total['put']} made, {total['sent']} sent, {total['resent']} sent from the spool,"
        f" {total['in_spool']} left in the spool, {dropped} dropped"
    )
    if total["in_spool"]:
        print(
            f"  {total['in_spool']} records wait in the ranks' spools: the host's"
            " `rankwatch agent` or `rankwatch relay` sends them once the broker answers"
        )
    if dropped:
        print(f"  {dropped} records were lost (the broker did not take them, and no spool did)")
        return 1
    return 0
