"""A job restored from its jobstate message on the store it was stored in (a worker
killed and restarted on its own embedded chDB) stores each raw op once.

The jobstate message describes what was stored when it was sent, at a step's close.
Batches of the next, still open step are stored at later flushes, but acknowledged
only when that step closes: after a kill they are read again, and the restored worker
must know from its store that they are in it (found by ``test_worker_kill`` once in
nine runs with steps stored at their close; here the same sequence, deterministic)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.messages import small_job

from rankwatch.schemas.codec import encode_ops
from rankwatch.streams.kit.output import Source
from rankwatch.streams.ops.worker_state import WorkerSettings, WorkerState, first_batch

pytestmark = pytest.mark.integration


def _feed(state: WorkerState, data: list[tuple[int, bytes]], saved: bytes | None = None) -> None:
    for offset, value in data:
        members = state.decode(value)
        batch = first_batch(members)
        if state.needs_restore(batch):
            assert batch is not None and state.restore(batch, saved)
        state.on_message(offset, value, Source("ops", 0, offset, b"j", time.time_ns()), members)


def _close(state: WorkerState) -> None:
    """Let go of the process's chDB (one path per process), as a killed worker does."""
    store = state.delivery.sink.store
    assert store is not None
    store.close()
    state.delivery.sink.store = None


def test_open_step_batches_stored_after_the_jobstate_message_are_not_stored_again(
    tmp_path: Path,
) -> None:
    batches = small_job()  # 6 steps x 4 ranks, one message per rank and step
    data = list(enumerate(encode_ops(b) for b in batches))
    sizes = [len(b) for b in batches]
    settings = WorkerSettings(bootstrap="-", dsn=f"chdb://{tmp_path / 'chdb'}")

    old = WorkerState(settings)
    _feed(old, data[:14])  # steps 0-2 complete, two batches of step 3
    assert sorted(old.flush()) == list(range(12))
    saved = old.handover()[0][2]  # sent as step 2 closed
    _feed(old, data[14:15])  # a third batch of step 3: stored, in no jobstate message
    assert old.flush() == [] and old.handover() == []  # step 3 open: none acknowledged
    _close(old)  # killed: offsets 12-15 are read again

    new = WorkerState(settings)
    _feed(new, data[12:], saved)
    assert sorted(new.flush()) == list(range(12, 24))
    assert new.snapshot()["restored_from_jobstate"] == 1
    store = new.delivery.store()
    count = {f: store.query(f"SELECT count() AS n FROM ops {f}")[0]["n"] for f in ("", "FINAL")}
    assert count == {"": sum(sizes), "FINAL": sum(sizes)}  # each record once, even unmerged
    steps = store.query("SELECT step, count() AS n FROM steps GROUP BY step ORDER BY step")
    assert [(r["step"], r["n"]) for r in steps] == [(s, 1) for s in range(6)]
    _close(new)
