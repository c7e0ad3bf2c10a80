"""When the Minder worker acknowledges a message: once a stored snapshot covers it (its
sample is no newer than a window the monitor evaluated), after the rows are stored;
a job that falls silent does not hold its messages for ever."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
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


class SnapshotStore(MemoryStore):
    """Answers the latest-snapshot query from the rows inserted (and nothing else)."""

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> list[dict]:
        self._check()
        if "detector_state" not in sql or parameters is None:
            return []
        mine = [
            row
            for row in self.rows.get("detector_state", [])
            if (row["job"], row["detector"]) == (parameters["job"], parameters["detector"])
        ]
        return [max(mine, key=lambda row: row["version"])] if mine else []


def test_revoked_partitions_jobs_are_recalled_from_their_snapshot_by_the_next_owner() -> None:
    """Two jobs on two partitions; the first partition is revoked after a snapshot was
    stored: its job's monitor and tokens go (the tokens are never handed over), the other
    job keeps its own; read again, the job is recalled from the stored snapshot, and the
    samples that snapshot covers are acknowledged without being counted twice."""
    now = [0.0]
    settings = MinderSettings("b", "chdb://unused", online=OnlineConfig(window_s=10, stride_s=10))
    store = SnapshotStore()
    state = MinderState(settings, store=store, clock=lambda: now[0])  # type: ignore[arg-type]

    def send(job: str, partition: int, seconds: range, tag: str) -> None:
        for s in seconds:
            msg = metrics_message(job, "h0", T0 + s * NS, {"cpu_util": 50.0})
            state.on_message(
                orjson.dumps(msg), "m", partition, s, token=(tag, job, s), key=job.encode()
            )

    send("j", 0, range(0, 23), "first")
    send("k", 1, range(0, 5), "first")
    assert state.on_tick()
    acked = state.take_acks()
    assert {t for t in acked if t[1] == "j"} == {("first", "j", s) for s in range(21)}
    state.forget_partitions({("m", 0)})
    assert set(state.monitors) == {"k"} and "j" not in state.unacked
    assert state.take_acks() == []  # j's uncovered tokens (21, 22) are never handed over
    send("j", 0, range(0, 23), "again")  # the next owner reads from the committed offset
    state.recall_waiting()  # (the worker looks up in a thread, holding j's messages)
    assert state.restored_jobs == 1
    assert state.monitors["j"].late == 0  # covered samples are not fed again
    now[0] += 1000.0  # both fall silent: everything left is let go
    state.on_tick()
    rest = state.take_acks()
    assert {t for t in rest if t[1] == "j"} == {("again", "j", s) for s in range(23)}
    assert {t for t in acked + rest if t[1] == "k"} == {("first", "k", s) for s in range(5)}


def test_a_message_refused_while_a_flush_runs_waits_for_the_next_flush() -> None:
    """The worker stores in a thread and reads on: a dead letter read meanwhile has its
    row buffered after the flush took the buffer, so that flush must not acknowledge it."""
    settings = MinderSettings("b", "chdb://unused", online=OnlineConfig(window_s=10, stride_s=10))
    store = MemoryStore()
    state = MinderState(settings, store=store)  # type: ignore[arg-type]
    state.on_message(b"not a sample", token="first")
    state.evaluate()
    tokens = state.take_settled()
    flush = state.delivery.begin()  # the flush the worker runs in a thread
    assert flush is not None
    state.on_message(b"nor this", token="meanwhile")  # read while the insert waits
    state.delivery.run(flush)
    state.stored(tokens, state.delivery.end(flush))
    assert state.take_acks() == ["first"]
    assert len(store.rows["dead_letters"]) == 1
    assert state.on_tick()  # the next store takes the second row, then lets it go
    assert state.take_acks() == ["meanwhile"]
    assert len(store.rows["dead_letters"]) == 2


def test_a_job_first_met_holds_its_messages_until_its_recall_answers() -> None:
    """The lookup of a job first met runs in a thread (it may wait behind a slow
    insert): the job's messages wait, in order, while a known job's are taken; a
    recall that answers after its job's partition was revoked changes nothing."""
    now = [0.0]
    settings = MinderSettings("b", "chdb://unused", online=OnlineConfig(window_s=10, stride_s=10))
    store = SnapshotStore()
    state = MinderState(settings, store=store, clock=lambda: now[0])  # type: ignore[arg-type]

    def send(job: str, partition: int, seconds: range) -> None:
        for s in seconds:
            msg = metrics_message(job, "h0", T0 + s * NS, {"cpu_util": 50.0})
            state.on_message(orjson.dumps(msg), "m", partition, s, token=(job, s), key=job.encode())

    send("k", 1, range(0, 3))
    state.recall_waiting()
    send("j", 0, range(0, 3))
    (recall,) = state.take_recalls()
    send("k", 1, range(3, 6))  # read on while j's lookup runs
    assert state.monitors["k"].newest_ns == T0 + 5 * NS and "j" not in state.monitors
    assert state.snapshot()["recalls_waiting"] == 1
    found = state.look_up("j")  # in the worker, a thread
    send("j", 0, range(3, 5))  # held behind the first three
    state.recalled(*recall, found)
    assert state.monitors["j"].newest_ns == T0 + 4 * NS and state.monitors["j"].late == 0
    assert [t for t, _ in state.unacked["j"]] == [("j", s) for s in range(5)]
    assert state.snapshot()["recalls_waiting"] == 0

    send("i", 2, range(0, 2))
    (stale,) = state.take_recalls()
    state.forget_partitions({("m", 2)})  # revoked while i's lookup runs...
    send("i", 2, range(0, 2))  # ...and assigned back: a new recall
    (current,) = state.take_recalls()
    state.recalled(*stale, state.look_up("i"))
    assert "i" not in state.monitors  # the stale answer took nothing
    state.recalled(*current, None)  # the store could not answer: afresh
    assert [t for t, _ in state.unacked["i"]] == [("i", 0), ("i", 1)]


def test_past_max_held_the_worker_stops_reading_rather_than_drop_a_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jobs first met hold every message while their recalls run; past ``MAX_HELD``
    the state asks the agent to stop reading (a dropped sample would be a window's
    sample lost). Stored data the worker cannot use (a snapshot of another shape, an
    alert state the schema refuses) starts the job afresh; its messages are taken."""
    from rankwatch.streams.minder import worker

    monkeypatch.setattr(worker, "MAX_HELD", 2)
    settings = MinderSettings("b", "chdb://unused", online=OnlineConfig(window_s=10, stride_s=1))
    state = MinderState(settings, store=MemoryStore())  # type: ignore[arg-type]
    for s in range(3):
        msg = metrics_message("j", "h0", T0 + s * NS, {"cpu_util": 50.0})
        state.on_message(orjson.dumps(msg), "m", 0, s, token=s, key=msg["job"].encode())
    assert state.held_full and state.snapshot()["recall_held"] == 3
    (recall,) = state.take_recalls()
    bad = worker.Recollection(snapshot={"next_end_ns": 1}, unsent=[{"not": "an alert"}])
    state.recalled(*recall, bad)
    assert not state.held_full and state.snapshot()["recall_held"] == 0
    monitor = state.monitors["j"]
    assert state.restored_jobs == 0 and monitor.late == 0 and monitor.newest_ns == T0 + 2 * NS
    assert state.delivery.snapshot()["held_messages"] == 0  # the refused one is not sent
    assert [t for t, _ in state.unacked["j"]] == [0, 1, 2]


def test_a_job_silent_for_retire_after_s_is_forgotten_and_recalled_when_it_speaks() -> None:
    """No message says a job ended: a job whose metrics stopped ``retire_after_s`` ago
    is forgotten once its messages are settled (a worker running for weeks would keep
    every monitor it ever made, and evaluate each every tick); when its metrics come
    again it is recalled from its latest stored snapshot."""
    now = [0.0]
    settings = MinderSettings(
        "b", "chdb://unused", online=OnlineConfig(window_s=10, stride_s=10), retire_after_s=600.0
    )
    store = SnapshotStore()
    state = MinderState(settings, store=store, clock=lambda: now[0])  # type: ignore[arg-type]
    feed(state, range(0, 23))
    assert state.on_tick()
    now[0] += 500.0
    assert state.on_tick() and set(state.monitors) == {"j"}  # silent, not long enough
    now[0] += 101.0
    assert state.on_tick()
    assert state.monitors == {} and state.snapshot()["retired_jobs"] == 1
    assert "j" not in state.job_partitions and "j" not in state.heard
    acks = state.take_acks()
    assert sorted(acks) == [(s, h) for s in range(23) for h in range(4)]  # all settled
    feed(state, range(23, 25))  # it speaks again
    state.recall_waiting()
    assert set(state.monitors) == {"j"} and state.restored_jobs == 1
    assert state.snapshot()["jobs"] == 1
