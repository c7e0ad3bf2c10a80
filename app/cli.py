"""``rankwatch <command>``: one entry point, one module per command.

Each module in :data:`COMMANDS` exposes ``register(subparsers)``; it adds its parser
and sets ``func`` to a callable taking the parsed namespace and returning an exit
code. Command modules import their heavy dependencies inside ``func`` so that
``rankwatch --help`` stays fast and works with the core install alone.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rankwatch.errors import UserError

COMMANDS = (
    "rankwatch.commands.demo",
    "rankwatch.commands.replay",
    "rankwatch.commands.worker",
    "rankwatch.commands.db",
    "rankwatch.commands.whatif",
    "rankwatch.commands.workload",
    "rankwatch.commands.minder",
    "rankwatch.commands.agent",
    "rankwatch.commands.hang",
    "rankwatch.commands.grafana",
    "rankwatch.commands.report",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankwatch",
        description="Straggler, hang and faulty-machine analysis for distributed training.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except UserError as exc:
        print(f"rankwatch {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
