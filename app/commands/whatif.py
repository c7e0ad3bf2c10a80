"""``rankwatch whatif TRACE.parquet --meta META.yaml``: straggler what-if analysis of a trace."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Simulate the trace's steps as they ran and as they would have run with no straggler
(WHATIF.md), and say how much slower they were (S, W) and who is to blame: op types,
DP ranks, pipeline stages, workers (S_w), a few bad workers (M_W) or the stage split
(M_S). Exit code 2 when the input cannot be read or modelled."""


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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orjson

    from rankwatch.errors import UserError
    from rankwatch.sim import ModelError, analyse
    from rankwatch.sim.summary import describe
    from rankwatch.traceio import read_meta, read_trace

    trace, meta = read_trace(args.trace), read_meta(args.meta)
    try:
        analysis = analyse(trace, meta)
    except ModelError as exc:
        raise UserError(f"cannot model {args.trace}: {exc}") from exc
    if args.heatmap:
        from rankwatch.sim.heatmap import render_heatmap

        try:
            Path(args.heatmap).write_bytes(render_heatmap(analysis, title=Path(args.trace).stem))
        except OSError as exc:
            raise UserError(f"cannot write heatmap {args.heatmap}: {exc}") from exc
    if args.format == "json":
        print(orjson.dumps(analysis.to_json()).decode())
    else:
        print(describe(analysis))
    return 0
