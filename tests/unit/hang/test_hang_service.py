"""The hang service: messages in, hangs/stacks rows and one alert per episode out."""

from __future__ import annotations

from rankwatch.schemas.codec import decode, encode
from rankwatch.streams.hang.detector import NS, Episode, HangConfig
from rankwatch.streams.hang.service import HangService, episode_from_alert
from rankwatch.streams.kit.output import Source

SRC = Source("rankwatch.heartbeats")


def heartbeat(rank: int, step: int, since_s: float, optype: str) -> bytes:
    return encode(
        "heartbeats",
        {
            "schema": "heartbeats",
            "version": 1,
            "job": "j",
            "host": f"h{rank}",
            "rank": rank,
            "dp_rank": rank,
            "pp_rank": 0,
            "tp_rank": 0,
            "cp_rank": 0,
            "sent_ns": int(since_s * NS),
            "step": step,
            "pid": 1,
            "last_done": None,
            "in_flight": {
                "optype": optype,
                "seq_id": 0,
                "mb_id": -1,
                "since_ns": int(since_s * NS),
            },
        },
    )


def dump(rank: int, fn: str, sent_s: float = 2.5) -> bytes:
    """A watchdog's dump, by default of the op in flight since 0.5 s (its 2 s later)."""
    frames = [
        {"file": "t.py", "line": 1, "function": "main"},
        {"file": "t.py", "line": 2, "function": fn},
    ]
    return encode(
        "stacks",
        {
            "schema": "stacks",
            "version": 1,
            "job": "j",
            "host": f"h{rank}",
            "rank": rank,
            "sent_ns": int(sent_s * NS),
            "reason": "op in flight too long",
            "threads": [{"name": "Main", "thread_id": 1, "native": False, "frames": frames}],
        },
    )


def test_episode_rows_stacks_and_a_single_firing_then_resolved_alert() -> None:
    svc = HangService(HangConfig(floor_s=5, warmup_s=5, silent_after_s=3))
    for r in range(3):
        svc.on_heartbeat(heartbeat(r, 1, 0.0, "forward-compute"), SRC, 0)
    for r in (0, 1):
        svc.on_stacks(dump(r, "all_reduce_wait"), Source("rankwatch.stacks"), NS)
    alerts = []
    for t in range(1, 12):
        for r in (0, 1):  # rank 2 went silent; 0 and 1 wait in the all-reduce
            svc.on_heartbeat(heartbeat(r, 1, 0.5, "grads-reduce-scatter"), SRC, t * NS)
        out = svc.on_tick(t * NS)
        alerts += [m for kind, _, m in out.messages if kind == "alerts"]
        if out.rows.get("hangs"):
            hang = out.rows["hangs"][0]
            stacks = out.rows["stacks"]
    assert [a["state"] for a in alerts] == ["firing"]
    assert decode("alerts", encode("alerts", alerts[0]))["evidence"]["culprits"] == [2]
    assert hang["culprit_ranks"] == [2] and hang["waiting_ranks"] == [0, 1]
    assert stacks[0]["ranks_text"] == "0-1" and stacks[0]["absent_ranks_text"] == "2"

    svc.on_heartbeat(heartbeat(2, 1, 13.0, "grads-reduce-scatter"), SRC, 13 * NS)
    out = svc.on_tick(13 * NS)
    (resolved,) = [m for kind, _, m in out.messages if kind == "alerts"]
    assert resolved["state"] == "resolved" and resolved["alert_id"] == alerts[0]["alert_id"]
    assert out.rows["hangs"][0]["resolved_at"] is not None


def test_a_dump_after_the_job_moves_again_leaves_the_hung_stacks_as_they_were() -> None:
    """Rank 2 is let go on (SIGCONT): its watchdog sees its op in flight since before
    the stop and dumps at once, before the next tick resolves the episode. That dump,
    and the progress of the others, must not rewrite where the ranks hung (the live
    SIGSTOP test's report once lost the waiters' stacks, once showed the culprit in
    the all-reduce it entered after being let go)."""
    svc = HangService(HangConfig(floor_s=5, warmup_s=5, silent_after_s=3))
    for r in range(3):
        svc.on_heartbeat(heartbeat(r, 1, 0.0, "forward-compute"), SRC, 0)
    for r in (0, 1):
        svc.on_stacks(dump(r, "all_reduce_wait"), Source("rankwatch.stacks"), NS)
    for t in range(1, 12):
        for r in (0, 1):
            svc.on_heartbeat(heartbeat(r, 1, 0.5, "grads-reduce-scatter"), SRC, t * NS)
        svc.on_tick(t * NS)
    assert svc.detector.episodes()
    svc.on_heartbeat(heartbeat(2, 1, 12.0, "grads-reduce-scatter"), SRC, 12 * NS)
    out = svc.on_stacks(dump(2, "all_reduce_wait"), Source("rankwatch.stacks"), 12 * NS)
    assert not out.rows.get("stacks"), out.rows


def test_a_dump_from_before_the_ranks_last_progress_is_left_out_of_the_episode() -> None:
    """Rank 2 waited long enough for a dump at 2.5 s, got out of that wait, and stopped
    at 3 s: its old dump says nothing of where it is stuck, so the waits of ranks 0 and
    1 are shown without it and rank 2 is in no path."""
    svc = HangService(HangConfig(floor_s=5, warmup_s=5, silent_after_s=3))
    for r in (0, 1):
        svc.on_stacks(dump(r, "all_reduce_wait", sent_s=5.0), Source("rankwatch.stacks"), 5 * NS)
    svc.on_heartbeat(heartbeat(2, 1, 0.5, "forward-recv"), SRC, NS)
    svc.on_stacks(dump(2, "all_reduce_wait", sent_s=2.5), Source("rankwatch.stacks"), 3 * NS)
    svc.on_heartbeat(heartbeat(2, 1, 3.0, "forward-compute"), SRC, 3 * NS)
    stacks = []
    for t in range(4, 14):
        for r in (0, 1):
            svc.on_heartbeat(heartbeat(r, 1, 3.0, "grads-reduce-scatter"), SRC, t * NS)
        stacks += svc.on_tick(t * NS).rows.get("stacks", [])
    assert stacks, "no episode declared"
    assert {(s["ranks_text"], s["absent_ranks_text"]) for s in stacks} == {("0-1", "2")}


def test_bad_heartbeats_are_dead_letters() -> None:
    svc = HangService()
    out = svc.on_heartbeat(b'{"schema": "heartbeats", "version": 3}', SRC, 0)
    assert out.rows["dead_letters"][0]["reason"] == "unknown-version"
    assert svc.dead_letters == 1


def test_a_restarted_service_reopens_the_stored_episode_and_resolves_it_once() -> None:
    """A worker killed mid-episode: the next one recalls the episode from its stored
    firing alert, does not declare it again while the ranks stay stuck, and sends the
    one resolved alert when a rank progresses."""
    config = HangConfig(floor_s=4, warmup_s=4, silent_after_s=30)
    first = HangService(config)
    for rank in range(3):
        first.on_heartbeat(
            heartbeat(rank, 3, 10, "forward-compute" if rank == 1 else "grads-reduce-scatter"),
            SRC,
            11 * NS,
        )
    (fired,) = first.on_tick(20 * NS).messages
    stored = decode("alerts", encode("alerts", fired[2]))  # as the store gives it back
    asked: list[str] = []

    def recall(job: str) -> tuple[Episode | None, list[float]]:
        asked.append(job)
        return episode_from_alert(stored), [3.0] * 5  # the stored step-time baseline

    second = HangService(config, recall=recall)
    for t in (21, 30, 40):  # still stuck, long past the floor
        for rank in range(3):
            op = "forward-compute" if rank == 1 else "grads-reduce-scatter"
            second.on_heartbeat(heartbeat(rank, 3, 10, op), SRC, t * NS)
        assert second.on_tick(t * NS).messages == []
    assert asked == ["j"]  # once, when the job was first met
    assert second.detector.threshold_s("j") == 15.0  # k x the restored median, not the floor
    second.on_heartbeat(heartbeat(1, 3, 41, "grads-reduce-scatter"), SRC, 41 * NS)
    (resolved,) = second.on_tick(42 * NS).messages
    assert resolved[2]["alert_id"] == stored["alert_id"] and resolved[2]["state"] == "resolved"
    assert second.detector.episodes() == []
