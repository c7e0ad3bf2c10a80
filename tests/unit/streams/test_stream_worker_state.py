"""The worker's shell logic without Kafka: while the store fails (transiently) mid-run,
rows stay buffered, nothing more is acknowledged, retries back off; once it is back,
everything is stored once and every message acknowledged. The store here is an
in-memory stand-in that fails on demand (the real-broker tests use chDB)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from support.memstore import MemoryStore

from rankwatch.schemas.batching import BatchingRule
from rankwatch.schemas.codec import decode, encode_ops
from rankwatch.sim.tracegen import GenConfig, generate_trace
from rankwatch.streams.kit.output import Source
from rankwatch.streams.ops.replay import replay_batches
from rankwatch.streams.ops.worker_state import WorkerSettings, WorkerState


def messages() -> list[bytes]:
    trace, meta = generate_trace(GenConfig(dp=2, pp=2, microbatches=2, steps=6, seed=1))
    one_per_step = BatchingRule(window_s=0.0)  # one message per rank and step, in step order
    batches = replay_batches(trace, meta, "j", time.time_ns(), rule=one_per_step)
    return [encode_ops(b.batch) for b in batches]


def consume(state: WorkerState, items: list[tuple[int, bytes]]) -> None:
    for offset, value in items:
        batch = state.decode(value)
        if state.needs_restore(batch):
            assert batch is not None and state.restore(batch)
        state.on_message(offset, value, Source("ops", 0, offset, b"j", 1), batch)


def test_store_outage_mid_run_keeps_rows_and_acknowledges_only_what_is_stored() -> None:
    store = MemoryStore()
    state = WorkerState(WorkerSettings(bootstrap="-", dsn="-"), connect=lambda: store)  # type: ignore[arg-type, return-value]
    data = list(enumerate(messages()))  # 6 steps x 4 workers
    consume(state, data[:12])
    acked = state.flush()
    assert sorted(acked) == list(range(12)) and len(store.rows["steps"]) == 3

    store.down = True
    consume(state, data[12:])
    assert state.flush() == []  # nothing stored: nothing acknowledged
    calls = store.calls
    assert state.flush() == [] and store.calls == calls  # backing off, not hammering
    first = state.delivery.retry_in()
    time.sleep(first)
    assert state.flush() == []
    assert state.delivery.retry_in() > first  # the delay grows
    assert state.snapshot()["buffered_rows"] > 0 and state.snapshot()["store_failures"] == 2

    store.down = False
    time.sleep(state.delivery.retry_in())
    acked += state.flush()
    assert sorted(acked) == list(range(len(data)))
    assert sorted(r["step"] for r in store.rows["steps"]) == list(range(6))
    assert len(state.delivery.take()) == 6


def test_a_revoked_partition_drops_its_jobs_and_their_unstored_messages() -> None:
    store = MemoryStore()
    state = WorkerState(WorkerSettings(bootstrap="-", dsn="-"), connect=lambda: store)  # type: ignore[arg-type, return-value]
    data = list(enumerate(messages()))
    consume(state, data[:14])  # steps 0-2 complete, step 3 open (two of its batches)
    state.forget_partitions({("ops", 0)})
    assert not state.pipeline.knows("j") and state.acks.waiting == 0
    assert sorted(state.flush()) == list(range(12))  # only what is stored


ALERT_ROW = {
    "alert_id": "straggler-j-1", "job": "j", "kind": "straggler", "state": "firing",
    "severity": "warning", "ts_ns": 1_732_000_000_123_000_000, "summary": "S 1.31",
    "evidence": '{"slowdown": 1.31}',
}  # fmt: skip
"""The job's straggler alert, stored as firing, as the alerts query returns it."""


class StoreWithAnAlert(MemoryStore):
    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> list[dict]:
        self._check()
        return [dict(ALERT_ROW)] if "FROM alerts" in sql else []


def test_a_restored_job_announces_its_latest_alert_again() -> None:
    """A crash between storing an alert and publishing it must not lose the message."""
    state = WorkerState(WorkerSettings(bootstrap="-", dsn="-"), connect=StoreWithAnAlert)  # type: ignore[arg-type]
    consume(state, list(enumerate(messages()[:1])))
    state.flush()
    published = [(p.kind, p.key, decode("alerts", p.value)) for p in state.delivery.take()]
    assert published == [
        ("alerts", "j", {
            "schema": "alerts", "version": 1, "alert_id": "straggler-j-1", "job": "j",
            "kind": "straggler", "state": "firing", "severity": "warning",
            "ts_ns": 1_732_000_000_123_000_000, "summary": "S 1.31",
            "evidence": {"slowdown": 1.31},
        })
    ]  # fmt: skip
    assert state.snapshot()["reannounced_alerts"] == 1
