"""What every rankwatch faust app shares: its settings and one workaround.

The ops worker, the hang worker and the Minder worker differ only in their agents;
their apps are made here so a setting fixed for one (replication on one broker, no
web server, where a new group starts) is fixed for all.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import faust

from rankwatch.streams.kit.heap import freeze_startup
from rankwatch.streams.kit.settings import ServiceSettings

log = logging.getLogger("rankwatch.faust")


def new_app(settings: ServiceSettings, offset_reset: str = "earliest", **extra: Any) -> faust.App:
    """A faust app for a worker's settings (its group, broker, partitions and group
    session), with in-memory state (rankwatch keeps its state in ClickHouse) and
    ``extra`` faust settings. A dead worker's partitions move after the session timeout;
    heartbeats go at a third of it, 3 s at most. Faust's own data directory (it keeps
    little there with in-memory state) is ``var/faust/<group>`` under the working
    directory, beside the default chDB store, not ``<group>-data`` in it."""
    datadir = Path("var") / "faust" / settings.group
    datadir.parent.mkdir(parents=True, exist_ok=True)  # faust makes the last level only
    app = faust.App(
        settings.group,
        broker=f"kafka://{settings.bootstrap}",
        datadir=str(datadir),
        store="memory://",
        web_enabled=False,
        topic_replication_factor=1,
        topic_partitions=settings.partitions,
        consumer_auto_offset_reset=offset_reset,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
        **extra,
    )
    app.on_partitions_assigned.connect(_freeze_startup)  # type: ignore[arg-type]
    return app


async def _freeze_startup(sender: Any, assigned: Any, **_: Any) -> None:
    """Start-up is over at the first assignment: its objects leave the collector's scans
    (:mod:`~rankwatch.streams.kit.heap`)."""
    if freeze_startup():
        log.info("start-up objects frozen out of the garbage collector's scans")


def serve(app: faust.App, loglevel: str, stop_wait_s: float) -> None:
    """Run ``app`` as faust's worker until a signal stops it. A stop that takes longer
    than ``stop_wait_s`` ends the process (exit status 1), with an error in the log.

    Faust waits for ever on a consumer whose broker is gone: its consumer thread's
    fetcher fails to close, and nothing ends the wait (seen with the ops and the hang
    worker, SIGTERM two seconds after their broker stopped: still running a minute
    later). Ending the process then costs what a crash costs: the next owner reads from
    the last committed offset, and the ops and Minder workers commit only what is
    stored (docs/running.md).

    ``stop`` is mode's public ``Service.stop``, which the signal handlers call."""
    from faust.worker import Worker

    class _Worker(Worker):
        async def stop(self) -> None:
            _exit_after(stop_wait_s)
            await super().stop()

    _Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()


_deadline: list[threading.Timer] = []


def _exit_after(wait_s: float) -> None:
    """End the process ``wait_s`` from the first call (a daemon thread: it fires however
    the event loop is stuck, and does not keep a process that stopped in time)."""
    if _deadline:
        return

    def fire() -> None:
        log.error(
            "still stopping %.0f s after the stop began (a broker that is gone?): exiting"
            " now, as after a crash: the next owner reads from the last committed offset",
            wait_s,
        )
        logging.shutdown()
        os._exit(1)

    timer = threading.Timer(wait_s, fire)
    timer.daemon = True
    _deadline.append(timer)
    timer.start()


def shorten_fetch_wait(app: faust.App, wait_ms: int) -> None:
    """Set the aiokafka fetcher's max wait, which faust hard-codes (1,500 ms).

    A caught-up worker otherwise sees a partition's new messages only when the fetch for
    its idle partitions returns. Reaches into faust's consumer thread and aiokafka's
    fetcher (private attributes, so call it at every tick: a re-created consumer gets it
    too); logs once and leaves the default when those are not there (another faust or
    aiokafka version)."""
    try:
        fetcher = app.consumer._thread._consumer._fetcher  # type: ignore[attr-defined]
    except AttributeError:
        fetcher = None
    if fetcher is None or not hasattr(fetcher, "_fetch_max_wait_ms"):
        if not getattr(app, "_rankwatch_fetch_warned", False):
            log.info("cannot set the fetch max wait (faust/aiokafka internals changed?)")
            app._rankwatch_fetch_warned = True  # type: ignore[attr-defined]
        return
    fetcher._fetch_max_wait_ms = wait_ms


def input_topic(app: faust.App, prefix: str, kind: str, partitions: int) -> Any:
    """The ``<prefix>.<kind>`` topic a worker reads raw bytes from (keys too)."""
    return app.topic(
        f"{prefix}.{kind}",
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
    )


def output_topics(app: faust.App, prefix: str, kinds: Iterable[str]) -> dict[str, Any]:
    """``<prefix>.<kind>`` topics a worker writes raw bytes to, by kind."""
    return {
        kind: app.topic(f"{prefix}.{kind}", key_serializer="raw", value_serializer="raw")
        for kind in kinds
    }
