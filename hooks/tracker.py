"""``RankWatch``: what the training thread calls. Cheap, never blocks, never raises.

::

    rw = RankWatch(identity, transport)           # or rankwatch.hooks.init(...)
    for step in range(n):
        rw.step_begin(step)
        with rw.op("forward-compute", mb=i):
            ...
        rw.step_end()                             # wakes the publisher
    rw.close()                                    # flushes; also at interpreter exit

On the training thread an op costs two clock reads, a tuple and a deque append; the
encoding and the network are the publisher thread's. seq_id counts the ops of one
optype in this step in start order. Op times are the aligned clock (see ``clock.py``).
A misuse (an unknown op type) is warned about once and ignored rather than raised
into training.

Communication timed elsewhere (p2p posted and waited for by the pipeline schedule,
DDP buckets) is *posted* with :meth:`RankWatch.next_seq` and finished with
:meth:`RankWatch.emit`; between the two it counts as in flight, so a rank blocked in a
p2p wait reports that op in its heartbeats and its watchdog sees it stuck.
"""

from __future__ import annotations

import os
import warnings
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from rankwatch.hooks.buffer import RecordBuffer
from rankwatch.hooks.clock import Clock, OffsetEstimate
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.publisher import Publisher, PublisherConfig, PublisherStats
from rankwatch.hooks.records import KNOWN_OPTYPES, InFlight, LastDone, Phase, encode_heartbeat
from rankwatch.hooks.signals import ALGORITHMS, StepNotes
from rankwatch.hooks.transports import Transport
from rankwatch.hooks.watchdog import Watchdog, WatchdogConfig
from rankwatch.schemas.beacon import Beacon
from rankwatch.schemas.optypes import COMMUNICATING, COMPUTE
from rankwatch.schemas.spool import Spool


class _Op:
    """The context manager of one timed op (slots: it is built on every call)."""

    __slots__ = ("chunk", "gmc", "mb", "optype", "prev", "rw", "seq", "t0")

    def __init__(self, rw: RankWatch, optype: str, mb: int, chunk: int, gmc: int) -> None:
        self.rw = rw
        self.optype = optype
        self.mb = mb
        self.chunk = chunk
        self.gmc = gmc

    def __enter__(self) -> _Op:
        rw = self.rw
        seqs = rw._seq
        self.seq = seq = seqs.get(self.optype, 0)
        seqs[self.optype] = seq + 1
        self.prev = rw._in_flight
        self.t0 = t0 = rw._read()
        rw._in_flight = (self.optype, seq, self.mb, t0)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        rw = self.rw
        t1 = rw._read()
        t0 = self.t0
        rw._put(
            (
                rw.step,
                self.optype,
                self.seq,
                self.mb,
                self.chunk,
                self.gmc,
                t0 + rw.clock.shift_ns,
                t1 - t0,
            )
        )
        rw._in_flight = self.prev
        rw._last_done = (self.optype, self.seq, rw.step, t1)


class _NoOp:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NOOP = _NoOp()

DEFAULT_PHASE_BOUND_S = 1800.0
"""How long an announced phase given no bound of its own may last before the hang
detector calls it a hang: half an hour, a large checkpoint on a slow file system."""


class _Phase:
    """``with rw.phase(name):`` (see :meth:`RankWatch.phase`)."""

    __slots__ = ("bound_s", "name", "rw")

    def __init__(self, rw: RankWatch, name: str, bound_s: float | None) -> None:
        self.rw, self.name, self.bound_s = rw, name, bound_s

    def __enter__(self) -> _Phase:
        self.rw.phase_begin(self.name, self.bound_s)
        return self

    def __exit__(self, *exc: object) -> None:
        self.rw.phase_end()


MAX_HELD_ENDS = 8
"""Step ends that may wait for a device's ops at once (``RankWatch.release_ends``)."""


class RankWatch:
    def __init__(
        self,
        identity: Identity,
        transport: Transport,
        *,
        clock: Clock | None = None,
        capacity: int = 100_000,
        publisher: PublisherConfig | None = None,
        spool: Spool | None = None,
        enabled: bool = True,
        start: bool = True,
        watchdog: WatchdogConfig | None = None,
        beacon: Beacon | None = None,
    ) -> None:
        self.identity = identity
        self.enabled = enabled
        self.clock = clock or Clock()
        self._read = self.clock.read
        self.buffer = RecordBuffer(capacity)
        self._put = self.buffer.put
        self.step = 0
        self._seq: dict[str, int] = {}
        self._in_flight: tuple[str, int, int, int] | None = None
        self._last_done: tuple[str, int, int, int] | None = None
        self._phases: list[tuple[str, int, float] | None] = []
        self._phase_ended = 0
        """When the latest phase ended (``clock.read()``): the watchdog counts a rank's
        time away from ops from there, as the hang worker counts a phase's end as
        progress."""
        """Announced phases (name, start as ``clock.read()``, bound), innermost last; None
        for one refused, so that its end ends it and not the phase around it."""
        self._posted: dict[tuple[int, str, int], tuple[str, int, int, int]] = {}
        """(step, optype, seq) -> in-flight tuple of communication posted, not yet emitted."""
        self._warned: set[str] = set()
        self._closed = False
        self.notes = StepNotes()
        """Declared work, GC pauses and data waits since the last step end."""
        self._prev_end_ns: int | None = None
        self.collectors: list[Callable[[], object]] = []
        """Called on the training thread at each step end, before the step is closed:
        they emit ops timed elsewhere (CUDA events, communication futures)."""
        self.holds: list[Callable[[int], bool]] = []
        """``hold(step)`` is True while ops of ``step`` are still to be emitted (timed on
        a device that has not finished them): the step's end waits (``release_ends``)."""
        self.finishers: list[Callable[[], object]] = []
        """Called at ``close``, while still enabled: emit what is left (may block)."""
        self._held_ends: deque[tuple[int, StepNotes, int, int | None]] = deque()
        """Ended steps (step, notes, end, previous end) whose end waits for a hold, oldest
        first; their notes are closed when the end is released."""
        self.watchdog = Watchdog(
            identity,
            in_flight=self.in_flight,
            step=lambda: self.step,
            read=self._read,
            now_ns=self.clock.now_ns,
            config=watchdog,
            idle=self._idle,
            progress_at=self._progress_at,
        )
        """Dumps the stacks from the publisher thread when the op in flight is stuck."""
        self.publisher = Publisher(
            identity,
            self.buffer,
            transport,
            now_ns=self.clock.now_ns,
            config=publisher,
            spool=spool,
            heartbeat=self._heartbeat,
            watchdog=self.watchdog.check,
            beacon=beacon,
        )
        if start and enabled:
            self.publisher.start()

    # -- ops ---------------------------------------------------------------------------

    def op(
        self, optype: str, mb: int = -1, chunk: int | None = None, gmc: int | None = None
    ) -> Any:
        """Time the ``with`` block as one op. ``chunk`` is the model chunk inside the stage
        (VPP); ``gmc`` defaults to ``chunk * pp_size + pp_rank``. Non-compute ops carry
        -1 for all three."""
        if not self.enabled:
            return NOOP
        if optype not in KNOWN_OPTYPES:
            self._warn(f"unknown op type {optype!r} ignored")
            return NOOP
        if optype in COMPUTE:
            c = 0 if chunk is None else chunk
            g = c * self.identity.pp_size + self.identity.pp_rank if gmc is None else gmc
            return _Op(self, optype, mb, c, g)
        return _Op(self, optype, -1, -1, -1)

    def begin(self, optype: str, mb: int = -1, chunk: int | None = None) -> Any:
        """Start an op timed by callbacks (``gc.callbacks``...); pass the result to ``end``."""
        token = self.op(optype, mb, chunk)
        token.__enter__()
        return token

    def end(self, token: Any) -> None:
        token.__exit__(None, None, None)

    def next_seq(self, optype: str) -> int:
        """Reserve the next seq_id of ``optype`` in this step (for ops timed elsewhere:
        reserve at the op's start, ``emit`` at its end)."""
        seq = self._seq.get(optype, 0)
        self._seq[optype] = seq + 1
        if optype in COMMUNICATING:
            self._posted[(self.step, optype, seq)] = (optype, seq, -1, self._read())
        return seq

    def emit(
        self,
        optype: str,
        seq: int,
        t0: int,
        t1: int,
        mb: int = -1,
        chunk: int = -1,
        gmc: int = -1,
        step: int | None = None,
    ) -> None:
        """Record an op timed by the caller with ``clock.read()`` values ``t0``..``t1``."""
        if not self.enabled:
            return
        step = self.step if step is None else step
        self._posted.pop((step, optype, seq), None)
        self.buffer.put((step, optype, seq, mb, chunk, gmc, self.clock.to_wall(t0), t1 - t0))
        self._last_done = (optype, seq, step, t1)

    # -- what the slowdown signals need (docs/detection.md, section 3) ------------------

    def work(self, optype: str, flops: float) -> None:
        """Declare ``flops`` floating-point operations done by ``optype`` ops in this step
        (from shapes: see ``integrations.linear_flops``)."""
        if self.enabled and flops > 0:
            self.notes.add_flops(optype, flops)

    def comm(self, optype: str, nbytes: int, group: int, algo: str) -> None:
        """Declare a collective of ``optype`` moving an ``nbytes`` buffer among ``group``
        ranks with ``algo`` (all-reduce, all-gather, reduce-scatter, p2p)."""
        if not self.enabled:
            return
        if algo not in ALGORITHMS:
            self._warn(f"unknown collective algorithm {algo!r} ignored")
            return
        self.notes.add_bytes(optype, nbytes, group, algo)

    def samples(self, n: int, dtype: str = "") -> None:
        """Samples (or tokens) this rank processes in this step, for throughput."""
        self.notes.samples += n
        if dtype:
            self.notes.dtype = dtype

    def note_gc(self, pause_ns: int) -> None:
        """A GC pause just ended (``integrations.watch_gc_pauses``)."""
        flight = self._in_flight
        self.notes.add_gc(pause_ns, flight[0] if flight is not None else None)

    def note_data_wait(self, wait_ns: int) -> None:
        """A wait for the next batch (``integrations.timed_batches``)."""
        self.notes.data_wait_ns += wait_ns

    def note_issue(self, latency_ns: int, step: int | None = None) -> None:
        """GPU start minus CPU launch of one timed op (``cuda.CudaTimer``) of ``step``.
        An op still on the device when its step ended is recorded later, while that
        step's end is held: its latency goes with that step, not the one running now
        (once the end is released, past ``MAX_HELD_ENDS``, to the one running now). A
        loop that ends a step number twice has its latencies go with the newest end."""
        notes = self.notes
        if step is not None:
            for held_step, held_notes, *_ in reversed(self._held_ends):
                if held_step == step:
                    notes = held_notes
                    break
        notes.issue_ns.append(latency_ns)

    # -- phases outside training steps (docs/detection.md, "Hangs") ---------------------

    def phase(self, name: str, bound_s: float | None = None) -> _Phase:
        """``with rw.phase("checkpoint-save", bound_s=600):`` announces a phase in which
        the rank may make no step progress for up to ``bound_s`` (default
        ``DEFAULT_PHASE_BOUND_S``) without the hang detector calling it hung; outside
        any phase a stall counts after a few step times. A heartbeat goes out at once
        on entering and leaving, so the detector never judges the phase by the bound of
        a training step."""
        return _Phase(self, name, bound_s)

    def phase_begin(self, name: str, bound_s: float | None = None) -> None:
        """Enter a phase (:meth:`phase`); phases nest, the innermost is the one reported."""
        if not self.enabled:
            self._phases.append(None)  # its end must not end an outer phase
            return
        try:
            bound = DEFAULT_PHASE_BOUND_S if bound_s is None else float(bound_s)
        except (TypeError, ValueError):
            bound = float("nan")
        if not isinstance(name, str) or not 1 <= len(name) <= 64 or not 0.001 <= bound <= 1e9:
            self._warn(f"phase {name!r} with bound {bound_s!r} ignored (name 1-64 characters,"
                       " bound in [0.001, 1e9] s)")  # fmt: skip
            self._phases.append(None)
            return
        self._phases.append((name, self._read(), bound))
        self.publisher.beat_soon()

    def phase_end(self) -> None:
        """Leave the innermost phase (one that was refused ends silently)."""
        if self._phases and self._phases.pop() is not None:
            self._phase_ended = self._read()
            self.publisher.beat_soon()

    # -- steps -------------------------------------------------------------------------

    def step_begin(self, step: int) -> None:
        """Ops from now on belong to ``step`` (seq_ids start again at 0)."""
        self.step = step
        self._seq = {}
        self.notes.begin_ns = self._read() + self.clock.shift_ns
        if self._posted:  # posted two steps ago and never finished: lost, forget them
            for key in [k for k in self._posted if k[0] < step - 1]:
                del self._posted[key]

    def step_end(self) -> None:
        """The current step is finished on this rank: its records can leave."""
        if not self.enabled:  # nothing recorded; the next step's T_inter starts here
            self._prev_end_ns, self.notes = self._read() + self.clock.shift_ns, StepNotes()
            return
        self._call_each(self.collectors, "collector")
        end = self._read() + self.clock.shift_ns
        notes, self.notes = self.notes, StepNotes()
        self._held_ends.append((self.step, notes, end, self._prev_end_ns))
        self._prev_end_ns = end
        self.release_ends()

    def _call_each(self, callbacks: list[Callable[[], object]], what: str) -> None:
        """Call each of ``callbacks``; one that raises is warned about, never raised
        into training."""
        for call in callbacks:
            try:
                call()
            except Exception as exc:
                self._warn(f"{what} {call!r} failed: {exc!r}")

    @property
    def ends_held(self) -> bool:
        """Whether a step's end waits for ops still to be emitted."""
        return bool(self._held_ends)

    def release_ends(self, force: bool = False) -> None:
        """Mark ended steps finished, oldest first, once no hold keeps them (all of them
        when ``force``, and the oldest past ``MAX_HELD_ENDS``: a device that never
        finishes must not hold memory or the stream's steps forever). The end marker
        says that every record of the step was put before it: a step whose last ops run
        on the device after its end (no synchronize in the loop) sends them with it,
        not after it, where the stream would take them for late records."""
        held, released = self._held_ends, False
        while held and (
            force or len(held) > MAX_HELD_ENDS or not any(hold(held[0][0]) for hold in self.holds)
        ):
            step, notes, end, prev_end = held.popleft()
            self.buffer.end_step(step, notes.close(step, end, prev_end))
            released = True
        if released:
            self.publisher.wake()

    # -- clock alignment ---------------------------------------------------------------

    def align_clock(self, estimate: OffsetEstimate) -> None:
        """Apply an offset to rank 0 (ops recorded from now on use it)."""
        self.clock.align(estimate)

    # -- end ---------------------------------------------------------------------------

    def close(self) -> PublisherStats:
        """Flush everything (spool resend included) and stop the publisher thread."""
        if self._closed:
            return self.publisher.snapshot()
        self._closed = True
        if self.enabled:
            self._call_each(self.finishers, "finisher")
        self.release_ends(force=True)
        was_on, self.enabled = self.enabled, False
        if not was_on:  # switched off: nothing was recorded, nothing to say
            return self.publisher.snapshot()
        return self.publisher.close()

    def stats(self) -> PublisherStats:
        return self.publisher.snapshot()

    def __enter__(self) -> RankWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def in_flight(self) -> tuple[str, int, int, int] | None:
        """The op the training thread is in, else the latest communication posted and not
        finished (what a blocked p2p wait waits for). Safe from another thread."""
        flight = self._in_flight
        if flight is not None or not self._posted:
            return flight
        posted = tuple(self._posted.values())  # one C-level copy: no concurrent-change error
        return max(posted, key=lambda f: f[3]) if posted else None

    def _idle(self) -> tuple[str, int, int, int] | None:
        """The last op done, while no op is in flight and no phase is announced (the
        watchdog's cue for a rank away in untimed Python). Safe from another thread."""
        done = self._last_done
        if done is None or self.in_flight() is not None or self._phases:
            return None
        return (*done[:3], max(done[3], self._phase_ended))

    def _progress_at(self) -> int:
        """When the last op or phase ended (``clock.read()``; 0: none yet)."""
        done = self._last_done
        return max(0 if done is None else done[3], self._phase_ended)

    def _heartbeat(self, finished: bool = False) -> bytes:
        flight = self.in_flight()
        done = self._last_done
        phases = tuple(self._phases)  # one C-level copy: the training thread may pop
        phase = next((p for p in reversed(phases) if p is not None), None)
        to_wall = self.clock.to_wall
        return encode_heartbeat(
            self.identity,
            sent_ns=self.clock.now_ns(),
            step=self.step,
            pid=os.getpid(),
            in_flight=None if flight is None else InFlight(*flight[:3], to_wall(flight[3])),
            last_done=None if done is None else LastDone(*done[:3], to_wall(done[3])),
            finished=finished,
            phase=None if phase is None else Phase(phase[0], to_wall(phase[1]), phase[2]),
        )

    def _warn(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warnings.warn(f"rankwatch hooks: {message}", RuntimeWarning, stacklevel=3)
