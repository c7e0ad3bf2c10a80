"""Bundles of frames (what a host's relay sends: joined, ``x-joined`` of the ops schema,
or whole frames, ``x-bundle``) on a real broker, to a worker started on topics the
broker has never seen: mixed with frames sent alone, a joined bundle delivered twice, a
bundle holding a bad member and one naming another job, and a bundle whose envelope is
broken. The worker stores exactly the rows
of a clean run of the same batches, each record once, one dead letter per bad message
(naming the bad members), and commits every offset."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from pathlib import Path

import pytest
from support.workers import (
    STEP_FIELDS,
    WorkerProcess,
    reference_run,
    send_in_order,
    several_jobs,
    wait_committed,
)

from rankwatch.schemas import joined
from rankwatch.schemas.batching import RelayRule
from rankwatch.schemas.codec import encode_ops, encode_ops_bundle
from rankwatch.streams.kit.store import Store
from rankwatch.streams.ops.replay import ReplayedBatch, relay_timeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]
KEY = b"job-0"


def stream(batches: list[ReplayedBatch]) -> tuple[list[bytes], list[bytes]]:
    """The job's messages through a relay of three frames a bundle (a step's fourth
    frame goes alone), the first bundle with two bad members added (one cut short, one
    of another job), a bundle delivered twice, and a broken bundle; returns (stream,
    the bad messages)."""
    relayed = relay_timeline(
        [(b, encode_ops(b.batch)) for b in batches], RelayRule(linger_s=0.05, max_members=3)
    )
    values = [joined.message(list(m.frames)) for m in relayed]  # as a relay sends them
    assert [len(m.frames) for m in relayed] == [3, 1] * 6
    assert [joined.is_joined(v) for v in values] == [True, False] * 6
    first = relayed[0].frames
    spare = encode_ops(dataclasses.replace(batches[0].batch, job="job-other", batch_seq=99))
    with_bad = encode_ops_bundle([first[0][:-8], spare, *first])
    broken = with_bad[:4] + (0).to_bytes(4, "little") + with_bad[8:]  # a bundle of no members
    out = [with_bad, *values[1:]]
    out.insert(7, values[4])  # a bundle delivered twice
    out.insert(3, broken)
    return out, [with_bad, broken]


def test_bundled_traffic_stores_what_a_clean_run_does(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    batches = several_jobs(["job-0"], steps=6, origin_ns=time.time_ns())
    clean = reference_run(batches)
    values, bad = stream(batches)
    prefix = f"u{uuid.uuid4().hex[:10]}"  # topics the broker has never seen
    topic = f"{prefix}.ops"
    dsn = f"chdb://{tmp_path / 'chdb'}"
    worker = WorkerProcess(kafka_broker, prefix, dsn, artifacts_dir, RANKWATCH_PARTITIONS="2")
    try:
        worker.wait_for(lambda s: s.get("problems") == [], 60, "a healthy worker")
        asyncio.run(send_in_order(kafka_broker, topic, [(KEY, v) for v in values]))
        wait_committed(kafka_broker, f"{prefix}-workers", topic, 2, timeout_s=90)
        status = worker.settled()
    finally:
        worker.stop()
    assert status["dead_letters"] == 3  # two members of one bundle, one broken bundle
    assert status["dead_letter_reasons"] == {
        "column-length": 1,
        "key-mismatch": 1,
        "malformed-frame": 1,
    }
    assert status["duplicate_batches"] == 3  # the bundle delivered twice: each member

    with Store.connect(dsn) as store:
        letters = store.query(
            "SELECT reason, detail, payload_bytes FROM dead_letters ORDER BY reason"
        )
        steps = store.query(f"SELECT {', '.join(STEP_FIELDS)} FROM steps ORDER BY step")
        raw, final = (
            store.query(f"SELECT count() AS n FROM ops {f}")[0]["n"] for f in ("", "FINAL")
        )
    assert [r["reason"] for r in letters] == ["column-length", "malformed-frame"]
    assert (
        "bundle member 0 of" in letters[0]["detail"]
        and "bundle member 1 of" in letters[0]["detail"]
    )
    assert sorted(r["payload_bytes"] for r in letters) == sorted(map(len, bad))
    want = sorted(clean.rows["steps"], key=lambda r: r["step"])
    assert steps == [{k: r[k] for k in STEP_FIELDS} for r in want] and len(steps) == 6
    assert raw == final == sum(len(b.batch) for b in batches)  # each record once
