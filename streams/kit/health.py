"""Worker health: a JSON status file written every tick, and the check that reads it.

A file rather than an HTTP endpoint: it needs no port, works the same in a container
(an exec probe: ``rankwatch worker --health FILE``) and on a laptop, and a test can
read it. The worker is healthy when the file is fresh (the event loop is turning), the
store is not failing for longer than ``max_lag_s`` (rows waiting to be stored), and
what :func:`health_problems` asks of its state holds.
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
    return problems + health_problems(status)


def health_problems(status: dict[str, Any]) -> list[str]:
    """What the worker's own state says is wrong (the file's age aside): healthy means
    its topics exist and it consumes them (subscribed, partitions assigned), it has read
    something or is caught up with the log, and its store takes writes."""
    problems = []
    if not status.get("topics"):
        problems.append("not subscribed: its topics were not made or found")
    if not status.get("assigned"):
        problems.append(
            "no partitions assigned (group still joining, or more workers than partitions)"
        )
    behind = {tp: n for tp, n in (status.get("lag") or {}).items() if n > 0}
    if not status.get("messages_in") and (behind or not status.get("lag")):
        shown = ", ".join(f"{tp} {n}" for tp, n in sorted(behind.items())) or "position unknown"
        problems.append(f"nothing consumed yet and not caught up ({shown})")
    if not status.get("store_connected") or float(status.get("store_retry_in_s", 0.0)) > 0:
        problems.append(f"store not writable: {status.get('last_error') or 'not connected yet'}")
    return problems
