"""Straggler alerts: one episode per chronic straggler, the group that explains the
slowdown named (a worker as a worker, not its stage), only when it stands out of its
peers; nothing on noise that moves from step to step; the episode survives a handover."""

from __future__ import annotations

import dataclasses

import pytest

from rankwatch.streams.ops.alerts import AlertConfig, StragglerAlerts, mark_of

CFG = AlertConfig(window=5)
"""The shipped rule on a short window: 4 of 5 steps must name one group."""
WORKERS = [(d, p) for d in range(2) for p in range(2)]


def attributions(
    slow: dict[tuple[int, int], float], optype: str = "forward-compute"
) -> list[tuple[str, str, float]]:
    """A 2x2 job's attributions when the workers in ``slow`` hold their real durations
    (S_w) and every other worker is ideal: a stage or DP rank is as slow as its slowest
    worker, a worker's S_g is its own (S_w = min(S_dp, S_stage) with the peers ideal)."""

    def of(keep: list[tuple[int, int]]) -> float:
        return max([slow.get(w, 1.0) for w in keep], default=1.0)

    out = [("worker", f"{d},{p}", slow.get((d, p), 1.0)) for d, p in WORKERS]
    out += [("stage", str(p), of([w for w in WORKERS if w[1] == p])) for p in range(2)]
    out += [("dp_rank", str(d), of([w for w in WORKERS if w[0] == d])) for d in range(2)]
    return [*out, ("optype", optype, max(slow.values(), default=1.0))]


def run(alerts: StragglerAlerts, steps: list[dict[tuple[int, int], float]], first: int = 0):
    out = []
    for i, slow in enumerate(steps, first):
        s = max(slow.values(), default=1.0)
        locate = lambda d, g: ([int(x) for x in g.split(",")], ["host-a"])  # noqa: E731
        fired = alerts.observe("j", i, 1000 + i, s, attributions(slow), locate)
        if fired is not None:
            out.append(fired)
    return out


def test_a_chronic_worker_fires_once_names_itself_and_resolves_with_the_same_id() -> None:
    slow = [{(1, 0): 1.5}] * 8 + [{}] * 8
    fired = run(StragglerAlerts(CFG), slow)
    assert [a.state for a in fired] == ["firing", "resolved"]
    assert fired[0].alert_id == fired[1].alert_id == "straggler:j:4"
    blame = fired[0].evidence["blame"]
    assert (blame["dimension"], blame["group"], blame["steps_led"]) == ("worker", "1,0", 5)
    assert fired[0].evidence["lead_over_peers"] == pytest.approx(0.5)
    assert fired[0].evidence["cause"] == "compute"
    assert fired[0].evidence["hosts"] == ["host-a"]
    assert "worker 1,0 (ranks 0-1 on host-a) explains 5 of its last 5 steps" in fired[0].summary
    assert fired[0].ts_ns == 1004  # the step's start: a re-analysis gives the same row
    assert fired[0].severity == "critical"  # median S 1.5


def test_healthy_noise_that_moves_between_workers_never_fires() -> None:
    """What a busy box does: every step one worker or another runs late."""
    slow = [{WORKERS[i % 4]: 1.3} for i in range(40)]
    assert run(StragglerAlerts(CFG), slow) == []


def test_a_worker_that_does_not_stand_out_of_its_peers_does_not_fire() -> None:
    """The same worker is the slowest each step, by less than the margin: the box is
    slow for everyone."""
    slow = [{(0, 0): 1.3, (1, 1): 1.2, (0, 1): 1.2}] * 10
    assert run(StragglerAlerts(CFG), slow) == []


def test_a_slow_stage_whose_copies_take_turns_is_the_stage() -> None:
    slow = [{(0, 1): 1.4, (1, 1): 1.35} if i % 2 else {(0, 1): 1.35, (1, 1): 1.4} for i in range(8)]
    fired = run(StragglerAlerts(CFG), slow)
    blame = fired[0].evidence["blame"]
    assert (blame["dimension"], blame["group"]) == ("stage", "1")


def test_a_mild_slowdown_under_fire_at_stays_silent() -> None:
    assert run(StragglerAlerts(CFG), [{(1, 1): 1.08}] * 10) == []


def test_a_few_healthy_steps_do_not_resolve_an_episode() -> None:
    """Hysteresis: the window must lose the worker's lead, not just a step or two."""
    slow = [{(1, 0): 1.5}] * 6 + [{}] * 2 + [{(1, 0): 1.5}] * 4
    assert [a.state for a in run(StragglerAlerts(CFG), slow)] == ["firing"]


def test_a_network_straggler_is_named_as_such() -> None:
    alerts = StragglerAlerts(CFG)
    fired = None
    for i in range(6):
        attrs = attributions({(0, 1): 1.6}, optype="dp-allreduce")
        fired = fired or alerts.observe("j", i, i, 1.6, attrs)
    assert fired is not None and fired.evidence["cause"] == "network"


def test_the_episode_survives_a_handover_and_resolves_there() -> None:
    first = StragglerAlerts(CFG)
    fired = run(first, [{(1, 1): 1.5}] * 6)
    assert [a.state for a in fired] == ["firing"]
    second = StragglerAlerts(CFG)
    second.load("j", first.state("j"))
    again = run(second, [{(1, 1): 1.5}] * 2 + [{}] * 8, first=6)
    assert [(a.state, a.alert_id) for a in again] == [("resolved", fired[0].alert_id)]


def test_a_step_mark_keeps_each_dimensions_two_largest() -> None:
    mark = mark_of(1.5, attributions({(1, 0): 1.5, (0, 1): 1.1}))
    assert mark.blame.key == ("worker", "1,0")
    assert mark.tops["worker"] == (("1,0", 1.5), ("0,1", 1.1))
    assert mark.lead(("worker", "1,0")) == pytest.approx(0.4)
    assert mark.lead(("worker", "0,0")) == pytest.approx(-0.4)


def test_the_config_refuses_a_share_that_cannot_clear() -> None:
    with pytest.raises(ValueError):
        AlertConfig(chronic_share=0.5, clear_share=0.6)


def test_an_episode_whose_group_is_unknown_is_held_while_the_rule_fires_then_resolved() -> None:
    """A firing alert of an earlier rule (its evidence names no group of this one) taken
    over: no second firing alert, and its own id on the resolved one."""
    first = StragglerAlerts(CFG)
    run(first, [{(1, 1): 1.5}] * 6)
    saved = first.state("j")
    second = StragglerAlerts(CFG)
    second.load("j", dataclasses.replace(saved, group=None))
    again = run(second, [{(1, 1): 1.5}] * 3 + [{}] * 8, first=6)
    assert [(a.state, a.alert_id) for a in again] == [("resolved", saved.episode)]


def blame_of(alert) -> tuple[str, str]:
    return (alert.evidence["blame"]["dimension"], alert.evidence["blame"]["group"])


def test_a_slow_stage_with_one_copy_always_slower_is_still_the_stage() -> None:
    """On a shared host one DP copy of a slow stage can lead every step: its peer still
    carries most of the step's excess (0.3 of 0.5), so the stage is slow, not one worker."""
    fired = run(StragglerAlerts(CFG), [{(0, 1): 1.5, (1, 1): 1.3}] * 8)
    assert blame_of(fired[0]) == ("stage", "1")


def test_a_slow_worker_whose_stage_peer_is_a_little_slow_is_the_worker() -> None:
    """A peer that carries a tenth of the excess (a neighbour on the same cores) does
    not make the worker's stage the blame."""
    fired = run(StragglerAlerts(CFG), [{(0, 1): 1.5, (1, 1): 1.05}] * 8)
    assert blame_of(fired[0]) == ("worker", "0,1")
    assert fired[0].evidence["ranks"] == [0, 1]


def test_a_slow_dp_rank_is_the_dp_rank() -> None:
    fired = run(StragglerAlerts(CFG), [{(1, 0): 1.5, (1, 1): 1.45}] * 8)
    assert blame_of(fired[0]) == ("dp_rank", "1")


def test_a_near_tie_of_workers_in_no_common_group_is_spread_and_silent() -> None:
    """Two workers of different stages and DP ranks, each slow alike: no one group
    explains the job's slowdown, and nobody is paged."""
    assert run(StragglerAlerts(CFG), [{(0, 0): 1.5, (1, 1): 1.48}] * 10) == []


def test_an_episode_moves_to_the_stage_it_turns_out_to_be() -> None:
    """A worker slows, then its stage peer too: one episode (one id), its firing sent
    again naming the stage, and no resolved message between."""
    slow = [{(0, 1): 1.5}] * 6 + [{(0, 1): 1.5, (1, 1): 1.45}] * 6
    fired = run(StragglerAlerts(CFG), slow)
    assert [(a.state, blame_of(a)) for a in fired] == [
        ("firing", ("worker", "0,1")),
        ("firing", ("stage", "1")),
    ]
    assert fired[0].alert_id == fired[1].alert_id


def observe_with(kinds: frozenset[str] | None, optype: str, steps: int = 8) -> list:
    alerts = StragglerAlerts(CFG)
    out = []
    for i in range(steps):
        fired = alerts.observe(
            "j", i, i, 1.6, attributions({(0, 1): 1.6}, optype=optype),
            lambda d, g: ([2], ["host-b"]), lambda ranks: kinds,
        )  # fmt: skip
        if fired is not None:
            out.append(fired)
    return out


def test_a_network_straggler_fires_only_where_its_links_slowed() -> None:
    """Communication time that grew while the group's bandwidth did not drop is waiting
    (a core shared with another process), not a slow link."""
    assert observe_with(frozenset(), "dp-allreduce") == []
    assert observe_with(frozenset({"flops-drop"}), "dp-allreduce") == []
    fired = observe_with(frozenset({"bandwidth-drop"}), "dp-allreduce")
    assert fired and fired[0].evidence["cause"] == "network"
    assert observe_with(None, "dp-allreduce")  # a job without signals: the what-if's word


def test_a_straggler_whose_ranks_pause_for_gc_is_blamed_on_gc() -> None:
    """A GC pause inside a forward is forward time to the what-if: the open gc-pauses
    episode on the blamed rank names the cause."""
    fired = observe_with(frozenset({"gc-pauses", "flops-drop"}), "forward-compute")
    assert fired[0].evidence["cause"] == "GC"
    assert "in GC" in fired[0].summary
    assert observe_with(frozenset(), "forward-compute")[0].evidence["cause"] == "compute"
