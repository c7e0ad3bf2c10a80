"""The what-if engine against the real workload: a heavier injected straggler is
measured and simulated as a larger slowdown, the two agree roughly, the injected
worker leads the heatmap, and the model replays its own trace.

The tolerance comes from the spread of ``benchmarks/validate_whatif.py`` on the shared
2-core machine (see benchmarks/README.md, "What-if validation"): single jobs of 12
analysed steps, not the repeated runs of the benchmark.
"""

from __future__ import annotations

import pytest

from rankwatch.validation import one_job
from rankwatch.workload.launch import torch_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not torch_available(), reason="the workload needs torch"),
]

AGREEMENT = 0.45
"""|simulated - measured| / measured allowed for one short job (see the module doc)."""


def test_simulated_slowdown_follows_the_measured_one() -> None:
    light = one_job(15, steps=12, warmup=2, every=2, seed=0)
    heavy = one_job(100, steps=12, warmup=2, every=2, seed=0)
    assert heavy["measured"] > light["measured"]
    assert heavy["simulated"] > light["simulated"]
    for run in (light, heavy):
        assert abs(run["error"]) < AGREEMENT, run
        assert run["replay_error"] < 0.02, run
    assert heavy["top_worker"] == "0,0", heavy["workers"]


def test_the_gap_to_the_measured_slowdown_decomposes_exactly() -> None:
    """S / measured (means) = imbalance * launch / dilution, on a real trace; and at a
    heavy straggler the ideal keeps part of the injected work (dilution > 1)."""
    run = one_job(100, steps=8, warmup=2, every=2, seed=1)
    factors = run["imbalance"] * run["launch"] / run["dilution"]
    assert run["simulated"] / run["measured_mean"] == pytest.approx(factors, rel=1e-6)
    assert run["dilution"] > 1.0, run
