"""``rankwatch demo``: a whole job analysed in-process, chDB as the store, no services.

The job is, when PyTorch is installed, a real training run (``hooks/workload``: gloo
on CPU, PP 2 x DP 2, 1F1B, one rank given extra compute) whose hooks spool their op
batches; otherwise a trace from the project's own generator (a PP x DP 1F1B job with
noise, a straggling worker and a slow last stage), replayed as the hooks would send
it. Either way the batches are assembled step by step by the worker's pipeline and
stored in embedded ClickHouse; then the per-step table is read back from ClickHouse
and printed, followed by the job-level verdict of the same engine run offline over
the whole trace and the worker heatmap.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankwatch.sim import JobMeta, Trace

DEFAULT_DIR = Path("var/demo")


def register(sub: Any) -> None:
    parser = sub.add_parser("demo", help="analyse a generated job end to end, embedded")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="data directory")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--job", default="demo", help="job id to store the results under")
    parser.add_argument(
        "--workload",
        choices=("auto", "generator", "torch"),
        default="auto",
        help="the job: real PyTorch training (torch), generated trace, or torch when installed",
    )
    parser.set_defaults(func=run)


DEMO_STEPS = 12


def run(args: argparse.Namespace) -> int:
    from rankwatch.hooks.workload.launch import torch_available

    if args.workload == "torch" or (args.workload == "auto" and torch_available()):
        return run_torch(args)
    return run_generated(args)


def run_torch(args: argparse.Namespace) -> int:
    """The real workload: rank 1 (DP 1, stage 0) does extra compute in its forward."""
    from rankwatch.commands.workload import run_embedded_workload
    from rankwatch.hooks.workload.config import WorkloadConfig

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
    embedded = run_embedded_workload(cfg, args.dir, skip_steps=1)  # step 0: handshakes
    print(embedded.headline())
    print(format_step_table(embedded.rows))
    print()
    print(job_report(embedded.trace, embedded.meta, args.dir / "heatmap.png"))
    return 0


def run_generated(args: argparse.Namespace) -> int:
    from rankwatch.sim.tracegen import demo_config, generate_trace
    from rankwatch.streams.analyser import WhatIfAnalyser
    from rankwatch.streams.embedded import run_embedded
    from rankwatch.streams.pipeline import Pipeline
    from rankwatch.streams.replay import replay_batches
    from rankwatch.streams.sink import TableSink
    from rankwatch.streams.store import Store

    trace, meta = generate_trace(demo_config(seed=args.seed))
    chdb_dir = args.dir / "chdb"
    if chdb_dir.exists():
        shutil.rmtree(chdb_dir)  # the demo starts clean; one process owns the path
    chdb_dir.parent.mkdir(parents=True, exist_ok=True)
    with Store.connect(f"chdb://{chdb_dir}") as store:
        store.migrate()
        pipeline = Pipeline(analyser=WhatIfAnalyser())
        started = time.perf_counter()
        fed = run_embedded(
            replay_batches(trace, meta, args.job, origin_ns=time.time_ns()),
            pipeline,
            TableSink(store),
        )
        elapsed = time.perf_counter() - started
        rows = store.query(
            "SELECT step, t_base, t_sim, t_ideal, slowdown, partial, n_ops "
            "FROM steps FINAL WHERE job = {job:String} ORDER BY step",
            {"job": args.job},
        )
    print(
        f"job {args.job}: DP {meta.dp_size} x PP {meta.pp_size}, {len(trace)} ops in "
        f"{fed} batches, {len(rows)} steps assembled in {elapsed:.2f} s; "
        f"stored in chdb://{chdb_dir}"
    )
    print(format_step_table(rows))
    print()
    print(job_report(trace, meta, args.dir / "heatmap.png"))
    return 0


def job_report(trace: Trace, meta: JobMeta, heatmap: Path) -> str:
    """The whole job through the same engine offline: verdict, blame and the heatmap."""
    from rankwatch.sim import analyse
    from rankwatch.sim.heatmap import render_heatmap
    from rankwatch.sim.summary import describe

    analysis = analyse(trace, meta)
    heatmap.write_bytes(render_heatmap(analysis, title="rankwatch demo: S_w per worker"))
    return f"{describe(analysis)}\nworker heatmap (S_w, DP x PP): {heatmap}"


def format_step_table(rows: list[dict[str, Any]]) -> str:
    header = f"{'step':>6} {'T recorded':>11} {'T simulated':>12} {'T ideal':>9} {'S':>6}  status"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['step']:>6} {r['t_base']:>10.4f}s {_s(r['t_sim']):>12} {_s(r['t_ideal']):>9} "
            f"{_x(r['slowdown']):>6}  {'partial' if r['partial'] else 'complete'}"
        )
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}s"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
