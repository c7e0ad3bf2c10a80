"""The kit's delivery, which every worker uses: rows stored before their messages are
released, failures retried with a growing delay and no store calls meanwhile, nothing given up
but the rows the store refuses alone (dead letters), a failed send first in line next
time, and the record of sent alerts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
import pytest
from support.memstore import MemoryStore

from rankwatch.schemas.codec import encode
from rankwatch.schemas.examples import example
from rankwatch.streams.kit.delivery import (
    FIRST_BACKOFF_S,
    MAX_BACKOFF_S,
    MAX_REFUSED,
    Delivery,
    flush_in_thread,
)
from rankwatch.streams.kit.output import Output, Publication


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def output(n: int, table: str = "hangs") -> Output:
    out = Output()
    for i in range(n):
        out.add(table, {"i": i})
    out.add("detector_state", {"job": "j"})
    alert = example("alerts")
    out.messages.append(("alerts", alert["job"], alert))
    return out


def delivery(store: MemoryStore, clock: Clock, **kw: Any) -> Delivery:
    return Delivery(lambda: store, clock=clock, **kw)  # type: ignore[arg-type, return-value]


def test_messages_wait_for_their_rows_and_retries_back_off() -> None:
    store, clock = MemoryStore(down=True), Clock()
    d = delivery(store, clock)
    d.write(output(3))
    delays = []
    for _ in range(10):
        assert not d.flush() and d.take() == []
        delays.append(d.retry_in())
        calls = store.calls
        assert not d.flush() and store.calls == calls  # waiting out the delay: no call
        clock.now += d.retry_in()
    assert delays[0] == FIRST_BACKOFF_S and delays == sorted(delays)
    assert delays[-1] == MAX_BACKOFF_S
    assert d.snapshot()["sink_lag_s"] > 0 and d.snapshot()["store_failures"] == 10
    store.down = False
    assert d.flush()
    assert store.order == ["hangs", "detector_state"]  # the snapshot after what it vouches for
    (pub,) = d.take()
    assert pub.kind == "alerts" and pub.value == encode("alerts", example("alerts"))
    assert d.retry_in() == 0 and d.snapshot()["sink_lag_s"] == 0


def test_rows_refused_alone_become_dead_letters_and_the_rest_is_stored() -> None:
    """Rows 3 and 11 of 20 break a constraint: the batch is halved down to them, the
    other 18 are stored, the two become dead letters saying why, and the flush goes on
    (its message is published: the store holds all it can)."""
    store, clock = MemoryStore(refuses=lambda t, row: t == "hangs" and row["i"] in (3, 11)), Clock()
    d = delivery(store, clock)
    d.write(output(20))
    assert d.flush()
    assert sorted(r["i"] for r in store.rows["hangs"]) == [i for i in range(20) if i not in (3, 11)]
    letters = store.rows["dead_letters"]
    assert [(r["topic"], r["reason"]) for r in letters] == [("store:hangs", "store-refused")] * 2
    assert sorted(orjson.loads(r["payload"])["i"] for r in letters) == [3, 11]
    assert all("VIOLATED_CONSTRAINT" in r["detail"] for r in letters)
    assert store.rows["detector_state"] and len(d.take()) == 1
    assert d.counters.rows_refused == 2 and not d.failing


def test_a_full_store_keeps_every_row_and_message_until_it_takes_them() -> None:
    """A full disk is no refusal: nothing is dropped, nothing published, the delivery
    says it is failing, and once space is back everything is stored and published."""
    store, clock = MemoryStore(full=True), Clock()
    d = delivery(store, clock)
    d.write(output(5))
    for _ in range(3):
        assert not d.flush() and d.take() == []
        assert d.failing and "NOT_ENOUGH_SPACE" in (d.last_error or "")
        clock.now += d.retry_in()
    assert d.pending == 6 and d.counters.rows_refused == 0 and "dead_letters" not in store.rows
    store.full = False
    assert d.flush() and not d.failing
    assert len(store.rows["hangs"]) == 5 and len(d.take()) == 1


def test_a_table_refusing_every_row_is_a_failure_not_a_flood_of_dead_letters() -> None:
    store, clock = MemoryStore(refuses=lambda t, row: t == "hangs"), Clock()
    d = delivery(store, clock)
    d.write(output(MAX_REFUSED + 10))
    assert not d.flush() and d.failing and d.take() == []
    assert "refuses more than" in (d.last_error or "")
    assert "dead_letters" not in store.rows and d.pending == MAX_REFUSED + 11


def test_a_store_failing_while_refused_rows_are_isolated_keeps_them_all() -> None:
    """The dead letters cannot be stored (the disk fills meanwhile): the refused rows
    stay buffered with the rest, for the retry."""
    store, clock = MemoryStore(refuses=lambda t, row: t == "hangs" and row["i"] == 2), Clock()
    d = delivery(store, clock)
    d.write(output(4))
    real_insert, filled = store.insert, []

    def fill_at_dead_letters(table: str, rows: Any) -> None:
        if table == "dead_letters" and not filled:
            store.full = True
            filled.append(table)
        real_insert(table, rows)

    store.insert = fill_at_dead_letters  # type: ignore[method-assign]
    assert not d.flush() and d.failing and d.pending == 5
    store.full = False
    clock.now += d.retry_in()
    assert d.flush() and [r["reason"] for r in store.rows["dead_letters"]] == ["store-refused"]


def test_a_failed_send_is_first_in_line_next_time() -> None:
    store, clock = MemoryStore(), Clock()
    d = delivery(store, clock)
    d.write(output(1))
    assert d.flush()
    first = d.take()
    d.announce("alerts", "j2", example("alerts", job="j2"))
    assert d.flush()
    d.unsent(first)
    assert [p.key for p in d.take()] == [first[0].key, "j2"]
    assert d.counters.send_failures == 1


def test_sent_alerts_are_recorded_and_other_kinds_are_not() -> None:
    store, clock = MemoryStore(), Clock()
    d = delivery(store, clock, record_sent=True)
    alert = Publication("alerts", "j", encode("alerts", example("alerts")))
    step = Publication("steps", "j", encode("steps", example("steps")))
    assert d.sent([alert, step]) == 1
    assert "announced" not in store.rows  # buffered: the shell stores it in a thread
    assert d.flush()
    (row,) = store.rows["announced"]
    assert (row["alert_id"], row["state"]) == (example("alerts")["alert_id"], "firing")
    assert d.counters.published == 2 and d.counters.recorded_sent == 1


def test_a_full_buffer_asks_for_back_pressure_until_stored() -> None:
    store, clock = MemoryStore(down=True), Clock()
    d = delivery(store, clock, max_rows=10)
    d.write(output(9))
    assert d.full  # 9 rows and a snapshot
    assert not d.flush() and d.full
    store.down = False
    clock.now += d.retry_in()
    assert d.flush() and not d.full


def rows_of(out: Output) -> Output:
    """``out``'s rows without its message."""
    return Output(rows=out.rows)


def test_rows_written_while_a_flush_runs_wait_for_the_next_one() -> None:
    store, clock = MemoryStore(), Clock()
    d = delivery(store, clock, max_rows=10)
    d.write(output(4))  # 4 rows, a snapshot, an alert
    flush = d.begin()
    assert flush is not None and d.pending == 5
    clock.now = 1.0
    d.write(rows_of(output(4, table="other")))  # while the insert runs elsewhere
    assert d.full  # the running flush's rows count until it ends
    d.run(flush)
    assert d.end(flush)
    assert [p.kind for p in d.take()] == ["alerts"] and d.pending == 5
    assert sorted(store.rows) == ["detector_state", "hangs"]  # what was buffered at begin
    clock.now = 3.0
    assert d.snapshot()["sink_lag_s"] == 2.0  # the rows written at 1.0 wait
    assert d.flush() and len(store.rows["other"]) == 4 and d.pending == 0


def test_the_worker_counts_a_running_flush_without_reading_its_rows() -> None:
    """A running flush's rows belong to the inserting thread, which deletes each
    table's rows once inserted; the worker's thread counts them as they were at
    begin (iterating them while the thread deletes raised RuntimeError)."""
    store, clock = MemoryStore(), Clock()
    d = delivery(store, clock, max_rows=100)
    d.write(output(4))
    flush = d.begin()
    assert flush is not None and d.pending == 5
    flush.rows._buffer.clear()  # as if the thread had inserted every table
    assert d.pending == 5  # counted until the flush ends
    d.run(flush)
    assert d.end(flush) and d.pending == 0


class SlowStore(MemoryStore):
    """Inserts wait for :attr:`go` (a server slow to answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.inserting, self.go = threading.Event(), threading.Event()

    def insert(self, table: str, rows: Any) -> None:
        self.inserting.set()
        self.go.wait(10)
        super().insert(table, rows)


def test_a_flush_cancelled_while_its_thread_inserts_ends_after_the_thread() -> None:
    """A worker stopping cancels the task that awaits a flush while its thread still
    inserts: the flush must not end (its rows put back, another flush allowed) until
    the thread does, or rows written meanwhile join the lists the thread then drops."""
    store, clock = SlowStore(), Clock()
    d = delivery(store, clock)
    d.write(output(4))

    async def main() -> None:
        task = asyncio.ensure_future(flush_in_thread(d))
        while not store.inserting.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.1)
        assert d.flying and not task.done()  # still waiting for the thread
        d.write(rows_of(output(2, table="other")))  # buffered meanwhile, not lost
        store.go.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not d.flying and len(store.rows["hangs"]) == 4
    assert d.flush() and len(store.rows["other"]) == 2 and len(store.rows["hangs"]) == 4


def test_a_failed_flush_puts_its_rows_and_messages_back_ahead_of_newer_ones() -> None:
    store, clock = MemoryStore(), Clock()
    d = delivery(store, clock)
    d.write(output(2))
    flush = d.begin()
    assert flush is not None
    store.down = True
    d.run(flush)
    clock.now = 1.0
    d.announce("alerts", "j2", example("alerts", job="j2"))
    d.write(rows_of(output(3)))
    assert not d.end(flush) and d.counters.store_failures == 1
    assert d.pending == 7 and d.snapshot()["sink_lag_s"] == 1.0  # its rows, from 0.0
    store.down = False
    clock.now += d.retry_in()
    assert d.flush()
    assert [row.get("i") for row in store.rows["hangs"]] == [0, 1, 0, 1, 2]
    assert [p.key for p in d.take()] == [example("alerts")["job"], "j2"]


def test_a_flush_that_raises_puts_its_rows_back_and_only_one_runs_at_a_time() -> None:
    store, clock = MemoryStore(), Clock()
    d = delivery(store, clock)
    d.write(output(2))

    def broken(table: str, rows: Any) -> None:
        raise ValueError("a bug in an insert")

    store.insert = broken  # type: ignore[method-assign]
    with pytest.raises(ValueError):
        d.flush()
    assert d.pending == 3 and d.take() == []
    assert d.begin() is not None
    with pytest.raises(RuntimeError):
        d.begin()
