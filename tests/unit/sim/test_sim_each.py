"""Several steps in one pass (``analyse_each``), each against its own window's ideal:
the analyses of one step at a time, number for number."""

from __future__ import annotations

from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from rankwatch.sim import (
    IdealCosts,
    JobMeta,
    ModelError,
    Trace,
    Workspace,
    analyse_each,
    analyse_measured,
    infer_graph,
    measure_trace,
)
from rankwatch.sim import analysis as analysis_module
from rankwatch.sim.durations import joined
from rankwatch.sim.ideal import summarise
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.ops.window import StepWindow

DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "stragglers"

CFG = GenConfig(
    dp=4,
    pp=3,
    microbatches=6,
    steps=6,
    noise=0.05,
    launch_delay_s=1e-4,
    stragglers=(Straggler(1, 2, 1.6), Straggler(3, 0, 1.3)),
)


def steps_and_ideals(trace: Trace, meta: JobMeta, window: int) -> tuple:
    """The graph, each step measured alone, and each step's rolling-window ideal (as a
    live worker forms them: the step put in its window, then the window's ideal)."""
    numbers = np.unique(trace.step).tolist()
    graph = infer_graph(trace.select(trace.step == numbers[0]), meta)
    kept = StepWindow(window)
    measured, ideals = [], []
    for step in numbers:
        m = measure_trace(graph, trace.select(trace.step == step))
        kept.put(step, summarise(graph, m))
        measured.append(m)
        ideals.append(kept.ideal(step))
    return graph, measured, ideals


def assert_same(one_at_a_time: list, together: list) -> None:
    assert len(one_at_a_time) == len(together)
    for a, b in zip(one_at_a_time, together, strict=True):
        assert b.to_json() == a.to_json()  # every figure, exactly (floats compared as ==)
        assert b.top_workers == a.top_workers
        np.testing.assert_array_equal(b.worker_DP, a.worker_DP)


def check(trace: Trace, meta: JobMeta, window: int) -> None:
    graph, measured, ideals = steps_and_ideals(trace, meta, window)
    alone = [
        analyse_measured(graph, m, i, Workspace()) for m, i in zip(measured, ideals, strict=True)
    ]
    assert_same(alone, analyse_each(graph, joined(measured), ideals, Workspace()))


def test_each_step_equals_its_analysis_alone() -> None:
    check(*generate_trace(CFG), window=3)


def test_chunks_change_nothing(monkeypatch) -> None:
    """1 byte: one scenario on one step per simulation, so each chunk slices the
    per-step ideals and fixed workers."""
    trace, meta = generate_trace(CFG)
    graph, measured, ideals = steps_and_ideals(trace, meta, 2)
    whole = analyse_each(graph, joined(measured), ideals)
    monkeypatch.setattr(analysis_module, "_MAX_CHUNK_BYTES", 1)
    assert_same(whole, analyse_each(graph, joined(measured), ideals))


@pytest.mark.parametrize("name", ["SE", "ST"])
def test_the_shipped_traces_step_by_step(name: str) -> None:
    """The two real traces, every step against a window of 20: as a live worker."""
    from rankwatch.traceio import read_meta, read_trace

    path = DATA / f"trace-{name}.parquet"
    if not path.exists():
        pytest.skip(f"{path} absent")
    check(read_trace(path), read_meta(DATA / f"meta-{name}.yaml"), window=20)


@settings(max_examples=12, deadline=None)
@given(
    dp=st.integers(1, 4),
    pp=st.integers(1, 3),
    window=st.integers(1, 4),
    factor=st.floats(1.0, 2.5),
    seed=st.integers(0, 1000),
)
def test_any_job_any_window(dp: int, pp: int, window: int, factor: float, seed: int) -> None:
    cfg = GenConfig(
        dp=dp,
        pp=pp,
        microbatches=2 * pp,
        steps=4,
        noise=0.1,
        launch_delay_s=1e-4,
        stragglers=(Straggler(dp - 1, pp - 1, factor),),
        seed=seed,
    )
    check(*generate_trace(cfg), window=window)


def test_one_ideal_per_step() -> None:
    graph, measured, ideals = steps_and_ideals(*generate_trace(CFG), window=2)
    with pytest.raises(ValueError, match="5 ideals for 6 steps"):
        analyse_each(graph, joined(measured), ideals[:5])


def test_a_step_without_an_ideal_cost_is_a_model_error() -> None:
    graph, measured, ideals = steps_and_ideals(*generate_trace(CFG), window=2)
    ideals[2] = IdealCosts(by_optype=np.full_like(ideals[2].by_optype, np.nan))
    with pytest.raises(ModelError, match="no ideal cost for op type"):
        analyse_each(graph, joined(measured), ideals)
