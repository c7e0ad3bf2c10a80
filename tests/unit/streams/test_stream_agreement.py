"""The live per-step results agree with the offline what-if (``rankwatch whatif``) on
the shipped traces: the simulated step time T is the same; S differs only through the
ideal costs (a rolling window of the latest 20 steps online, the whole trace offline),
most in the first steps, while the window holds few steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.workers import reference_rows

from rankwatch.sim import analyse
from rankwatch.streams.ops.replay import replay_batches
from rankwatch.traceio import read_meta, read_trace

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "stragglers"


@pytest.mark.parametrize(("name", "late_bound"), [("ST", 0.02), ("SE", 0.01)])
def test_online_slowdowns_agree_with_the_offline_analysis(name: str, late_bound: float) -> None:
    if not DATA.is_dir():
        pytest.skip("../shared/data is absent")
    trace = read_trace(DATA / f"trace-{name}.parquet")
    meta = read_meta(DATA / f"meta-{name}.yaml")
    rows = reference_rows(replay_batches(trace, meta, "j", 10**18))
    offline = analyse(trace, meta)
    steps = np.unique(trace.step).tolist()
    online = [rows[("j", s)] for s in steps]
    t_sim = np.array([r["t_sim"] for r in online])
    np.testing.assert_allclose(t_sim, offline.simulated_S, rtol=1e-6)
    diff = np.abs(np.array([r["slowdown"] for r in online]) / offline.step_slowdown - 1)
    assert diff.max() < 0.10  # the first steps: a window of one or two steps
    assert diff[20:].max() < late_bound  # once the window is full


def test_one_slowdown_function_for_the_offline_and_live_figures() -> None:
    """S is ``sum(T) / sum(T_ideal)`` wherever it is computed: a job, one step, the live
    figures; the boards' SQL says the same."""
    from rankwatch.sim import slowdown_of
    from rankwatch.sim.tracegen import GenConfig, generate_trace
    from rankwatch.streams.ops.live import live_figures

    assert slowdown_of(np.array([3.0, 1.0]), np.array([1.0, 1.0])) == 2.0  # not mean(T/T_ideal)
    assert np.isnan(slowdown_of(np.array([1.0]), np.array([0.0])))
    trace, meta = generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=6, seed=3))
    offline = analyse(trace, meta)
    assert offline.slowdown == slowdown_of(offline.simulated_S, offline.ideal_S)
    live = live_figures(trace, meta)
    assert live.slowdown == slowdown_of(live.t_sim, live.t_ideal)
    assert live.waste == 1 - 1 / live.slowdown
