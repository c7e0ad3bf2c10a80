"""Worker health: a JSON status file written every tick, and the check that reads it;
the same for every worker (:class:`StatusReporter`).

A file rather than an HTTP endpoint: it needs no port, works the same in a container
(an exec probe: ``rankwatch worker --health FILE``) and on a laptop, and a test can
read it. The worker is healthy when the file is fresh (the event loop is turning), the
store is not failing for longer than ``max_lag_s`` (rows waiting to be stored), and
what :func:`health_problems` asks of its state holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import faust
import orjson

from rankwatch.streams.kit.heap import gc_clock
from rankwatch.streams.kit.membership import GroupLease
from rankwatch.streams.kit.rewind import StallGuard

POSITION_WAIT_S = 0.5
"""How long a tick waits for the consumer's position on one partition (left out past it)."""


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
    something or is caught up with the log, its broker answers, and its store takes
    writes."""
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
    if float(status.get("broker_unreachable_s", 0.0)) > 0:
        problems.append(
            f"broker unreachable for {status['broker_unreachable_s']:.0f}s"
            f" ({status.get('broker_error') or 'no answer'}): nothing is read or committed"
        )
    failing = status.get("store_failing") or float(status.get("store_retry_in_s", 0.0)) > 0
    if not status.get("store_connected") or failing:
        problems.append(f"store not writable: {status.get('last_error') or 'not connected yet'}")
    return problems


class StatusReporter:
    """A worker's tick report: its state's ``snapshot`` plus what its consumer holds
    (assigned partitions, lag) and the :func:`health_problems` they show; logged (at
    DEBUG every tick, at INFO once a minute) and written to ``status_file`` if any.
    With a ``guard``, each report first reads again the partitions faust read past
    (:class:`~rankwatch.streams.kit.rewind.StallGuard`) and counts them."""

    def __init__(
        self,
        app: faust.App,
        status_file: str | None,
        log: logging.Logger,
        every_s: float = 60.0,
        guard: StallGuard | None = None,
        lease: GroupLease | None = None,
    ) -> None:
        self.app = app
        self.status_file = status_file
        self.log = log
        self.every_s = every_s
        self.guard = guard
        self.lease = lease
        self.gc = gc_clock()
        self._logged = float("-inf")

    async def __call__(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        assigned = _assignment(self.app)
        positions = await consumer_positions(self.app, assigned)
        if self.guard is not None:
            await self.guard.check(positions)
            snapshot.update(self.guard.counters())
        snapshot["assigned"] = sorted(f"{tp.topic}:{tp.partition}" for tp in assigned)
        snapshot["lag"] = _lag(self.app, positions)
        if self.lease is not None:
            snapshot.update(self.lease.snapshot())
        snapshot.update(self.gc.snapshot())
        snapshot["problems"] = health_problems(snapshot)
        self._log(snapshot)
        if self.status_file:
            try:
                write_status(self.status_file, snapshot)
            except OSError as exc:  # a full or read-only disk: the probe sees a stale file
                self.log.error("status file %s not written: %s", self.status_file, exc)
        return snapshot

    def _log(self, snapshot: dict[str, Any]) -> None:
        now = time.monotonic()
        level = logging.INFO if now - self._logged >= self.every_s else logging.DEBUG
        if level == logging.INFO:
            self._logged = now
        if self.log.isEnabledFor(level):
            self.log.log(level, "counters %s", orjson.dumps(snapshot).decode())


async def consumer_positions(app: faust.App, assigned: set[Any]) -> dict[Any, int]:
    """The consumer's position on each assigned partition (faust TP -> offset of the
    next record it returns); a partition whose position is not known yet is left out."""
    out = {}
    for tp in assigned:
        try:  # the consumer's thread may wait on a broker that is away: never the tick
            position = await asyncio.wait_for(app.consumer.position(tp), POSITION_WAIT_S)
        except Exception:  # not fetched yet, the consumer being rebuilt, or too slow
            continue
        if position is not None:
            out[tp] = int(position)
    return out


def _lag(app: faust.App, positions: dict[Any, int]) -> dict[str, int]:
    """Per partition, records between the consumer's position and the end of the log
    (0: caught up)."""
    out = {}
    for tp, position in positions.items():
        try:
            highwater = app.consumer.highwater(tp)
        except Exception:  # not fetched yet, or the consumer is being rebuilt
            continue
        if highwater is not None:
            out[f"{tp.topic}:{tp.partition}"] = max(0, int(highwater) - position)
    return out


def _assignment(app: faust.App) -> set[Any]:
    try:
        return set(app.consumer.assignment())
    except Exception:  # consumer not started yet
        return set()
