"""A partition the consumer read past while the agent got nothing is read again, once;
records merely queued, a partition that makes progress, or one not read past are left
alone (streams/kit/stalls.py)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, NamedTuple

from hypothesis import given
from hypothesis import strategies as st

from rankwatch.streams.kit.rewind import StallGuard
from rankwatch.streams.kit.stalls import Rewind, StallWatch

P = ("t.ops", 2)
QUIET = {"t.ops": True}


def test_a_partition_read_past_with_nothing_handed_is_read_again_from_where_it_resumed() -> None:
    watch = StallWatch(wait_s=5.0)
    assert watch.check(0.0, {P: 44}, {P: 0}, QUIET) == []  # first seen
    assert watch.check(4.9, {P: 44}, {P: 0}, QUIET) == []  # not long enough
    assert watch.check(5.0, {P: 44}, {P: 0}, QUIET) == [Rewind(P, 0, 44, 5.0)]
    assert watch.rewinds == 1


def test_the_agent_s_last_offset_wins_over_where_reading_resumed() -> None:
    watch = StallWatch(wait_s=1.0)
    for offset in range(10):
        watch.handed(P, offset)
    watch.check(0.0, {P: 30}, {P: 0}, QUIET)
    assert watch.check(2.0, {P: 30}, {}, QUIET) == [Rewind(P, 10, 30, 2.0)]


def test_no_gap_means_nothing_to_do() -> None:
    watch = StallWatch(wait_s=1.0)
    for offset in range(44):
        watch.handed(P, offset)
    for t in range(5):
        assert watch.check(float(t), {P: 44}, {P: 0}, QUIET) == []
    # nothing handed since the assignment and the consumer where reading resumed
    watch.reassigned()
    for t in range(5):
        assert watch.check(float(t), {P: 44}, {P: 44}, QUIET) == []
    # nothing known of where reading resumed: left alone
    for t in range(5):
        assert watch.check(float(t), {P: 44}, {}, QUIET) == []
    assert watch.rewinds == 0


def test_records_still_queued_or_progress_on_the_partition_are_not_a_stall() -> None:
    watch = StallWatch(wait_s=1.0)
    busy = {"t.ops": False}
    watch.check(0.0, {P: 44}, {P: 0}, busy)
    assert watch.check(10.0, {P: 44}, {P: 0}, busy) == []  # the agent's queue holds records
    for offset in range(4):  # progress: the wait starts again
        watch.handed(P, offset)
    assert watch.check(10.5, {P: 44}, {P: 0}, QUIET) == []
    assert watch.check(11.0, {P: 44}, {}, QUIET) == []
    assert watch.check(11.5, {P: 44}, {}, QUIET) == [Rewind(P, 4, 44, 1.0)]


def test_a_skipped_record_is_read_again_at_once() -> None:
    watch = StallWatch(wait_s=60.0)
    watch.handed(P, 0)
    watch.handed(P, 1)
    watch.handed(P, 7)  # 2-6 never came
    watch.handed(P, 8)
    assert watch.check(0.0, {P: 9}, {P: 0}, {"t.ops": False}) == []  # queued: wait
    assert watch.check(0.5, {P: 9}, {}, QUIET) == [Rewind(P, 2, 9, 0.0)]
    for offset in range(2, 9):  # read again: 2 comes, and what follows it
        watch.handed(P, offset)
    assert watch.check(1.0, {P: 9}, {}, QUIET) == []


def test_a_first_record_past_where_reading_resumed_means_the_ones_before_were_skipped() -> None:
    watch = StallWatch(wait_s=60.0)
    watch.handed(P, 44)  # reading resumed at 0 (nothing committed): 0-43 were dropped
    assert watch.check(0.0, {P: 45}, {P: 0}, QUIET) == [Rewind(P, 0, 45, 0.0)]
    watch.reassigned()
    watch.handed(P, 20)  # resumed at the committed offset 20: as it should
    assert watch.check(0.0, {P: 21}, {P: 20}, QUIET) == []
    watch.reassigned()
    watch.handed(P, 44)  # where it resumed is not known yet: judged when it is
    assert watch.check(0.0, {P: 45}, {}, QUIET) == []
    assert watch.check(1.0, {P: 45}, {P: 44}, QUIET) == []
    assert watch.rewinds == 1


def test_a_gap_that_comes_back_at_the_same_offset_is_reported_once_and_left_alone() -> None:
    watch = StallWatch(wait_s=1.0)
    watch.check(0.0, {P: 44}, {P: 0}, QUIET)
    assert [r.stuck for r in watch.check(1.0, {P: 44}, {P: 0}, QUIET)] == [False]
    watch.check(2.0, {P: 44}, {P: 0}, QUIET)
    assert [r.stuck for r in watch.check(3.0, {P: 44}, {P: 0}, QUIET)] == [True]
    for t in range(4, 20):
        assert watch.check(float(t), {P: 44}, {P: 0}, QUIET) == []
    assert (watch.rewinds, watch.stuck) == (1, 1)
    watch.handed(P, 0)  # the record read again came after all: watched again
    watch.check(20.0, {P: 44}, {P: 0}, QUIET)
    assert watch.check(21.0, {P: 44}, {}, QUIET) == [Rewind(P, 1, 44, 1.0)]


def test_a_hole_that_comes_back_is_reported_once() -> None:
    watch = StallWatch(wait_s=60.0)
    watch.handed(P, 0)
    watch.handed(P, 5)
    assert [r.stuck for r in watch.check(0.0, {P: 6}, {}, QUIET)] == [False]
    watch.handed(P, 5)  # read again from 1, and 1-4 still do not come
    assert [r.stuck for r in watch.check(1.0, {P: 6}, {}, QUIET)] == [True]
    watch.handed(P, 5)
    assert watch.check(2.0, {P: 6}, {}, QUIET) == []
    assert (watch.rewinds, watch.stuck) == (1, 1)


def test_a_reassignment_forgets_what_the_agent_got() -> None:
    watch = StallWatch(wait_s=1.0)
    watch.handed(P, 40)
    watch.reassigned()
    assert watch.wants_resumed(P)
    assert watch.check(5.0, {P: 44}, {P: 44}, QUIET) == []  # resumed at the committed offset
    assert watch.check(7.0, {P: 44}, {P: 44}, QUIET) == []


@given(
    start=st.integers(0, 1000),
    chunks=st.lists(st.integers(0, 20), max_size=30),
    skip=st.integers(1, 50),
)
def test_records_in_order_never_cause_a_read_again_and_a_skip_always_does(
    start: int, chunks: list[int], skip: int
) -> None:
    """The agent gets the records from where reading resumed, in order, a few between
    checks (the consumer's position a little ahead): nothing to do. Skip some, and the
    next quiet check reads again from the first skipped."""
    watch = StallWatch(wait_s=1.0)
    offset, now = start, 0.0
    for n in chunks:
        for _ in range(n):
            watch.handed(P, offset)
            offset += 1
        now += 0.3
        assert watch.check(now, {P: offset}, {P: start}, QUIET) == []
    watch.handed(P, offset + skip)
    found = watch.check(now + 0.3, {P: offset + skip + 1}, {P: start}, QUIET)
    assert [(r.offset, r.stuck) for r in found] == [(offset, False)]


class TP(NamedTuple):
    topic: str
    partition: int


class FakeConsumer:
    """What the guard asks of faust's consumer (the real one: the integration tests)."""

    def __init__(self, positions: dict[TP, int], committed: dict[TP, int | None]) -> None:
        self.positions = positions
        self._committed_offset = committed
        self.seeks: list[tuple[TP, int]] = []
        self.starts = 0
        self.earliest = 0

    async def position(self, tp: TP) -> int:
        return self.positions[tp]

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        self.starts += 1
        return {tp: self.earliest for tp in tps}

    async def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))
        self.positions[tp] = offset


class Signal:
    def __init__(self) -> None:
        self.receivers: list[Any] = []

    def connect(self, fun: Any) -> None:
        self.receivers.append(fun)


def fake_app(consumer: FakeConsumer, reset: str = "earliest") -> Any:
    return SimpleNamespace(
        consumer=consumer,
        rebalancing=False,
        conf=SimpleNamespace(consumer_auto_offset_reset=reset),
        on_partitions_revoked=Signal(),
        on_partitions_assigned=Signal(),
    )


def run_checks(guard: StallGuard, assigned: list[TP], times: int) -> list[Rewind]:
    consumer = guard.app.consumer

    async def go() -> list[Rewind]:
        found = []
        for _ in range(times):
            found += await guard.check({tp: consumer.positions[tp] for tp in assigned})
        return found

    return asyncio.run(go())


def test_the_guard_resumes_no_earlier_than_the_log_start_and_asks_for_it_once() -> None:
    tp = TP("t.ops", 1)
    consumer = FakeConsumer({tp: 31}, {tp: 20})
    consumer.earliest = 30  # retention removed 20-29: reading resumed at 30
    guard = StallGuard(fake_app(consumer), ["t.ops"], logging.getLogger("test"), wait_s=0.0)
    guard.handed(SimpleNamespace(topic="t.ops", partition=1, offset=30))
    assert run_checks(guard, [tp], 3) == []  # the first record after 30 was 30
    assert consumer.starts == 1


def test_the_guard_seeks_an_uncommitted_partition_back_to_the_log_start() -> None:
    stalled, fine, other = TP("t.ops", 2), TP("t.ops", 0), TP("t-__assignor-__leader", 0)
    consumer = FakeConsumer({stalled: 44, fine: 44, other: 3}, {stalled: None, fine: 44})
    guard = StallGuard(fake_app(consumer), ["t.ops"], logging.getLogger("test"), wait_s=0.0)
    found = run_checks(guard, [stalled, fine, other], 2)
    assert [(r.partition, r.offset) for r in found] == [(("t.ops", 2), 0)]
    assert consumer.seeks == [(stalled, 0)]
    assert guard.counters() == {"partitions_read_again": 1, "partitions_stuck": 0}
    assert consumer.starts == 1  # the log's start asked once per assignment


def test_the_guard_does_nothing_while_the_group_rebalances_or_for_a_latest_start() -> None:
    tp = TP("t.ops", 1)
    consumer = FakeConsumer({tp: 44}, {tp: None})
    app = fake_app(consumer)
    app.rebalancing = True
    guard = StallGuard(app, ["t.ops"], logging.getLogger("test"), wait_s=0.0)
    assert run_checks(guard, [tp], 3) == []
    app.rebalancing = False
    latest = StallGuard(fake_app(consumer, "latest"), ["t.ops"], logging.getLogger("t"), 0.0)
    assert run_checks(latest, [tp], 3) == []  # where it resumed is not known
    assert consumer.seeks == []


def test_the_guard_forgets_at_each_assignment() -> None:
    tp = TP("t.ops", 1)
    consumer = FakeConsumer({tp: 44}, {tp: 20})
    app = fake_app(consumer)
    guard = StallGuard(app, ["t.ops"], logging.getLogger("test"), wait_s=0.0)
    for offset in range(20, 44):
        guard.handed(SimpleNamespace(topic="t.ops", partition=1, offset=offset))
    assert run_checks(guard, [tp], 2) == []
    for receiver in app.on_partitions_assigned.receivers:
        asyncio.run(receiver(app, {tp}))
    assert [r.offset for r in run_checks(guard, [tp], 2)] == [20]  # from the committed offset
