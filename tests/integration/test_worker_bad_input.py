"""Duplicate, shuffled, truncated, wrong-typed, unknown-version and oversized messages
mixed into a replay: the worker does not crash, each bad message is in the dead-letter
table with its reason, and the good data's results are those of a clean run."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from rankwatch.schemas.codec import encode_ops
from rankwatch.streams.devbroker import create_topics
from rankwatch.streams.store import Store
from rankwatch.streams.testing import (
    WorkerProcess,
    assert_same_numbers,
    reference_rows,
    several_jobs,
    stored_steps,
    wait_committed,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MAX_BYTES = 100_000


def dirty_stream(good: list[bytes], steps_of: list[int]) -> tuple[list[bytes], dict[str, int]]:
    """The good messages with each step's batches shuffled, some repeated, and bad ones
    in between; returns the stream and the bad count expected per reason."""
    rng = random.Random(7)
    out: list[bytes] = []
    for step in sorted(set(steps_of)):
        batch = [m for m, s in zip(good, steps_of, strict=True) if s == step]
        rng.shuffle(batch)  # inside a step: arrival order must not matter
        out += batch + batch[:1]  # and a hook retried one batch
    doc = orjson.loads(good[0])
    bad = {
        "malformed-json": good[1][: len(good[1]) // 2],  # truncated
        "schema": orjson.dumps({**doc, "rank": "three"}),  # wrong-typed
        "unknown-version": orjson.dumps({**doc, "version": 99}),
        "too-large": good[2] + b" " * MAX_BYTES,  # oversized (valid JSON, too big)
    }
    for i, message in enumerate(bad.values()):
        out.insert(5 + 7 * i, message)
    return out, dict.fromkeys(bad, 1)


async def send(bootstrap: str, topic: str, messages: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 * 1024 * 1024)
    await producer.start()
    try:
        for message in messages:
            await producer.send_and_wait(topic, message, key=b"job-0")
    finally:
        await producer.stop()


def test_bad_messages_are_dead_letters_and_good_results_unchanged(
    kafka_broker: str, tmp_path: Path, artifacts_dir: Path
) -> None:
    batches = several_jobs(["job-0"], steps=6, origin_ns=time.time_ns())
    expected = reference_rows(batches)
    messages, reasons = dirty_stream(
        [encode_ops(b.batch) for b in batches], [b.batch.steps_done[0][0] for b in batches]
    )
    prefix = f"b{uuid.uuid4().hex[:10]}"
    topic = f"{prefix}.ops"
    asyncio.run(create_topics(kafka_broker, [topic], 2))
    asyncio.run(create_topics(kafka_broker, [f"{prefix}.steps", f"{prefix}.alerts"], 1))
    dsn = f"chdb://{tmp_path / 'chdb'}"
    asyncio.run(send(kafka_broker, topic, messages))
    worker = WorkerProcess(
        kafka_broker, prefix, dsn, artifacts_dir, RANKWATCH_MAX_MESSAGE_BYTES=str(MAX_BYTES)
    )
    try:
        wait_committed(kafka_broker, f"{prefix}-workers", topic, 2, timeout_s=90)
        status = worker.wait_for(lambda s: s.get("buffered_rows") == 0, 30, "empty buffer")
    finally:
        worker.stop()
    assert status["dead_letters"] == sum(reasons.values())
    assert status["duplicate_batches"] == 6

    with Store.connect(dsn) as store:
        letters = store.query("SELECT reason, detail, payload_bytes FROM dead_letters")
    assert sorted(r["reason"] for r in letters) == sorted(reasons)
    assert all(r["detail"] for r in letters)
    rows = stored_steps(dsn)
    assert sorted((r["job"], r["step"]) for r in rows) == sorted(expected)
    assert_same_numbers(rows, expected)
