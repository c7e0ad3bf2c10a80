from __future__ import annotations

import threading

import pytest

from rankwatch.hooks.buffer import RecordBuffer


def test_full_buffer_drops_the_oldest_and_counts() -> None:
    buf = RecordBuffer(capacity=3)
    for i in range(5):
        buf.put(i)
    records, ends = buf.take()
    assert records == [2, 3, 4] and ends == []
    assert (buf.put_count, buf.dropped_count, buf.taken_count) == (5, 2, 3)


def test_step_ends_survive_dropped_records() -> None:
    buf = RecordBuffer(capacity=1)
    buf.put("a")
    buf.end_step(0)
    buf.put("b")
    buf.put("c")
    buf.end_step(1)
    assert buf.take() == (["c"], [0, 1])
    assert buf.take() == ([], [])


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RecordBuffer(capacity=0)


def test_counts_hold_under_concurrent_puts() -> None:
    buf = RecordBuffer(capacity=100)
    taken: list[int] = []

    def produce() -> None:
        for i in range(5000):
            buf.put(i)

    threads = [threading.Thread(target=produce) for _ in range(3)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        taken += buf.take()[0]
    for t in threads:
        t.join()
    taken += buf.take()[0]
    assert buf.put_count == 15000
    assert len(taken) + buf.dropped_count == 15000
