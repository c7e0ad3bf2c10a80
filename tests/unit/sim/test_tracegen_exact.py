"""Exact step times of the schedules with no noise, no communication and equal stages.

With per-chunk forward and backward times f and b, p stages, m microbatches and v model
chunks per stage, a step's compute lasts ``(v m + p - 1)(f + b)``: 1F1B and GPipe
(v = 1) take ``(m + p - 1)(f + b)``, a bubble of ``(p - 1) / m`` of the ideal compute
``m (f + b)``; interleaved 1F1B takes ``(m + (p - 1) / v)(F + B)`` in whole-stage times
``F = v f``, ``B = v b``: a bubble of ``(p - 1) / (v m)``. The tail after the last
backward (gc, then the optimizer) adds its own time.
"""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.sim.trace import Trace
from rankwatch.sim.tracegen import GenConfig, generate_trace

F, B = 0.010, 0.025


def _quiet(**kw: object) -> GenConfig:
    base: dict[str, object] = dict(
        noise=0.0,
        p2p_s=0.0,
        dp_comm_s=0.0,
        optimizer_s=0.0,
        gc_s=0.0,
        forward_s=F,
        backward_s=B,
        steps=2,
    )
    return GenConfig(**{**base, **kw})  # type: ignore[arg-type]


def _step_times(trace: Trace) -> np.ndarray:
    end = trace.start_ts + trace.duration
    return np.array([end[trace.step == s].max() for s in np.unique(trace.step)])


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 16])
def test_1f1b_and_gpipe_last_m_plus_p_minus_one_microbatches(
    schedule: str, pp: int, m: int
) -> None:
    trace, _ = generate_trace(_quiet(schedule=schedule, pp=pp, microbatches=m, dp=2))
    np.testing.assert_allclose(_step_times(trace), (m + pp - 1) * (F + B), rtol=0, atol=1e-12)


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("vpp", [1, 2, 3, 4])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_interleaved_bubble_shrinks_by_the_number_of_chunks(pp: int, vpp: int, groups: int) -> None:
    m = groups * pp
    cfg = _quiet(schedule="interleaved", pp=pp, vpp=vpp, microbatches=m, dp=2)
    t = _step_times(generate_trace(cfg)[0])
    np.testing.assert_allclose(t, (vpp * m + pp - 1) * (F + B), rtol=0, atol=1e-12)
    whole_f, whole_b = vpp * F, vpp * B
    ideal = m * (whole_f + whole_b)
    np.testing.assert_allclose((t - ideal) / ideal, (pp - 1) / (vpp * m), atol=1e-9)


def test_tail_adds_gc_and_optimizer_after_the_last_backward() -> None:
    cfg = _quiet(pp=4, microbatches=8, dp=3, gc_s=0.003, optimizer_s=0.02)
    t = _step_times(generate_trace(cfg)[0])
    np.testing.assert_allclose(t, (8 + 4 - 1) * (F + B) + 0.003 + 0.02, atol=1e-12)


def test_uneven_stages_are_paced_by_the_slowest() -> None:
    # 1F1B steady state runs at the slowest stage's pace: with one stage k times slower
    # the step is at least m k (f + b) and longer than the balanced one.
    balanced = _step_times(generate_trace(_quiet(pp=4, microbatches=8))[0])
    heavy = _step_times(generate_trace(_quiet(pp=4, microbatches=8, stage_factors=(1, 1, 1, 2)))[0])
    assert np.all(heavy >= 8 * 2 * (F + B) - 1e-12)
    assert np.all(heavy > balanced)


def test_without_communication_time_the_dp_size_does_not_matter() -> None:
    one = _step_times(generate_trace(_quiet(pp=3, microbatches=6, dp=1))[0])
    many = _step_times(generate_trace(_quiet(pp=3, microbatches=6, dp=5))[0])
    np.testing.assert_array_equal(one, many)
