"""Per-stage compute orders, checked against the schedules' definitions."""

from __future__ import annotations

import pytest

from rankwatch.sim.tracegen.schedule import Action, stage_actions


def _names(actions: list[Action]) -> list[str]:
    return [f"{a.kind}{a.mb}" + (f"c{a.chunk}" if a.chunk else "") for a in actions]


def test_gpipe_runs_all_forwards_then_all_backwards() -> None:
    assert _names(stage_actions("gpipe", 4, 1, 3, 2)) == ["F0", "F1", "F2", "B0", "B1", "B2"]


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        (0, ["F0", "F1", "F2", "F3", "B0", "F4", "B1", "B2", "B3", "B4"]),
        (2, ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "F4", "B3", "B4"]),
        (3, ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "F4", "B4"]),
    ],
)
def test_1f1b_warms_up_with_pp_minus_stage_minus_one_forwards(
    stage: int, expected: list[str]
) -> None:
    assert _names(stage_actions("1f1b", 4, 1, 5, stage)) == expected


def test_1f1b_with_fewer_microbatches_than_stages_warms_up_with_all() -> None:
    assert _names(stage_actions("1f1b", 8, 1, 2, 0)) == ["F0", "F1", "B0", "B1"]


def test_interleaved_walks_chunks_in_groups_of_pp() -> None:
    # pp 2, 2 chunks, 4 microbatches, stage 1: warm-up 2*(2-1-1) + (2-1)*2 = 2 forwards
    got = _names(stage_actions("interleaved", 2, 2, 4, 1))
    assert got == [
        "F0", "F1",  # warm-up: chunk 0, microbatches 0-1
        "F0c1", "B0c1", "F1c1", "B1c1",  # forward chunk 1 / backward last chunk first
        "F2", "B0", "F3", "B1",
        "F2c1", "B2c1", "F3c1", "B3c1",
        "B2", "B3",  # cool-down
    ]  # fmt: skip


def test_interleaved_with_as_many_microbatches_as_stages_warms_up_with_everything() -> None:
    got = _names(stage_actions("interleaved", 2, 2, 2, 1))
    assert got == ["F0", "F1", "F0c1", "F1c1", "B0c1", "B1c1", "B0", "B1"]


def test_interleaved_with_one_chunk_is_1f1b() -> None:
    assert stage_actions("interleaved", 4, 1, 8, 1) == stage_actions("1f1b", 4, 1, 8, 1)


@pytest.mark.parametrize(
    ("schedule", "pp", "vpp", "m"),
    [("gpipe", 3, 1, 5), ("1f1b", 4, 1, 7), ("interleaved", 4, 2, 8), ("interleaved", 2, 3, 6)],
)
def test_every_stage_runs_each_pass_once_forward_before_backward(
    schedule: str, pp: int, vpp: int, m: int
) -> None:
    for stage in range(pp):
        actions = stage_actions(schedule, pp, vpp, m, stage)
        passes = [(a.kind, a.chunk, a.mb) for a in actions]
        assert sorted(passes) == sorted(
            (k, c, i) for k in "FB" for c in range(vpp) for i in range(m)
        )
        for c in range(vpp):
            for i in range(m):
                assert passes.index(("F", c, i)) < passes.index(("B", c, i))
        assert all(a.stage == stage for a in actions)


def test_action_reads_like_pytorch_pipelining_vocabulary() -> None:
    assert str(Action(2, "F", 0, 0)) == "2F0"
    assert str(Action(1, "B", 1, 3)) == "1B3c1"


def test_unknown_schedule_is_rejected() -> None:
    with pytest.raises(ValueError, match="zero-bubble"):
        stage_actions("zero-bubble", 2, 1, 2, 0)
