"""Spools left behind: the ops messages of ranks that ended while the broker was away.

A rank resends its own spool once the broker answers again; a rank that ends before
that (its job finished, crashed, or was killed during the outage) leaves the file
behind, and nothing of that job would ever send it. The host's ``rankwatch agent`` and
``rankwatch relay`` sweep the spool directory: a file whose lock no live process holds
(:func:`~rankwatch.schemas.spool.take_lock`) is sent to ``<prefix>.ops``, keyed by the job
its name carries, and removed once the broker has every message. Until then it stays,
and the next sweep tries again; a message sent twice (a sweep cut off midway) is taken
once by the worker, which files batches by rank, ``batch_seq`` and first step.

Standard library only, as the rest of the agent.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rankwatch.schemas.spool import LOCK_SUFFIX, SUFFIX, Message, Spool, take_lock

log = logging.getLogger("rankwatch.agent")

SWEEP_EVERY_S = 10.0
"""How often the directory is looked at (a left spool waits at most this long once the
broker answers)."""

Send = Callable[[list[tuple[bytes, bytes]]], None]
"""Sends (key, value) messages to the ops topic; raises unless the broker has them all."""


@dataclass
class SweepCounters:
    files_sent: int = 0
    messages_sent: int = 0
    records_sent: int = 0
    send_failures: int = 0
    unreadable: int = 0
    """Files that could not be read (left in place, named in the log)."""


def job_of(path: Path) -> str:
    """The job a spool file belongs to, from its name (``<job>.rank<N>[.<pid>].spool``,
    as the hooks name it); "" when the name is not one."""
    name = path.name[: -len(SUFFIX)]
    cut = name.rfind(".rank")
    return name[:cut] if cut > 0 else ""


class SpoolSweeper:
    """Sends the spools of ranks that are gone, from ``directory``, with ``send``."""

    def __init__(self, directory: Path, send: Send) -> None:
        self.directory = directory
        self.send = send
        self.counters = SweepCounters()

    def sweep(self) -> int:
        """Send every left spool once; returns how many files were sent and removed.

        A job's left spools go in one send, its ranks' messages together: sent one file
        at a time, a job's last ranks could reach the worker a sweep after its first
        ones, and their steps wait on the missing ranks meanwhile. The sweep stops at
        the first send that fails (the broker is away: the next sweep tries them all)."""
        if not self.directory.is_dir():
            return 0
        by_job: dict[str, list[Path]] = {}
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            by_job.setdefault(job_of(path), []).append(path)
        sent = 0
        for job, paths in sorted(by_job.items()):
            locks = [(path, take_lock(path)) for path in paths]
            try:
                mine = [path for path, fd in locks if fd is not None]  # the others' ranks run
                if mine:
                    done = self._send_job(job, mine)
                    if done is None:
                        break
                    sent += done
            finally:
                for _, fd in locks:
                    if fd is not None:
                        os.close(fd)
        return sent

    def _send_job(self, job: str, paths: list[Path]) -> int | None:
        """Send the spools of ``job`` whose locks this sweeper holds, then remove them (and
        their locks); None when the send failed (all kept)."""
        readable: list[tuple[Path, list[Message]]] = []
        for path in paths:
            try:
                readable.append(
                    (path, [m for m in Spool(path, lock=False).read() if m.kind == "ops"])
                )
            except OSError as exc:
                self.counters.unreadable += 1
                log.warning("left spool %s not readable: %s", path, exc)
        messages = [m for _, got in readable for m in got]
        if messages and not job:
            self.counters.unreadable += len(readable)
            log.warning(
                "left spools %s: no job in their names, not sent", [str(p) for p, _ in readable]
            )
            return 0
        if messages:
            try:
                self.send([(job.encode(), m.value) for m in messages])
            except Exception as exc:  # the broker is still away: the next sweep retries
                self.counters.send_failures += 1
                log.debug("left spools of %s not sent yet: %s", job, exc)
                return None
        records = sum(m.records for m in messages)
        self.counters.files_sent += len(readable)
        self.counters.messages_sent += len(messages)
        self.counters.records_sent += records
        if messages:
            log.info("sent %d records of job %s left in %d spools", records, job, len(readable))
        for path, _ in readable:
            path.unlink(missing_ok=True)
            Path(f"{path}{LOCK_SUFFIX}").unlink(missing_ok=True)
        return len(readable)


def kafka_sweeper(
    bootstrap: str, topic: str, directory: Path
) -> tuple[SpoolSweeper, Callable[[], None]]:
    """A sweeper sending to ``topic`` with a producer of its own (the agent's and the
    relay's run on other threads), and what closes that producer."""
    from rankwatch.agent.outbox import KafkaTransport
    from rankwatch.agent.relay import KafkaSender

    sender = KafkaSender(KafkaTransport(bootstrap, topic, linger_ms=5))
    return SpoolSweeper(directory, sender), sender.close


def sweep_in_background(
    sweeper: SpoolSweeper, stop: threading.Event, every_s: float = SWEEP_EVERY_S
) -> threading.Thread:
    """A daemon thread sweeping every ``every_s`` until ``stop`` is set."""

    def loop() -> None:
        while not stop.is_set():
            try:
                sweeper.sweep()
            except Exception:  # never kill the agent
                log.exception("sweeping left spools failed")
            stop.wait(every_s)

    thread = threading.Thread(target=loop, name="rankwatch-spool-sweeper", daemon=True)
    thread.start()
    return thread
