"""``rankwatch report JOB``: a job's key numbers for the terminal, and optionally a
self-contained HTML file with the worker heatmap, for a ticket."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rankwatch.stores import add_store_arguments


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="a job's slowdown, blame and worker heatmap, without Grafana",
        description="Read a job's analysed steps from ClickHouse and print its key numbers"
        " (the same queries as the Grafana boards); --html also writes them with the"
        " worker heatmap into one self-contained HTML file.",
    )
    parser.add_argument("job", help="job id")
    add_store_arguments(parser)
    parser.add_argument("--html", type=Path, metavar="FILE", help="also write the HTML report")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwatch.errors import UserError
    from rankwatch.grafana.report import NoSuchJob, collect, format_text
    from rankwatch.grafana.report_html import render_html
    from rankwatch.stores import open_store, require_job

    with open_store(args.clickhouse, args.database) as store:
        require_job(store, args.job)
        try:
            report = collect(store, args.job)
        except NoSuchJob as exc:
            raise UserError(f"job {args.job!r} has no analysed steps in {store.where}") from exc
    print(format_text(report))
    if args.html:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(render_html(report), encoding="utf-8")
        print(f"\nHTML report: {args.html}")
    return 0
