"""Write the boards as JSON: ``rankwatch grafana build``.

JSON is written with sorted keys, two-space indents and a final newline, so building
twice gives the same bytes and a rebuild of unchanged code is a no-op diff; CI checks
that the committed files are what the code builds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from rankwatch.grafana.boards import BOARDS

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboards"
"""Where the committed boards live (resolved: the strict editable install links files)."""


def board_model(name: str) -> dict[str, Any]:
    """The board ``name`` as a plain JSON object (the dashboard model Grafana stores).

    Canonical: the built model is decoded once more by the SDK's own model, which fills
    the defaults of each panel type, so what is written is a fixed point of
    :func:`load_model` (the tests check that the committed files load unchanged).
    """
    return load_model(_plain(BOARDS[name]().build()))


def load_model(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` decoded as the SDK's dashboard model and encoded again."""
    register_default_plugins()  # panel options and queries decode to their typed models
    return _plain(Dashboard.from_json(data))


def _plain(model: Dashboard) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(model, cls=JSONEncoder))
    return out


def render(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def build_all(out_dir: Path = DASHBOARD_DIR) -> list[Path]:
    """Write every board to ``<out_dir>/<name>.json``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in BOARDS:
        path = out_dir / f"{name}.json"
        text = render(board_model(name))
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale(out_dir: Path = DASHBOARD_DIR) -> list[str]:
    """Names of the boards whose file differs from what the code builds (or is missing)."""
    out = []
    for name in BOARDS:
        path = out_dir / f"{name}.json"
        if not path.exists() or path.read_text(encoding="utf-8") != render(board_model(name)):
            out.append(name)
    return out
