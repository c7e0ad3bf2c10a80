"""The rolling windows are defined by step numbers: the same steps give the same window
whatever order they were put in, and memory stays bounded."""

from __future__ import annotations

import numpy as np

from rankwatch.sim.ideal import StepSummary
from rankwatch.streams.ops.window import SlowdownWindow, StepWindow


def summary(value: float) -> StepSummary:
    k = 14
    return StepSummary(count=np.full(k, 2.0), total=np.full(k, 2 * value), median=np.full(k, value))


def test_window_is_the_latest_steps_up_to_the_step() -> None:
    a, b = StepWindow(3), StepWindow(3)
    for step in range(10):
        a.put(step, summary(float(step)))
    for step in (9, 3, 8, 4, 5, 7, 6, 2, 1, 0):
        b.put(step, summary(float(step)))
    for step in (5, 7, 9):
        assert np.array_equal(a.ideal(step).by_optype, b.ideal(step).by_optype)
    assert a.ideal(9).by_optype[0] == 8.0  # mean of 7, 8, 9
    assert len(a.summaries) == 6  # bounded: 2 x window


def test_rolling_slowdown_over_the_latest_steps() -> None:
    w = SlowdownWindow(2)
    for step, s in enumerate((1.0, 1.2, 1.4, 1.6)):
        w.put(step, s)
    assert w.rolling(3) == (1.5, 2)
    assert w.rolling(1) == (1.1, 2)
    assert SlowdownWindow(2).rolling(0)[1] == 0
