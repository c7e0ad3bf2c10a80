"""The local watchdog: dump every thread's stack once the rank's own op is stuck.

When a job hangs, the stream can name the rank that stopped first, but a person also
needs *where* each rank sits. The training thread is the one stuck, so the dump is
taken from the publisher's background thread: :meth:`Watchdog.check` runs in each
publisher round (every ``flush_interval_s``), reads the op in flight that the tracker
already keeps for its heartbeats (nothing is added on the hot path), and when that op
has been in flight longer than ``threshold_s`` returns one ``stacks`` message (schema
``stacks.v1``), once per stuck op. A rank with no op in flight and none announced
phase, whose last op ended longer ago than ``threshold_s`` (away in untimed Python: a
sleep, a lock, an unannounced save), is dumped too, once per such spell: the hang
detector names it "outside any timed op", and this is the stack that says where.
Python frames come from ``sys._current_frames()``;
native frames are added from ``py-spy dump`` only when ``WatchdogConfig.py_spy`` says
so (off by default: see there). Frames are listed outermost first. Nothing here raises
into the caller.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from rankwatch.hooks.identity import Identity
from rankwatch.schemas import stackdump
from rankwatch.schemas.stackdump import MAX_FRAMES, MAX_THREADS

InFlightTuple = tuple[str, int, int, int]
"""The tracker's op in flight: (optype, seq_id, mb_id, start as ``clock.read()``)."""
LastDoneTuple = tuple[str, int, int, int]
"""The tracker's last op done: (optype, seq_id, step, end as ``clock.read()``)."""


@dataclass(frozen=True)
class WatchdogConfig:
    threshold_s: float = 10.0
    """Dump once the rank's own op has been in flight this long; 0 switches it off. A
    few seconds past the hang worker's 6 s floor, so that the waiters' stacks are in
    ``hang report`` moments after the alert; a healthy op that long costs one dump
    (Python frames, on the publisher's thread), once per op."""
    py_spy: bool = False
    """Add native frames with ``py-spy dump`` of this very process. Off by default: the
    dump runs on the publisher's thread and py-spy suspends the whole process while it
    unwinds, so the rank sends no heartbeat meanwhile (with py-spy installed, every
    waiting rank of a 4-rank job went silent at once in a test); and Yama's default
    ``ptrace_scope`` 1 refuses a child tracing its parent unless root. The host agent
    takes a silent rank's stack from outside instead (``agent/stacks.py``)."""
    py_spy_timeout_s: float = 10.0


class Watchdog:
    """Decides when to dump and builds the message; the publisher thread sends it."""

    def __init__(
        self,
        identity: Identity,
        in_flight: Callable[[], InFlightTuple | None],
        step: Callable[[], int],
        read: Callable[[], int],
        now_ns: Callable[[], int],
        config: WatchdogConfig | None = None,
        idle: Callable[[], LastDoneTuple | None] = lambda: None,
        progress_at: Callable[[], int] = lambda: 0,
    ) -> None:
        self.identity = identity
        self.in_flight = in_flight
        self.idle = idle
        """The last op done while the rank has none in flight and no phase announced."""
        self.progress_at = progress_at
        """When the rank last finished an op or a phase (``read()``): a communication
        posted early (a pipeline receive) is in flight while the rank still computes, and
        only counts as stuck once the rank stopped progressing."""
        self.step = step
        self.read = read
        self.now_ns = now_ns
        self.config = config or WatchdogConfig()
        self._dumped: tuple[int, InFlightTuple, int] | LastDoneTuple | None = None
        self.dumps = 0
        self.errors = 0

    def check(self) -> bytes | None:
        """A ``stacks`` message when the op in flight just passed the threshold, else None."""
        limit = self.config.threshold_s
        flight = self.in_flight()
        if limit <= 0:
            return None
        if flight is None:
            return self._check_idle(limit)
        now = self.read()
        since = max(flight[3], self.progress_at())
        stuck_s = (now - since) / 1e9
        key = (self.step(), flight, since)
        if stuck_s < limit or key == self._dumped:
            return None
        self._dumped = key
        try:
            optype, seq, mb, _ = flight
            later = f", no progress for {stuck_s:.1f} s" if since > flight[3] else ""
            reason = (
                f"{optype}_{seq} (microbatch {mb}) of step {key[0]} in flight for "
                f"{(now - flight[3]) / 1e9:.1f} s{later} (watchdog threshold {limit:g} s)"
            )
            message = self.message(reason)
        except Exception:
            self.errors += 1
            return None
        self.dumps += 1
        return message

    def _check_idle(self, limit: float) -> bytes | None:
        done = self.idle()
        if done is None:
            return None
        away_s = (self.read() - done[3]) / 1e9
        if away_s < limit or done == self._dumped:
            return None
        self._dumped = done
        try:
            optype, seq, step, _ = done
            reason = (
                f"outside any timed op for {away_s:.1f} s since {optype}_{seq} of step "
                f"{step} ended (watchdog threshold {limit:g} s)"
            )
            message = self.message(reason)
        except Exception:
            self.errors += 1
            return None
        self.dumps += 1
        return message

    def message(self, reason: str) -> bytes:
        threads = python_threads()
        if self.config.py_spy:
            threads += native_threads(os.getpid(), self.config.py_spy_timeout_s)
        return encode_stacks(self.identity, self.now_ns(), reason, threads[:MAX_THREADS])


def encode_stacks(
    identity: Identity, sent_ns: int, reason: str, threads: list[dict[str, Any]]
) -> bytes:
    """One ``stacks`` v1 message."""
    return stackdump.encode_stacks(
        identity.job, identity.host, identity.rank, sent_ns, reason, threads
    )


def python_threads() -> list[dict[str, Any]]:
    """Every other Python thread's frames, outermost first (the calling thread, busy
    taking this dump, would only add the same noise path to every rank's stacks)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        out.append(
            {
                "name": names.get(ident, f"thread-{ident}")[:256],
                "thread_id": ident,
                "native": False,
                "frames": _frames(frame),
            }
        )
    return out


def _frames(frame: FrameType | None) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        frames.append(
            {
                "file": code.co_filename[:4096],
                "line": max(frame.f_lineno or 0, 0),
                "function": code.co_name[:1024],
            }
        )
        frame = frame.f_back
    frames.reverse()
    return frames


def native_threads(pid: int, timeout_s: float) -> list[dict[str, Any]]:
    """Native frames of every thread from ``py-spy dump --native`` (``schemas/stackdump.py``);
    [] when py-spy is absent, not permitted to attach (py-spy is our child, and Yama's
    default ``ptrace_scope=1`` lets no child trace its parent without ``CAP_SYS_PTRACE``),
    or says something unexpected."""
    threads, _ = stackdump.dump_threads(pid, timeout_s, native=True)
    return threads
