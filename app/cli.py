"""``rankwatch <command>``: one entry point, one module per command.

Each module in :data:`COMMANDS` exposes ``register(subparsers)``; it adds its parser
and sets ``func`` to a callable taking the parsed namespace and returning an exit
code. Command modules import their heavy dependencies inside ``func`` so that
``rankwatch --help`` stays fast and works with the core install alone.
"""

from __future__ import annotations

import argparse
import importlib
import os
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
    "rankwatch.commands.relay",
    "rankwatch.commands.hang",
    "rankwatch.commands.grafana",
    "rankwatch.commands.report",
    "rankwatch.commands.diagnose",
    "rankwatch.commands.scenario",
    "rankwatch.commands.config",
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


BROKEN_PIPE = 141
"""Exit code when the reader of our output went away (``| head``): 128 + SIGPIPE, what a
shell reports for a process that SIGPIPE ended."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except UserError as exc:
        reason = " ".join(str(exc).split())  # one line, whatever the library wrote
        print(f"rankwatch {args.command}: error: {reason}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _silence_stdout()
        print(f"rankwatch {args.command}: output closed early (broken pipe)", file=sys.stderr)
        return BROKEN_PIPE
    except KeyboardInterrupt:
        return 130


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush of what is still
    buffered cannot raise again (the recipe of Python's signal module docs)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (e.g. captured in tests)
        pass


if __name__ == "__main__":
    raise SystemExit(main())
