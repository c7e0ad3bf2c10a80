"""GPU op timing with CUDA events, anchored to the host clock.

The training thread only records two events per op (asynchronous, no sync);
:meth:`CudaTimer.collect` (a collector of the ``RankWatch``: called at each step end,
never blocking) turns the events that completed into records: an event's host time is
the anchor's host time plus the GPU time elapsed since the anchor event, scaled by the
rate of the host's clock against the device's. The anchor is an event recorded on a
stream of the timer's own, which nothing else uses: it runs as soon as it is recorded,
however deep the training stream's queue, so the host waits for that event alone and
reads its clock as it completes. It is renewed at a step end, ``first_anchor_s`` after
the first and then every ``anchor_every_s``, ops pending or not, and two anchors give
the rate. The two clocks parted at 21 µs a second on an H100 and 12.5 on an H200,
steadily: 1.3 ms by a 60-s renewal without the rate; with it, within 15 µs over 90 s
on the H200 (``benchmarks/README.md``, "Hooks"). Anchored instead on the training
stream after a synchronize (a ``cuda`` without ``Stream``), renewal waits for a step end
with nothing pending, which a loop that never waits for the device never has.

Ops still running on the device when their step ends (a loop with no synchronize)
hold the step's end back (``RankWatch.holds``) until they are recorded, at a later
op's start or step end: the stream gets them with their step, not as late records of a
step it has closed. ``close`` waits for the device and records the rest.

Each op's issue latency (GPU start minus the CPU time of its launch) goes into its
step's notes (a held step's too, until its end is released): a healthy distribution is
smooth, GC pauses and stray synchronisations make it jump (docs/detection.md, section 3).

torch is not imported: pass the ``torch.cuda`` module (or anything with ``Event``,
``synchronize`` and, for the anchor's own stream, ``Stream``). CI has no GPU, so the
unit tests drive it with stand-in events; ``benchmarks/check_cuda_timer.py`` checks it
on a real one (durations against torch's own events, anchoring against host clock
readings, ``collect`` not waiting, the current stream followed, the anchor renewed
while the device is busy), run on NVIDIA H200 and H100 machines (``benchmarks/README.md``,
"Hooks").
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any

from rankwatch.hooks.tracker import RankWatch
from rankwatch.schemas.optypes import COMPUTE

_MS = 1_000_000  # ns per ms (elapsed_time is in ms)


class _GpuOp:
    __slots__ = ("chunk", "gmc", "mb", "optype", "timer")

    def __init__(self, timer: CudaTimer, optype: str, mb: int, chunk: int, gmc: int) -> None:
        self.timer, self.optype, self.mb, self.chunk, self.gmc = timer, optype, mb, chunk, gmc

    def __enter__(self) -> None:
        t = self.timer
        if t.rw.ends_held:  # a step ended with ops on the device: theirs may be done now
            t.collect(reanchor=False)
        launch = t.rw.clock.read()  # CPU side: the op is issued now
        start = t._event()
        stream = t._stream
        start.record() if stream is None else start.record(stream())
        t._open.append((self, t.rw.step, t.rw.next_seq(self.optype), start, launch))

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        t = self.timer
        end = t._event()
        stream = t._stream
        end.record() if stream is None else end.record(stream())
        op, step, seq, start, launch = t._open.pop()
        t.pending.append((op, step, seq, start, end, launch))


class CudaTimer:
    MAX_FREE_EVENTS = 4096
    """Completed events kept for reuse: two new events per op cost the training thread
    3-8 µs more than two reused ones (an H200 with torch 2.11: 34-50 µs per timed op
    reused, 38-58 new, 7-10 for the bare launch; ``benchmarks/README.md``, "Hooks")."""

    MAX_RATE_ERROR = 1e-3
    """A measured rate further than this from 1 (1,000 ppm; crystals differ by tens) is
    taken for a bad reading, not a clock, and not used."""

    def __init__(
        self,
        rw: RankWatch,
        cuda: Any,
        anchor_every_s: float = 60.0,
        current_stream: Callable[[], Any] | None = None,
        first_anchor_s: float = 10.0,
    ) -> None:
        """``current_stream``: what each event is recorded on (default: torch's current
        stream through :func:`stream_lookup`; None there: ``Event.record()`` finds it)."""
        self.rw = rw
        self.cuda = cuda
        self._stream = current_stream or stream_lookup(cuda)
        self._free: list[Any] = []
        self.anchor_every_ns = int(anchor_every_s * 1e9)
        self.first_anchor_ns = int(first_anchor_s * 1e9)
        self.rate = 1.0
        """Host ns per device ns, measured between the last two anchors (1.0 before)."""
        self.rate_measured = False
        self._anchor_event: Any = None
        self._anchor_raw = 0
        self.anchor_wait_ns = 0
        """How long the latest anchor kept the host waiting: its event's record to the
        clock read after it completed (the bound on the anchor's error)."""
        make_stream = getattr(cuda, "Stream", None)
        self._anchor_stream: Any = make_stream() if make_stream is not None else None
        self.pending: deque[tuple[_GpuOp, int, int, Any, Any, int]] = deque()
        self._open: list[tuple[_GpuOp, int, int, Any, int]] = []
        self.anchor()
        rw.collectors.append(self.collect)
        rw.holds.append(self.holds)
        rw.finishers.append(self.finish)

    def _event(self) -> Any:
        """A timing event: a completed one again, else a new one."""
        return self._free.pop() if self._free else self.cuda.Event(enable_timing=True)

    def anchor(self) -> None:
        """Tie GPU time to the host clock; from the second on, also measure the rate of
        the one against the other. On the anchor's own stream it waits for its event
        alone; without one, for the whole device (a synchronize)."""
        event = self.cuda.Event(enable_timing=True)
        if self._anchor_stream is None:
            self.cuda.synchronize()
            began = self.rw.clock.read()
            event.record()
        else:
            began = self.rw.clock.read()
            event.record(self._anchor_stream)
        event.synchronize()
        raw = self.rw.clock.read()
        self.anchor_wait_ns = raw - began
        if self._anchor_event is not None:
            device_ns = self._anchor_event.elapsed_time(event) * _MS
            rate = (raw - self._anchor_raw) / device_ns if device_ns > 0 else 0.0
            if abs(rate - 1.0) <= self.MAX_RATE_ERROR:
                self.rate, self.rate_measured = rate, True
        self._anchor_raw = raw
        self._anchor_event = event

    def host_ns(self, event: Any) -> int:
        """The host clock's raw reading when ``event`` (completed) happened on the device."""
        return self._anchor_raw + round(self._anchor_event.elapsed_time(event) * _MS * self.rate)

    def op(self, optype: str, mb: int = -1, chunk: int | None = None) -> Any:
        """Like ``RankWatch.op`` but timed on the device's current stream."""
        rw = self.rw
        if not rw.enabled:
            return rw.op(optype)
        if optype in COMPUTE:
            c = 0 if chunk is None else chunk
            return _GpuOp(self, optype, mb, c, c * rw.identity.pp_size + rw.identity.pp_rank)
        return _GpuOp(self, optype, -1, -1, -1)

    def holds(self, step: int) -> bool:
        """Whether an op of ``step`` (or before) is still running on the device."""
        return bool(self.pending) and self.pending[0][1] <= step

    def finish(self) -> None:
        """Wait for the device and record every op left (``RankWatch.close``)."""
        self.cuda.synchronize()
        self.collect(reanchor=False)

    def collect(self, reanchor: bool = True) -> int:
        """Record every timed op whose end event completed, in order; never blocks.

        Returns how many are still pending. Re-anchors (only at a step end,
        ``reanchor``) when the anchor is old: on the anchor's own stream whether or not
        ops are pending (their events are then read against the new anchor), without
        one only when nothing is (a synchronize would wait for them). Step ends that
        waited for the ops recorded are released (``RankWatch.release_ends``).
        """
        emitted = 0
        while self.pending:
            op, step, seq, start, end, launch = self.pending[0]
            if not end.query():
                break
            self.pending.popleft()
            t0 = self.host_ns(start)
            t1 = t0 + round(start.elapsed_time(end) * _MS * self.rate)
            if len(self._free) < self.MAX_FREE_EVENTS:  # both completed: safe to record again
                self._free += (start, end)
            self.rw.emit(op.optype, seq, t0, t1, op.mb, op.chunk, op.gmc, step=step)
            self.rw.note_issue(max(0, t0 - launch), step)  # GPU start - CPU launch
            emitted += 1
        if emitted and self.rw.ends_held:
            self.rw.release_ends()
        every = self.anchor_every_ns if self.rate_measured else self.first_anchor_ns
        may = self._anchor_stream is not None or not self.pending
        if reanchor and may and self.rw.clock.read() - self._anchor_raw > every:
            self.anchor()
        return len(self.pending)


def stream_lookup(cuda: Any, keep: int = 64) -> Callable[[], Any] | None:
    """The current stream, cheaply, or None where torch's C functions are not there.

    ``Event.record()`` with no stream calls ``torch.cuda.current_stream()``, which builds
    a new Stream object each time: 4.2-7.5 of the 6.2-10.2 µs a record costs the
    training thread (an H100 with torch 2.11; ``benchmarks/README.md``, "Hooks"). The
    current device's raw stream handle is a plain C call; its Stream object is made once
    and kept (at most ``keep`` of them: a job uses a few streams)."""
    torch_c = getattr(sys.modules.get("torch"), "_C", None)
    device = getattr(torch_c, "_cuda_getDevice", None)
    raw = getattr(torch_c, "_cuda_getCurrentRawStream", None)
    current = getattr(cuda, "current_stream", None)
    if device is None or raw is None or current is None:
        return None
    known: dict[tuple[int, int], Any] = {}

    def lookup() -> Any:
        index = device()
        key = (index, raw(index))
        stream = known.get(key)
        if stream is None:
            if len(known) >= keep:
                known.clear()
            stream = known[key] = current(index)
        return stream

    return lookup
