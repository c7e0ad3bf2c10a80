"""The validation's gap decomposition on generated jobs where every factor is known.

PP 2 x DP 2, 1F1B, no communication cost, no noise, no launch delay: the clean steps
are balanced (imbalance 1, launch 1), and slowing worker (0,0) by k puts exactly
(3 + k) / 4 of a forward and backward into the ideal (the mean over 4 workers), so
the method's S falls short of the measured slowdown by that factor and nothing else.
Tolerances are 1e-6: the simulation runs in float32.
"""

from __future__ import annotations

import pytest

from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.validation import decompose


def job(factor: float | None, dp: int = 2) -> GenConfig:
    slow = () if factor is None else (Straggler(dp_rank=0, stage=0, factor=factor),)
    return GenConfig(
        dp=dp, pp=2, microbatches=4, steps=4, forward_s=0.01, backward_s=0.02, p2p_s=0.0,
        dp_comm_s=0.0, optimizer_s=0.0, noise=0.0, stragglers=slow,
    )  # fmt: skip


@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0])
def test_the_gap_is_the_dilution_of_the_ideal(factor: float) -> None:
    slow, meta = generate_trace(job(factor))
    clean, _ = generate_trace(job(None))
    straggled, baseline, gap = decompose(slow, clean, meta)
    assert gap["imbalance"] == pytest.approx(1.0, abs=1e-6)
    assert gap["launch"] == pytest.approx(1.0, abs=1e-6)
    assert gap["dilution"] == pytest.approx((3 + factor) / 4, rel=1e-6)
    assert straggled.slowdown == pytest.approx(gap["measured_mean"] / gap["dilution"], rel=1e-6)
    assert gap["undiluted_over_imbalance"] == pytest.approx(gap["measured_mean"], rel=1e-6)
    assert baseline.slowdown == pytest.approx(1.0, abs=1e-6)
    assert gap["others_slowed"] == pytest.approx(1.0, rel=1e-6)


def test_dilution_fades_with_more_workers() -> None:
    by_dp = {}
    for dp in (2, 4, 8):
        slow, meta = generate_trace(job(2.0, dp))
        clean, _ = generate_trace(job(None, dp))
        by_dp[dp] = decompose(slow, clean, meta)[2]["dilution"]
    assert by_dp == pytest.approx({dp: 1 + 1 / (2 * dp) for dp in by_dp}, rel=1e-6)


def test_neighbours_slowed_with_the_straggler_are_seen() -> None:
    """Workers (0,1), (1,0), (1,1) in the straggled steps, (1,1) 1.5x: mean 7/6."""
    cfg = job(2.0)
    spill = (*cfg.stragglers, Straggler(dp_rank=1, stage=1, factor=1.5))
    slow, meta = generate_trace(GenConfig(**{**vars(cfg), "stragglers": spill}))
    clean, _ = generate_trace(job(None))
    assert decompose(slow, clean, meta)[2]["others_slowed"] == pytest.approx(7 / 6, rel=1e-6)
