"""The heatmap's colour scale shows which workers are worse than the others."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.sim.heatmap import colour_scale


def test_scale_is_centred_on_the_median_worker_and_spans_the_spread() -> None:
    # SE-like: every worker between 1.08 and 1.19 (a scale from 1 painted them one red)
    grid = np.array([[1.10, 1.15], [1.11, 1.19], [1.08, 1.16]])
    low, centre, high = colour_scale(grid)
    assert centre == np.median(grid)
    half = max(grid.max() - centre, centre - grid.min())
    assert high - centre == pytest.approx(half) and centre - low == pytest.approx(half)
    position = (grid - low) / (high - low)  # where each worker lands on the colour bar
    assert max(position.max(), 1 - position.min()) == pytest.approx(1)  # extreme one at an end
    assert position.max() - position.min() >= 0.5  # the workers use half the bar or more


def test_equal_workers_and_empty_grids_get_a_narrow_scale_around_their_value() -> None:
    low, centre, high = colour_scale(np.full((2, 2), 1.2))
    assert low < centre == 1.2 < high and high - low < 0.01
    low, centre, high = colour_scale(np.full((2, 2), np.nan))
    assert low < centre < high
