"""Stacks taken from outside: the host agent dumps a rank that cannot dump its own.

A rank's own watchdog dumps its stacks from a thread of the rank. A rank that is
stopped (SIGSTOP), wedged with the GIL held, or blocked where none of its threads
runs sends nothing: its heartbeats stop, and the hang worker can say only that it went
silent, not where it is. Every rank that publishes to Kafka also writes each heartbeat
into a file on its own host (its beacon, ``schemas/beacon.py``). The agent looks at
those files every second; one that has not changed for ``silent_s`` while its process
still lives is a rank to dump: ``py-spy dump`` (``schemas/stackdump.py``), sent to
``<prefix>.stacks`` as the rank's own dump would be, with a reason that says who took
it and how. Once per silence: the same unchanged beacon is not dumped again.

What it trusts: only the files of its own host, in a folder private to the user
(``private_dir``), and a pid that must still be the process that wrote the file (it
started before the file's last write). No message from the network makes it attach to
a process. Attaching needs ptrace rights (``schemas/stackdump.py``): without them the
dump fails, and the failure is counted and logged once per rank, not sent.

Standard library only, as the rest of the agent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rankwatch.schemas.beacon import SUFFIX, Beat, read_beacon
from rankwatch.schemas.stackdump import dump_threads, encode_stacks, process_state

log = logging.getLogger("rankwatch.agent")

Send = Callable[[str, list[tuple[bytes, bytes]]], None]
"""Sends (key, value) messages to a topic; raises unless the broker has them all."""
Dump = Callable[[int, float], tuple[list[dict], str]]


@dataclass(frozen=True)
class StackTakerConfig:
    silent_s: float = 6.0
    """A beacon unchanged this long is a silent rank: three heartbeat periods (2 s by
    default), so one late beat of a busy rank is not taken for silence; the hang
    worker's ``silent_after_s`` is the same."""
    every_s: float = 1.0
    timeout_s: float = 10.0
    """How long one py-spy dump may take."""
    forget_s: float = 3600.0
    """A beacon whose process is gone is removed once this old."""


@dataclass
class StackTakerCounters:
    dumps_sent: int = 0
    dumps_failed: int = 0
    """py-spy could not read the process (no rights, gone meanwhile) or the send failed."""
    unreadable: int = 0
    """Beacon files that are not beacons (left alone)."""
    forgotten: int = 0
    """Beacons of processes long gone, removed."""


@dataclass
class StackTaker:
    folder: Path
    send: Send
    config: StackTakerConfig = field(default_factory=StackTakerConfig)
    dump: Dump = field(default=dump_threads)
    now_ns: Callable[[], int] = time.time_ns
    proc: str = "/proc"
    counters: StackTakerCounters = field(default_factory=StackTakerCounters)
    _taken: dict[Path, int] = field(default_factory=dict)
    """beacon -> the write time of the version dumped (one dump per silence)"""
    _told: set[str] = field(default_factory=set)

    def scan(self) -> int:
        """One look at the folder; returns the dumps sent."""
        sent = 0
        now = self.now_ns()
        paths = sorted(self.folder.glob(f"*{SUFFIX}")) if self.folder.is_dir() else []
        for path in paths:
            beat = self._read(path)
            if beat is None or self._taken.get(path) == beat.written_ns:
                continue
            silent_ns = now - beat.written_ns
            if silent_ns < self.config.silent_s * 1e9:
                continue
            if not self._same_process(beat):
                self._forget(beat, silent_ns)
                continue
            self._taken[path] = beat.written_ns
            sent += self._take(beat, silent_ns)
        for gone in set(self._taken) - set(paths):
            del self._taken[gone]
        return sent

    def _forget(self, beat: Beat, silent_ns: int) -> None:
        """A beacon its process left behind (killed: no clean end removes it) goes once
        it is ``forget_s`` old, so that the folder does not grow with every dead rank."""
        if silent_ns > self.config.forget_s * 1e9:
            try:
                beat.path.unlink()
                self.counters.forgotten += 1
            except OSError:
                pass

    def _read(self, path: Path) -> Beat | None:
        try:
            return read_beacon(path)
        except FileNotFoundError:
            return None  # removed meanwhile: the rank ended
        except Exception as exc:  # not a beacon: left alone, counted and said once
            if path.name not in self._told:
                self.counters.unreadable += 1
            self._tell(path.name, f"beacon {path} unreadable ({exc}); left alone")
            return None

    def _same_process(self, beat: Beat) -> bool:
        """The pid still lives, is not a zombie, and started before the beacon's last
        write (a pid reused since would have started after it; the boot time is in
        whole seconds, hence the second's margin)."""
        pid = int(beat.heartbeat["pid"])
        if pid <= 1 or pid == os.getpid() or process_state(pid, self.proc) in ("", "Z", "X"):
            return False
        started_ns = process_start_ns(pid, self.proc)
        return started_ns is not None and started_ns <= beat.written_ns + 10**9

    def _take(self, beat: Beat, silent_ns: int) -> int:
        hb = beat.heartbeat
        pid, job, rank = int(hb["pid"]), hb["job"], int(hb["rank"])
        state = process_state(pid, self.proc)
        threads, failed = self.dump(pid, self.config.timeout_s)
        if failed:
            self.counters.dumps_failed += 1
            self._tell(f"{job}:{rank}", f"no stack of rank {rank} of {job} (pid {pid}): {failed}")
            return 0
        how = "Python frames only: py-spy cannot suspend a stopped process" if state in (
            "T", "t") else "py-spy, native frames included"  # fmt: skip
        reason = (
            f"taken from outside by the host agent: no heartbeat for {silent_ns / 1e9:.0f} s,"
            f" process {pid} in state {state} ({how})"
        )
        # the rank's clock: its last heartbeat's time plus what passed since on this host
        sent_ns = int(hb["sent_ns"]) + silent_ns
        message = encode_stacks(job, hb["host"], rank, sent_ns, reason, threads)
        try:
            self.send(f"{beat.topic_prefix}.stacks", [(job.encode(), message)])
        except Exception as exc:
            self.counters.dumps_failed += 1
            self._tell(f"{job}:{rank}:send", f"stack of rank {rank} of {job} not sent: {exc}")
            return 0
        self.counters.dumps_sent += 1
        log.info("sent the stack of rank %d of %s (pid %d): %s", rank, job, pid, reason)
        return 1

    def _tell(self, key: str, text: str) -> None:
        if key not in self._told:
            self._told.add(key)
            log.warning(text)


def process_start_ns(pid: int, proc: str = "/proc") -> int | None:
    """When the process started (wall clock, ns), from its start time in clock ticks
    since boot (``/proc/<pid>/stat``, field 22) and the boot time (``btime``)."""
    try:
        stat = Path(f"{proc}/{pid}/stat").read_text()
        boot = next(
            line for line in Path(f"{proc}/stat").read_text().splitlines()
            if line.startswith("btime ")
        )  # fmt: skip
        ticks = int(stat[stat.rfind(")") + 2 :].split()[19])
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return int(boot.split()[1]) * 10**9 + ticks * 10**9 // os.sysconf("SC_CLK_TCK")


def take_in_background(taker: StackTaker, stop: threading.Event) -> threading.Thread:
    """A daemon thread scanning every ``every_s`` until ``stop`` is set."""

    def loop() -> None:
        while not stop.is_set():
            try:
                taker.scan()
            except Exception:  # never kill the agent
                log.exception("looking at the ranks' beacons failed")
            stop.wait(taker.config.every_s)

    thread = threading.Thread(target=loop, name="rankwatch-stack-taker", daemon=True)
    thread.start()
    return thread
