"""Contract with the what-if engine: it reads generated traces exactly as generated.

The engine infers its graph from one step of dp_rank 0 and re-simulates; on a generated
trace the replay with launch delays must hit the recorded step times, and without
launch delays in the config it must find none (T equals the recorded times).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rankwatch.sim import analyse
from rankwatch.sim.tracegen import GenConfig, Straggler, demo_config, generate_trace

CONFIGS = {
    "1f1b": GenConfig(dp=2, pp=4, microbatches=4, steps=3),
    "gpipe": GenConfig(dp=3, pp=3, microbatches=5, schedule="gpipe", steps=2),
    "interleaved": GenConfig(dp=2, pp=4, microbatches=8, vpp=2, schedule="interleaved", steps=2),
    "overlap": GenConfig(dp=2, pp=3, microbatches=6, overlap_grad_comm=True, steps=2),
    "pp1": GenConfig(dp=4, pp=1, microbatches=3, steps=2),
    "dp1": GenConfig(dp=1, pp=4, microbatches=6, steps=2),
    "straggler": GenConfig(stragglers=(Straggler(1, 2, 1.7),), steps=3),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_engine_finds_no_launch_delay_where_none_was_generated(name: str) -> None:
    trace, meta = generate_trace(CONFIGS[name])
    result = analyse(trace, meta)
    np.testing.assert_allclose(result.simulated_S, result.base_S, rtol=0, atol=1e-12)
    assert result.replay_error < 1e-12


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_engine_replays_generated_launch_delays_exactly(name: str) -> None:
    trace, meta = generate_trace(replace(CONFIGS[name], launch_delay_s=0.001, seed=5))
    result = analyse(trace, meta)
    assert result.replay_error < 1e-9
    assert result.launch_slowdown > 1.0


def test_engine_blames_the_demo_straggler() -> None:
    trace, meta = generate_trace(demo_config())
    result = analyse(trace, meta)
    assert result.slowdown > 1.1
    assert result.top_workers == ((2, 1),)
    assert next(iter(result.attribution("dp_rank"))) == "2"
