"""Jobs first met: what they hold while their recall runs, and the recalls themselves
(streams/kit/recall.py)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from rankwatch.streams.kit.recall import Held, RecallTasks, recall_now


def test_a_job_holds_its_items_in_order_until_its_recall_answers() -> None:
    held: Held[int] = Held(limit=10)
    assert held.hold("j", 1) is None and held.hold("j", 2) is None
    assert held.take_new() == [("j", 1)] and held.take_new() == []  # one recall a job
    assert "j" in held and len(held) == 1
    assert list(held.answered("j", 1) or ()) == [1, 2]
    assert "j" not in held and held.answered("j", 1) is None  # answered once


def test_past_the_limit_the_oldest_item_is_dropped_and_counted() -> None:
    held: Held[int] = Held(limit=2)
    dropped = [held.hold("j", i) for i in range(4)]
    assert dropped == [None, None, 0, 1] and held.dropped == 2 and held.total == 2
    ((job, ticket),) = held.take_new()
    assert list(held.answered(job, ticket) or ()) == [2, 3]


def test_without_a_limit_every_item_is_held_and_the_total_counted() -> None:
    held: Held[int] = Held(limit=None)
    assert [held.hold("j", i) for i in range(5)] == [None] * 5
    held.hold("k", 9)
    assert held.total == 6 and held.dropped == 0
    held.forget("k")
    assert held.total == 5
    ((job, ticket),) = held.take_new()
    assert len(held.answered(job, ticket) or ()) == 5 and held.total == 0


def test_a_recall_answering_after_its_job_was_forgotten_takes_nothing() -> None:
    held: Held[str] = Held(limit=10)
    held.hold("j", "before")
    ((_, stale),) = held.take_new()
    held.forget("j")  # the partition was revoked while the lookup ran...
    held.hold("j", "after")  # ...and came back: a recall of its own
    ((_, current),) = held.take_new()
    assert held.answered("j", stale) is None
    assert list(held.answered("j", current) or ()) == ["after"]


def test_a_waiting_jobs_first_item_and_current_ticket_are_known_until_it_answers() -> None:
    held: Held[str] = Held(limit=None)
    held.hold("j", "a")
    held.hold("j", "b")
    ((job, ticket),) = held.take_new()
    assert held.first(job) == "a" and held.current(job, ticket) and held.jobs() == ["j"]
    assert not held.current(job, ticket + 1) and held.first("k") is None
    assert list(held.forget(job)) == ["a", "b"] and held.total == 0  # what it held
    assert held.first(job) is None and not held.current(job, ticket) and held.jobs() == []
    assert list(held.forget(job)) == []


def test_a_job_taken_in_parts_stays_held_until_empty() -> None:
    held: Held[int] = Held(limit=None)
    for i in range(3):
        held.hold("j", i)
    ((job, ticket),) = held.take_new()
    assert held.take(job, ticket + 1, 2) is None  # stale
    assert held.take(job, ticket, 2) == [0, 1] and "j" in held and held.total == 1
    held.hold("j", 3)  # comes meanwhile: behind what is left, no new recall
    assert held.take_new() == []
    assert held.take(job, ticket, 5) == [2, 3] and "j" not in held and held.total == 0
    assert held.take(job, ticket, 5) is None


def test_a_job_forgotten_before_its_recall_started_asks_for_none() -> None:
    held: Held[str] = Held(limit=10)
    held.hold("j", "x")
    held.forget("j")
    assert held.take_new() == [] and len(held) == 0


def test_recall_now_answers_each_in_turn() -> None:
    answers: list[tuple[str, int, str | None]] = []
    recall_now([("j", 1), ("k", 2)], str.upper, lambda j, t, f: answers.append((j, t, f)))
    assert answers == [("j", 1, "J"), ("k", 2, "K")]


def test_recall_tasks_look_up_in_a_thread_and_answer_on_the_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The lookup runs off the event loop's thread; one that raises answers None (the
    job starts afresh) and one whose taking raises is logged, not lost in a task."""
    threads: dict[str, int] = {}
    answers: list[tuple[str, int, str | None]] = []

    def look_up(job: str) -> str | None:
        threads[job] = threading.get_ident()
        if job == "broken":
            raise RuntimeError("store gone")
        return job.upper()

    def recalled(job: str, ticket: int, found: str | None) -> None:
        if job == "bad":
            raise ValueError("cannot take it")
        answers.append((job, ticket, found))

    async def main() -> int:
        tasks = RecallTasks(look_up, recalled, logging.getLogger("test.recall"))
        tasks.start([("j", 1), ("broken", 2), ("bad", 3)])
        for _ in range(200):
            if len(answers) == 2 and len(threads) == 3:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the last task's taking, logged
        return threading.get_ident()

    with caplog.at_level(logging.ERROR, logger="test.recall"):
        loop_thread = asyncio.run(main())
    assert sorted(answers) == [("broken", 2, None), ("j", 1, "J")]
    assert loop_thread not in threads.values()
    messages = [r.getMessage() for r in caplog.records]
    assert any("recall of job broken failed" in m for m in messages)
    assert any("taking job bad's recall failed" in m for m in messages)
