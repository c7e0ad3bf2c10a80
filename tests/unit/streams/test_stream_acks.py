"""A message is acknowledged only after every step it fed closed and a flush stored it."""

from __future__ import annotations

from rankwatch.streams.kit.acks import AckTracker


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
