"""Bundles through the pure core: the relay's rule (``Bundler``), the replay's relay
timeline, and the pipeline and worker state taking bundles exactly as the same batches
sent one by one."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.memstore import MemoryStore

from rankwatch.schemas.batching import BatchingRule, Bundler, RelayRule
from rankwatch.schemas.codec import encode_ops, encode_ops_bundle
from rankwatch.sim.tracegen import GenConfig, Straggler, generate_trace
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.ops.alerts import StragglerAlerts
from rankwatch.streams.ops.analyser import WhatIfAnalyser
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.pipeline import Pipeline
from rankwatch.streams.ops.replay import ReplayedBatch, relay_timeline, replay_batches
from rankwatch.streams.ops.worker_state import WorkerSettings, WorkerState, first_batch

RULE = RelayRule(linger_s=0.05, max_bytes=100, alone_bytes=60, max_members=3)


def test_a_bundle_leaves_when_its_first_frame_has_lingered() -> None:
    b = Bundler(RULE)
    assert b.add(0.0, "j", b"a" * 10) == [] and b.add(0.03, "j", b"b" * 10) == []
    assert b.deadline == pytest.approx(0.05)
    assert b.due(0.049) == []
    assert b.due(0.05) == [("j", [b"a" * 10, b"b" * 10])] and b.deadline is None


def test_jobs_bundle_apart_and_size_count_and_large_frames_cut_bundles() -> None:
    b = Bundler(RULE)
    assert b.add(0.0, "j", b"1" * 40) == [] and b.add(0.0, "k", b"2" * 10) == []
    assert b.add(0.01, "j", b"3" * 70) == [("j", [b"3" * 70])]  # large: alone, at once
    assert b.add(0.01, "j", b"4" * 50) == []
    assert b.add(0.02, "j", b"5" * 20) == [("j", [b"1" * 40, b"4" * 50])]  # 110 > 100
    assert b.add(0.02, "j", b"6") == [] and b.add(0.02, "j", b"7") == [
        ("j", [b"5" * 20, b"6", b"7"])
    ]
    assert b.drain() == [("k", [b"2" * 10])] and b.deadline is None


def small_job(hosts_of: int = 2) -> list[ReplayedBatch]:
    """A DP 2 x PP 2 job with a straggler, its ranks spread over hosts of ``hosts_of``."""
    cfg = GenConfig(dp=2, pp=2, microbatches=4, steps=5, stragglers=(Straggler(1, 1, 1.4),))
    trace, meta = generate_trace(cfg)
    batches = list(replay_batches(trace, meta, "j", 10**18, BatchingRule(window_s=0.0)))
    return [
        dataclasses.replace(
            b, batch=dataclasses.replace(b.batch, host=f"h{b.batch.rank // hosts_of}")
        )
        for b in batches
    ]


def test_the_relay_timeline_keeps_every_batch_once_each_host_apart() -> None:
    batches = small_job()
    relayed = relay_timeline([(b, encode_ops(b.batch)) for b in batches], RelayRule(linger_s=0.05))
    held = [batch for message in relayed for batch in message.batches]
    assert sorted(id(b) for b in held) == sorted(id(b.batch) for b in batches)
    assert len(relayed) < len(batches)
    sent = {id(b.batch): b.sent_ns for b in batches}
    for message in relayed:
        assert len({b.host for b in message.batches}) == 1
        waited = [message.sent_ns - sent[id(b)] for b in message.batches]
        assert (
            min(waited) >= 0 and max(waited) <= 0.05e9 + 1000
        )  # float seconds on the relay's clock
    assert [m.sent_ns for m in relayed] == sorted(m.sent_ns for m in relayed)


def pipeline(**assembly: Any) -> Pipeline:
    return Pipeline(
        assembly=AssemblyConfig(grace_s=1e9, **assembly),
        analyser=WhatIfAnalyser(),
        alerts=StragglerAlerts(),
        keep_ops=True,
    )


def bundled(batches: list[ReplayedBatch]) -> list[bytes]:
    relayed = relay_timeline([(b, encode_ops(b.batch)) for b in batches], RelayRule(linger_s=0.05))
    return [encode_ops_bundle(list(m.frames)) for m in relayed]


def run(messages: list[bytes]) -> tuple[Pipeline, Output]:
    p, out = pipeline(), Output()
    for i, m in enumerate(messages):
        out.extend(p.on_message(m, Source("ops", 0, i, b"j"), i))
    out.extend(p.flush(0))
    return p, out


def results(rows: list[dict]) -> list[dict]:
    """Rows without when they were made (the call that closed the step differs)."""
    return [{k: v for k, v in r.items() if k not in ("analysed_at", "version")} for r in rows]


def test_bundles_give_the_same_results_as_their_batches_one_by_one() -> None:
    batches = small_job()
    _, alone = run([encode_ops(b.batch) for b in batches])
    _, together = run(bundled(batches))
    assert results(together.rows["steps"]) == results(alone.rows["steps"])
    assert len(alone.rows["steps"]) == 5
    assert results(together.rows["step_attribution"]) == results(alone.rows["step_attribution"])
    assert (
        sum(map(len, together.ops))
        == sum(map(len, alone.ops))
        == sum(len(b.batch) for b in batches)
    )


def test_a_bad_member_makes_one_dead_letter_naming_it_and_costs_nothing_else() -> None:
    batches = small_job(hosts_of=4)
    frames = [encode_ops(b.batch) for b in batches]
    spare = encode_ops(dataclasses.replace(batches[0].batch, job="k", batch_seq=99))
    bad = encode_ops_bundle([frames[0], frames[1][:-8], spare, *frames[2:4]])
    p, out = run([bad, frames[1], *frames[4:], frames[0]])  # frame 0 again: a duplicate
    [letter] = out.dead_letters
    assert letter.data == bad and letter.reason == "column-length"
    assert "bundle member 1 of 5" in letter.detail and "bundle member 2 of 5" in letter.detail
    assert p.dead_letters == 2 and p.dead_letter_reasons == {"column-length": 1, "key-mismatch": 1}
    unkeyed = pipeline()
    unkeyed.on_message(bad, Source("ops"), 0)  # no key: the first member's job rules
    assert unkeyed.dead_letter_reasons == {"column-length": 1, "schema": 1}
    _, clean = run(frames)
    assert results(out.rows["steps"]) == results(clean.rows["steps"])
    assert sum(map(len, out.ops)) == sum(len(b.batch) for b in batches)  # none twice


def test_a_step_closed_by_a_later_member_is_not_pending_and_every_bundle_is_acknowledged() -> None:
    batches = small_job(hosts_of=4)  # one host: a step's four batches in one bundle
    messages = bundled(batches)
    store = MemoryStore()
    state = WorkerState(WorkerSettings(bootstrap="-", dsn="-"), connect=lambda: store)
    for offset, value in enumerate(messages):
        members = state.decode(value)
        assert members is not None and len(members) > 1
        if state.needs_restore(first_batch(members)):
            assert state.restore(first_batch(members))  # type: ignore[arg-type]
        state.on_message(offset, value, Source("ops", 0, offset, b"j", time.time_ns()), members)
    assert sorted(state.flush()) == list(range(len(messages)))
    assert state.snapshot()["steps_analysed"] == 5 and not state.acks.waiting
    assert len(store.rows["ops"]) == len(batches)


def test_records_of_a_bundle_are_views_of_its_bytes() -> None:
    batches = small_job(hosts_of=4)
    data = bundled(batches)[0]
    p = pipeline()
    out = p.on_message(data, Source("ops", 0, 0, b"j"), 0)
    whole = np.frombuffer(data, dtype=np.uint8)
    assert out.ops and all(np.shares_memory(b.start_ns, whole) for b in out.ops)


def _as_sent(out: Output) -> dict:
    """Everything a call's output says, comparable."""
    return {
        "rows": out.rows,
        "steps": [(s.job, s.step, s.partial) for s in out.steps],
        "pending": out.pending,
        "ops": [(b.rank, b.batch_seq, len(b)) for b in out.ops],
        "letters": [(d.reason, d.detail) for d in out.dead_letters],
    }


def _pool() -> tuple[list[bytes], list[list[int]], dict[tuple[int, int], int]]:
    """Frames of a DP 2 x PP 2 job on 2 hosts (a step's 4 frames in 2 bundles), then one
    of another job, a broken one, and step 0's four sent again under new batch numbers
    (a restarted process's); the natural bundles (host and step); (step, rank) -> frame."""
    batches = [b.batch for b in small_job(hosts_of=2)]
    frames = [encode_ops(b) for b in batches]
    frames += [encode_ops(dataclasses.replace(batches[0], job="k")), frames[1][:-8]]
    again = sorted((b for b in batches if b.step_span[0] == 0), key=lambda b: b.rank)
    frames += [encode_ops(dataclasses.replace(b, batch_seq=b.batch_seq + 1000)) for b in again]
    where = {(b.step_span[0], b.rank): i for i, b in enumerate(batches)}
    hosts = dict.fromkeys((step, rank // 2) for step, rank in where)
    natural = [[i for (s, r), i in where.items() if (s, r // 2) == key] for key in hosts]
    return frames, natural, where


def _agree(frames: list[bytes], messages: list[list[int]]) -> tuple[int, Pipeline]:
    """Feed ``messages`` (lists of frame indices) to a pipeline and to one that takes
    every bundle a member at a time; assert they say the same, call by call. Returns
    how many bundles were taken as one, and the second pipeline."""
    fast, slow = pipeline(max_open_steps=3), pipeline(max_open_steps=3)  # some evicted
    slow.assembler.add_together = lambda *_: None  # type: ignore[method-assign]
    taken = [0]
    together = fast.assembler.add_together

    def counted(*args: object) -> object:
        added = together(*args)  # type: ignore[arg-type]
        taken[0] += added is not None
        return added

    fast.assembler.add_together = counted  # type: ignore[method-assign]
    for i, members in enumerate(messages):
        parts = [frames[m] for m in members]
        data = encode_ops_bundle(parts) if len(parts) > 1 else parts[0]
        source = Source("ops", 0, i, b"j")
        said = _as_sent(fast.on_message(data, source, i))
        assert said == _as_sent(slow.on_message(data, source, i))
    assert _as_sent(fast.flush(99)) == _as_sent(slow.flush(99))
    assert fast.assembler.counters == slow.assembler.counters
    assert fast.dead_letter_reasons == slow.dead_letter_reasons
    assert fast.identity.coordinates("j") == slow.identity.coordinates("j")
    return taken[0], slow


@settings(max_examples=60, deadline=None)
@given(
    order=st.permutations(range(10)),
    extra=st.lists(
        st.tuples(
            st.integers(0, 12),
            st.one_of(
                st.lists(st.integers(0, 25), min_size=1, max_size=5),
                st.sampled_from([[22, 23], [24, 25]]),  # step 0 sent again, new batch_seq
            ),
        ),
        max_size=6,
    ),
)
def test_a_bundle_taken_as_one_gives_what_its_members_one_at_a_time_give(
    order: list[int], extra: list[tuple[int, list[int]]]
) -> None:
    """The host's bundle fast path (``StepAssembler.add_together``) against the members
    taken one at a time, message by message: steps out of order, bundles sent again,
    mixed steps, repeated frames, a frame of another job, a broken one, and step 0's
    batches sent again under new batch numbers."""
    frames, natural, _ = _pool()
    messages = [natural[i] for i in order]
    for at, members in extra:
        messages.insert(at, members)
    _agree(frames, messages)


def test_a_hosts_bundles_are_taken_as_one_all_but_a_jobs_first() -> None:
    frames, natural, _ = _pool()
    taken, slow = _agree(frames, natural)
    assert taken == len(natural) - 1 and slow.steps_analysed == 5


def test_a_member_after_the_one_that_closes_its_step_is_late_as_alone() -> None:
    """Rank 1 completes step 0; rank 0, done with it already, sends it again (a new
    batch number): one at a time, that comes after the step closed and is late."""
    frames, _, where = _pool()
    step0 = [where[0, r] for r in range(4)]
    messages = [[step0[2], step0[3]], [step0[0]], [step0[1], 22]]  # 22: rank 0 again
    _, slow = _agree(frames, messages)
    assert slow.assembler.counters.late_batches == 1
