"""Duplicate, shuffled, truncated (JSON, and ops v3 frames cut short), wrong-typed,
unknown-version and oversized messages, and batches that contradict their job (other
sizes, another rank's coordinates, a key naming another job, a step far away) mixed
into a replay on topics the broker has never seen,
whose ranks restart their batch numbering halfway (a training restart): the worker does
not crash, each bad message is in the dead-letter table and on the dead-letter topic
(original bytes, reason header), duplicates are counted and not stored twice, and the
good job's rows are exactly those of a clean run."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from pathlib import Path

import orjson
import pytest
from support.workers import (
    STEP_FIELDS,
    WorkerProcess,
    records_until,
    reference_run,
    send_in_order,
    several_jobs,
    wait_committed,
)

from rankwatch.schemas.codec import encode_ops
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.replay import ReplayedBatch

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MAX_BYTES = 100_000
KEY = b"job-0"


Message = tuple[bytes, bytes]
"""(key, value)"""


def dirty_stream(
    good: list[bytes], as_json: list[bytes], steps_of: list[int]
) -> tuple[list[Message], dict[str, Message]]:
    """The good messages (ops v3 frames) with each step's batches shuffled, some
    repeated, and bad ones in between, frames and JSON (``as_json``: the same batches as
    v2, the base of the edited ones); returns the stream and the bad message of each
    reason."""
    rng = random.Random(7)
    out: list[Message] = []
    for step in sorted(set(steps_of)):
        batch = [(KEY, m) for m, s in zip(good, steps_of, strict=True) if s == step]
        rng.shuffle(batch)  # inside a step: arrival order must not matter
        out += batch + batch[:1]  # and a hook retried one batch
    doc = orjson.loads(as_json[0])
    other_rank = next(d for d in map(orjson.loads, as_json) if d["rank"] != doc["rank"])
    fresh = {**doc, "batch_seq": 10_000}  # not a duplicate: a new batch that lies
    bad = {
        "malformed-json": as_json[1][: len(as_json[1]) // 2],  # truncated
        "malformed-frame": good[1][:6],  # a frame cut inside its head
        "column-length": good[3][:-8],  # a frame short of its last block's bytes
        "schema": orjson.dumps({**doc, "rank": "three"}),  # wrong-typed
        "unknown-version": orjson.dumps({**doc, "version": 99}),
        "too-large": good[2] + b" " * MAX_BYTES,  # oversized (valid JSON, too big)
        "contradicts-job": orjson.dumps({**fresh, "dp_size": 4}),  # a DP2 job said DP4
        "bad-coordinates": orjson.dumps({**fresh, "dp_rank": 3}),  # dp 3 of 2
        "step-out-of-window": orjson.dumps(
            {**fresh, "ops": {**doc["ops"], "step": [10**12] * len(doc["ops"]["step"])}}
        ),
        # another rank's coordinates under this rank's number
        "contradicts-job/rank": orjson.dumps(
            {**fresh, **{k: other_rank[k] for k in ("dp_rank", "pp_rank")}}
        ),
    }
    letters = {
        reason.split("/")[0] + f"#{i}": (KEY, m) for i, (reason, m) in enumerate(bad.items())
    }
    letters["key-mismatch#9"] = (KEY, orjson.dumps({**fresh, "job": "job-other"}))
    for i, message in enumerate(letters.values()):
        out.insert(5 + 7 * i, message)
    return out, letters


def restarted_halfway(batches: list[ReplayedBatch], step: int) -> list[ReplayedBatch]:
    """The batches as if training restarted before ``step`` under the same job id: each
    rank numbers its batches from 0 again (not duplicates: they carry new steps)."""
    later = [b.batch for b in batches if b.batch.steps_done[0][0] >= step]
    base = {r: min(b.batch_seq for b in later if b.rank == r) for r in {b.rank for b in later}}
    return [
        b
        if b.batch.steps_done[0][0] < step
        else dataclasses.replace(
            b, batch=dataclasses.replace(b.batch, batch_seq=b.batch.batch_seq - base[b.batch.rank])
        )
        for b in batches
    ]


def test_bad_messages_are_dead_letters_and_good_results_unchanged(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    batches = restarted_halfway(several_jobs(["job-0"], steps=6, origin_ns=time.time_ns()), 3)
    clean = reference_run(batches)
    messages, letters = dirty_stream(
        [encode_ops(b.batch) for b in batches],
        [encode_ops(b.batch, version=2) for b in batches],
        [b.batch.steps_done[0][0] for b in batches],
    )
    prefix = f"b{uuid.uuid4().hex[:10]}"  # topics the broker has never seen
    topic = f"{prefix}.ops"
    dsn = f"chdb://{tmp_path / 'chdb'}"
    worker = WorkerProcess(
        kafka_broker,
        prefix,
        dsn,
        artifacts_dir,
        RANKWATCH_MAX_MESSAGE_BYTES=str(MAX_BYTES),
        RANKWATCH_PARTITIONS="2",
    )
    try:
        worker.wait_for(lambda s: s.get("problems") == [], 60, "a healthy worker")
        asyncio.run(send_in_order(kafka_broker, topic, messages))
        wait_committed(kafka_broker, f"{prefix}-workers", topic, 2, timeout_s=90)
        status = worker.settled()
    finally:
        worker.stop()
    assert status["dead_letters"] == len(letters)
    assert status["duplicate_batches"] == 6  # retried batches are normal: counted, not dead

    reasons = sorted(name.split("#")[0] for name in letters)
    published = asyncio.run(
        records_until(kafka_broker, f"{prefix}.dead-letters", lambda g: len(g) >= len(letters), 30)
    )
    assert sorted((r.key, r.value) for r in published) == sorted(letters.values())
    headers = [dict(r.headers) for r in published]
    assert sorted(h["rankwatch-reason"].decode() for h in headers) == reasons
    assert all(h["rankwatch-source-topic"] == topic.encode() for h in headers)

    with Store.connect(dsn) as store:
        stored = store.query("SELECT reason, detail, payload_bytes FROM dead_letters")
        steps = store.query(f"SELECT {', '.join(STEP_FIELDS)} FROM steps ORDER BY step")
        attribution = store.query(
            "SELECT job, step, dimension, group, slowdown FROM step_attribution "
            "ORDER BY step, dimension, group"
        )
        jobs = store.query(
            "SELECT job, dp_size, pp_size, tp_size, world_size, hosts FROM jobs FINAL"
        )
        raw, final = (
            store.query(f"SELECT count() AS n FROM ops {f}")[0]["n"] for f in ("", "FINAL")
        )
    assert sorted(r["reason"] for r in stored) == reasons and all(r["detail"] for r in stored)
    # the good job's rows: exactly those of a run without the bad input (unmerged, too)
    want = sorted(clean.rows["steps"], key=lambda r: r["step"])
    assert steps == [{k: r[k] for k in STEP_FIELDS} for r in want]
    keys = ("job", "step", "dimension", "group", "slowdown")
    clean_attr = sorted(
        ({k: r[k] for k in keys} for r in clean.rows["step_attribution"]),
        key=lambda r: (r["step"], r["dimension"], r["group"]),
    )
    assert attribution == clean_attr
    last_job = clean.rows["jobs"][-1]
    assert jobs == [
        {k: last_job[k] for k in ("job", "dp_size", "pp_size", "tp_size", "world_size", "hosts")}
    ]
    assert raw == final == sum(len(b.batch) for b in batches)
