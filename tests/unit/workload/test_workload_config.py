"""The workload's settings (no torch needed): straggler schedule, JSON hand-off."""

from __future__ import annotations

import pytest

from rankwatch.workload.config import WorkloadConfig


def test_the_straggler_alternates_every_k_steps_on_its_rank_only() -> None:
    cfg = WorkloadConfig(slow_rank=1, slow_matmuls=10, slow_every=2)
    assert [cfg.is_slow(1, s) for s in range(6)] == [False, False, True, True, False, False]
    assert not any(cfg.is_slow(0, s) for s in range(6))
    always = WorkloadConfig(slow_rank=1, slow_matmuls=10)
    assert all(always.is_slow(1, s) for s in range(4))
    assert not WorkloadConfig(slow_rank=1).is_slow(1, 3)  # no extra work: not slow


def test_round_trips_through_json_and_checks_values() -> None:
    cfg = WorkloadConfig(dp=1, pp=4, schedule="interleaved", steps=3)
    assert WorkloadConfig.from_json(cfg.to_json()) == cfg
    assert (cfg.world, cfg.chunks) == (4, 2)
    with pytest.raises(ValueError, match="schedule"):
        WorkloadConfig(schedule="zb")
    with pytest.raises(ValueError):
        WorkloadConfig(dp=0)


def test_a_mismatch_needs_a_rank_of_the_job_in_a_dp_group_of_two_or_more() -> None:
    """Else the fault would inject nothing (or no DP group to leave), and a study would
    read the silence as the detector's miss."""
    assert WorkloadConfig(dp=4, pp=1, mismatch_rank=3).mismatch_rank == 3
    with pytest.raises(ValueError, match="mismatch_rank 4"):
        WorkloadConfig(dp=2, pp=2, mismatch_rank=4)
    with pytest.raises(ValueError, match="mismatch_rank -2"):
        WorkloadConfig(mismatch_rank=-2)
    with pytest.raises(ValueError, match="DP group"):
        WorkloadConfig(dp=1, pp=4, mismatch_rank=1)


def test_faults_start_at_fault_from_on_the_chosen_ranks() -> None:
    cfg = WorkloadConfig(slow_rank=1, slow_matmuls=10, fault_from=3, netns="ns", netns_ranks="1,3")
    assert [cfg.is_slow(1, s) for s in range(5)] == [False, False, False, True, True]
    assert cfg.faulty(2, -1, 3) and not cfg.faulty(2, -1, 2)
    assert cfg.faulty(2, 2, 4) and not cfg.faulty(1, 2, 4)
    assert cfg.in_netns(3) and not cfg.in_netns(0) and not cfg.in_netns(13)


def test_pauses_fall_after_every_kth_step_of_the_chosen_rank() -> None:
    cfg = WorkloadConfig(pause_every=3, pause_s=1.0, pause_rank=2, fault_from=4)
    assert [s for s in range(12) if cfg.pauses(2, s)] == [5, 8, 11]
    assert not any(cfg.pauses(0, s) for s in range(12))
    assert not any(WorkloadConfig(pause_rank=2).pauses(2, s) for s in range(12))
