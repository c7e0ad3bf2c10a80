"""The scenario model (docs/scenarios.md): exact values on generated jobs, properties."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankwatch.schemas.optypes import bus_factor
from rankwatch.sim import analyse
from rankwatch.sim.scenario import (
    Hardware,
    Scenario,
    ScenarioError,
    calibrate_trace,
    run_scenarios,
)
from rankwatch.sim.scenario.network import hops
from rankwatch.sim.scenario.reshape import _signature, recognise_schedule
from rankwatch.sim.tracegen import GenConfig, Straggler, demo_config, generate_trace

SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ONE_HOST = Hardware(gpus_per_host=1024)
EXACT = dict(noise=0.0, launch_delay_s=0.0)


def step(cfg: GenConfig, hardware: Hardware = ONE_HOST, **changes: object) -> float:
    cal = calibrate_trace(*generate_trace(cfg), hardware)
    return run_scenarios(cal, [Scenario.of(changes)])[0].step_time_s


@st.composite
def jobs(draw: st.DrawFn) -> GenConfig:
    schedule = draw(st.sampled_from(("1f1b", "gpipe", "interleaved")))
    pp = draw(st.integers(2, 4))
    vpp = 2 if schedule == "interleaved" else 1
    m = pp * draw(st.integers(1, 2)) if schedule == "interleaved" else draw(st.integers(1, 6))
    return GenConfig(
        dp=draw(st.integers(1, 3)),
        pp=pp,
        vpp=vpp,
        microbatches=m,
        schedule=schedule,
        steps=2,
        p2p_s=draw(st.floats(0.0, 0.01)),
        dp_comm_s=draw(st.floats(0.0, 0.02)),
        overlap_grad_comm=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
    )


# -- a scenario that changes nothing ---------------------------------------------------


def test_no_change_reproduces_the_measured_simulated_step_bit_for_bit() -> None:
    trace, meta = generate_trace(demo_config())
    cal = calibrate_trace(trace, meta, Hardware(gpu="A100", inter_gbps=200, intra_gbps=2400))
    same = {"network.inter_gbps": 200, "gpu.model": "A100", "parallel.dp": 4, "microbatches": 8}
    base, unchanged = run_scenarios(cal, [Scenario.of({}), Scenario.of(same)])
    t = analyse(trace, meta).simulated_S
    assert np.array_equal(base.step_S, t)
    assert np.array_equal(unchanged.step_S, t)
    assert base.speedup == 1.0


@SETTINGS
@given(jobs())
def test_no_change_is_exact_on_any_job(cfg: GenConfig) -> None:
    trace, meta = generate_trace(cfg)
    (result,) = run_scenarios(calibrate_trace(trace, meta), [Scenario.of({})])
    assert np.array_equal(result.step_S, analyse(trace, meta).simulated_S)


@SETTINGS
@given(jobs())
def test_the_schedule_builder_rebuilds_every_generated_job(cfg: GenConfig) -> None:
    cal = calibrate_trace(*generate_trace(cfg))
    found = recognise_schedule(cal.graph)
    if found != cfg.schedule:  # two schedules that order this small job alike
        other = calibrate_trace(*generate_trace(replace(cfg, schedule=found)))
        assert _signature(other.graph) == _signature(cal.graph)


# -- communication ----------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64, 1024])
def test_nccl_bus_factors(n: int) -> None:
    assert bus_factor("all-reduce", n) == 2 * (n - 1) / n
    assert bus_factor("all-gather", n) == bus_factor("reduce-scatter", n) == (n - 1) / n
    assert bus_factor("p2p", n) == 1.0
    assert hops("all-reduce", n) == 2 * (n - 1)
    assert hops("all-reduce", n, tree=True) == 2 * np.ceil(np.log2(n))


PURE_P2P = GenConfig(
    dp=1, pp=4, microbatches=4, forward_s=0.0, backward_s=0.0, optimizer_s=0.0, gc_s=0.0,
    p2p_s=0.002, dp_comm_s=0.0, **EXACT,
)  # fmt: skip
"""Every op that takes time is a pipeline send/recv: the step is communication alone."""


def test_doubling_bandwidth_halves_a_pure_communication_step() -> None:
    hw = Hardware(inter_gbps=100, gpus_per_host=1)  # every stage on its own host
    base = step(PURE_P2P, hw)
    assert base > 0
    assert step(PURE_P2P, hw, **{"network.inter_gbps": 200}) == pytest.approx(base / 2, rel=1e-12)
    assert step(PURE_P2P, hw, **{"network.inter_x": 2}) == pytest.approx(base / 2, rel=1e-12)
    # the intra-host links carry none of it
    assert step(PURE_P2P, hw, **{"network.intra_x": 2}) == base


def test_doubling_bandwidth_halves_the_beta_term_and_keeps_alpha() -> None:
    """With a stated latency every op's alpha part stays, its beta part halves."""
    from rankwatch.sim.scenario.reshape import same_shape
    from rankwatch.sim.scenario.retime import scenario_costs

    hw = Hardware(inter_gbps=100, latency_us=300, gpus_per_host=1)
    cal = calibrate_trace(*generate_trace(PURE_P2P), hw)
    shape = same_shape(cal.graph)
    faster = scenario_costs(cal, shape, {"network.inter_gbps": 200})
    comm = np.isin(cal.graph.optype, [2, 3, 4, 5])
    alpha = 300e-6  # one hop per send/recv
    before, after = cal.cost_NSD[comm], faster[comm]
    assert (before > alpha).all()
    np.testing.assert_allclose(after - alpha, (before - alpha) / 2, rtol=1e-12)


def test_with_sizes_only_the_bytes_time_scales() -> None:
    """A send of 125 kB on a 1 Gbit/s link needs 1 ms of its 2 ms: doubling the
    bandwidth saves 0.5 ms per send; the rest (latency, waiting) stays."""
    from rankwatch.sim.scenario.reshape import same_shape
    from rankwatch.sim.scenario.retime import scenario_costs

    p2p = ("forward-send", "forward-recv", "backward-send", "backward-recv")
    hw = Hardware(inter_gbps=1, gpus_per_host=1, bytes=dict.fromkeys(p2p, 125_000.0))
    cal = calibrate_trace(*generate_trace(PURE_P2P), hw)
    faster = scenario_costs(cal, same_shape(cal.graph), {"network.inter_gbps": 2})
    comm = np.isin(cal.graph.optype, [2, 3, 4, 5])
    np.testing.assert_allclose(faster[comm], cal.cost_NSD[comm] - 0.5e-3, rtol=1e-12)
    assert cal.links[1].bandwidth == 125e6


def test_a_larger_dp_ring_moves_more_bus_bytes() -> None:
    """DP 2 -> 4: the bus factor (n-1)/n of all-gather and reduce-scatter goes 1/2 -> 3/4,
    so their transfers grow 1.5 times; all-reduce 2(n-1)/n the same; groups that do not
    span the DP ranks keep their costs."""
    from rankwatch.sim.scenario.reshape import reshape
    from rankwatch.sim.scenario.retime import scenario_costs

    cfg = GenConfig(dp=2, pp=2, microbatches=4, **EXACT)
    cal = calibrate_trace(*generate_trace(cfg), ONE_HOST)
    shape = reshape(cal.graph, 4, 2, 4)
    cost = scenario_costs(cal, shape, {"parallel.dp": 4})
    before = cal.cost_NSD[shape.source_N][:, :, shape.source_D]
    ratio = np.full(shape.graph.size, 1.0)
    ratio[np.isin(shape.graph.optype, [6, 7])] = 1.5  # params-all-gather, grads-reduce-scatter
    ratio[shape.graph.optype == 11] = (2 * 7 / 8) / (2 * 3 / 4)  # the clip: all 2 x 4 ranks
    np.testing.assert_allclose(cost, before * ratio[:, None, None], rtol=1e-12)
    assert cost.shape[2] == 4


# -- re-shaping -------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_more_microbatches_match_the_job_generated_with_them(schedule: str) -> None:
    cfg = GenConfig(dp=2, pp=4, microbatches=4, schedule=schedule, **EXACT)
    expected = analyse(*generate_trace(replace(cfg, microbatches=8))).simulated_S.mean()
    assert step(cfg, microbatches=8) == pytest.approx(expected, rel=1e-12)


def test_interleaved_microbatches_match_the_job_generated_with_them() -> None:
    cfg = GenConfig(dp=1, pp=2, vpp=2, microbatches=4, schedule="interleaved", **EXACT)
    expected = analyse(*generate_trace(replace(cfg, microbatches=8))).simulated_S.mean()
    assert step(cfg, microbatches=8) == pytest.approx(expected, rel=1e-12)


def test_twice_the_stages_halve_each_stage_s_work() -> None:
    """Compute and optimizer halve per stage. (No communication: the generator sizes the
    embedding all-reduce from the DP collectives, which per stage do halve while the
    embedding does not.)"""
    cfg = GenConfig(dp=2, pp=2, microbatches=8, p2p_s=0.0, dp_comm_s=0.0, **EXACT)
    deeper = replace(
        cfg, pp=4, forward_s=cfg.forward_s / 2, backward_s=cfg.backward_s / 2,
        optimizer_s=cfg.optimizer_s / 2,
    )  # fmt: skip
    expected = analyse(*generate_trace(deeper)).simulated_S.mean()
    assert step(cfg, **{"parallel.pp": 4}) == pytest.approx(expected, rel=1e-12)


# -- compute ----------------------------------------------------------------------------


def test_gpu_change_scales_compute_by_the_catalogue_ratio() -> None:
    cfg = GenConfig(dp=1, pp=1, microbatches=4, optimizer_s=0.0, p2p_s=0.0, dp_comm_s=0.0, **EXACT)
    a100 = Hardware(gpu="A100", gpus_per_host=8)
    base = step(cfg, a100)
    assert step(cfg, a100, **{"gpu.model": "H100"}) == pytest.approx(base * 312 / 989, rel=1e-12)
    assert step(cfg, a100, **{"gpu.speed": 2}) == pytest.approx(base / 2, rel=1e-12)


def test_no_stragglers_is_the_what_if_ideal() -> None:
    cfg = GenConfig(dp=2, pp=2, microbatches=4, stragglers=(Straggler(1, 1, 1.8),), seed=3)
    trace, meta = generate_trace(cfg)
    (r,) = run_scenarios(calibrate_trace(trace, meta), [Scenario.of({"no_stragglers": True})])
    np.testing.assert_allclose(r.step_S, analyse(trace, meta).ideal_S, rtol=1e-6)  # f32 ideal


# -- properties -------------------------------------------------------------------------


@SETTINGS
@given(jobs(), st.floats(1.0, 8.0), st.floats(1.0, 8.0))
def test_a_faster_network_never_slows_a_step(cfg: GenConfig, x: float, y: float) -> None:
    sizes = {"forward-send": 1e6, "forward-recv": 1e6, "backward-send": 1e6, "backward-recv": 1e6}
    sized = Hardware(gpus_per_host=2, inter_gbps=10, intra_gbps=100, bytes=sizes)
    for hardware in (Hardware(gpus_per_host=2, latency_us=5), sized):
        cal = calibrate_trace(*generate_trace(cfg), hardware)
        low, high = sorted((x, y))
        runs = [
            {"network.inter_x": low, "network.intra_x": low},
            {"network.inter_x": high, "network.intra_x": high},
            {"network.inter_x": high, "network.intra_x": high, "network.latency_us": 0},
        ]
        base, slow, fast, faster = run_scenarios(cal, [Scenario.of({}), *map(Scenario.of, runs)])
        eps = 1e-12
        assert np.all(slow.step_S <= base.step_S + eps)
        assert np.all(fast.step_S <= slow.step_S + eps)
        assert np.all(faster.step_S <= fast.step_S + eps)


@SETTINGS
@given(jobs(), st.floats(0.25, 4.0))
def test_step_time_is_monotonic_in_gpu_speed(cfg: GenConfig, speed: float) -> None:
    cal = calibrate_trace(*generate_trace(cfg))
    base, other = run_scenarios(cal, [Scenario.of({}), Scenario.of({"gpu.speed": speed})])
    if speed >= 1:
        assert np.all(other.step_S <= base.step_S + 1e-12)
    else:
        assert np.all(other.step_S >= base.step_S - 1e-12)


# -- refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"network.bogus": 1}, "unknown scenario key"),
        ({"gpu.model": "Z9"}, "not in the catalogue"),
        ({"gpu.model": "H100"}, "the job's GPU is unknown"),
        ({"network.inter_gbps": 400}, "inter-host bandwidth is unknown"),
        ({"parallel.tp": 2}, "parallel.tp cannot change"),
        ({"microbatches": 0}, "integer >= 1"),
        ({"network.inter_gbps": -3}, "positive number"),
    ],
)
def test_refused_scenarios_say_why(changes: dict[str, object], words: str) -> None:
    cal = calibrate_trace(*generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=1)),
                          Hardware(gpus_per_host=1))  # fmt: skip
    with pytest.raises(ScenarioError, match=words):
        run_scenarios(cal, [Scenario.of(changes)])


def test_more_dp_ranks_need_a_measured_dp_collective() -> None:
    cal = calibrate_trace(*generate_trace(GenConfig(dp=1, pp=2, microbatches=2, steps=1)))
    with pytest.raises(ScenarioError, match="no data-parallel collectives"):
        run_scenarios(cal, [Scenario.of({"parallel.dp": 2})])
