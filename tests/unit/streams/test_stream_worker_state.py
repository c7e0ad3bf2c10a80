"""The worker's shell logic without Kafka: while the store fails (transiently) mid-run,
rows stay buffered, nothing more is acknowledged, retries back off; once it is back,
everything is stored once and every message acknowledged. The store here is an
in-memory stand-in that fails on demand (the real-broker tests use chDB)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from support.memstore import MemoryStore
from support.messages import small_job

from rankwatch.schemas.codec import decode, encode_ops
from rankwatch.streams.kit.output import Source
from rankwatch.streams.ops import recovery, worker_state
from rankwatch.streams.ops.worker_state import (
    HeldMessage,
    Recollection,
    WorkerSettings,
    WorkerState,
    first_batch,
)


def messages() -> list[bytes]:
    return [encode_ops(b) for b in small_job()]


def consume(state: WorkerState, items: list[tuple[int, bytes]]) -> None:
    for offset, value in items:
        members = state.decode(value)
        batch = first_batch(members)
        if state.needs_restore(batch):
            assert batch is not None and state.restore(batch)
        state.on_message(offset, value, Source("ops", 0, offset, b"j", time.time_ns()), members)


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
        if sql == recovery.ANY_ROW:  # the store holds rows of the job: read them all
            return [{"n": 1}]
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


def _state(store: Any) -> WorkerState:
    return WorkerState(WorkerSettings(bootstrap="-", dsn="-"), connect=lambda: store)


def test_jobstate_messages_describe_what_is_stored_and_hold_back_the_acks() -> None:
    state = _state(MemoryStore())
    data = list(enumerate(messages()))
    consume(state, data[:14])  # steps 0-2 complete, step 3 open (two of its batches)
    tokens = state.flush()
    assert state.stored
    handed = state.handover()
    assert [(job, partition) for job, partition, _ in handed] == [("j", 0)]
    message = decode("jobstate", handed[0][2])
    assert message["closed"] == [[0, 2]] and len(message["window"]) == 3
    assert sorted(step for _, _, step in message["stored_batches"]) == [3, 3]
    assert state.handover() == []  # nothing changed since
    assert [job for job, _, _ in state.handover(every=True)] == ["j"]  # as it is revoked
    # not sent: the stored messages are not acknowledged, the job stays to be sent
    state.handed_over(handed, ok=False)
    assert state.release(tokens, ok=False) == [] and state.changed == {"j"}
    assert sorted(state.release([], ok=True)) == list(range(12))
    # a flush that fails stores nothing: nothing to hand over, the job stays changed
    consume(state, data[14:18])  # closes step 3
    state.delivery.sink.store.down = True  # type: ignore[union-attr]
    assert state.flush() == [] and not state.stored and state.changed == {"j"}


def test_messages_taken_while_a_store_runs_wait_for_the_next_store() -> None:
    """The worker runs a store's inserts in a thread and goes on taking messages: the
    store's acknowledgements and jobstate cover what was buffered when it began, and a
    step that closes meanwhile is due once it ends, stored or not."""
    store, clock = MemoryStore(), Clock()
    state = _state(store)
    state.delivery.clock = clock
    data = list(enumerate(messages()))  # 6 steps x 4 workers, one message per rank and step
    consume(state, data[:4])  # step 0 closes
    round_ = state.begin_store()
    assert round_ is not None and sorted(round_.tokens) == [0, 1, 2, 3]
    handed = state.handover()
    consume(state, data[4:8])  # step 1 closes while the inserts run
    state.delivery.run(round_.flush)
    assert sorted(state.end_store(round_)) == [0, 1, 2, 3] and state.stored
    assert [row["step"] for row in store.rows["steps"]] == [0]
    assert decode("jobstate", handed[0][2])["closed"] == [[0, 0]]
    clock.now += 0.1
    assert state.settle_in() == 0.0  # step 1 waits for the next store, not the tick

    round_ = state.begin_store()  # this one fails: its messages wait, step 1 stays due
    assert round_ is not None and sorted(round_.tokens) == [4, 5, 6, 7]
    store.down = True
    state.delivery.run(round_.flush)
    assert state.end_store(round_) == [] and not state.stored
    store.down = False
    clock.now += state.delivery.retry_in()
    assert state.settle_in() == 0.0
    assert sorted(state.flush()) == [4, 5, 6, 7]
    assert [row["step"] for row in store.rows["steps"]] == [0, 1]


class StoreWithSteps(MemoryStore):
    """A store whose newest stored step of every job is ``newest``."""

    newest = 4

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> list[dict]:
        self._check()
        return [{"step": self.newest, "n": 1}] if "max(step) AS step" in sql else []


def test_a_job_met_again_restores_from_the_newer_of_its_jobstate_and_the_store() -> None:
    old = _state(MemoryStore())
    data = list(enumerate(messages()))
    consume(old, data[:14])
    old.flush()
    saved = old.handover()[0][2]
    first = data[12][1]  # the first message not acknowledged: re-read by the new owner
    batch = first_batch(old.decode(first))
    assert batch is not None

    store = MemoryStore()
    new = _state(store)
    assert new.restore(batch, saved)
    assert new.snapshot()["restored_from_jobstate"] == 1
    for offset, value in data[12:]:
        new.on_message(offset, value, Source("ops", 0, offset, b"j", 1), new.decode(value))
    assert sorted(new.flush()) == list(range(12, 24))
    assert sorted(r["step"] for r in store.rows["steps"]) == [3, 4, 5]
    assert len(store.rows["ops"]) == len(data[14:])  # the two stored batches: not again

    newer = _state(StoreWithSteps())  # this worker stored step 4 and died before handing over
    assert newer.restore(batch, saved) and newer.snapshot()["restored_from_jobstate"] == 0
    assert newer.pipeline.assembler.closed_steps("j") == []  # the stub store's, not 0-2

    bad = _state(MemoryStore())
    assert bad.restore(batch, saved[:-5])
    assert bad.snapshot()["jobstates_bad"] == 1 and bad.snapshot()["restored_from_jobstate"] == 0
    track = {"kind": "flops-drop", "rank": 0, "history": [1.0], "recent": [False],
             "pending": [], "run": 0, "open": "yes"}  # fmt: skip
    odd = orjson.dumps({**orjson.loads(saved), "detector": {"tracks": [track], "alerts": []}})
    worse = _state(MemoryStore())
    assert worse.restore(batch, odd)  # a track the schema lets through, the detector not
    assert worse.snapshot()["jobstates_bad"] == 1 and not worse.pipeline.slowdown._jobs  # type: ignore[union-attr]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_closed_step_is_due_for_storing_at_once_not_at_the_next_tick() -> None:
    """The shell settles when ``settle_in`` says 0: a step that closes right after the
    timer stored the buffer waits only ``store_gap_s``, not the rest of the tick."""
    store, clock = MemoryStore(), Clock()
    state = _state(store)
    state.delivery.clock = clock
    data = list(enumerate(messages()))  # 6 steps x 4 workers, one message per rank and step
    consume(state, data[:3])  # step 0 still open
    assert state.settle_in() is None  # nothing closed: the tick stores the raw ops
    consume(state, data[3:4])  # step 0's last batch: it closes
    assert state.settle_in() == 0.0
    assert sorted(state.flush()) == [0, 1, 2, 3] and len(store.rows["steps"]) == 1
    assert state.settle_in() is None

    clock.now += 0.03  # step 1 closes 30 ms after that store
    consume(state, data[4:8])
    assert state.settle_in() == pytest.approx(0.07)  # not sooner than the gap
    clock.now += 0.07
    assert state.settle_in() == 0.0
    state.flush()
    assert len(store.rows["steps"]) == 2 and state.settle_in() is None


def test_a_closed_step_waits_for_the_store_backoff() -> None:
    store, clock = MemoryStore(), Clock()
    state = _state(store)
    state.delivery.clock = clock
    data = list(enumerate(messages()))
    consume(state, data[:4])
    store.down = True
    assert state.flush() == []
    wait = state.settle_in()
    assert wait is not None and wait == pytest.approx(state.delivery.retry_in()) and wait > 0
    store.down = False
    clock.now += wait
    assert state.settle_in() == 0.0
    assert sorted(state.flush()) == [0, 1, 2, 3] and state.settle_in() is None


def test_behind_its_input_a_closed_step_waits_for_the_tick_gap() -> None:
    """Messages produced long before they are read (a backlog after an outage): closed
    steps are stored once a tick, not at once, and at once again when caught up."""
    store, clock = MemoryStore(), Clock()
    state = _state(store)
    state.delivery.clock = clock
    data = list(enumerate(messages()))
    old = time.time_ns() - 10**10  # produced 10 s ago: more than two 1-s ticks
    for offset, value in data[:4]:
        state.on_message(offset, value, Source("ops", 0, offset, b"j", old), state.decode(value))
    assert state.behind and state.settle_in() == 0.0  # nothing stored yet: at once
    state.flush()
    clock.now += 0.3
    for offset, value in data[4:8]:  # step 1 closes 0.3 s after that store
        state.on_message(offset, value, Source("ops", 0, offset, b"j", old), state.decode(value))
    assert state.settle_in() == pytest.approx(0.7)  # the tick's gap, not store_gap_s
    consume(state, data[8:12])  # a fresh message: caught up
    assert not state.behind and state.settle_in() == 0.0
    assert state.snapshot()["behind"] is False


def test_a_stored_message_is_acknowledged_only_after_the_ones_read_before_it() -> None:
    """A dead letter is stored at once, but read after two batches of a still open step
    it waits for them: the consumer must never be handed an offset past an unstored one."""
    state = _state(MemoryStore())
    data = list(enumerate(messages()))
    consume(state, data[:14])  # steps 0-2 closed; 12, 13: step 3, open
    state.on_message(14, b"not a batch", Source("ops", 0, 14, b"j", time.time_ns()))
    state.on_message(15, b"nor this", Source("ops", 1, 15, b"j", time.time_ns()))
    tokens = state.flush()
    assert sorted(tokens) == [*range(12), 14, 15]  # stored
    assert sorted(state.release(tokens)) == [*range(12), 15]  # 14 waits for 12 and 13
    assert state.snapshot()["acks_held"] == 1
    consume(state, [(16, data[14][1]), (17, data[15][1])])  # step 3 closes
    assert sorted(state.release(state.flush())) == [12, 13, 14, 16, 17]
    assert state.snapshot()["acks_held"] == 0


def _held(state: WorkerState, items: list[tuple[int, bytes]], partition: int = 0) -> None:
    """Read ``items`` as the worker does: a job first met is held for its restore."""
    for offset, value in items:
        members = state.decode(value)
        batch = first_batch(members)
        source = Source("ops", partition, offset, b"j", time.time_ns())
        if batch is not None and state.must_hold(batch):
            state.hold(HeldMessage(offset, value, source, members, batch))
        else:
            state.on_message(offset, value, source, members)


def _recalled(state: WorkerState, job: str, ticket: int, found: Recollection) -> bool:
    """Restore ``job`` and take every message it held, as the worker does in parts."""
    if not state.restore_held(job, ticket, found):
        return False
    while state.take_held(job, ticket, 100):
        pass
    return True


def test_a_job_first_met_waits_for_its_restore_and_keeps_its_place_in_the_partition() -> None:
    """The worker restores a job first met in a thread and reads on meanwhile: the job's
    messages wait, in order, and a later message of their partition, stored first, is
    not acknowledged before them."""
    state = _state(MemoryStore())
    data = list(enumerate(messages()))
    _held(state, data[:4])  # step 0 of job j
    state.on_message(99, b"not a batch", Source("ops", 0, 99, b"j", time.time_ns()))
    assert state.snapshot()["recalls_waiting"] == 1 and state.snapshot()["recall_held"] == 4
    assert state.release(state.flush()) == []  # the dead letter is stored, and waits
    [(job, ticket)] = state.take_recalls()
    assert state.take_recalls() == []  # one restore a job
    first = state.recall_subject(job, ticket)
    assert first is not None and first.token == 0
    found = state.look_up(job, (first.batch.dp_size, first.batch.pp_size), None)
    assert _recalled(state, job, ticket, found)
    assert state.pipeline.knows("j") and state.snapshot()["restored_jobs"] == 1
    assert state.snapshot()["recalls_waiting"] == 0 and state.snapshot()["recall_held"] == 0
    assert sorted(state.release(state.flush())) == [0, 1, 2, 3, 99]
    _held(state, data[4:8])  # known now: taken at once
    assert state.snapshot()["recalls_waiting"] == 0
    assert sorted(state.release(state.flush())) == [4, 5, 6, 7]
    assert state.snapshot()["steps_analysed"] == 2


def test_a_restore_answering_after_its_partition_was_revoked_changes_nothing() -> None:
    state = _state(MemoryStore())
    data = list(enumerate(messages()))
    _held(state, data[:4])
    [(job, ticket)] = state.take_recalls()
    found = state.look_up(job, (2, 2), None)
    state.forget_held({("ops", 0)})
    assert not _recalled(state, job, ticket, found) and state.recall_subject(job, ticket) is None
    assert not state.pipeline.knows("j") and state.snapshot()["recall_held"] == 0
    assert state.release(state.flush()) == []  # read again by the partition's next owner


def test_a_restore_held_too_long_stops_the_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_state, "MAX_HELD_MESSAGES", 3)
    state = _state(MemoryStore())
    data = list(enumerate(messages()))
    _held(state, data[:2])
    assert not state.held_full
    _held(state, data[2:3])
    assert state.held_full  # the agent reads nothing more until the restore answers
    [(job, ticket)] = state.take_recalls()
    assert _recalled(state, job, ticket, state.look_up(job, (2, 2), None))
    assert not state.held_full


def test_a_job_silent_for_retire_after_s_is_forgotten_then_restored_when_it_speaks() -> None:
    """A worker that runs for weeks must not keep every job it ever saw. A job silent
    for ``retire_after_s`` with nothing open, waiting or unsent is forgotten (its jobs
    row written); when it speaks again it is restored as a job first met, and goes on
    where it stopped: its next steps' rows are those of an uninterrupted run."""
    store = MemoryStore()
    now = [0.0]
    state = WorkerState(
        WorkerSettings(bootstrap="-", dsn="-", retire_after_s=600.0), connect=lambda: store
    )  # type: ignore[arg-type, return-value]
    state.delivery.clock = lambda: now[0]
    data = list(enumerate(messages()))
    consume(state, data[:14])  # steps 0-2 closed, step 3 open (two of its batches)
    state.release(state.flush())
    state.handed_over(state.handover(), ok=True)
    now[0] = 601.0
    state.on_tick()
    assert state.pipeline.knows("j")  # step 3 is open: not quiet
    consume(state, data[14:16])  # step 3 closes
    state.release(state.flush())
    [(_, _, saved)] = handed = state.handover()
    state.handed_over(handed, ok=True)
    now[0] = 1_000.0
    state.on_tick()
    assert state.pipeline.knows("j")  # heard at 601 s: not silent long enough
    now[0] = 1_202.0
    state.on_tick()
    assert not state.pipeline.knows("j") and state.snapshot()["retired_jobs"] == 1
    assert "j" not in state.job_partitions and state.flush() == []
    assert [r["job"] for r in store.rows["jobs"]][-1] == "j"
    batch = first_batch(state.decode(data[16][1]))  # it speaks again: restored from
    assert state.needs_restore(batch) and state.restore(batch, saved)  # its jobstate
    consume(state, data[16:])
    state.flush()
    assert state.snapshot()["restored_jobs"] == 2
    assert sorted(r["step"] for r in store.rows["steps"]) == list(range(6))  # each once
    reference = MemoryStore()
    uninterrupted = _state(reference)
    consume(uninterrupted, data)
    uninterrupted.flush()
    for name in ("t_ideal", "slowdown", "t_sim"):
        got = {r["step"]: r[name] for r in store.rows["steps"]}
        assert got == {r["step"]: r[name] for r in reference.rows["steps"]}, name


def test_a_restored_jobs_held_messages_are_taken_in_parts_and_in_order() -> None:
    """The worker takes a restored job's held messages a few at a time, the event loop
    free in between: what comes meanwhile is held behind them, not taken ahead."""
    state = _state(MemoryStore())
    data = list(enumerate(messages()))
    _held(state, data[:4])
    [(job, ticket)] = state.take_recalls()
    assert state.restore_held(job, ticket, state.look_up(job, (2, 2), None))
    assert state.take_held(job, ticket, 3)  # one of step 0's four waits
    assert state.snapshot()["steps_analysed"] == 0
    _held(state, data[4:8])  # read meanwhile: held behind it
    assert state.snapshot()["recall_held"] == 5
    assert not state.take_held(job, ticket, 100)  # all taken: the job is no longer held
    assert state.snapshot()["recall_held"] == 0
    assert state.snapshot()["steps_analysed"] == 0  # closed: analysed before the store
    assert sorted(state.release(state.flush())) == list(range(8))
    assert state.snapshot()["steps_analysed"] == 2


def test_a_revocation_between_restore_and_taking_forgets_the_restored_job() -> None:
    state = _state(MemoryStore())
    data = list(enumerate(messages()))
    _held(state, data[:4])
    [(job, ticket)] = state.take_recalls()
    assert state.restore_held(job, ticket, state.look_up(job, (2, 2), None))
    state.forget_partitions({("ops", 0)})
    assert not state.take_held(job, ticket, 100) and not state.pipeline.knows("j")
    assert state.release(state.flush()) == []
