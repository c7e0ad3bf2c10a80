"""The hang worker's state: rows stored before their alerts are released."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.memstore import MemoryStore

from rankwatch.schemas.codec import decode, encode
from rankwatch.streams.hang import worker as hang_worker
from rankwatch.streams.hang.detector import NS, HangConfig
from rankwatch.streams.hang.worker import HangSettings, HangState
from rankwatch.streams.kit.output import Publication, Source


def tick(state: HangState) -> list[Publication]:
    """A timer tick: what the worker would publish after it."""
    state.on_tick()
    return state.delivery.take()


def beat(rank: int, since_ns: int) -> bytes:
    flight = {"optype": "grads-reduce-scatter", "seq_id": 0, "mb_id": -1, "since_ns": since_ns}
    return encode(
        "heartbeats",
        {
            "schema": "heartbeats", "version": 1, "job": "j", "host": "h", "rank": rank,
            "dp_rank": rank, "pp_rank": 0, "tp_rank": 0, "cp_rank": 0, "sent_ns": since_ns,
            "step": 1, "pid": 1, "last_done": None, "in_flight": flight,
        },
    )  # fmt: skip


def test_alert_waits_for_its_rows_and_bad_input_becomes_a_dead_letter() -> None:
    now = [100 * NS]
    store = MemoryStore(down=True)
    settings = HangSettings(
        "b", "chdb://unused", hang=HangConfig(floor_s=4, warmup_s=4, silent_after_s=30)
    )
    state = HangState(settings, store=store, clock=lambda: now[0])  # type: ignore[arg-type]
    src = Source("p.heartbeats")
    for rank in (0, 1):
        state.on_heartbeat(beat(rank, now[0]), src)
    state.on_heartbeat(b"not json", src)
    state.recall_waiting()  # the store is down: the job starts afresh
    now[0] += 5 * NS
    assert tick(state) == []  # hung, but the store is down: nothing published
    store.down = False
    time.sleep(state.delivery.retry_in())  # the kit's backoff
    ready = tick(state)
    alerts = [p for p in ready if p.kind == "alerts"]
    assert [decode("alerts", p.value)["state"] for p in alerts] == ["firing"]
    assert [p.key for p in alerts] == ["j"]
    (dead,) = [p for p in ready if p.kind == "dead-letters"]  # also for automation
    assert dead.value == b"not json" and dict(dead.headers or [])["rankwatch-reason"]
    assert len(store.rows["hangs"]) == 1 and len(store.rows["alerts"]) == 1
    assert len(store.rows["dead_letters"]) == 1
    assert tick(state) == []  # one alert per episode


def test_a_stored_alert_never_recorded_as_sent_is_sent_by_the_next_worker(
    tmp_path: Path,
) -> None:
    """Killed after storing the firing alert, before sending it: the next worker (same
    chDB store) reopens the episode, sends the alert once, and once it is recorded as
    sent, a third worker sends nothing."""
    dsn = f"chdb://{tmp_path / 'chdb'}"
    settings = HangSettings("b", dsn, hang=HangConfig(floor_s=4, warmup_s=4, silent_after_s=30))
    now = [100 * NS]
    src = Source("p.heartbeats")

    def worker() -> HangState:
        state = HangState(settings, clock=lambda: now[0])
        for rank in (0, 1):
            state.on_heartbeat(beat(rank, 100 * NS), src)
        state.recall_waiting()
        return state

    first = worker()
    now[0] += 5 * NS
    (fired,) = tick(first)  # stored; the kill comes before the send
    assert first.delivery.sink.store is not None
    first.delivery.sink.store.close()
    second = worker()
    (again,) = tick(second)
    assert again.value == fired.value  # the same message, ts_ns as first stored
    assert second.restored_episodes == 1 and second.service.detector.episodes()
    now[0] += 60 * NS  # still stuck: not declared again
    assert tick(second) == []
    second.delivery.sent([again])
    assert second.delivery.flush()
    assert second.delivery.sink.store is not None
    second.delivery.sink.store.close()
    third = worker()
    assert tick(third) == [] and third.reannounced == 0 and third.restored_episodes == 1
    assert third.delivery.sink.store is not None
    with third.delivery.sink.store as store:
        assert [r["state"] for r in store.query("SELECT state FROM alerts FINAL")] == ["firing"]


def stepping(rank: int, step: int, at_ns: int) -> bytes:
    done = {"optype": "forward-compute", "seq_id": 0, "step": step, "end_ns": at_ns}
    return encode(
        "heartbeats",
        {
            "schema": "heartbeats", "version": 1, "job": "j", "host": "h", "rank": rank,
            "dp_rank": rank, "pp_rank": 0, "tp_rank": 0, "cp_rank": 0, "sent_ns": at_ns,
            "step": step, "pid": 1, "last_done": done, "in_flight": None,
        },
    )  # fmt: skip


def test_the_step_time_baseline_survives_a_restart(tmp_path: Path) -> None:
    """Steps of 20 s: the stall threshold is 5 x 20 s, and stays so for the next worker
    (not the 4 s floor, which would call the next slow step a hang)."""
    settings = HangSettings(
        "b",
        f"chdb://{tmp_path / 'chdb'}",
        hang=HangConfig(floor_s=4, warmup_s=4, silent_after_s=300),
    )
    now = [1000 * NS]
    src = Source("p.heartbeats")
    first = HangState(settings, clock=lambda: now[0])
    for step in range(6):
        now[0] = (1000 + 20 * step) * NS
        for rank in (0, 1):
            first.on_heartbeat(stepping(rank, step, now[0]), src)
        first.recall_waiting()
        first.on_tick()
    assert first.service.detector.threshold_s("j") == 100.0
    assert first.delivery.sink.store is not None
    first.delivery.sink.store.close()
    second = HangState(settings, clock=lambda: now[0])
    second.on_heartbeat(stepping(0, 5, now[0]), src)
    second.recall_waiting()
    assert second.service.detector.threshold_s("j") == 100.0


def test_a_job_met_first_holds_its_heartbeats_until_recalled_and_others_go_on() -> None:
    """The worker looks a job first met up in a thread: meanwhile its heartbeats are
    held (the job is not judged), the other jobs' are taken as they come, and once the
    lookup answers the held ones are taken at the times they came."""
    now = [100 * NS]
    settings = HangSettings(
        "b", "chdb://unused", hang=HangConfig(floor_s=4, warmup_s=4, silent_after_s=30)
    )
    state = HangState(settings, store=MemoryStore(), clock=lambda: now[0])  # type: ignore[arg-type]
    src = Source("p.heartbeats")
    state.on_heartbeat(beat(0, now[0]), src)  # job j
    ((job, ticket),) = state.take_recalls()
    assert job == "j"
    state.recalled(job, ticket, state.look_up(job))
    state.on_heartbeat(beat(0, now[0]).replace(b'"j"', b'"k"'), src)  # job k, first met
    (recall,) = state.take_recalls()
    arrived = now[0]
    now[0] += 2 * NS
    state.on_heartbeat(beat(1, now[0]), src)  # j goes on while k's lookup runs
    state.on_heartbeat(beat(1, now[0]).replace(b'"j"', b'"k"'), src)
    assert state.take_recalls() == []  # one lookup per job
    assert state.snapshot()["recalls_waiting"] == 1
    assert [r.rank for r in state.service.detector.ranks("j")] == [0, 1]
    assert not state.service.detector.knows("k")  # not judged before it is recalled
    now[0] += 10 * NS
    state.recalled(*recall, state.look_up(recall[0]))
    heard = {r.rank: r.heard_ns for r in state.service.detector.ranks("k")}
    assert heard == {0: arrived, 1: arrived + 2 * NS}  # when they came, not now
    assert state.snapshot()["recalls_waiting"] == 0


def test_a_job_holds_at_most_max_held_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hang_worker, "MAX_HELD", 3)
    settings = HangSettings("b", "chdb://unused")
    state = HangState(settings, store=MemoryStore())  # type: ignore[arg-type]
    for i in range(5):
        state.on_heartbeat(beat(i, (100 + i) * NS), Source("p.heartbeats"))
    assert state.snapshot()["held_dropped"] == 2
    state.recall_waiting()
    assert [r.rank for r in state.service.detector.ranks("j")] == [2, 3, 4]  # the latest


def test_a_stored_state_the_worker_cannot_read_starts_the_job_afresh() -> None:
    """Input from the store is data too: a latest alert row of another shape is logged
    and the job starts with no episode, its held heartbeats taken all the same."""
    settings = HangSettings("b", "chdb://unused")
    state = HangState(settings, store=MemoryStore())  # type: ignore[arg-type]
    state.on_heartbeat(beat(0, 100 * NS), Source("p.heartbeats"))
    (recall,) = state.take_recalls()
    odd = hang_worker.Recollection(unsent=[], latest=[{"no": "such"}], baseline={"x": 1})
    state.recalled(*recall, odd)
    assert state.restored_episodes == 0
    assert [r.rank for r in state.service.detector.ranks("j")] == [0]


def test_an_unsent_alert_state_the_schema_refuses_is_not_sent_again() -> None:
    settings = HangSettings("b", "chdb://unused")
    state = HangState(settings, store=MemoryStore())  # type: ignore[arg-type]
    state.on_heartbeat(beat(0, 100 * NS), Source("p.heartbeats"))
    (recall,) = state.take_recalls()
    odd = hang_worker.Recollection(unsent=[{"not": "an alert"}], latest=[], baseline=None)
    state.recalled(*recall, odd)
    assert state.reannounced == 0 and state.delivery.snapshot()["held_messages"] == 0
    assert [r.rank for r in state.service.detector.ranks("j")] == [0]


def test_a_job_whose_partition_went_to_another_worker_is_forgotten_not_declared() -> None:
    """After a rebalance a job's heartbeats go to its new owner: kept here, its ranks
    would fall silent and the job be declared hung. Jobs that stay keep their state."""
    now = [100 * NS]
    settings = HangSettings(
        "b", "chdb://unused", hang=HangConfig(floor_s=4, warmup_s=4, silent_after_s=30)
    )
    state = HangState(settings, store=MemoryStore(), clock=lambda: now[0])  # type: ignore[arg-type]
    state.on_heartbeat(beat(0, now[0]), Source("p.heartbeats", 0, key=b"j"))
    state.on_heartbeat(beat(0, now[0]).replace(b'"j"', b'"k"'), Source("p.heartbeats", 1, key=b"k"))
    state.recall_waiting()
    assert state.keep_partitions({("p.heartbeats", 0), ("p.stacks", 1)}) == ["k"]
    assert state.service.detector.jobs() == ["j"]
    now[0] += 60 * NS  # both silent, as far as this worker hears
    assert [p.kind for p in tick(state)] == ["alerts"]  # j's hang only
    assert state.service.detector.episodes()[0].job == "j"


def test_a_finished_job_leaves_no_partition_or_baseline_behind() -> None:
    settings = HangSettings("b", "chdb://unused")
    state = HangState(settings, store=MemoryStore())  # type: ignore[arg-type]
    done = b'"last_done":null,"state":"finished"'
    finished = beat(0, 100 * NS).replace(b'"last_done":null', done)
    state.on_heartbeat(finished, Source("p.heartbeats", 0, key=b"j"))
    state.recall_waiting()
    assert state.job_partitions == {"j": ("p.heartbeats", 0)}
    state.on_tick()  # the detector drops a job whose ranks all finished
    assert state.job_partitions == {} and state._baselines == {}


def test_a_job_silent_for_retire_after_s_is_forgotten_and_its_episode_recalled(
    tmp_path: Path,
) -> None:
    """No heartbeat says a killed job ended: declared hung, then ``retire_after_s`` after
    its last heartbeat, forgotten (its episode stays firing in the store). When it beats
    again, making progress, the episode is recalled and resolves, not declared anew."""
    settings = HangSettings(
        "b",
        f"chdb://{tmp_path / 'chdb'}",
        retire_after_s=600.0,
        hang=HangConfig(floor_s=4, warmup_s=4, silent_after_s=30),
    )
    now = [100 * NS]
    src = Source("p.heartbeats", 0, key=b"j")
    state = HangState(settings, clock=lambda: now[0])
    for rank in (0, 1):
        state.on_heartbeat(beat(rank, now[0]), src)
    state.recall_waiting()
    now[0] += 60 * NS
    (fired,) = tick(state)
    state.delivery.sent([fired])  # the broker took it: recorded as sent
    assert state.delivery.flush()
    now[0] = 100 * NS + 599 * NS
    assert tick(state) == [] and state.service.detector.jobs() == ["j"]
    now[0] += 2 * NS
    assert tick(state) == [] and state.snapshot()["retired_jobs"] == 1
    assert state.service.detector.jobs() == [] and state.job_partitions == {}

    state.on_heartbeat(stepping(0, 2, now[0]), src)
    state.recall_waiting()
    assert state.restored_episodes == 1 and state.reannounced == 0
    (resolved,) = tick(state)
    first, last = decode("alerts", fired.value), decode("alerts", resolved.value)
    assert (first["state"], last["state"]) == ("firing", "resolved")
    assert last["alert_id"] == first["alert_id"]


def test_a_job_whose_rows_are_not_stored_is_not_retired() -> None:
    """Retired before its episode is stored, a job beating again would find nothing in
    the store and be declared hung a second time."""
    settings = HangSettings(
        "b",
        "chdb://unused",
        retire_after_s=600.0,
        hang=HangConfig(floor_s=4, warmup_s=4, silent_after_s=30),
    )
    now = [100 * NS]
    store = MemoryStore(down=True)
    state = HangState(settings, store=store, clock=lambda: now[0])  # type: ignore[arg-type]
    state.on_heartbeat(beat(0, now[0]), Source("p.heartbeats", 0, key=b"j"))
    state.recall_waiting()
    now[0] += 60 * NS
    assert tick(state) == []  # declared; the store is down
    now[0] += 3600 * NS
    assert tick(state) == [] and state.service.detector.jobs() == ["j"]
    store.down = False
    time.sleep(state.delivery.retry_in())
    assert [p.kind for p in tick(state)] == ["alerts"]  # stored, then published...
    assert state.service.detector.jobs() == ["j"]
    tick(state)  # ...and forgotten at the next tick
    assert state.service.detector.jobs() == [] and state.retired_jobs == 1
