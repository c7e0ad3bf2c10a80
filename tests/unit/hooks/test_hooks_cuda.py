"""CUDA-event timing, driven by stand-in events (no GPU here): anchoring and order."""

from __future__ import annotations

import itertools
import sys
import types
from typing import Any

from rankwatch.hooks.clock import Clock
from rankwatch.hooks.cuda import CudaTimer, stream_lookup
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.tracker import MAX_HELD_ENDS, RankWatch
from rankwatch.hooks.transports import SinkTransport
from rankwatch.schemas.codec import decode_ops


class FakeCuda:
    """Device time in ms advances by ``gpu_ms`` per recorded event; ``done`` says up
    to which event the device has got."""

    def __init__(self) -> None:
        self.gpu_ms = 0.0
        self.done = 10**9
        self.recorded = 0
        self.made = 0
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = 0.0
                self.n = 0
                cuda.made += 1

            def record(self, stream: Any = None) -> None:
                cuda.gpu_ms += 2.0
                cuda.recorded += 1
                self.t, self.n, self.stream = cuda.gpu_ms, cuda.recorded, stream

            def synchronize(self) -> None:
                pass

            def query(self) -> bool:
                return self.n <= cuda.done

            def elapsed_time(self, other: Any) -> float:
                return float(other.t - self.t)

        self.Event = Event
        self.device_syncs = 0

    def synchronize(self) -> None:
        self.device_syncs += 1


class StreamedCuda(FakeCuda):
    """With ``Stream``: the timer anchors on a stream of its own."""

    def Stream(self) -> str:  # torch.cuda's name
        return "anchor's stream"


def _tracker(clock: Clock | None = None) -> RankWatch:
    """A rank's tracker with no publisher thread: tests take its buffer themselves."""
    ident = Identity(job="j", host="h", rank=0, dp_rank=0, pp_rank=0)
    return RankWatch(ident, SinkTransport(lambda k, v: None), clock=clock, start=False)


def test_events_become_records_on_the_host_clock_once_complete() -> None:
    ticks = itertools.count(1_000_000, 1_000)
    rw = RankWatch(
        Identity(job="j", host="h", rank=0, dp_rank=0, pp_rank=1, pp_size=2),
        SinkTransport(lambda k, v: None),
        clock=Clock(read=lambda: next(ticks), wall=lambda: 0),
        start=False,
    )
    cuda = FakeCuda()
    timer = CudaTimer(rw, cuda)  # anchor: event 1 at 2 ms, host raw 1_001_000
    anchor_raw = timer._anchor_raw
    rw.step_begin(5)
    with timer.op("forward-compute", mb=0):  # events 2 (4 ms) and 3 (6 ms)
        pass
    with timer.op("forward-send"):  # events 4, 5
        pass
    cuda.done = 3  # the send has not finished on the device
    assert timer.collect() == 1
    cuda.done = 10**9
    assert timer.collect() == 0
    recs = rw.buffer.take()[0]
    shift = rw.clock.shift_ns
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in recs] == [
        (5, "forward-compute", 0, 0, 1),
        (5, "forward-send", 0, -1, -1),
    ]
    assert recs[0][6] == anchor_raw + 2 * 1_000_000 + shift and recs[0][7] == 2_000_000
    assert recs[1][6] == anchor_raw + 6 * 1_000_000 + shift


def test_issue_latency_is_gpu_start_minus_cpu_launch() -> None:
    """Stand-in events (CI has no GPU; benchmarks/check_cuda_timer.py is the real-GPU
    check)."""
    reads: list[int] = []
    ticks = itertools.count(1_000_000, 1_000)

    def read() -> int:
        reads.append(next(ticks))
        return reads[-1]

    rw = _tracker(Clock(read=read, wall=lambda: 0))
    cuda = FakeCuda()
    timer = CudaTimer(rw, cuda)  # anchor event at 2 ms
    anchor_raw = timer._anchor_raw
    rw.step_begin(0)
    n = len(reads)
    with timer.op("forward-compute", mb=0):  # start event at 4 ms: 2 ms after the anchor
        pass
    launch = reads[n]
    timer.collect()
    assert rw.notes.issue_ns == [anchor_raw + 2_000_000 - launch]


def _drifting(ppm: float) -> tuple[RankWatch, FakeCuda, CudaTimer]:
    """A timer whose host clock runs ``ppm`` faster than the device's (an H100 measured
    21), anchored once at device time 2 ms."""
    cuda = FakeCuda()
    rw = _tracker(Clock(read=lambda: round(cuda.gpu_ms * 1e6 * (1 + ppm * 1e-6)), wall=lambda: 0))
    return rw, cuda, CudaTimer(rw, cuda)


def _start_raw(rw: RankWatch, timer: CudaTimer, idle_ms: float) -> int:
    """The host time recorded for an op launched after ``idle_ms`` of device time."""
    timer.cuda.gpu_ms += idle_ms
    rw.step_begin(0)
    with timer.op("forward-compute", mb=0):
        pass
    timer.collect(reanchor=False)
    return int(rw.buffer.take()[0][-1][6] - rw.clock.shift_ns)


def test_a_second_anchor_measures_the_clocks_rate_and_host_times_follow_it() -> None:
    rw, cuda, timer = _drifting(100.0)
    assert not timer.rate_measured
    cuda.gpu_ms += 10_000.0  # 10 s of an idle device
    timer.anchor()
    assert timer.rate_measured and abs(timer.rate - 1.0001) < 1e-9
    start = _start_raw(rw, timer, 60_000.0)  # a minute later: 6 ms of drift uncorrected
    truth = round((cuda.gpu_ms - 2.0) * 1e6 * 1.0001)  # its start event: 2 ms before the end
    assert abs(start - truth) <= 2


def test_a_rate_far_from_one_is_taken_for_a_bad_reading() -> None:
    _, cuda, timer = _drifting(5_000.0)  # 5,000 ppm: no crystal, a glitch
    cuda.gpu_ms += 10_000.0
    timer.anchor()
    assert not timer.rate_measured and timer.rate == 1.0


def test_on_its_own_stream_the_anchor_is_renewed_with_ops_pending() -> None:
    """A loop that never waits for the device has ops pending at every step end: the
    anchor, on a stream nothing else uses, is renewed all the same, waits for no
    training op (no synchronize), and the pending op's times are read against it."""
    cuda = StreamedCuda()
    ppm = 100.0
    rw = _tracker(Clock(read=lambda: round(cuda.gpu_ms * 1e6 * (1 + ppm * 1e-6)), wall=lambda: 0))
    timer = CudaTimer(rw, cuda)
    assert cuda.device_syncs == 0 and timer._anchor_event.stream == "anchor's stream"
    rw.step_begin(0)
    with timer.op("forward-compute", mb=0):  # its events at 4 and 6 ms
        pass
    cuda.done = cuda.recorded - 1  # its end event has not run yet
    cuda.gpu_ms += 11_000.0
    assert timer.collect() == 1  # 11 s on: renewed, the op still pending
    assert timer.rate_measured and abs(timer.rate - 1.0001) < 1e-9 and cuda.device_syncs == 0
    cuda.done = 10**9
    assert timer.collect() == 0
    start = int(rw.buffer.take()[0][-1][6] - rw.clock.shift_ns)
    assert abs(start - round(4.0 * 1e6 * 1.0001)) <= 2  # before the new anchor: still right


def test_without_its_own_stream_the_anchor_waits_for_a_step_end_with_nothing_pending() -> None:
    _, cuda, timer = _drifting(0.0)
    first = timer._anchor_raw
    rw = timer.rw
    rw.step_begin(0)
    with timer.op("forward-compute", mb=0):
        pass
    cuda.done = cuda.recorded - 1
    cuda.gpu_ms += 11_000.0
    syncs = cuda.device_syncs
    assert timer.collect() == 1 and timer._anchor_raw == first  # a synchronize would wait
    cuda.done = 10**9
    assert timer.collect() == 0 and timer._anchor_raw > first
    assert cuda.device_syncs == syncs + 1


def test_the_first_renewal_comes_early_then_once_a_minute() -> None:
    _, cuda, timer = _drifting(0.0)
    first = timer._anchor_raw
    cuda.gpu_ms += 9_000.0
    timer.collect()  # 9 s: not yet
    assert timer._anchor_raw == first
    cuda.gpu_ms += 2_000.0
    timer.collect()  # 11 s: renewed, rate measured
    assert timer._anchor_raw > first and timer.rate_measured
    second = timer._anchor_raw
    cuda.gpu_ms += 30_000.0
    timer.collect()  # 30 s later: not yet (every 60 s from now on)
    assert timer._anchor_raw == second


def test_completed_events_are_recorded_again_not_made_anew() -> None:
    """A new event costs the training thread more than a reused one: the events of
    collected ops are reused, and the times read from them are those of their new use."""
    ticks = itertools.count(1_000_000, 1_000)
    rw = _tracker(Clock(read=lambda: next(ticks), wall=lambda: 0))
    cuda = FakeCuda()
    timer = CudaTimer(rw, cuda)  # anchor: 1 event, at 2 ms
    rw.step_begin(0)
    with timer.op("forward-compute", mb=0):  # 2 new events, at 4 and 6 ms
        pass
    cuda.done = 2  # its end has not completed: not collected, its events not reused
    assert timer.collect() == 1
    with timer.op("forward-compute", mb=1):  # 2 more new events, at 8 and 10 ms
        pass
    assert cuda.made == 5
    cuda.done = 10**9
    assert timer.collect() == 0
    with timer.op("backward-compute", mb=0):  # reused, recorded at 12 and 14 ms
        pass
    assert timer.collect() == 0
    assert cuda.made == 5
    recs = rw.buffer.take()[0]
    starts = [r[6] - rw.clock.shift_ns - timer._anchor_raw for r in recs]
    assert starts == [2_000_000, 6_000_000, 10_000_000]
    assert [r[7] for r in recs] == [2_000_000] * 3


class FakeTorchC:
    """torch._C's two stream calls: which device is current, and its raw stream."""

    def __init__(self) -> None:
        self.device, self.raw = 0, {0: 111, 1: 222}

    def _cuda_getDevice(self) -> int:
        return self.device

    def _cuda_getCurrentRawStream(self, index: int) -> int:
        return self.raw[index]


def test_stream_lookup_follows_the_current_stream_and_makes_each_stream_once(
    monkeypatch: Any,
) -> None:
    torch_c = FakeTorchC()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=torch_c))
    made: list[int] = []

    class Cuda:
        @staticmethod
        def current_stream(index: int) -> tuple[int, int]:
            made.append(index)
            return (index, torch_c.raw[index])

    lookup = stream_lookup(Cuda, keep=2)
    assert lookup is not None
    assert [lookup(), lookup()] == [(0, 111), (0, 111)] and made == [0]
    torch_c.raw[0] = 333  # inside torch.cuda.stream(side)
    assert lookup() == (0, 333)
    torch_c.device = 1
    assert lookup() == (1, 222) and made == [0, 0, 1]  # a third stream: the two forgotten
    torch_c.device, torch_c.raw[0] = 0, 111
    assert lookup() == (0, 111) and made == [0, 0, 1, 0]


def test_events_are_recorded_on_the_looked_up_stream_or_find_it_themselves() -> None:
    rw = _tracker()
    streams: list[Any] = []

    class Cuda(FakeCuda):
        def __init__(self) -> None:
            super().__init__()
            plain = self.Event

            class Event(plain):  # type: ignore[misc,valid-type]
                def record(self, stream: Any = None) -> None:
                    streams.append(stream)
                    super().record()

            self.Event = Event

    assert stream_lookup(FakeCuda()) is None  # no current_stream: events find it
    with CudaTimer(rw, Cuda(), current_stream=lambda: "side").op("optimizer"):
        pass
    with CudaTimer(rw, Cuda()).op("optimizer"):
        pass
    # each timer's anchor first (always Event.record()), then its op's two events
    assert streams == [None, "side", "side", None, None, None]


def _taken(rw: RankWatch) -> tuple[list[tuple[int, str]], list[int]]:
    records, ends = rw.buffer.take()
    return [(r[0], r[1]) for r in records], ends


def _late_optimizer_step() -> tuple[RankWatch, FakeCuda, CudaTimer]:
    """Step 0 ended with its forward done and its optimizer still on the device."""
    rw = _tracker()
    cuda = FakeCuda()
    timer = CudaTimer(rw, cuda)  # the anchor: event 1
    rw.step_begin(0)
    with timer.op("forward-compute", mb=0):  # events 2, 3
        pass
    with timer.op("optimizer"):  # events 4, 5: still running at the step end
        pass
    cuda.done = 3
    rw.step_end()
    return rw, cuda, timer


def test_a_step_whose_ops_are_still_on_the_device_ends_once_they_are_recorded() -> None:
    rw, cuda, timer = _late_optimizer_step()
    assert _taken(rw) == ([(0, "forward-compute")], [])  # no end: the optimizer is to come
    rw.step_begin(1)
    with timer.op("forward-compute", mb=0):  # the device is not done yet: still held
        pass
    assert _taken(rw) == ([], [])
    cuda.done = 10**9
    with timer.op("backward-compute", mb=0):  # what completed is recorded, then step 0 ends
        pass
    assert _taken(rw) == ([(0, "optimizer"), (1, "forward-compute")], [0])
    rw.step_end()
    assert _taken(rw) == ([(1, "backward-compute")], [1])


def test_an_op_recorded_after_its_step_ended_counts_its_issue_latency_in_that_step() -> None:
    rw, cuda, timer = _late_optimizer_step()
    rw.step_begin(1)
    cuda.done = 10**9
    with timer.op("forward-compute", mb=0):  # step 0's optimizer is recorded first
        pass
    rw.step_end()
    notes = {n["step"]: n["issue"] for n in rw.buffer.take_all()[2]}
    assert notes[0] is not None and notes[0]["n"] == 2  # its two ops, the late one too
    assert notes[1] is not None and notes[1]["n"] == 1  # its own op alone


def test_the_last_steps_late_op_counts_its_issue_latency_at_close() -> None:
    issues: dict[int, Any] = {}

    def deliver(kind: str, value: bytes) -> None:
        if kind == "ops":
            issues.update((s["step"], s.get("issue")) for s in decode_ops(value).rank_steps)

    rw = RankWatch(
        Identity(job="j", host="h", rank=0, dp_rank=0, pp_rank=0), SinkTransport(deliver)
    )
    cuda = FakeCuda()
    cuda.synchronize = lambda: setattr(cuda, "done", 10**9)  # type: ignore[method-assign]
    timer = CudaTimer(rw, cuda)
    rw.step_begin(0)
    with timer.op("optimizer"):  # still running at the step end
        pass
    cuda.done = 0
    rw.step_end()
    rw.close()
    assert issues[0] is not None and issues[0]["n"] == 1


def test_close_waits_for_the_device_and_releases_every_end() -> None:
    sent: list[int] = []

    def deliver(kind: str, value: bytes) -> None:
        if kind == "ops":
            batch = decode_ops(value)
            sent.extend(batch.step.tolist())
            sent.extend(-s for s, _ in batch.steps_done)  # step ends as negatives

    rw = RankWatch(
        Identity(job="j", host="h", rank=0, dp_rank=0, pp_rank=0), SinkTransport(deliver)
    )
    cuda = FakeCuda()
    synced = []
    cuda.synchronize = lambda: (synced.append(True), setattr(cuda, "done", 10**9))  # type: ignore[method-assign]
    timer = CudaTimer(rw, cuda)
    rw.step_begin(3)
    with timer.op("optimizer"):
        pass
    cuda.done = 0  # nothing finished
    rw.step_end()
    stats = rw.close()
    assert len(synced) == 2  # the anchor's, then close's
    assert sorted(sent) == [-3, 3] and stats.sent == 1


def test_ends_held_past_the_limit_are_released_oldest_first() -> None:
    rw = _tracker()
    cuda = FakeCuda()
    timer = CudaTimer(rw, cuda)
    cuda.done = 0  # a device that never finishes
    for step in range(MAX_HELD_ENDS + 2):
        rw.step_begin(step)
        with timer.op("optimizer"):
            pass
        rw.step_end()
    assert rw.buffer.take()[1] == [0, 1]  # the two oldest of ten
