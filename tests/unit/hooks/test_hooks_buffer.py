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


def test_counts_hold_while_another_thread_takes() -> None:
    buf = RecordBuffer(capacity=100)
    taken: list[int] = []

    def produce() -> None:
        for i in range(20_000):
            buf.put(i)
            if i % 1000 == 999:
                buf.end_step(i // 1000)

    producer = threading.Thread(target=produce)
    producer.start()
    while producer.is_alive():
        taken += buf.take()[0]
    producer.join()
    taken += buf.take()[0]
    assert buf.put_count == 20_000
    assert len(taken) + buf.dropped_count == 20_000
    assert taken == sorted(taken)  # put order kept
