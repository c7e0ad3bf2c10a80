"""The hooks' watchdog: one valid ``stacks`` message per stuck op, from another thread."""

from __future__ import annotations

import threading
from typing import Any

from rankwatch.hooks.clock import Clock
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.publisher import PublisherConfig
from rankwatch.hooks.tracker import RankWatch
from rankwatch.hooks.transports import SinkTransport
from rankwatch.hooks.watchdog import Watchdog, WatchdogConfig, native_threads
from rankwatch.schemas import stackdump
from rankwatch.schemas.codec import decode

IDENT = Identity(job="j", host="h", rank=3, dp_rank=1, pp_rank=1, dp_size=2, pp_size=2)
S = 1_000_000_000


class FakeClock:
    def __init__(self) -> None:
        self.t = 0

    def read(self) -> int:
        return self.t


def watchdog(flight: list[Any], clock: FakeClock, threshold_s: float = 2.0) -> Watchdog:
    return Watchdog(
        IDENT,
        in_flight=lambda: flight[0],
        step=lambda: 7,
        read=clock.read,
        now_ns=lambda: 1_700_000_000 * S,
        config=WatchdogConfig(threshold_s=threshold_s, py_spy=False),
    )


def stuck_here(release: threading.Event) -> None:
    release.wait()


def test_dumps_once_per_stuck_op_and_again_for_the_next() -> None:
    release = threading.Event()
    stuck = threading.Thread(target=stuck_here, args=(release,), name="stuck")
    stuck.start()
    try:
        dumps_once_per_stuck_op()
    finally:
        release.set()
        stuck.join()


def dumps_once_per_stuck_op() -> None:
    clock, flight = FakeClock(), [("forward-recv", 2, -1, 0)]
    dog = watchdog(flight, clock)
    clock.t = 1 * S
    assert dog.check() is None  # not stuck yet
    clock.t = 3 * S
    first = dog.check()
    assert first is not None and dog.check() is None  # once per stuck op
    message = decode("stacks", first)
    assert (message["job"], message["rank"]) == ("j", 3)
    assert "forward-recv_2" in message["reason"] and "step 7" in message["reason"]
    ids = {t["thread_id"] for t in message["threads"]}
    assert threading.get_ident() not in ids  # the dumping thread leaves itself out
    [other] = [t for t in message["threads"] if t["name"] == "stuck"]
    functions = [f["function"] for f in other["frames"]]
    assert functions[-3:] == ["stuck_here", "wait", "wait"]  # outermost first
    assert functions[0] == "_bootstrap" and not other["native"]
    flight[0] = ("grads-reduce-scatter", 0, -1, 3 * S)
    clock.t = 6 * S
    assert dog.check() is not None and dog.dumps == 2


def test_idle_rank_or_switched_off_never_dumps() -> None:
    clock = FakeClock()
    clock.t = 100 * S
    assert watchdog([None], clock).check() is None
    assert watchdog([("optimizer", 0, -1, 0)], clock, threshold_s=0).check() is None


def test_without_py_spy_native_frames_are_simply_absent(monkeypatch: Any) -> None:
    monkeypatch.setattr(stackdump, "py_spy", lambda: None)
    assert native_threads(1, 1.0) == []
    assert stackdump.dump_threads(1, 1.0) == ([], "py-spy is not installed")


def test_tracker_sees_a_posted_p2p_wait_as_in_flight_and_publishes_its_stacks() -> None:
    sent: list[tuple[str, bytes]] = []
    ticks = [0]
    rw = RankWatch(
        IDENT,
        SinkTransport(lambda kind, value: sent.append((kind, value))),
        clock=Clock(read=lambda: ticks[0]),
        publisher=PublisherConfig(heartbeat_s=1000.0),
        watchdog=WatchdogConfig(threshold_s=2.0, py_spy=False),
        start=False,
    )
    rw.step_begin(4)
    seq = rw.next_seq("forward-recv")  # posted by the schedule, waited for elsewhere
    assert rw.in_flight() == ("forward-recv", seq, -1, 0)
    ticks[0] = 5 * S
    rw.publisher.step_once(0.0)
    stacks = [decode("stacks", v) for k, v in sent if k == "stacks"]
    assert len(stacks) == 1 and "forward-recv_0" in stacks[0]["reason"]
    beats = [decode("heartbeats", v) for k, v in sent if k == "heartbeats"]
    assert beats[-1]["in_flight"]["optype"] == "forward-recv"
    rw.emit("forward-recv", seq, 0, 5 * S)  # the wait ended
    assert rw.in_flight() is None
    assert rw.stats().stacks_sent == 1


def test_a_rank_away_from_any_timed_op_is_dumped_once_and_not_inside_a_phase() -> None:
    """The hang detector names a rank "outside any timed op" (an unannounced save, a
    sleep, a lock); its own watchdog is then the one that can say where it is."""
    sent: list[tuple[str, bytes]] = []
    ticks = [0]
    rw = RankWatch(
        IDENT,
        SinkTransport(lambda kind, value: sent.append((kind, value))),
        clock=Clock(read=lambda: ticks[0]),
        publisher=PublisherConfig(heartbeat_s=1000.0),
        watchdog=WatchdogConfig(threshold_s=2.0, py_spy=False),
        start=False,
    )

    def dumps() -> list[dict[str, Any]]:
        rw.publisher.step_once(0.0)
        return [decode("stacks", v) for k, v in sent if k == "stacks"]

    rw.step_begin(4)
    with rw.op("optimizer"):
        ticks[0] = 1 * S
    ticks[0] = 2 * S
    assert dumps() == []  # away 1 s: not yet
    ticks[0] = 4 * S
    [away] = dumps()
    assert "outside any timed op for 3.0 s since optimizer_0 of step 4" in away["reason"]
    ticks[0] = 9 * S
    assert len(dumps()) == 1  # once per spell
    with rw.op("forward-compute"):
        ticks[0] = 10 * S
    with rw.phase("checkpoint-save", 60.0):
        ticks[0] = 40 * S
        assert len(dumps()) == 1  # an announced phase is no cue
    ticks[0] = 41 * S
    assert len(dumps()) == 1  # and its end is a fresh start
    ticks[0] = 43 * S
    assert "outside any timed op for 3.0 s" in dumps()[-1]["reason"]


def test_a_receive_posted_early_is_stuck_only_once_the_rank_stops_progressing() -> None:
    """1F1B posts a pipeline receive while the rank still computes: a dump 2 s after the
    post, with the rank busy, would be stale once the rank goes on, and the same op was
    never dumped again when the rank then really sat in the wait (the SIGSTOP test's
    report once lacked that rank's stack). The count runs from the rank's last progress."""
    clock, flight = FakeClock(), [("forward-recv", 1, -1, 0)]
    progress = [0]
    dog = Watchdog(
        IDENT,
        in_flight=lambda: flight[0],
        step=lambda: 5,
        read=clock.read,
        now_ns=lambda: 1_700_000_000 * S,
        config=WatchdogConfig(threshold_s=2.0, py_spy=False),
        progress_at=lambda: progress[0],
    )
    for t in (1, 2, 3):  # the rank finishes an op every second: not stuck
        clock.t = progress[0] = t * S
        assert dog.check() is None
    clock.t = 5 * S  # no progress since 3 s: now it is
    dump = dog.check()
    assert dump is not None and dog.check() is None
    reason = decode("stacks", dump)["reason"]
    assert "forward-recv_1 (microbatch -1) of step 5 in flight for 5.0 s" in reason
    assert "no progress for 2.0 s" in reason
