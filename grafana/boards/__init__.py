"""The boards, one module per board; :data:`BOARDS` maps a board's file name to its
builder. uids are fixed here: links between boards and the publisher rely on them."""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.builders.dashboard import Dashboard

from rankwatch.grafana.boards import fleet, hangs, job, machines, workers

BOARDS: dict[str, Callable[[], Dashboard]] = {
    "job": job.build,
    "workers": workers.build,
    "hangs": hangs.build,
    "machines": machines.build,
    "fleet": fleet.build,
}

UIDS = {
    "job": job.UID,
    "workers": workers.UID,
    "hangs": hangs.UID,
    "machines": machines.UID,
    "fleet": fleet.UID,
}
