"""The slowdown signals on hand-built steps: exact values (docs/detection.md, section 3)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankwatch.schemas.optypes import bus_factor
from rankwatch.streams.slowdown.signals import (
    RankStep,
    flops_per_s,
    step_signals,
)

MS = 1_000_000


def item(**overrides: Any) -> dict[str, Any]:
    """A step: previous end at 0, begin at 20 ms, end at 100 ms, 60 ms covered."""
    return {
        "step": 7,
        "begin_ns": 20 * MS,
        "end_ns": 100 * MS,
        "prev_end_ns": 0,
        "covered_ns": 60 * MS,
        "samples": 32,
        "gc_ns": 0,
        "gc_count": 0,
        "data_wait_ns": 0,
        "issue": None,
        "ops": [],
        **overrides,
    }


def rank_step(rank: int, pp_rank: int = 0, **overrides: Any) -> RankStep:
    return RankStep("j", rank, "h", rank, pp_rank, item(**overrides))


@pytest.mark.parametrize(
    ("algo", "n", "factor"),
    [
        ("all-reduce", 2, 1.0),
        ("all-reduce", 4, 1.5),
        ("all-reduce", 8, 1.75),
        ("all-reduce", 1, 0.0),
        ("all-gather", 4, 0.75),
        ("reduce-scatter", 8, 0.875),
        ("p2p", 2, 1.0),
    ],
)
def test_bus_factors_are_ncclS(algo: str, n: int, factor: float) -> None:
    assert bus_factor(algo, n) == factor


def test_bus_factor_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        bus_factor("all-reduce", 0)
    with pytest.raises(ValueError):
        bus_factor("butterfly", 4)


def test_flops_per_s_leaves_gc_inside_out() -> None:
    ops = [
        {"optype": "forward-compute", "n": 4, "time_ns": 30 * MS, "gc_ns": 10 * MS, "flops": 2e9},
        {"optype": "backward-compute", "n": 4, "time_ns": 40 * MS, "flops": 4e9},
        {"optype": "optimizer", "n": 1, "time_ns": 5 * MS},
    ]
    # 6e9 FLOPs over (30 - 10) + 40 = 60 ms
    assert flops_per_s(ops) == pytest.approx(1e11, rel=1e-12)
    assert flops_per_s([{"optype": "gc", "n": 1, "time_ns": 5}]) is None


def test_void_percentages_of_a_hand_built_timeline() -> None:
    (s,) = step_signals([rank_step(0, gc_ns=4 * MS, data_wait_ns=6 * MS)])
    assert s.t_step == pytest.approx(0.100) and s.t_inter == pytest.approx(0.020)
    assert s.v_inter == pytest.approx(0.2)  # 20 / 100
    assert s.v_minority == pytest.approx(0.25)  # (80 - 60) / (100 - 20)
    assert s.v_hidden == pytest.approx(0.1)  # (20 - 6 - 4) / 100
    assert s.gc_share == pytest.approx(0.04) and s.data_share == pytest.approx(0.06)
    assert s.throughput == pytest.approx(320.0)  # 32 samples / 0.1 s


def test_first_step_has_no_time_between_steps() -> None:
    (s,) = step_signals([rank_step(0, prev_end_ns=None)])
    assert s.t_inter == 0 and s.v_inter == 0 and s.t_step == pytest.approx(0.080)


def _allreduce(time_ms: int, nbytes: int = 100 * MS) -> list[dict[str, Any]]:
    return [
        {
            "optype": "grads-reduce-scatter",
            "n": 1,
            "time_ns": time_ms * MS,
            "bytes": nbytes,
            "group": 2,
            "algo": "all-reduce",
        }
    ]


def test_a_collective_is_timed_by_the_member_that_waited_least() -> None:
    """Rank 0 waited 90 ms for a late rank 1 inside the all-reduce; rank 1's 10 ms is
    the transfer: both get 100 MB x 2(2-1)/2 / 10 ms = 10 GB/s. Another stage's group
    is timed on its own."""
    steps = [
        rank_step(0, 0, ops=_allreduce(100)),
        rank_step(1, 0, ops=_allreduce(10)),
        rank_step(2, 1, ops=_allreduce(50)),
        rank_step(3, 1, ops=_allreduce(40)),
    ]
    got = {s.rank: s.busbw for s in step_signals(steps)}
    assert got[0] == pytest.approx(1e10) and got[1] == pytest.approx(1e10)
    assert got[2] == pytest.approx(2.5e9) and got[3] == pytest.approx(2.5e9)


def test_issue_latency_in_microseconds() -> None:
    issue = {"n": 10, "p50_ns": 8_000, "p99_ns": 250_000, "max_ns": 300_000}
    (s,) = step_signals([rank_step(0, issue=issue)])
    assert (s.issue_p50_us, s.issue_p99_us) == (8.0, 250.0)


@given(
    prev=st.integers(0, 10**9),
    inter=st.integers(0, 10**9),
    inner=st.integers(1, 10**9),
    covered=st.integers(0, 2 * 10**9),
)
def test_shares_stay_within_zero_and_one(prev: int, inter: int, inner: int, covered: int) -> None:
    begin = prev + inter
    rs = rank_step(0, prev_end_ns=prev, begin_ns=begin, end_ns=begin + inner, covered_ns=covered)
    (s,) = step_signals([rs])
    assert 0 <= s.v_inter <= 1 and 0 <= s.v_minority <= 1 and 0 <= s.v_hidden <= 1
