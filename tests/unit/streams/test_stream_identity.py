"""A job's identity is fixed once: a batch that contradicts it, names another job than
its key, or a step far from the job's, is a dead letter (table row and topic message,
original bytes kept) and changes nothing; a late or re-read batch is not stored twice."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.workers import several_jobs

from rankwatch.schemas.codec import encode_ops
from rankwatch.schemas.opbatch import OpBatch
from rankwatch.schemas.topics import DEAD_LETTER_HEADERS
from rankwatch.streams.kit.output import Output, Source
from rankwatch.streams.ops.assembly import AssemblyConfig
from rankwatch.streams.ops.identity import JobIdentities
from rankwatch.streams.ops.pipeline import JobHistory, Pipeline
from rankwatch.streams.ops.replay import ReplayedBatch

ORIGIN = 1_700_000_000 * 10**9


@pytest.fixture(scope="module")
def batches() -> list[ReplayedBatch]:
    return several_jobs(["job-st"], steps=4, origin_ns=ORIGIN)


def run(
    items: list[tuple[OpBatch, bytes | None]], keep_ops: bool = True
) -> tuple[Pipeline, Output]:
    pipeline = Pipeline(assembly=AssemblyConfig(grace_s=1e9), keep_ops=keep_ops)
    out = Output()
    for offset, (batch, key) in enumerate(items):
        # unkeyed: a file or the embedded runner, from no topic (keyless records of a
        # topic are refused: test_stream_records_without.py)
        source = Source("p.ops", -1 if key is None else 0, offset, key, ORIGIN + offset)
        out.extend(pipeline.on_message(encode_ops(batch), source, ORIGIN))
    out.extend(pipeline.flush(ORIGIN))
    return pipeline, out


def good(batches: list[ReplayedBatch]) -> list[tuple[OpBatch, bytes | None]]:
    return [(b.batch, b.batch.job.encode()) for b in batches]


def without_dead_letters(out: Output) -> dict[str, list[dict]]:
    return {t: rows for t, rows in out.rows.items() if t != "dead_letters"}


def comparable(rows: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Rows less the processing-time bookkeeping (analysed_at, version)."""
    drop = {"analysed_at", "version"}
    return {
        t: [{k: v for k, v in r.items() if k not in drop} for r in rs] for t, rs in rows.items()
    }


def bad_copy(batch: OpBatch, **changes: object) -> OpBatch:
    return dataclasses.replace(batch, batch_seq=batch.batch_seq + 10_000, **changes)


def far_step(batch: OpBatch) -> OpBatch:
    return bad_copy(batch, step=np.full_like(batch.step, 10**12))


CASES = {
    "contradicts-job/sizes": (lambda b: bad_copy(b, dp_size=4), "contradicts-job", "dp_size 4"),
    "contradicts-job/rank": (lambda b: bad_copy(b, dp_rank=1 - b.dp_rank), "contradicts-job", ""),
    "bad-coordinates": (lambda b: bad_copy(b, pp_rank=7), "bad-coordinates", "pp 7/2"),
    "step-out-of-window": (far_step, "step-out-of-window", "window 4096"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_contradicting_batch_is_a_dead_letter_and_changes_nothing(
    batches: list[ReplayedBatch], case: str
) -> None:
    make, reason, detail = CASES[case]
    _, clean = run(good(batches))
    bad = make(batches[5].batch)
    dirty_items = good(batches)
    dirty_items.insert(9, (bad, bad.job.encode()))
    pipeline, dirty = run(dirty_items)
    (row,) = dirty.rows["dead_letters"]
    assert row["reason"] == reason and detail in row["detail"]
    assert comparable(without_dead_letters(dirty)) == comparable(clean.rows)
    assert [b.batch_seq for b in dirty.ops] == [b.batch_seq for b in clean.ops]
    (letter,) = dirty.dead_letters
    assert letter.key == "job-st" and letter.data == encode_ops(bad)
    assert dict(letter.headers())[DEAD_LETTER_HEADERS[0]] == reason.encode()
    assert pipeline.dead_letter_reasons == {reason: 1}


def test_a_key_naming_another_job_is_a_dead_letter(batches: list[ReplayedBatch]) -> None:
    _, clean = run(good(batches))
    stray = dataclasses.replace(batches[3].batch, job="job-other")
    items = good(batches)
    items.insert(4, (stray, b"job-st"))
    _, dirty = run(items)
    (row,) = dirty.rows["dead_letters"]
    assert row["reason"] == "key-mismatch" and "job-other" in row["detail"]
    assert row["key"] == "job-st"
    assert comparable(without_dead_letters(dirty)) == comparable(clean.rows)
    assert {r["job"] for r in dirty.rows["jobs"]} == {"job-st"}


def test_unkeyed_messages_are_accepted(batches: list[ReplayedBatch]) -> None:
    """Files and the embedded runner have no Kafka key: only a key that disagrees counts."""
    _, out = run([(b.batch, None) for b in batches])
    assert "dead_letters" not in out.rows and len(out.rows["steps"]) == 4


def test_world_size_comes_from_the_coordinates(batches: list[ReplayedBatch]) -> None:
    """Sparse rank numbers (here every rank x 2 + 1) must not inflate the world size."""
    sparse = [(dataclasses.replace(b.batch, rank=2 * b.batch.rank + 1), None) for b in batches]
    _, out = run(sparse)
    assert {r["world_size"] for r in out.rows["jobs"]} == {4}


def test_late_and_repeated_batches_are_not_stored_again(batches: list[ReplayedBatch]) -> None:
    _, clean = run(good(batches))
    late = dataclasses.replace(batches[0].batch, batch_seq=99)  # a step closed long ago
    _, dirty = run([*good(batches), (batches[1].batch, b"job-st"), (late, b"job-st")])
    assert sum(len(b) for b in dirty.ops) == sum(len(b) for b in clean.ops)
    assert "dead_letters" not in dirty.rows


def test_batches_stored_before_a_restart_feed_their_step_but_are_not_stored_again(
    batches: list[ReplayedBatch],
) -> None:
    first_step = [b for b in batches if b.batch.steps_done[0][0] == 0]
    stored = frozenset(b.batch.delivery_key for b in first_step[:2])
    pipeline = Pipeline(assembly=AssemblyConfig(grace_s=1e9), keep_ops=True)
    pipeline.restore("job-st", (2, 2), JobHistory(stored_batches=stored))
    out = Output()
    for b in first_step:
        out.extend(pipeline.on_message(encode_ops(b.batch), Source("p.ops"), ORIGIN))
    assert len(out.rows["steps"]) == 1 and not out.rows["steps"][0]["partial"]
    assert {(b.rank, b.batch_seq) for b in out.ops} == {
        (b.batch.rank, b.batch.batch_seq) for b in first_step[2:]
    }


def test_identity_restored_from_the_store_refuses_a_contradiction(
    batches: list[ReplayedBatch],
) -> None:
    """After a restart the first batch met must not define the job anew."""
    ids = JobIdentities(step_window=100)
    ids.restore("job-st", (2, 2), newest_step=3, coordinates={0: (0, 0, 0, 0)})
    wrong = dataclasses.replace(batches[0].batch, dp_size=4, pp_size=1, pp_rank=0)
    rejected = ids.check(wrong, b"job-st")
    assert rejected is not None and rejected.reason == "contradicts-job"
    moved = dataclasses.replace(batches[0].batch, rank=0, dp_rank=1)
    assert ids.check(moved, None) is not None
    assert ids.check(dataclasses.replace(batches[0].batch, rank=0, dp_rank=0, pp_rank=0)) is None


def test_step_window_must_fit_the_closed_memory() -> None:
    with pytest.raises(ValueError, match="step_window"):
        AssemblyConfig(step_window=5000, closed_memory=4096)


def test_a_restarted_training_process_reusing_a_batch_seq_is_stored(
    batches: list[ReplayedBatch],
) -> None:
    """A stored (rank, batch_seq) of an open step does not hide a batch of another step
    that a restarted training process numbered the same."""
    first_step = [b for b in batches if b.batch.steps_done[0][0] == 0]
    later = [b for b in batches if b.batch.steps_done[0][0] == 1]
    renumbered = {b.batch.rank: b.batch.batch_seq for b in first_step}
    stored = frozenset(b.batch.delivery_key for b in first_step)
    pipeline = Pipeline(assembly=AssemblyConfig(grace_s=1e9), keep_ops=True)
    pipeline.restore("job-st", (2, 2), JobHistory(stored_batches=stored))
    out = Output()
    for b in later:
        again = dataclasses.replace(b.batch, batch_seq=renumbered[b.batch.rank])
        out.extend(pipeline.on_message(encode_ops(again), Source("p.ops"), ORIGIN))
    assert sorted(b.rank for b in out.ops) == sorted(b.batch.rank for b in later)
