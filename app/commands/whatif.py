"""``rankwatch whatif TRACE.parquet --meta META.yaml``: straggler what-if analysis of a trace."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankwatch.sim import JobMeta, Trace

DESCRIPTION = """\
Simulate the trace's steps as they ran and as they would have run with no straggler
(docs/whatif.md), and say how much slower they were (S, W) and who is to blame: op
types, DP ranks, pipeline stages, workers (S_w), a few bad workers (M_W) or the stage
split (M_S). Ideal costs come from the whole trace (offline). With --window W, each step
is analysed instead as the live worker does, against ideal costs from the W latest steps
up to it, and the figures are those `rankwatch report` shows for the stored job.
Exit code 2 when the input cannot be read or modelled."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "whatif",
        help="straggler slowdown and attribution of an op trace",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace", metavar="TRACE.parquet", help="op trace (parquet)")
    parser.add_argument("--meta", required=True, metavar="META.yaml", help="job sizes (yaml)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--heatmap", metavar="FILE", help="write the S_w heatmap (PNG) here")
    parser.add_argument(
        "--window",
        type=int,
        metavar="W",
        help="live figures: rolling ideal over the W latest steps (the worker's default is 20)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orjson

    from rankwatch.errors import UserError
    from rankwatch.sim import ModelError, analyse
    from rankwatch.sim.summary import describe
    from rankwatch.traceio import read_meta, read_trace

    trace, meta = read_trace(args.trace), read_meta(args.meta)
    if args.window is not None:
        return run_live(args, trace, meta)
    try:
        analysis = analyse(trace, meta)
    except ModelError as exc:
        raise UserError(f"cannot model {args.trace}: {exc}") from exc
    if args.heatmap:
        from rankwatch.heatmap import render_heatmap

        try:
            Path(args.heatmap).write_bytes(render_heatmap(analysis, title=Path(args.trace).stem))
        except OSError as exc:
            raise UserError(f"cannot write heatmap {args.heatmap}: {exc}") from exc
    if args.format == "json":
        print(orjson.dumps({"method": "offline", **analysis.to_json()}).decode())
    else:
        print(describe(analysis))
    return 0


def run_live(args: argparse.Namespace, trace: Trace, meta: JobMeta) -> int:
    """The figures the live worker stores for this trace (rolling ideal)."""
    import orjson

    from rankwatch.errors import UserError
    from rankwatch.streams.ops.live import describe_live, live_figures, live_json

    if args.window < 1:
        raise UserError(f"--window must be at least 1, not {args.window}")
    if args.heatmap:
        raise UserError("--heatmap draws the offline S_w: run it without --window")
    figures = live_figures(trace, meta, args.window)
    if args.format == "json":
        print(orjson.dumps(live_json(figures)).decode())
    else:
        print(describe_live(figures))
    return 0 if figures.steps.size else 2
