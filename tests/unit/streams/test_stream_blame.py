"""Who a straggler alert blames, on hand-built attributions: the smallest group that
explains the step (a worker, a stage, a DP rank), or spread; over a window, the group
most steps blame. On main the largest S_g named "stage 0" for a slow worker (1,0): a
worker's S_g is the smaller of its stage's and its DP rank's, so it never led."""

from __future__ import annotations

import pytest

from rankwatch.streams.ops.blame import (
    SPREAD,
    StepBlame,
    ranks_of,
    step_blame,
    window_blame,
)


def attributions(
    dp: int, pp: int, slow: dict[tuple[int, int], float]
) -> list[tuple[str, str, float]]:
    """S_g of a DP x PP job whose workers in ``slow`` alone slow the step by their value
    (1.0: not at all), as the simulator derives them: a DP rank or stage is as slow as
    its slowest worker, a worker the smaller of its DP rank and stage."""

    def worst(cells: list[tuple[int, int]]) -> float:
        return max([slow.get(c, 1.0) for c in cells])

    by_dp = {d: worst([(d, p) for p in range(pp)]) for d in range(dp)}
    by_stage = {p: worst([(d, p) for d in range(dp)]) for p in range(pp)}
    out = [("dp_rank", str(d), v) for d, v in by_dp.items()]
    out += [("stage", str(p), v) for p, v in by_stage.items()]
    out += [
        ("worker", f"{d},{p}", min(by_dp[d], by_stage[p])) for d in range(dp) for p in range(pp)
    ]
    out += [("optype", "forward-compute", 1.3)]
    return out


def test_a_single_slow_worker_is_named_as_the_worker_not_its_stage() -> None:
    assert step_blame(2.0, attributions(2, 2, {(1, 0): 2.0})) == StepBlame("worker", "1,0")
    assert step_blame(1.5, attributions(4, 4, {(1, 1): 1.5})) == StepBlame("worker", "1,1")


def test_a_slow_stage_is_the_stage() -> None:
    slow = {(d, 1): 1.6 for d in range(4)}
    assert step_blame(1.6, attributions(4, 2, slow)) == StepBlame("stage", "1")


def test_a_slow_dp_rank_is_the_dp_rank() -> None:
    slow = {(2, p): 1.4 for p in range(3)}
    assert step_blame(1.4, attributions(4, 3, slow)) == StepBlame("dp_rank", "2")


def test_noise_or_a_slowdown_no_group_carries_is_spread() -> None:
    noise = {(0, 0): 1.04, (1, 1): 1.05, (0, 1): 1.03}  # no one carries the step's 1.2
    assert step_blame(1.2, attributions(2, 2, noise)).dimension == SPREAD
    two_corners = {(0, 0): 1.5, (1, 1): 1.5}  # two workers of different stages and ranks
    assert step_blame(1.5, attributions(2, 2, two_corners)).dimension == SPREAD
    assert step_blame(1.0, attributions(2, 2, {})).dimension == SPREAD


def test_a_near_tie_between_two_workers_is_not_blamed_on_either() -> None:
    """Two workers of one stage each carry the step: the stage is blamed, not the one
    that happens to be a hair ahead."""
    slow = {(0, 0): 1.500, (1, 0): 1.499}
    assert step_blame(1.5, attributions(2, 2, slow)) == StepBlame("stage", "0")


def test_a_window_blames_the_group_most_of_its_steps_blame() -> None:
    worker = StepBlame("worker", "1,0")
    blames = [worker] * 7 + [StepBlame("stage", "0"), StepBlame(SPREAD, ""), worker]
    found = window_blame(blames, chronic_share=0.6)
    assert (found.dimension, found.group, found.led, found.steps) == ("worker", "1,0", 8, 10)
    moving = [StepBlame("worker", f"{i % 4},0") for i in range(10)]
    assert not window_blame(moving, chronic_share=0.6).chronic


@pytest.mark.parametrize(
    ("dimension", "group", "ranks"),
    [("worker", "1,0", [1, 5]), ("stage", "1", [2, 3, 6, 7]), ("dp_rank", "0", [0, 2, 4, 6])],
)
def test_a_groups_ranks_are_every_rank_at_its_coordinates(
    dimension: str, group: str, ranks: list[int]
) -> None:
    """DP 2 x PP 2 x TP 2: ranks 0-3 are TP rank 0, ranks 4-7 their TP peers."""
    coords = {r: (r % 2, (r // 2) % 2, r // 4, 0) for r in range(8)}
    assert ranks_of(dimension, group, coords) == ranks
