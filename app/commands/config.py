"""``rankwatch config show``: every setting of every service, merged, with its origin.

The tree and its precedence are in ``rankwatch.config``: defaults < ``--config`` file <
environment < a command's flags. Printed as TOML that can be saved and edited as a
config file (each value's origin is a comment), or as JSON.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rankwatch.errors import UserError


def register(sub: Any) -> None:
    parser = sub.add_parser("config", help="show the merged configuration and its origins")
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="every setting, where it came from")
    show.add_argument("--config", help="TOML config file (as given to the workers)")
    show.add_argument("--format", choices=("toml", "json"), default="toml")
    show.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankwatch.config import load_config_origins, settings

    config, origins = load_config_origins(args.config)
    tree = settings(config, origins)
    if args.format == "json":
        out = {
            section: {key: {"value": v, "from": o} for key, (v, o) in values.items()}
            for section, values in tree.items()
        }
        print(json.dumps(out, indent=2))
        return 0
    print(as_toml(tree))
    return 0


def as_toml(tree: dict[str, dict[str, tuple[Any, str]]]) -> str:
    blocks = []
    for section, values in tree.items():
        lines = {f"{key} = {_toml_value(value)}": origin for key, (value, origin) in values.items()}
        width = max(map(len, lines))
        body = "\n".join(f"{line:<{width}}  # {origin}" for line, origin in lines.items())
        blocks.append(f"[{section}]\n{body}")
    return "\n\n".join(blocks)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string
    raise UserError(f"cannot print {value!r} as TOML")
