"""generate_trace: determinism, shape, stragglers, imbalance, validation, the demo job."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest

from rankwatch.schemas.optypes import CODE
from rankwatch.sim.trace import Trace
from rankwatch.sim.tracegen import GenConfig, Straggler, demo_config, generate_trace

_COMPUTE = [CODE["forward-compute"], CODE["backward-compute"]]


def _same(a: Trace, b: Trace) -> bool:
    return all(np.array_equal(getattr(a, f.name), getattr(b, f.name)) for f in fields(Trace))


def test_same_seed_same_trace_other_seed_other_durations() -> None:
    cfg = GenConfig(launch_delay_s=0.0005, seed=11)
    assert _same(generate_trace(cfg)[0], generate_trace(cfg)[0])
    other, _ = generate_trace(replace(cfg, seed=12))
    assert not np.array_equal(other.duration, generate_trace(cfg)[0].duration)


@pytest.mark.parametrize(
    "cfg",
    [
        GenConfig(dp=3, pp=4, microbatches=5, steps=4, first_step=7),
        GenConfig(dp=2, pp=2, microbatches=4, vpp=2, schedule="interleaved", steps=3),
        GenConfig(dp=1, pp=1, microbatches=1, steps=2),
    ],
)
def test_every_step_and_dp_rank_records_the_same_number_of_ops(cfg: GenConfig) -> None:
    trace, meta = generate_trace(cfg)
    counts = {
        (s, d): int(np.sum((trace.step == s) & (trace.dp_rank == d)))
        for s in cfg.step_numbers
        for d in range(cfg.dp)
    }
    assert len(set(counts.values())) == 1
    assert sorted(np.unique(trace.step).tolist()) == list(cfg.step_numbers)
    assert set(np.unique(trace.rank).tolist()) == set(range(meta.world_size))
    assert np.all(trace.duration >= 0.0)


def test_a_straggler_slows_only_its_own_compute() -> None:
    base = GenConfig(dp=2, pp=4, microbatches=4, steps=3, first_step=5)
    slow = replace(base, stragglers=(Straggler(dp_rank=1, stage=2, factor=1.5, steps=(6,)),))
    a, _ = generate_trace(base)
    b, _ = generate_trace(slow)
    compute = np.isin(a.optype, _COMPUTE)
    hit = compute & (a.dp_rank == 1) & (a.stage == 2) & (a.step == 6)
    np.testing.assert_allclose(b.duration[hit], 1.5 * a.duration[hit], rtol=1e-12)
    np.testing.assert_array_equal(b.duration[compute & ~hit], a.duration[compute & ~hit])
    # ... and the step it straggles in gets longer
    end_a, end_b = a.start_ts + a.duration, b.start_ts + b.duration
    assert end_b[b.step == 6].max() > end_a[a.step == 6].max()
    assert end_b[b.step == 5].max() == end_a[a.step == 5].max()


def test_stage_factors_scale_that_stages_compute() -> None:
    base = GenConfig(dp=2, pp=3, microbatches=3, steps=1)
    a, _ = generate_trace(base)
    b, _ = generate_trace(replace(base, stage_factors=(1.0, 1.0, 1.2)))
    last = np.isin(a.optype, _COMPUTE) & (a.stage == 2)
    np.testing.assert_allclose(b.duration[last], 1.2 * a.duration[last], rtol=1e-12)


def test_noise_zero_gives_exact_durations() -> None:
    trace, _ = generate_trace(GenConfig(noise=0.0, forward_s=0.01, backward_s=0.03))
    assert set(trace.duration[trace.optype == CODE["forward-compute"]].tolist()) == {0.01}
    assert set(trace.duration[trace.optype == CODE["backward-compute"]].tolist()) == {0.03}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dp": 0}, "dp"),
        ({"schedule": "zb"}, "schedule"),
        ({"vpp": 2}, "interleaved"),
        ({"vpp": 2, "schedule": "interleaved", "microbatches": 6}, "multiple of pp"),
        ({"forward_s": -1.0}, "forward_s"),
        ({"noise": float("nan")}, "noise"),
        ({"stage_factors": (1.0, 2.0)}, "one factor per stage"),
        ({"stragglers": (Straggler(dp_rank=2, stage=0, factor=2.0),)}, "outside"),
        ({"stragglers": (Straggler(dp_rank=0, stage=0, factor=0.0),)}, "factor"),
    ],
)
def test_bad_configs_are_rejected_naming_the_field(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GenConfig(**changes)


def test_demo_job_has_a_straggler_worker_and_a_heavier_last_stage() -> None:
    cfg = demo_config()
    assert (cfg.dp, cfg.pp, cfg.microbatches, cfg.steps, cfg.schedule) == (4, 4, 8, 30, "1f1b")
    trace, meta = generate_trace(cfg)
    assert meta.world_size == 16
    compute = np.isin(trace.optype, _COMPUTE)

    def mean_compute(mask: np.ndarray) -> float:
        return float(trace.duration[compute & mask].mean())

    straggler = (trace.dp_rank == 2) & (trace.stage == 1)
    peers = (trace.dp_rank != 2) & (trace.stage == 1)
    assert mean_compute(straggler) / mean_compute(peers) == pytest.approx(1.6, rel=0.02)
    last, first = trace.stage == 3, (trace.stage == 0)
    assert mean_compute(last) / mean_compute(first) == pytest.approx(1.15, rel=0.02)
    assert _same(trace, generate_trace(demo_config())[0])
    assert not _same(trace, generate_trace(demo_config(seed=1))[0])


def test_a_1024_gpu_job_generates_whole() -> None:
    # DP 64 x PP 16, 32 microbatches, 2 chunks: about 0.3 s on one core (not timed here;
    # the figure belongs in benchmarks).
    cfg = GenConfig(dp=64, pp=16, microbatches=32, vpp=2, schedule="interleaved", steps=2)
    trace, meta = generate_trace(cfg)
    assert meta.world_size == 1024
    per_worker_step = len(trace) // (64 * 2)
    assert per_worker_step * 64 * 2 == len(trace)
    assert set(np.unique(trace.rank).tolist()) == set(range(1024))
