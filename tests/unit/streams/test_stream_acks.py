"""A message is acknowledged only after every step it fed closed and a flush stored it,
and only once every message read before it on its partition was."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.streams.kit.acks import AckTracker, InOrder


def test_message_waits_for_all_its_steps_and_then_a_flush() -> None:
    acks: AckTracker[str] = AckTracker()
    acks.received("m1", "j", [("j", 1), ("j", 2)])
    acks.received("m2", "j", [("j", 2)])
    acks.received("bad", "", [])  # a dead letter: only its own row to store
    assert acks.flushed() == ["bad"]
    acks.closed([("j", 1)])
    assert acks.flushed() == []  # m1 still feeds step 2
    acks.closed([("j", 2)])
    assert acks.waiting == 0 and acks.settled == 2
    assert sorted(acks.flushed()) == ["m1", "m2"]
    assert acks.flushed() == []


def test_forgotten_jobs_are_never_acknowledged() -> None:
    acks: AckTracker[str] = AckTracker()
    acks.received("a", "ja", [("ja", 1)])
    acks.received("b", "jb", [("jb", 1)])
    acks.forget(lambda job: job == "ja")
    acks.closed([("ja", 1), ("jb", 1)])
    assert acks.flushed() == ["b"]


P0, P1 = ("ops", 0), ("ops", 1)


def test_a_safe_message_waits_for_every_earlier_message_of_its_partition() -> None:
    order: InOrder[str] = InOrder()
    for token, partition in [("a", P0), ("b", P0), ("x", P1), ("c", P0)]:
        order.received(token, partition)
    assert order.release(["b", "c", "x"]) == ["x"]  # a (step still open) holds b and c
    assert order.held == 2
    assert order.release(["a"]) == ["a", "b", "c"]
    assert order.held == 0 and order.release(["a"]) == []  # handed over once


def test_tokens_of_a_partition_given_up_are_never_handed_over() -> None:
    order: InOrder[str] = InOrder()
    order.received("a", P0)
    order.received("b", P0)
    order.received("x", P1)
    assert order.release(["b"]) == []
    order.forget({P0})
    assert order.release(["a", "x"]) == ["x"]  # read again after the rebalance: not acked
    order.received("a2", P0)  # the partition's re-read starts afresh
    assert order.release(["a2"]) == ["a2"]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_what_is_handed_over_is_always_a_prefix_of_each_partition(data: st.DataObject) -> None:
    """Whatever order messages become safe in, each partition's handed-over tokens are
    exactly its first k messages (so a consumer commits nothing unstored), and all of
    them once all are safe."""
    n = data.draw(st.integers(1, 60))
    partitions = data.draw(st.lists(st.sampled_from([P0, P1]), min_size=n, max_size=n))
    order: InOrder[int] = InOrder()
    for token, partition in enumerate(partitions):
        order.received(token, partition)
    safe_order = data.draw(st.permutations(range(n)))
    done: set[int] = set()
    handed: list[int] = []
    for i in range(0, n, 3):
        chunk = list(safe_order[i : i + 3])
        done.update(chunk)
        handed += order.release(chunk)
        for partition in (P0, P1):
            mine = [t for t, p in enumerate(partitions) if p == partition]
            got = [t for t in handed if partitions[t] == partition]
            prefix = 0
            while prefix < len(mine) and mine[prefix] in done:
                prefix += 1
            assert got == mine[:prefix]
    assert sorted(handed) == list(range(n)) and order.held == 0


def test_faust_commits_past_an_unacknowledged_message() -> None:
    """Why :class:`InOrder` exists: faust-streaming 0.15.3 computes the offset to commit
    from the acknowledged offsets alone. With offset 45 committed (next to read) and 46,
    47 acknowledged, it commits 48: message 45, never acknowledged, is skipped; with
    nothing committed yet it commits past any gap before the first run. If this test
    fails, faust changed: re-read streams/FAUST_NOTES.md, "How offsets are committed"."""
    from collections import defaultdict
    from types import SimpleNamespace

    from faust.transport.consumer import Consumer
    from intervaltree import IntervalTree

    def new_offset(committed: int | None, acked: list[int]) -> int | None:
        state = SimpleNamespace(
            _acked=defaultdict(list, {"tp": list(acked)}),
            _acked_index=defaultdict(set, {"tp": set(acked)}),
            _gap=defaultdict(IntervalTree),
            _committed_offset=defaultdict(lambda: None, {"tp": committed}),
        )
        return Consumer._new_offset(state, "tp")  # type: ignore[arg-type]

    assert new_offset(45, [46, 47]) == 48  # 45 skipped
    assert new_offset(None, [3, 4]) == 5  # 0-2 skipped
    assert new_offset(45, [47, 48]) is None  # a gap of two is respected
    assert new_offset(45, [45, 46]) == 47  # in order: what InOrder guarantees


def test_a_long_partition_keeps_its_order() -> None:
    """10,000 tokens: handing over half leaves the rest in their places, and one missing
    token holds every later one."""
    order: InOrder[int] = InOrder()
    for token in range(10_000):
        order.received(token, P0)
    assert order.release(list(range(5_000))) == list(range(5_000))
    assert order.release(list(range(5_001, 10_000))) == []
    assert order.held == 4_999
    assert order.release([5_000]) == list(range(5_000, 10_000))
