"""Spools left behind: the ops messages of ranks that ended while the broker was away.

A rank resends its own spool once the broker answers again; a rank that ends before
that (its job finished, crashed, or was killed during the outage) leaves the file
behind, and nothing of that job would ever send it. The host's ``rankwatch agent`` and
``rankwatch relay`` sweep the spool directory: a file whose lock no live process holds
(:func:`~rankwatch.schemas.spool.take_lock`) is sent where its rank would have sent it
(the topic prefix and job in the file's head), and removed once the broker has every
message. Until then it stays, and the next sweep tries again; a message sent twice (a
sweep cut off midway) is taken once by the worker, which files batches by rank,
``batch_seq`` and first step. A spool its rank meant for another Kafka than the
sweeper's is left alone (said in the log once).

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

Send = Callable[[str, list[tuple[bytes, bytes]]], None]
"""Sends (key, value) messages to a topic; raises unless the broker has them all."""


@dataclass
class SweepCounters:
    files_sent: int = 0
    messages_sent: int = 0
    records_sent: int = 0
    send_failures: int = 0
    unreadable: int = 0
    """Files that could not be read (left in place, named in the log)."""
    elsewhere: int = 0
    """Files meant for another Kafka than this sweeper's (left in place)."""


def job_of(path: Path) -> str:
    """The job a spool file belongs to, from its name (``<job>.rank<N>[.<pid>].spool``,
    as the hooks name it); "" when the name is not one. For files without a head."""
    name = path.name[: -len(SUFFIX)]
    cut = name.rfind(".rank")
    return name[:cut] if cut > 0 else ""


@dataclass(frozen=True)
class _Left:
    path: Path
    messages: list[Message]


class SpoolSweeper:
    """Sends the spools of ranks that are gone, from ``directory``, with ``send``, to
    ``<prefix>.ops`` of each file's own prefix (``default_prefix`` for a file without a
    head); files whose rank sent to another Kafka than ``kafka`` are left alone."""

    def __init__(
        self, directory: Path, send: Send, *, default_prefix: str = "rankwatch", kafka: str = ""
    ) -> None:
        self.directory = directory
        self.send = send
        self.default_prefix = default_prefix
        self.kafka = kafka
        self.counters = SweepCounters()
        self._told: set[Path] = set()

    def sweep(self) -> int:
        """Send every left spool once; returns how many files were sent and removed.

        A job's left spools go in one send, its ranks' messages together: sent one file
        at a time, a job's last ranks could reach the worker a sweep after its first
        ones, and their steps wait on the missing ranks meanwhile. The sweep stops at
        the first send that fails (the broker is away: the next sweep tries them all)."""
        if not self.directory.is_dir():
            return 0
        self._remove_orphan_locks()
        locks: list[int] = []
        by_destination: dict[tuple[str, str], list[_Left]] = {}
        try:
            for path in sorted(self.directory.glob(f"*{SUFFIX}")):
                fd = take_lock(path)
                if fd is None:  # its rank runs, or another sweeper has it
                    continue
                locks.append(fd)
                destination = self._destination(path)
                if destination is not None:
                    by_destination.setdefault(destination, []).append(destination_left(path))
            sent = 0
            for (topic, job), left in sorted(by_destination.items()):
                done = self._send(topic, job, left)
                if done is None:
                    break
                sent += done
            return sent
        finally:
            for fd in locks:
                os.close(fd)

    def _destination(self, path: Path) -> tuple[str, str] | None:
        """(topic, job) a left spool goes to; None to leave it (unreadable, no job in
        it, or another Kafka's)."""
        try:
            meta = Spool(path, lock=False).meta
        except OSError as exc:
            self.counters.unreadable += 1
            log.warning("left spool %s not readable: %s", path, exc)
            return None
        kafka = str(meta.get("kafka") or "")
        if kafka and self.kafka and _servers(kafka) != _servers(self.kafka):
            self.counters.elsewhere += 1
            if path not in self._told:
                self._told.add(path)
                log.warning(
                    "left spool %s is for Kafka %s, not %s: left alone", path, kafka, self.kafka
                )
            return None
        job = str(meta.get("job") or job_of(path))
        if not job:
            self.counters.unreadable += 1
            log.warning("left spool %s: no job in it or its name, not sent", path)
            return None
        return f"{meta.get('topic_prefix') or self.default_prefix}.ops", job

    def _send(self, topic: str, job: str, left: list[_Left]) -> int | None:
        """Send the left spools of one job and topic, then remove them (and their
        locks); None when the send failed (all kept)."""
        messages = [m for item in left for m in item.messages]
        if messages:
            try:
                self.send(topic, [(job.encode(), m.value) for m in messages])
            except Exception as exc:  # the broker is still away: the next sweep retries
                self.counters.send_failures += 1
                log.debug("left spools of %s not sent yet: %s", job, exc)
                return None
            records = sum(m.records for m in messages)
            self.counters.messages_sent += len(messages)
            self.counters.records_sent += records
            log.info(
                "sent %d records of job %s left in %d spools to %s", records, job, len(left), topic
            )
        self.counters.files_sent += len(left)
        for item in left:
            item.path.unlink(missing_ok=True)
            Path(f"{item.path}{LOCK_SUFFIX}").unlink(missing_ok=True)
        return len(left)

    def _remove_orphan_locks(self) -> None:
        """Lock files whose spool is gone (a rank killed before it spooled anything)."""
        for lock in self.directory.glob(f"*{SUFFIX}{LOCK_SUFFIX}"):
            spool = Path(str(lock)[: -len(LOCK_SUFFIX)])
            if spool.exists():
                continue
            fd = take_lock(spool)
            if fd is not None:
                try:
                    if not spool.exists():
                        lock.unlink(missing_ok=True)
                finally:
                    os.close(fd)


def destination_left(path: Path) -> _Left:
    """A left spool's ops messages (heartbeats in it say what was happening then: no
    longer worth sending)."""
    try:
        messages = [m for m in Spool(path, lock=False).read() if m.kind == "ops"]
    except OSError:
        messages = []
    return _Left(path, messages)


def _servers(bootstrap: str) -> frozenset[str]:
    return frozenset(part.strip() for part in bootstrap.split(",") if part.strip())


def kafka_senders(bootstrap: str) -> tuple[Send, Callable[[], None]]:
    """A :data:`Send` with producers of its own (the agent's and the relay's run on other
    threads), one per topic it meets, and what closes them."""
    from rankwatch.agent.outbox import KafkaTransport
    from rankwatch.agent.relay import KafkaSender

    senders: dict[str, KafkaSender] = {}

    def send(topic: str, items: list[tuple[bytes, bytes]]) -> None:
        if topic not in senders:
            senders[topic] = KafkaSender(KafkaTransport(bootstrap, topic, linger_ms=5))
        senders[topic](items)

    def close() -> None:
        for sender in senders.values():
            sender.close()

    return send, close


def kafka_sweeper(
    bootstrap: str, directory: Path, default_prefix: str
) -> tuple[SpoolSweeper, Callable[[], None]]:
    """A sweeper sending with producers of its own, and what closes them."""
    send, close = kafka_senders(bootstrap)
    sweeper = SpoolSweeper(directory, send, default_prefix=default_prefix, kafka=bootstrap)
    return sweeper, close


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
