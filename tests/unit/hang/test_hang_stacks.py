"""Merged stacks and rank ranges."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rankwatch.streams.hang.ranges import format_ranges, parse_ranges
from rankwatch.streams.hang.stacks import folded_text, merge_stacks


def thread(*functions: str, native: bool = False) -> dict:
    frames = [{"file": "train.py", "line": 10 + i, "function": f} for i, f in enumerate(functions)]
    return {"name": "MainThread", "thread_id": 1, "native": native, "frames": frames}


def test_ranges_fold_runs() -> None:
    assert format_ranges([8, 0, 1, 2, 3, 5, 9, 10, 3]) == "0-3,5,8-10"
    assert format_ranges([]) == ""


@given(st.sets(st.integers(0, 300)))
def test_ranges_round_trip(ranks: set[int]) -> None:
    assert parse_ranges(format_ranges(ranks)) == sorted(ranks)


def test_identical_paths_fold_and_name_the_absent_rank() -> None:
    waiting = thread("main", "train_step", "all_reduce", "wait")
    dumps = {r: [waiting] for r in range(16) if r != 5}
    dumps[5] = [thread("main", "train_step", "forward", "matmul")]
    merged = merge_stacks(dumps, range(16))
    assert [m.ranks_text for m in merged] == ["0-4,6-15", "5"]
    assert merged[0].absent_text == "5"
    assert merged[0].stack == "train.py:main;train.py:train_step;train.py:all_reduce;train.py:wait"
    text = folded_text(merged)
    assert text.splitlines()[0].endswith(" 15") and text.splitlines()[1].endswith(" 1")


def test_ranks_without_a_dump_count_as_absent() -> None:
    merged = merge_stacks({0: [thread("main", "wait")], 1: [thread("main", "wait")]}, range(3))
    assert merged[0].absent == (2,)
