"""``rankwatch demo``: a whole job analysed in-process and stored, no services.

The job is chosen by ``--workload``, never by what is installed, so the same command
gives the same numbers: ``generator`` (the default) is a trace from the project's own
generator (a PP x DP 1F1B job with noise, a straggling worker and a slow last stage),
replayed as the hooks would send it; ``torch`` is a real training run (``workload/``:
gloo on CPU, PP 2 x DP 2, 1F1B, one rank given extra compute; its timings are real, so
its numbers vary from run to run) whose hooks spool their op batches.

Either way the batches go through the ops worker's pipeline into the configured store
(the one every command reads: ``chdb://var/chdb`` unless ``RANKWATCH_CLICKHOUSE`` or
``--clickhouse`` says otherwise), replacing an earlier job of the same id. The demo then
prints the stored step table, the stored job figures (those of ``rankwatch report`` and
the Grafana boards: ideal costs from a rolling window, as live) and the offline verdict
over the whole trace (those of ``rankwatch whatif`` on the exported trace), each labelled
with its method (docs/whatif.md, "Offline and live figures"). The analysed trace and its
sizes are exported to ``--dir`` with the worker heatmap.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankwatch.ingest import StoredJob

DEFAULT_DIR = Path("var/demo")
DEMO_STEPS = 24
"""Analysed steps of the torch demo: more than the straggler alert's 20-step window."""


def register(sub: Any) -> None:
    parser = sub.add_parser("demo", help="analyse a job end to end, embedded, and store it")
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="exported trace, meta and heatmap"
    )
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument(
        "--job", default="demo", help="job id to store under (its earlier rows are replaced)"
    )
    parser.add_argument(
        "--workload",
        choices=("generator", "torch"),
        default="generator",
        help="the job: a generated trace (default, same numbers every run) or a real"
        " PyTorch training run (needs the torch extra)",
    )
    parser.add_argument(
        "--clickhouse",
        metavar="DSN",
        help="store (default: $RANKWATCH_CLICKHOUSE, else chdb://var/chdb)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwatch.ingest import export, format_step_table

    if args.workload == "torch":
        stored, headline = run_torch(args)
    else:
        stored, headline = run_generated(args)
    trace_path, meta_path = export(stored, args.dir)
    print(headline)
    print(format_step_table(stored.rows))
    print()
    print(live_summary(stored, args.clickhouse))
    print()
    print(offline_summary(stored, trace_path, meta_path, args.dir / "heatmap.png"))
    return 0


def run_torch(args: argparse.Namespace) -> tuple[StoredJob, str]:
    """The real workload: rank 1 (DP 1, stage 0) does extra compute in its forward."""
    from rankwatch.errors import UserError
    from rankwatch.ingest import run_embedded_workload
    from rankwatch.workload.config import WorkloadConfig
    from rankwatch.workload.launch import torch_available

    if not torch_available():
        raise UserError("--workload torch needs PyTorch: pip install 'rankwatch[torch]'")
    cfg = WorkloadConfig(
        dp=2,
        pp=2,
        microbatches=4,
        steps=DEMO_STEPS + 1,
        job=args.job,
        slow_rank=1,
        slow_matmuls=20,
        seed=args.seed,
    )
    # step 0 is left out: it holds the process groups' handshakes, not training
    embedded = run_embedded_workload(cfg, args.dir, skip_steps=1, dsn=args.clickhouse)
    return embedded.stored, embedded.headline()


def run_generated(args: argparse.Namespace) -> tuple[StoredJob, str]:
    from rankwatch.ingest import store_job
    from rankwatch.schemas.codec import encode_ops
    from rankwatch.sim.tracegen import demo_config, generate_trace
    from rankwatch.streams.ops.replay import replay_batches, span_ns

    trace, meta = generate_trace(demo_config(seed=args.seed))
    origin_ns = time.time_ns() - span_ns(trace)  # the job ends now, not in the future
    batches = replay_batches(trace, meta, args.job, origin_ns=origin_ns)
    messages = ((encode_ops(b.batch), b.sent_ns) for b in batches)
    stored = store_job(messages, args.job, args.clickhouse, meta)
    headline = (
        f"job {args.job}: generated trace (seed {args.seed}), DP {meta.dp_size} x PP "
        f"{meta.pp_size}, {len(trace)} ops in {stored.messages} batches, {len(stored.rows)} "
        f"steps assembled in {stored.elapsed_s:.2f} s; stored in {stored.where}"
    )
    return stored, headline


def live_summary(stored: StoredJob, dsn: str | None) -> str:
    """The stored job's figures, read back with the report's own queries."""
    from rankwatch.grafana.report import collect, method_line
    from rankwatch.stores import open_store

    with open_store(dsn) as store:
        report = collect(store, stored.job)
    return "\n".join(
        [
            f"Live figures, as stored (`rankwatch report {stored.job}` and the Grafana boards"
            " show these):",
            f"  {method_line(report)}",
            f"  Slowdown S = {_x(report.slowdown)}, waste W = {_pct(report.waste)}",
        ]
    )


def offline_summary(stored: StoredJob, trace_path: Path, meta_path: Path, heatmap: Path) -> str:
    """The whole trace through the engine offline: verdict, blame and the heatmap."""
    from rankwatch.heatmap import render_heatmap
    from rankwatch.sim import analyse
    from rankwatch.sim.summary import describe

    analysis = analyse(stored.trace, stored.meta)
    heatmap.write_bytes(render_heatmap(analysis, title="rankwatch demo: S_w per worker"))
    return "\n".join(
        [
            f"Offline figures over the whole trace (`rankwatch whatif {trace_path} --meta "
            f"{meta_path}` prints these):",
            describe(analysis),
            f"worker heatmap (S_w, DP x PP): {heatmap}",
        ]
    )


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
