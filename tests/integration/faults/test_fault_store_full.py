"""Fault: the store's disk fills up (chDB on a 48 MiB tmpfs, filled with a ballast file).

On main the worker took ClickHouse's NOT_ENOUGH_SPACE (code 243) for a refusal of the
rows: it dropped 112,066 rows, went on acknowledging, announced 43 steps and an alert it
never stored, and stayed healthy. Now a full disk is a failure: the worker keeps every
row, acknowledges and announces nothing, is unhealthy with the reason, and once space is
freed stores everything, exactly as a clean run of the same input does."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from support.faults import assert_stored_as_clean, clean_run, fill, healthy
from support.workers import (
    WorkerProcess,
    records_until,
    several_jobs,
    uncommitted,
    wait_committed,
)

from rankwatch.schemas.codec import encode_ops
from rankwatch.streams.ops.publish import publish

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_full_disk_is_waited_out_with_nothing_lost_acknowledged_or_announced(
    kafka_broker: str, small_disk: Path, artifacts_dir: Path
) -> None:
    batches = several_jobs(["job-0", "job-1"], steps=12, origin_ns=time.time_ns())
    clean = clean_run(encode_ops(b.batch) for b in batches)
    prefix = f"f{uuid.uuid4().hex[:10]}"
    topic, group = f"{prefix}.ops", f"{prefix}-workers"
    dsn = f"chdb://{small_disk / 'chdb'}"
    worker = WorkerProcess(
        kafka_broker, prefix, dsn, artifacts_dir, RANKWATCH_PARTITIONS="2"
    )  # the worker makes its topics: the broker has none of this prefix
    try:
        worker.wait_for(lambda s: s.get("store_connected") and s.get("assigned"), 90, "start")
        ballast = fill(small_disk)
        publish(kafka_broker, batches, topic=topic)
        full = worker.wait_for(lambda s: s.get("store_failing"), 90, "the full disk")
        assert "NOT_ENOUGH_SPACE" in full["last_error"], full
        time.sleep(5)  # retries with backoff; nothing may be given up meanwhile
        held = worker.wait_for(lambda s: s.get("store_failing"), 30, "still failing")
        ok, said = healthy(worker.status_file)
        assert not ok and "store not writable" in said, said
        assert held["rows_refused"] == 0 and held["buffered_rows"] > 0, held
        assert uncommitted(kafka_broker, group, topic, 2) == len(batches)
        announced = asyncio.run(records_until(kafka_broker, f"{prefix}.steps", bool, 3))
        assert announced == [], f"{len(announced)} steps announced, none stored"

        ballast.unlink()  # space again: everything held is stored
        wait_committed(kafka_broker, group, topic, 2, timeout_s=120)
        settled = worker.settled(60)
        assert not settled["store_failing"] and settled["rows_refused"] == 0, settled
        assert healthy(worker.status_file)[0]
        steps = asyncio.run(
            records_until(
                kafka_broker, f"{prefix}.steps", lambda got: len(got) >= len(clean.steps), 30
            )
        )
    finally:
        worker.stop()
    assert len({(r.key, r.value) for r in steps}) == len(clean.steps)
    assert_stored_as_clean(dsn, clean)
