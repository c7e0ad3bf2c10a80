"""Hang detection on synthetic heartbeats: culprit vs waiters, silence, slow is not hung,
clean finish, resolution, adaptive threshold."""

from __future__ import annotations

from typing import Any

from rankwatch.streams.hang.detector import NS, HangConfig, HangDetector

CFG = HangConfig(k=5.0, floor_s=10.0, silent_after_s=6.0)


def hb(
    rank: int, step: int, at_s: float, optype: str | None = "forward-compute", **extra: Any
) -> dict[str, Any]:
    in_flight = (
        None
        if optype is None
        else {"optype": optype, "seq_id": 0, "mb_id": -1, "since_ns": int(at_s * NS)}
    )
    return {
        "job": "j",
        "host": f"h{rank // 2}",
        "rank": rank,
        "dp_rank": rank % 2,
        "pp_rank": rank // 2,
        "tp_rank": 0,
        "cp_rank": 0,
        "sent_ns": int(at_s * NS),
        "step": step,
        "in_flight": in_flight,
        "last_done": None,
        "pid": 100 + rank,
        **extra,
    }


def run_steps(det: HangDetector, ranks: range, steps: int, period_s: float = 1.0) -> float:
    t = 0.0
    for step in range(steps):
        t = step * period_s
        for r in ranks:
            det.observe(hb(r, step, t), int(t * NS))
    assert det.evaluate(int(t * NS)) == []
    return t


def test_a_stopped_rank_is_the_culprit_and_the_others_wait() -> None:
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    stop = t + 0.5
    # rank 2 is stopped (SIGSTOP): no more heartbeats; the others enter the
    # reduce-scatter of step 5 and keep beating from inside it
    for beat in range(30):
        now = stop + beat
        for r in (0, 1, 3):
            det.observe(hb(r, 5, stop, "grads-reduce-scatter"), int(now * NS))
        opened = det.evaluate(int(now * NS))
        if opened:
            break
    (ep,) = opened
    assert ep.culprits == (2,) and ep.waiting == (0, 1, 3) and ep.silent == (2,)
    assert ep.first_stopped == 2 and ep.suspects == (2,)
    assert ep.culprit_hosts == ("h1",)
    assert "silent" in ep.culprit_where and "rank 2" in ep.summary
    # declared once the floor passed since the waiters' last progress
    assert now - stop >= CFG.floor_s
    assert det.evaluate(int((now + 1) * NS)) == []  # one episode, not one per call

    # SIGCONT: rank 2 beats again and the collective completes
    det.observe(hb(2, 5, now + 2, "grads-reduce-scatter"), int((now + 2) * NS))
    (resolved,) = det.evaluate(int((now + 2) * NS))
    assert resolved.episode_id == ep.episode_id and resolved.resolved_ns is not None


def test_silence_the_worker_could_not_hear_is_held_against_no_one() -> None:
    """The worker's broker was unreachable for 40 s (every heartbeat stopped at once):
    excused, no hang is declared when it hears again; a rank that really stops after
    that is still found, a floor later."""
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    for blind in range(1, 41):  # the worker's ticks while it reads nothing
        det.excuse(int((t + blind) * NS))
        assert det.evaluate(int((t + blind) * NS)) == []
    back = t + 41
    assert det.evaluate(int(back * NS)) == []
    for beat in range(int(CFG.floor_s) + 10):  # rank 2 stays silent from here
        now = back + beat
        for r in (0, 1, 3):
            det.observe(hb(r, 5, back, "grads-reduce-scatter"), int(now * NS))
        opened = det.evaluate(int(now * NS))
        if opened:
            break
    (ep,) = opened
    assert ep.culprits == (2,) and now - back >= CFG.floor_s


def test_an_open_hang_is_not_resolved_by_the_worker_being_blind() -> None:
    det = HangDetector(CFG)
    t = run_steps(det, range(2), 5)
    for beat in range(40):
        now = t + beat
        det.observe(hb(0, 5, t, "grads-all-reduce"), int(now * NS))
        if det.evaluate(int(now * NS)):
            break
    assert det.episodes()
    det.excuse(int((now + 5) * NS))
    assert det.evaluate(int((now + 6) * NS)) == [] and det.episodes()


def test_a_rank_stuck_in_compute_is_the_culprit_while_still_beating() -> None:
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    for beat in range(40):
        now = t + 1 + beat
        det.observe(hb(1, 5, t + 1, "backward-compute"), int(now * NS))
        for r in (0, 2, 3):
            det.observe(
                hb(r, 5, t + 1, "backward-recv" if r == 0 else "params-all-gather"), int(now * NS)
            )
        opened = det.evaluate(int(now * NS))
        if opened:
            break
    (ep,) = opened
    assert ep.culprits == (1,) and ep.silent == ()
    assert "backward-compute_0" in ep.culprit_where
    assert 1 in ep.suspects


def test_a_slow_rank_is_a_straggler_not_a_hang() -> None:
    det = HangDetector(CFG)
    now = 0.0
    for step in range(60):  # rank 3 takes twice as long per op, everyone keeps going
        for r in range(4):
            now = step * 2.0
            det.observe(hb(r, step, now + (1.0 if r == 3 else 0.0)), int(now * NS))
        assert det.evaluate(int(now * NS)) == []


def test_a_clean_finish_raises_nothing() -> None:
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    for r in range(4):
        det.observe(hb(r, 5, t + 1, None, state="finished"), int((t + 1) * NS))
    assert det.evaluate(int((t + 100) * NS)) == []
    assert det.episodes() == []


def test_the_threshold_adapts_to_the_step_time() -> None:
    det = HangDetector(HangConfig(k=5.0, floor_s=1.0, warmup_s=1.0))
    run_steps(det, range(2), 6, period_s=4.0)
    assert det.threshold_s("j") == 20.0


def test_ranks_still_starting_are_not_hung_until_they_go_silent() -> None:
    """Heartbeats before the first op (imports, process groups) show no progress; that is
    no hang, but a rank that stops beating during start-up still is one."""
    det = HangDetector(CFG)
    for t in range(0, 30, 2):
        for r in range(4):
            det.observe(hb(r, 0, t, optype=None), int(t * NS))
        assert det.evaluate(int(t * NS)) == []
    [episode] = det.evaluate(int(40 * NS))  # nobody heard for 12 s > silent_after_s
    assert episode.silent == (0, 1, 2, 3)


def test_a_waiter_that_entered_its_receive_early_is_not_the_first_stopped() -> None:
    """Rank 0 waits in a receive it entered before rank 1's last op ended; rank 1 is
    then stopped. The earliest progress is rank 0's, but rank 1 stopped first."""
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    wait_from, stopped_at = t + 0.2, t + 0.6
    det.observe(hb(1, 5, stopped_at), int(stopped_at * NS))  # its last beat: in compute
    for beat in range(30):
        now = stopped_at + beat
        det.observe(hb(0, 5, wait_from, "forward-recv"), int(now * NS))
        for r in (2, 3):
            det.observe(hb(r, 5, stopped_at + 0.1, "grads-reduce-scatter"), int(now * NS))
        opened = det.evaluate(int(now * NS))
        if opened:
            break
    (ep,) = opened
    assert ep.culprits == (1,) and ep.waiting == (0, 2, 3)
    assert ep.first_stopped == 1


# -- phases and the warm-up bound ------------------------------------------------------


def _phase(name: str, since_s: float, bound_s: float) -> dict[str, Any]:
    return {"name": name, "since_ns": int(since_s * NS), "bound_s": bound_s}


def _pause(det: HangDetector, t: float, seconds: int, phase: dict[str, Any] | None) -> list[Any]:
    """Rank 0 leaves the step loop at ``t`` (saving a checkpoint, say) for ``seconds``;
    ranks 1-3 wait for it in the next step's all-gather, beating all along."""
    opened: list[Any] = []
    for beat in range(1, seconds + 1):
        now = t + beat
        extra = {"phase": phase} if phase else {}
        det.observe(hb(0, 5, t, None, **extra), int(now * NS))
        for r in (1, 2, 3):
            det.observe(hb(r, 5, t, "params-all-gather"), int(now * NS))
        opened += det.evaluate(int(now * NS))
    return opened


def test_an_announced_phase_keeps_its_own_bound_and_an_unannounced_pause_does_not() -> None:
    """A 90 s checkpoint save announced with a 600 s bound raises nothing; the same pause
    unannounced is a hang once the training-step bound has passed, rank 0 named outside
    any timed op; a phase past its own bound is a hang too, and says so."""
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    assert _pause(det, t, 90, _phase("checkpoint-save", t, 600.0)) == []

    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    (ep,) = _pause(det, t, 90, None)
    assert ep.culprits == (0,) and "outside any timed op" in ep.culprit_where
    assert CFG.floor_s <= (ep.declared_ns / NS - t) <= CFG.floor_s + 2

    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    (ep,) = _pause(det, t, 90, _phase("evaluation", t, 30.0))
    assert ep.culprits == (0,) and "'evaluation' past its bound (30 s)" in ep.culprit_where
    assert 30 <= (ep.declared_ns / NS - t) <= 32


def test_the_end_of_a_phase_is_progress_before_the_next_op_is_heard() -> None:
    """The heartbeat that ends a 90 s save can come a few ticks before the rank's next
    op: its last op is then 90 s old, its peers' too, yet nothing hangs (CI saw this
    race raise a hang that resolved half a second later)."""
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    assert _pause(det, t, 90, _phase("checkpoint-save", t, 600.0)) == []
    opened = []
    for beat in range(1, 4):  # phase over, next op not yet reported
        now = t + 90 + beat
        det.observe(hb(0, 5, t, None), int(now * NS))
        for r in (1, 2, 3):
            det.observe(hb(r, 5, t, "params-all-gather"), int(now * NS))
        opened += det.evaluate(int(now * NS))
    assert opened == []


def test_a_rank_cannot_switch_hang_detection_off_with_a_huge_bound() -> None:
    det = HangDetector(HangConfig(k=5.0, floor_s=10.0, warmup_s=10.0, max_phase_s=60.0))
    t = run_steps(det, range(4), 5)
    (ep,) = _pause(det, t, 90, _phase("checkpoint-save", t, 1e9))
    assert 60 <= (ep.declared_ns / NS - t) <= 62


def test_a_rank_in_its_phase_may_stop_beating_until_the_bound() -> None:
    """A save that holds the GIL starves the thread that beats: silence inside an
    announced phase is not a hang before the phase's bound."""
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    det.observe(hb(0, 5, t, None, phase=_phase("checkpoint-save", t, 120.0)), int(t * NS))
    opened = []
    for beat in range(1, 131):
        now = t + beat
        for r in (1, 2, 3):
            det.observe(hb(r, 5, t, "params-all-gather"), int(now * NS))
        opened += det.evaluate(int(now * NS))
    (ep,) = opened
    assert 120 <= ep.declared_ns / NS - t <= 122 and ep.culprits == (0,)


def test_the_first_steps_get_the_warm_up_bound() -> None:
    """Before three step times are known a job's ranks get ``warmup_s`` (compilation, the
    first batches), then the training-step bound."""
    det = HangDetector(HangConfig(k=5.0, floor_s=5.0, warmup_s=60.0))
    run_steps(det, range(2), 3)  # two step times
    assert det.threshold_s("j") == 60.0
    run_steps(det, range(2), 4)
    assert det.threshold_s("j") == 5.0


def test_a_rank_that_skips_a_collective_is_named_with_where_each_rank_waits() -> None:
    """Rank 3 skipped step 5's gradient all-reduce and waits in step 6's receive; its DP
    peer (rank 2) waits in the all-reduce for it: everyone waits, nobody computes. The
    hang is a collective mismatch naming rank 3, and the summary says where each of the
    group's ranks waits."""
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    where = {0: (5, "separate-grads-all-reduce"), 1: (5, "separate-grads-all-reduce"),
             2: (5, "separate-grads-all-reduce"), 3: (6, "forward-recv")}  # fmt: skip
    opened = []
    for beat in range(1, 40):
        now = t + beat
        for r, (step, optype) in where.items():
            det.observe(hb(r, step, t + 0.1 * r, optype), int(now * NS))
        opened += det.evaluate(int(now * NS))
    (ep,) = opened
    assert ep.culprits == (3,) and ep.first_stopped == 3 and 3 not in ep.waiting
    assert "forward-recv_0 (microbatch -1) of step 6" in ep.culprit_where
    assert (
        "rank 3 (dp 1, pp 1, tp 0) on h1 went on past its DP group's collective, in" in ep.summary
    )
    assert (
        "collective mismatch in the DP group of stage 1 (tp 0, cp 0): rank 2 in"
        " separate-grads-all-reduce_0 of step 5, rank 3 in forward-recv_0 of step 6"
    ) in ep.summary
    assert "stage 0" not in ep.summary  # ranks 0 and 1 wait in the same all-reduce


def test_a_rank_in_another_collective_of_the_same_step_is_the_culprit() -> None:
    """Ranks 0 and 2 of stage 0's DP group (DP 4 here) wait in step 5's reduce-scatter,
    rank 4 (dp 2) in an all-reduce none of them called: the majority's collective is the
    group's, so rank 4 is away. (With two ranks a group has no majority; the summary
    then still says where each waits.)"""
    det = HangDetector(CFG)

    def beats(r: int, step: int, at: float, optype: str) -> dict[str, Any]:
        return {**hb(r, step, at, optype), "dp_rank": r // 2, "pp_rank": r % 2}

    t = 0.0
    for step in range(5):
        t = float(step)
        for r in range(8):
            det.observe(beats(r, step, t, "forward-compute"), int(t * NS))
    opened = []
    for beat in range(1, 40):
        now = t + beat
        for r in range(8):
            optype = "grads-reduce-scatter" if r != 4 else "separate-grads-all-reduce"
            det.observe(beats(r, 5, t + 0.1, optype), int(now * NS))
        opened += det.evaluate(int(now * NS))
    (ep,) = opened
    assert ep.culprits == (4,) and ep.waiting == (0, 1, 2, 3, 5, 6, 7), ep
    assert (
        "rank 4 (dp 2, pp 0, tp 0) on h2 called another collective than its DP group" in ep.summary
    )
    assert (
        "collective mismatch in the DP group of stage 0 (tp 0, cp 0): ranks 0, 2, 6 in"
        " grads-reduce-scatter_0 of step 5, rank 4 in separate-grads-all-reduce_0 of step 5"
    ) in ep.summary, ep.summary
    assert "stage 1" not in ep.summary


def test_a_group_of_two_split_between_collectives_claims_no_side() -> None:
    """DP 2: rank 0 in the reduce-scatter, rank 1 in another all-reduce. One against one
    is no majority, so the alert must not say which rank is wrong, only where each is."""
    det = HangDetector(CFG)

    def beats(r: int, step: int, at: float, optype: str) -> dict[str, Any]:
        return {**hb(r, step, at, optype), "dp_rank": r, "pp_rank": 0}

    t = 0.0
    for step in range(5):
        t = float(step)
        for r in range(2):
            det.observe(beats(r, step, t, "forward-compute"), int(t * NS))
    opened = []
    for beat in range(1, 40):
        now = t + beat
        for r, optype in enumerate(("grads-reduce-scatter", "separate-grads-all-reduce")):
            det.observe(beats(r, 5, t + 0.1, optype), int(now * NS))
        opened += det.evaluate(int(now * NS))
    (ep,) = opened
    assert "is split from its DP group (no majority: either side may be wrong)" in ep.summary
    assert "called another collective" not in ep.summary and "stopped first" not in ep.summary
    assert (
        "rank 0 in grads-reduce-scatter_0 of step 5,"
        " rank 1 in separate-grads-all-reduce_0 of step 5"
    ) in ep.summary, ep.summary


def test_a_peer_waiting_for_input_from_a_stopped_rank_is_no_collective_mismatch() -> None:
    """Rank 1 (stage 0) stopped; rank 3 (stage 1, the same DP rank) waits for its
    activations in step 15's receive, and rank 3's DP peer, rank 2, in step 15's
    reduce-scatter for rank 3. Rank 3 is behind, not away from the collective: the live
    workload's SIGSTOP alert said "collective mismatch" here until the rule looked at
    which side of the collective the odd rank stands."""
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 15)
    where = {0: "grads-reduce-scatter", 2: "grads-reduce-scatter", 3: "forward-recv"}
    opened = []
    for beat in range(1, 40):
        now = t + beat
        for r, optype in where.items():
            det.observe(hb(r, 15, t + 0.1 * r, optype), int(now * NS))
        opened += det.evaluate(int(now * NS))
    (ep,) = opened
    assert ep.culprits == (1,) and "mismatch" not in ep.summary, ep.summary


def test_a_stopped_rank_is_no_collective_mismatch() -> None:
    """Every DP peer in the same collective, one rank silent: an ordinary hang."""
    det = HangDetector(CFG)
    t = run_steps(det, range(4), 5)
    opened = []
    for beat in range(1, 40):
        now = t + beat
        for r in (0, 1, 2):
            det.observe(hb(r, 5, t, "separate-grads-all-reduce"), int(now * NS))
        opened += det.evaluate(int(now * NS))
    (ep,) = opened
    assert ep.culprits == (3,) and "mismatch" not in ep.summary
