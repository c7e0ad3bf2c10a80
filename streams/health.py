"""Worker health: a JSON status file written every tick, and the check that reads it.

A file rather than an HTTP endpoint: it needs no port, works the same in a container
(an exec probe: ``rankwatch worker --health FILE``) and on a laptop, and a test can
read it. The worker is healthy when the file is fresh (the event loop is turning) and
the store is not failing for longer than ``max_lag_s`` (rows waiting to be stored).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson


def write_status(path: str | Path, status: dict[str, Any]) -> None:
    """Replace the status file atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps({**status, "written_ns": time.time_ns(), "pid": os.getpid()}))
    tmp.replace(path)


def read_status(path: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(Path(path).read_bytes())
    return data


def check_status(
    status: dict[str, Any], now_ns: int, max_age_s: float, max_lag_s: float
) -> list[str]:
    """Why the worker is unhealthy (empty when healthy)."""
    problems = []
    age = (now_ns - int(status.get("written_ns", 0))) / 1e9
    if age > max_age_s:
        problems.append(f"status is {age:.1f}s old (worker stalled or gone)")
    lag = float(status.get("sink_lag_s", 0.0))
    if lag > max_lag_s:
        problems.append(f"rows waiting {lag:.1f}s to be stored: {status.get('last_error')}")
    return problems
