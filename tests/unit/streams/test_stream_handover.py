"""A job handed over through its ``jobstate`` message goes on as if it never moved: the
worker that takes it over, restored from the message alone (no store), re-reads the
uncommitted batches and produces, together with the old owner, every step row, alert
and raw op exactly once, with the numbers of an uninterrupted run (docs/sizing.md,
"Moving jobs between workers")."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.schemas.codec import decode, decode_ops, encode, encode_ops
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.ops.alerts import AlertConfig, StragglerAlerts
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.handover import history_from, state_message, step_ranges, steps_of
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import replay_batches

CFG = GenConfig(dp=2, pp=2, microbatches=4, steps=12, stragglers=(Straggler(0, 1, 1.5),), seed=5)
SOURCE = Source(topic="ops")
ALERTS = AlertConfig(fire_at=1.05, clear_below=1.01, window=3)


def pipeline() -> Pipeline:
    return Pipeline(
        analyser=WhatIfAnalyser(window=4), alerts=StragglerAlerts(ALERTS), keep_ops=True
    )


def feed(p: Pipeline, messages: list[bytes], first: int = 0) -> Output:
    out = Output()
    for i, m in enumerate(messages):
        out.extend(p.on_message(m, SOURCE, first + i))
    return out


def handed_over(p: Pipeline, job: str) -> Pipeline:
    """A fresh pipeline restored from ``p``'s jobstate message, through the codec."""
    data = encode("jobstate", state_message(job, p.history(job)))
    history = history_from(decode("jobstate", data))
    taker = pipeline()
    taker.restore(job, (CFG.dp, CFG.pp), history)
    return taker


MESSAGES = [
    encode_ops(b.batch) for b in replay_batches(*generate_trace(CFG), "j", origin_ns=10**18)
]


def uninterrupted() -> Output:
    p = pipeline()
    out = feed(p, MESSAGES)
    out.extend(p.flush(0))
    return out


WHOLE = uninterrupted()


def first_uncommitted(before: Output, messages: list[bytes]) -> int:
    """The first message that fed a step not stored before the move: the committed
    offset can be no later (a message is acknowledged once its steps are stored)."""
    stored = {r["step"] for r in before.rows.get("steps", [])}
    for i, m in enumerate(messages):
        if not set(np.unique(decode_ops(m).step).tolist()) <= stored:
            return i
    return len(messages)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_job_handed_over_mid_run_is_stored_once_with_the_same_numbers(
    data: st.DataObject,
) -> None:
    cut = data.draw(st.integers(1, len(MESSAGES) - 1), label="moved after message")
    old = pipeline()
    before = feed(old, MESSAGES[:cut])
    # the new owner re-reads from the committed offset, anywhere up to the first
    # message of a step the old owner had not stored
    start = data.draw(st.integers(0, first_uncommitted(before, MESSAGES[:cut])), label="from")
    new = handed_over(old, "j")
    after = feed(new, MESSAGES[start:], start)
    after.extend(new.flush(0))

    rows = before.rows.get("steps", []) + after.rows.get("steps", [])
    expected = {r["step"]: r for r in WHOLE.rows["steps"]}
    assert sorted(r["step"] for r in rows) == sorted(expected)  # each step once
    for row in rows:
        for name in ("t_base", "t_sim", "t_ideal", "slowdown", "partial", "n_ops"):
            assert row[name] == expected[row["step"]][name], (row["step"], name)
    attributions = before.rows.get("step_attribution", []) + after.rows.get("step_attribution", [])
    key = lambda r: (r["step"], r["dimension"], r["group"], r["slowdown"])  # noqa: E731
    assert sorted(map(key, attributions)) == sorted(map(key, WHOLE.rows["step_attribution"]))
    alerts = before.rows.get("alerts", []) + after.rows.get("alerts", [])
    assert WHOLE.rows.get("alerts"), "the straggler fires an alert"
    assert [(a["alert_id"], a["state"], a["evidence"]) for a in alerts] == [
        (a["alert_id"], a["state"], a["evidence"]) for a in WHOLE.rows["alerts"]
    ]
    # the raw ops: those stored before the move for steps still open are not stored again
    stored_ops = sum(len(b) for b in before.ops + after.ops)
    assert stored_ops == sum(len(b) for b in WHOLE.ops)


def test_the_message_carries_the_window_exactly() -> None:
    old = pipeline()
    feed(old, MESSAGES[: len(MESSAGES) // 2])
    history = old.history("j")
    assert history.summaries, "the window has steps"
    back = history_from(decode("jobstate", encode("jobstate", state_message("j", history))))
    assert back.summaries is not None
    for step, summary in history.summaries.items():
        for name in ("count", "total", "median"):
            np.testing.assert_array_equal(
                getattr(back.summaries[step], name), getattr(summary, name)
            )
    assert back.closed_steps == sorted(history.closed_steps)
    assert back.marks == history.marks and back.marks, "the alerts' step marks, exactly"
    assert back.layout == history.layout and back.coordinates == history.coordinates
    assert back.stored_batches == history.stored_batches
    assert back.last_alert == history.last_alert


def test_a_state_that_cannot_be_the_jobs_is_refused_not_restored() -> None:
    """Messages the schema lets through but no worker of this version wrote: window
    summaries of another op vocabulary (a rolling upgrade, or damage) once restored and
    then failed the job's next analysis; closed steps past any assembly's memory would
    expand into the worker's memory. Both are ValueError: the store is used instead."""
    old = pipeline()
    feed(old, MESSAGES[: len(MESSAGES) // 2])
    message = state_message("j", old.history("j"))
    short = {
        **message,
        "window": [{**w, "count": w["count"][:-1]} for w in message["window"]],
    }
    with pytest.raises(ValueError, match="summaries of shape"):
        history_from(decode("jobstate", encode("jobstate", short)))
    huge = {**message, "closed": [[0, 1 << 19], [1 << 20, (1 << 20) + (1 << 19)]]}
    with pytest.raises(ValueError, match="bad step range"):
        history_from(decode("jobstate", encode("jobstate", huge)))


@given(st.sets(st.integers(0, 10_000), max_size=200))
def test_step_ranges_round_trip(steps: set[int]) -> None:
    ranges = step_ranges(list(steps))
    assert steps_of(ranges) == sorted(steps)
    assert all(b[0] > a[1] + 1 for a, b in itertools.pairwise(ranges))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_a_kill_between_a_flush_and_its_jobstate_stores_again_identically(
    data: st.DataObject,
) -> None:
    """The old owner's latest jobstate message is from an earlier flush (it was killed
    after storing more steps and before their message went out): the new owner re-reads
    from the offset that message covers and stores those steps again, the same rows.
    Deduplicated on (job, step), the union is the uninterrupted run."""
    sent = data.draw(st.integers(1, len(MESSAGES) - 2), label="last jobstate after message")
    killed = data.draw(st.integers(sent + 1, len(MESSAGES) - 1), label="killed after message")
    old = pipeline()
    before = feed(old, MESSAGES[:sent])
    handed = handed_over(old, "j")  # the last message that reached the broker
    before.extend(feed(old, MESSAGES[sent:killed], sent))  # stored, never handed over
    start = first_uncommitted(feed(pipeline(), MESSAGES[:sent]), MESSAGES[:sent])
    after = feed(handed, MESSAGES[start:], start)
    after.extend(handed.flush(0))

    expected = {r["step"]: r for r in WHOLE.rows["steps"]}
    rows = before.rows.get("steps", []) + after.rows.get("steps", [])
    assert {r["step"] for r in rows} == set(expected)  # nothing lost
    for row in rows:  # a step stored twice: the same figures both times
        for name in ("t_base", "t_sim", "t_ideal", "slowdown", "partial", "n_ops"):
            assert row[name] == expected[row["step"]][name], (row["step"], name)
    alerts = before.rows.get("alerts", []) + after.rows.get("alerts", [])
    assert {(a["alert_id"], a["state"], a["ts_ns"], a["evidence"]) for a in alerts} == {
        (a["alert_id"], a["state"], a["ts_ns"], a["evidence"]) for a in WHOLE.rows["alerts"]
    }


@pytest.mark.parametrize(
    ("dimension", "group"),
    [("blame:worker", "3"), ("blame:worker", "a,b"), ("blame:stage", "1,0"),
     ("blame:optype", "gc"), ("blame:spread", "0"), ("top:worker", "x"), ("top:rack", "1"),
     ("peer:stage", "1"), ("peer:rack", "0,1"), ("peer:dp_rank", "")],
)  # fmt: skip
def test_a_message_whose_alert_marks_cannot_be_split_is_refused(dimension: str, group: str) -> None:
    """The alerts split a worker's group into its DP and PP rank: a mark another worker
    (or anything on the topic) wrote wrong is refused with the message, which the worker
    then counts and restores from the store instead (``WorkerState.recollect``)."""
    p = pipeline()
    feed(p, MESSAGES[: len(MESSAGES) // 2])
    message = decode("jobstate", encode("jobstate", state_message("j", p.history("j"))))
    step = message["slowdowns"][0][0]
    message["leaders"].append(
        {"step": step, "dimension": dimension, "group": group, "slowdown": 1.2}
    )
    with pytest.raises(ValueError, match="bad alert mark"):
        history_from(message)
