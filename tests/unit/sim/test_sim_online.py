"""The online API: graph once, one step at a time, ideal costs from a rolling window."""

from __future__ import annotations

import warnings

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from rankwatch.sim import (
    ModelError,
    RollingIdeal,
    Workspace,
    analyse,
    analyse_measured,
    analyse_step,
    ideal_costs,
    infer_graph,
    measure_trace,
)
from rankwatch.sim.ideal import median_in_place, nanmedian_columns
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace

CFG = GenConfig(dp=3, pp=4, microbatches=8, steps=5, noise=0.05, stragglers=(Straggler(1, 2, 1.5),))


@pytest.fixture(scope="module")
def job():
    return generate_trace(CFG)


def test_one_step_at_a_time_equals_the_offline_analysis(job) -> None:
    trace, meta = job
    offline = analyse(trace, meta)
    graph = infer_graph(trace.select(trace.step == trace.step.min()), meta)
    ideal = ideal_costs(graph, measure_trace(graph, trace))
    for i, step in enumerate(offline.steps.tolist()):
        online = analyse_step(graph, trace.select(trace.step == step), ideal)
        assert online.steps.tolist() == [step]
        assert online.simulated_S[0] == pytest.approx(offline.simulated_S[i], rel=1e-9)
        assert online.ideal_S[0] == pytest.approx(offline.ideal_S[i], rel=1e-6)
        for dim in ("optype", "dp_rank", "stage"):
            per_step = offline.attribution_per_step(dim)
            for group, value in online.attribution(dim).items():
                assert value == pytest.approx(per_step[group][i], rel=1e-5)


def test_rolling_window_of_one_step_is_that_steps_ideal(job) -> None:
    trace, meta = job
    graph = infer_graph(trace, meta)
    window = RollingIdeal(window=1)
    for step in np.unique(trace.step).tolist():
        measured = measure_trace(graph, trace.select(trace.step == step))
        window = window.push(graph, measured)
        assert len(window) == 1
        np.testing.assert_allclose(
            window.ideal().by_optype, ideal_costs(graph, measured).by_optype, equal_nan=True
        )


def test_rolling_window_means_are_exact_over_the_window(job) -> None:
    trace, meta = job
    graph = infer_graph(trace, meta)
    window = RollingIdeal(window=3)
    steps = np.unique(trace.step).tolist()
    for step in steps:
        window = window.push(graph, measure_trace(graph, trace.select(trace.step == step)))
    last = trace.select(np.isin(trace.step, steps[-3:]))
    whole = ideal_costs(graph, measure_trace(graph, last)).by_optype
    got = window.ideal().by_optype
    for code in (0, 1):  # forward/backward compute: means
        assert got[code] == pytest.approx(whole[code], rel=1e-12)


def test_the_window_is_pure(job) -> None:
    trace, meta = job
    graph = infer_graph(trace, meta)
    empty = RollingIdeal()
    full = empty.push(graph, measure_trace(graph, trace.select(trace.step == 0)))
    assert len(empty) == 0 and len(full) == 1
    with pytest.raises(ValueError, match="push one first"):
        empty.ideal()


def test_online_step_finds_the_straggler(job) -> None:
    trace, meta = job
    graph = infer_graph(trace, meta)
    window = RollingIdeal()
    for step in np.unique(trace.step).tolist():
        measured = measure_trace(graph, trace.select(trace.step == step))
        window = window.push(graph, measured)
        result = analyse_measured(graph, measured, window.ideal())
        assert result.top_workers[0] == (1, 2)
        assert result.slowdown > 1.03


def test_analyse_step_takes_exactly_one_step(job) -> None:
    trace, meta = job
    graph = infer_graph(trace, meta)
    ideal = ideal_costs(graph, measure_trace(graph, trace))
    with pytest.raises(ModelError, match="one step"):
        analyse_step(graph, trace, ideal)


def test_a_reused_workspace_changes_nothing_but_time(job) -> None:
    trace, meta = job
    graph = infer_graph(trace, meta)
    ideal = ideal_costs(graph, measure_trace(graph, trace))
    workspace = Workspace()
    for step in np.unique(trace.step).tolist():
        one = trace.select(trace.step == step)
        fresh = analyse_step(graph, one, ideal).to_json()
        assert analyse_step(graph, one, ideal, workspace).to_json() == fresh
    assert workspace.nbytes > 0


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=24),
        elements=st.one_of(st.just(np.nan), st.floats(0, 1e6, allow_nan=False)),
    )
)
def test_nanmedian_columns_equals_numpys_nanmedian(values: np.ndarray) -> None:
    """The window's median (``RollingIdeal.ideal``) is numpy's, bit for bit, NaN for a
    column without a value."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns on all-NaN columns
        expected = np.nanmedian(values, axis=0)
    np.testing.assert_array_equal(nanmedian_columns(values), expected)


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(np.float64, st.integers(1, 200), elements=st.floats(0, 1e6)),
    st.one_of(st.none(), st.integers(0, 199)),
)
def test_median_in_place_equals_numpys_median(values: np.ndarray, nan_at: int | None) -> None:
    """The summaries' medians are numpy's, bit for bit (NaN if a value is NaN)."""
    if nan_at is not None:
        values[nan_at % values.size] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.median(values)
    np.testing.assert_array_equal(median_in_place(values.copy()), expected)
