"""The kit's delivery, which every worker uses: rows stored before their messages are
released, transient failures retried with a growing delay and no store calls meanwhile,
a table rejected for good dropped and counted while the rest goes on, a failed send
first in line next time, and the record of sent alerts."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from support.memstore import MemoryStore

from rankwatch.schemas.codec import encode
from rankwatch.schemas.examples import example
from rankwatch.streams.kit.delivery import (
    FIRST_BACKOFF_S,
    MAX_BACKOFF_S,
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


def test_a_table_rejected_for_good_is_dropped_and_counted_the_rest_stored() -> None:
    store, clock = MemoryStore(rejects=["hangs"]), Clock()
    d = delivery(store, clock)
    d.write(output(4))
    assert d.flush()
    assert "hangs" not in store.rows and store.rows["detector_state"]
    assert d.counters.rows_dropped == 4 and d.counters.store_failures == 1
    assert len(d.take()) == 1  # its message goes out: the store holds all it can


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
