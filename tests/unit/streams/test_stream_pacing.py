"""A closed step is due for storing at once, but never sooner than the gap after the
previous store, whatever asked for that store (the timer, back-pressure, a step)."""

from __future__ import annotations

import pytest

from rankwatch.streams.kit.pacing import Pacer


def test_nothing_closed_nothing_due() -> None:
    pacer = Pacer(gap_s=0.1)
    assert pacer.due_in(5.0) is None
    pacer.flushed(5.0, stored=True)
    assert pacer.due_in(5.01) is None


def test_a_step_closed_long_after_the_last_store_is_due_at_once() -> None:
    pacer = Pacer(gap_s=0.1)
    pacer.closed()
    assert pacer.due_in(0.0) == 0.0  # no store yet
    pacer.flushed(10.0, stored=True)
    assert pacer.due_in(10.0) is None
    pacer.closed()
    assert pacer.due_in(10.5) == 0.0  # not at the next tick


def test_a_step_closed_right_after_a_store_waits_out_the_gap() -> None:
    pacer = Pacer(gap_s=0.1)
    pacer.flushed(10.0, stored=True)  # the timer stored the buffer
    pacer.closed()
    assert pacer.due_in(10.03) == pytest.approx(0.07)
    pacer.closed()  # more steps closing meanwhile: still one store, at the gap's end
    assert pacer.due_in(10.1) == 0.0


def test_a_failed_store_leaves_the_step_due() -> None:
    pacer = Pacer(gap_s=0.1)
    pacer.closed()
    pacer.flushed(10.0, stored=False)
    assert pacer.due_in(10.05) == pytest.approx(0.05)
    assert pacer.due_in(10.2) == 0.0
    pacer.flushed(10.2, stored=True)
    assert pacer.due_in(10.3) is None


def test_no_gap_means_every_close_is_due_at_once() -> None:
    pacer = Pacer(gap_s=0.0)
    pacer.flushed(10.0, stored=True)
    pacer.closed()
    assert pacer.due_in(10.0) == 0.0


def test_behind_its_input_the_gap_is_the_backlog_gap() -> None:
    pacer = Pacer(gap_s=0.1, backlog_gap_s=1.0)
    pacer.flushed(10.0, stored=True)
    pacer.closed()
    assert pacer.due_in(10.05, behind=True) == pytest.approx(0.95)
    assert pacer.due_in(10.05) == pytest.approx(0.05)  # caught up again: the short gap
    assert pacer.due_in(11.0, behind=True) == 0.0
    first = Pacer(gap_s=0.1, backlog_gap_s=1.0)
    first.closed()
    assert first.due_in(0.0, behind=True) == 0.0  # no store yet
    slow = Pacer(gap_s=2.0, backlog_gap_s=1.0)
    slow.flushed(0.0, stored=True)
    slow.closed()
    assert slow.due_in(1.5, behind=True) == pytest.approx(0.5)  # never shorter than gap_s
