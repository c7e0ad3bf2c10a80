"""A generated job at the scale of 1,024 GPUs runs end to end (DP 64 x PP 16, VPP 2)."""

from __future__ import annotations

import pytest

from rankwatch.sim import RollingIdeal, analyse, analyse_measured, infer_graph, measure_trace
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace

BIG = GenConfig(
    dp=64,
    pp=16,
    microbatches=32,
    vpp=2,
    schedule="interleaved",
    steps=2,
    stragglers=(Straggler(dp_rank=7, stage=11, factor=1.5),),
)


@pytest.mark.slow
def test_1024_gpu_job_offline_and_online() -> None:
    trace, meta = generate_trace(BIG)
    offline = analyse(trace, meta)
    assert offline.worker_DP.shape == (64, 16)
    assert offline.top_workers[0] == (7, 11)
    assert offline.replay_error < 1e-6
    graph = infer_graph(trace.select(trace.step == trace.step.min()), meta)
    window = RollingIdeal()
    for step in (0, 1):
        measured = measure_trace(graph, trace.select(trace.step == step))
        window = window.push(graph, measured)
        online = analyse_measured(graph, measured, window.ideal())
        assert online.top_workers[0] == (7, 11)
        assert online.slowdown > 1.03
