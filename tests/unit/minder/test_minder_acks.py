"""When the Minder worker acknowledges a message: once a stored snapshot covers it (its
sample is no newer than a window the monitor evaluated), after the rows are stored;
a job that falls silent does not hold its messages for ever."""

from __future__ import annotations

import time

import orjson
from support.memstore import MemoryStore

from rankwatch.agent import metrics_message
from rankwatch.streams.minder.online import NS, OnlineConfig
from rankwatch.streams.minder.worker import MinderSettings, MinderState

T0 = 1_790_000_000 * NS


def feed(state: MinderState, seconds: range) -> None:
    for s in seconds:
        for h in range(4):
            msg = metrics_message("j", f"h{h}", T0 + s * NS, {"cpu_util": 50.0 + h})
            state.on_message(orjson.dumps(msg), token=(s, h))


def test_acknowledged_once_a_stored_snapshot_covers_the_sample() -> None:
    now = [0.0]
    settings = MinderSettings("b", "chdb://unused", online=OnlineConfig(window_s=10, stride_s=10))
    store = MemoryStore()
    state = MinderState(settings, store=store, clock=lambda: now[0])  # type: ignore[arg-type]
    feed(state, range(0, 12))  # the first window ends at T0 + 10 s (+2 s lag): not yet due
    state.on_tick()
    assert state.take_acks() == []
    feed(state, range(12, 23))
    store.down = True
    assert not state.on_tick()  # the store is down: kept for a retry, with backoff
    assert state.take_acks() == []  # evaluated, but nothing stored: nothing acknowledged
    store.down = False
    time.sleep(state.delivery.retry_in())
    assert state.on_tick()
    acks = state.take_acks()
    (snapshot,) = store.rows["detector_state"]  # the tick that failed queued it
    end = orjson.loads(snapshot["state"])["evaluated_end_ns"]
    assert end == T0 + 20 * NS  # windows ending at 10 s and 20 s were evaluated
    assert sorted(acks) == [(s, h) for s in range(21) for h in range(4)]
    now[0] += 1000.0  # the job falls silent: its uncovered messages are let go
    state.on_tick()
    rest = state.take_acks()
    assert sorted(acks + rest) == [(s, h) for s in range(23) for h in range(4)]


def test_a_covered_message_waits_for_an_uncovered_one_read_before_it() -> None:
    """Jobs share partitions and are covered at different times: job k's first sample,
    read first and not covered yet, holds back job j's covered ones (the consumer would
    otherwise commit past it)."""
    now = [0.0]
    settings = MinderSettings("b", "chdb://unused", online=OnlineConfig(window_s=10, stride_s=10))
    state = MinderState(settings, store=MemoryStore(), clock=lambda: now[0])  # type: ignore[arg-type]
    k = metrics_message("k", "h0", T0 + 30 * NS, {"cpu_util": 50.0})
    state.on_message(orjson.dumps(k), token="k")
    feed(state, range(0, 23))
    assert state.on_tick()
    assert state.take_acks() == []  # j's covered samples wait for k's
    assert state.snapshot()["acks_held"] > 0
    now[0] += 1000.0  # both fall silent: everything is let go, k's first
    state.on_tick()
    acks = state.take_acks()
    assert acks[0] == "k" and len(acks) == 1 + 23 * 4
