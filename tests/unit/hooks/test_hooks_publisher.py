"""Publishing: a rank's finished steps in as few messages as the batching rule allows,
failures spooled or counted, all accounted."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest

from rankwatch.hooks.clock import Clock
from rankwatch.hooks.identity import Identity
from rankwatch.hooks.publisher import PublisherConfig
from rankwatch.hooks.session import HooksConfig, init, shutdown
from rankwatch.hooks.tracker import RankWatch
from rankwatch.hooks.transports import SinkTransport
from rankwatch.schemas.codec import decode, decode_ops
from rankwatch.schemas.spool import Spool

IDENT = Identity(job="j", host="h", rank=0, dp_rank=0, pp_rank=0)


class Wire:
    """An in-process destination that can be switched off (a broker outage)."""

    def __init__(self) -> None:
        self.up = True
        self.messages: list[tuple[str, bytes]] = []

    def deliver(self, kind: str, value: bytes) -> None:
        if not self.up:
            raise ConnectionError("down")
        self.messages.append((kind, value))

    def batches(self) -> list:
        return [decode_ops(v) for k, v in self.messages if k == "ops"]


def make(wire: Wire, spool: Spool | None = None, **config: float) -> RankWatch:
    ticks = itertools.count(1_000, 1_000)
    return RankWatch(
        IDENT,
        SinkTransport(wire.deliver),
        clock=Clock(read=lambda: next(ticks), wall=lambda: 10**18),
        publisher=PublisherConfig(heartbeat_s=1e9, **config),  # type: ignore[arg-type]
        spool=spool,
        start=False,
    )


def run_steps(rw: RankWatch, steps: range, ops_per_step: int = 3) -> None:
    for step in steps:
        rw.step_begin(step)
        for mb in range(ops_per_step - 1):
            with rw.op("forward-compute", mb=mb):
                pass
        with rw.op("optimizer"):
            pass
        rw.step_end()


def test_steps_finished_together_leave_together_with_their_record_counts() -> None:
    wire = Wire()
    rw = make(wire)
    run_steps(rw, range(3))
    rw.publisher.step_once(now=0.0)
    assert wire.batches() == []  # held: steps that end together are short ones
    rw.publisher.step_once(now=0.2)
    assert wire.batches() == []
    rw.publisher.step_once(now=0.25)  # the window (0.25 s) is over
    (batch,) = wire.batches()
    assert batch.steps_done == ((0, 3), (1, 3), (2, 3))
    assert batch.step.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert batch.seq_id.tolist() == [0, 1, 0] * 3 and batch.batch_seq == 0
    stats = rw.close()
    assert stats.sent == stats.put == 9 and stats.accounted()


def test_long_steps_leave_at_once_short_ones_share_a_message() -> None:
    wire = Wire()
    rw = make(wire)
    for step, now in enumerate([0.0, 1.0, 2.0]):  # 1-s steps: longer than the window
        run_steps(rw, range(step, step + 1))
        rw.publisher.step_once(now=now)
        assert [b.steps_done[0][0] for b in wire.batches()] == list(range(step + 1))
    for step, now in zip(range(3, 8), [2.05, 2.1, 2.15, 2.2, 2.25], strict=True):  # 50 ms
        run_steps(rw, range(step, step + 1))
        rw.publisher.step_once(now=now)
    assert len(wire.batches()) == 3  # steps 3.. held since 2.05
    rw.publisher.step_once(now=2.3)
    assert [s for s, _ in wire.batches()[-1].steps_done] == [3, 4, 5, 6, 7]
    rw.close()


def test_a_held_step_leaves_when_the_next_one_is_late() -> None:
    """A short step is held for the next one; if the rank's step time grows past the
    window, what is held leaves as soon as it is due, and the later step at once."""
    wire = Wire()
    rw = make(wire, batch_window_s=0.5)
    for step, now in enumerate([0.0, 0.1, 0.2]):
        run_steps(rw, range(step, step + 1))
        rw.publisher.step_once(now=now)
    assert [b.steps_done for b in wire.batches()] == [((0, 3),)]  # no interval known yet
    rw.publisher.step_once(now=0.6)  # 0.1 + 0.5
    assert [b.steps_done for b in wire.batches()][-1] == ((1, 3), (2, 3))
    run_steps(rw, range(3, 4))
    rw.publisher.step_once(now=2.0)  # interval 1.8 s > window: at once
    assert [b.steps_done for b in wire.batches()][-1] == ((3, 3),)
    rw.close()


def test_without_a_window_every_step_leaves_at_once() -> None:
    wire = Wire()
    rw = make(wire, batch_window_s=0.0)
    for step in range(3):
        run_steps(rw, range(step, step + 1))
        rw.publisher.step_once(now=0.0)
    assert [b.steps_done for b in wire.batches()] == [((0, 3),), ((1, 3),), ((2, 3),)]
    rw.close()


def test_a_long_step_is_flushed_in_parts_and_its_end_is_never_empty() -> None:
    wire = Wire()
    rw = make(wire, partial_flush_s=1.0)
    rw.step_begin(0)
    for mb in range(5):
        with rw.op("forward-compute", mb=mb):
            pass
    rw.publisher.step_once(now=0.0)  # first pending records seen
    rw.publisher.step_once(now=0.5)
    assert wire.batches() == []
    rw.publisher.step_once(now=2.0)  # interval passed: all but the last record leave
    assert [len(b) for b in wire.batches()] == [4]
    assert wire.batches()[0].steps_done == ()
    rw.step_end()
    rw.publisher.step_once(now=2.1)
    last = wire.batches()[-1]
    assert len(last) == 1 and last.steps_done == ((0, 5),)


def test_big_steps_are_split_into_max_batch_messages() -> None:
    wire = Wire()
    rw = make(wire, max_batch=4)
    run_steps(rw, range(1), ops_per_step=10)
    rw.publisher.step_once(now=0.0)
    assert [len(b) for b in wire.batches()] == [4, 4, 2]
    assert [b.steps_done for b in wire.batches()] == [(), (), ((0, 10),)]


def test_held_steps_fill_messages_up_to_max_batch() -> None:
    wire = Wire()
    rw = make(wire, max_batch=4)
    run_steps(rw, range(3))  # 9 records held: more than max_batch, so they leave now
    rw.publisher.step_once(now=0.0)
    assert [len(b) for b in wire.batches()] == [4, 4, 1]
    assert [b.steps_done for b in wire.batches()] == [((0, 3),), ((1, 3),), ((2, 3),)]
    assert [b.step.tolist() for b in wire.batches()] == [[0, 0, 0, 1], [1, 1, 2, 2], [2]]
    assert rw.close().accounted()


def test_outage_spools_and_resends_everything_in_the_order_it_was_made(tmp_path: Path) -> None:
    """Steps 2-4 spooled while the broker is away; step 5, made once it is back, goes
    behind them through the spool rather than overtaking them: the worker gets every
    step of the rank in order, so the spooled ones are not late."""
    wire = Wire()
    rw = make(wire, spool=Spool(tmp_path / "r0.spool"), resend_interval_s=0.0, batch_window_s=0.0)
    run_steps(rw, range(2))
    rw.publisher.step_once(now=0.0)
    wire.up = False
    run_steps(rw, range(2, 5))
    rw.publisher.step_once(now=1.0)
    mid = rw.stats()
    assert mid.spooled == 9 and mid.in_spool == 9 and mid.accounted()
    wire.up = True
    run_steps(rw, range(5, 6))
    rw.publisher.step_once(now=2.0)
    stats = rw.close()
    assert (stats.sent, stats.resent, stats.in_spool, stats.dropped_send) == (6, 12, 0, 0)
    assert stats.accounted()
    assert [s for b in wire.batches() for s, _ in b.steps_done] == list(range(6))


def test_without_a_spool_failed_records_are_counted_as_dropped() -> None:
    wire = Wire()
    wire.up = False
    rw = make(wire)
    run_steps(rw, range(2))
    stats = rw.close()
    assert (stats.put, stats.dropped_send, stats.sent) == (6, 6, 0)
    assert stats.accounted()


def test_buffer_overflow_is_counted_and_the_step_count_matches_what_was_sent() -> None:
    wire = Wire()
    ticks = itertools.count()
    rw = RankWatch(
        IDENT,
        SinkTransport(wire.deliver),
        clock=Clock(read=lambda: next(ticks)),
        capacity=4,
        start=False,
    )
    run_steps(rw, range(1), ops_per_step=10)
    stats = rw.close()
    (batch,) = wire.batches()
    assert batch.steps_done == ((0, 4),) and len(batch) == 4
    assert (stats.dropped_buffer, stats.sent) == (6, 4) and stats.accounted()


def test_heartbeats_say_what_is_in_flight() -> None:
    wire = Wire()
    rw = make(wire)
    rw.step_begin(4)
    with rw.op("forward-compute", mb=2):
        rw.publisher.step_once(now=0.0)
    (beat,) = [decode("heartbeats", v) for k, v in wire.messages if k == "heartbeats"]
    assert beat["step"] == 4
    assert beat["in_flight"]["optype"] == "forward-compute" and beat["in_flight"]["mb_id"] == 2
    assert beat["last_done"] is None and "state" not in beat
    rw.close()
    last = decode("heartbeats", wire.messages[-1][1])
    assert last["state"] == "finished" and last["last_done"]["optype"] == "forward-compute"


def test_a_phase_is_announced_at_once_and_ends_with_its_block() -> None:
    """``with rw.phase(...)``: the next round beats at once, whatever the heartbeat period
    (1e9 s here), carrying the phase; leaving it beats again without it. A bound the
    schema cannot carry is warned about and announces nothing."""
    wire = Wire()
    rw = make(wire)
    rw.publisher.step_once(now=0.0)  # the first beat; the next is 1e9 s away
    with rw.phase("checkpoint-save", bound_s=600):
        rw.publisher.step_once(now=1.0)
        with pytest.warns(RuntimeWarning, match="phase 'x' with bound -1"):
            rw.phase_begin("x", bound_s=-1)
        rw.phase_end()  # ends the ignored phase, not the save around it
        with pytest.warns(RuntimeWarning, match="phase 3"):
            rw.phase_begin(3, bound_s="soon")  # type: ignore[arg-type]
        rw.phase_end()
        rw.enabled = False  # hooks switched off for a step: a phase begun then...
        rw.phase_begin("off")
        rw.enabled = True
        rw.phase_end()  # ...ends itself, not the save
        rw.publisher.step_once(now=2.0)  # no beat due
    rw.publisher.step_once(now=3.0)
    beats = [decode("heartbeats", v) for k, v in wire.messages if k == "heartbeats"]
    assert [b.get("phase") is not None for b in beats] == [False, True, False]
    assert beats[2]["sent_ns"] > beats[1]["sent_ns"]
    assert beats[1]["phase"]["name"] == "checkpoint-save" and beats[1]["phase"]["bound_s"] == 600
    assert beats[1]["phase"]["since_ns"] <= beats[1]["sent_ns"]
    rw.close()


def test_the_thread_flushes_on_step_end() -> None:
    wire = Wire()
    rw = RankWatch(IDENT, SinkTransport(wire.deliver), publisher=PublisherConfig(heartbeat_s=60))
    run_steps(rw, range(2))
    stats = rw.close()
    assert stats.sent == 6 and stats.accounted()
    assert [s for b in wire.batches() for s in b.steps_done] == [(0, 3), (1, 3)]


@pytest.mark.parametrize("enabled", [False])
def test_disabled_hooks_record_nothing(enabled: bool) -> None:
    wire = Wire()
    rw = RankWatch(IDENT, SinkTransport(wire.deliver), enabled=enabled)
    run_steps(rw, range(2))
    assert rw.close().put == 0 and wire.messages == []


def test_a_restarted_rank_resends_its_predecessors_spool(tmp_path: Path) -> None:
    from rankwatch import hooks

    config = hooks.HooksConfig(spool_dir=str(tmp_path), publisher=PublisherConfig(heartbeat_s=60))
    down, up = Wire(), Wire()
    down.up = False
    hooks.init(config, identity=IDENT, sink=down.deliver)
    hooks.step_begin(0)
    with hooks.op("optimizer"):
        pass
    hooks.step_end()
    hooks.shutdown()  # the process dies with its records spooled
    rw = hooks.init(config, identity=IDENT, sink=up.deliver)
    assert rw is not None
    stats = rw.close()
    assert stats.resent == 1 and stats.in_spool == 0
    assert [b.steps_done for b in up.batches()] == [((0, 1),)]


def test_a_rank_that_does_not_send_ops_still_beats_and_accounts_for_every_record() -> None:
    wire = Wire()
    ticks = itertools.count(1_000, 1_000)
    rw = RankWatch(
        IDENT,
        SinkTransport(wire.deliver),
        clock=Clock(read=lambda: next(ticks), wall=lambda: 10**18),
        publisher=PublisherConfig(heartbeat_s=0.0, send_ops=False),
        start=False,
    )
    run_steps(rw, range(3))
    rw.publisher.step_once(now=1.0)
    assert wire.batches() == []
    assert [k for k, _ in wire.messages] == ["heartbeats"]
    stats = rw.close()
    assert stats.withheld == stats.put == 9 and stats.sent == 0 and stats.accounted()


@pytest.mark.parametrize(
    ("tp_rank", "cp_rank", "sends"), [(0, 0, True), (1, 0, False), (0, 1, False)]
)
def test_ops_from_tp0_keeps_only_the_tp_and_cp_rank_0(
    tp_rank: int, cp_rank: int, sends: bool
) -> None:
    wire = Wire()
    config = HooksConfig.from_env({"RANKWATCH_OPS_FROM": "TP0"}, kafka="")
    assert config.ops_from == "tp0"
    rw = init(config, replace(IDENT, tp_rank=tp_rank, cp_rank=cp_rank), sink=wire.deliver)
    assert rw is not None
    run_steps(rw, range(2))
    shutdown()
    steps = [s for b in wire.batches() for s, _ in b.steps_done]
    assert steps == ([0, 1] if sends else [])
    assert HooksConfig.from_env({}).sends_ops(replace(IDENT, tp_rank=3))  # default: all


def test_an_unknown_ops_from_is_refused() -> None:
    with pytest.raises(ValueError, match="ops_from"):
        HooksConfig.from_env({"RANKWATCH_OPS_FROM": "tp1"})
