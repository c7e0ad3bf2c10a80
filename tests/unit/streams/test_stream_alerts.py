"""One straggler alert per episode, with a stable id, the top attribution as evidence,
resolved when the rolling slowdown clears; a restart that restores the open episode
does not fire it again."""

from __future__ import annotations

from rankwatch.streams.ops.alerts import AlertConfig, StragglerAlerts

CFG = AlertConfig(fire_at=1.2, clear_below=1.1, window=2, min_steps=2)
TOP = ("worker", "1,2", 1.5)


def run(alerts: StragglerAlerts, slowdowns: list[float], first: int = 0) -> list:
    out = []
    for i, s in enumerate(slowdowns):
        alert = alerts.observe("j", first + i, 1000 + first + i, s, TOP)
        if alert is not None:
            out.append(alert)
    return out


def test_one_episode_fires_once_and_resolves_with_the_same_id() -> None:
    fired = run(StragglerAlerts(CFG), [1.0, 1.3, 1.4, 1.5, 1.3, 1.0, 1.0, 1.0])
    assert [a.state for a in fired] == ["firing", "resolved"]
    assert fired[0].alert_id == fired[1].alert_id == "straggler:j:2"
    assert fired[0].evidence["top_attribution"] == {
        "dimension": "worker",
        "group": "1,2",
        "slowdown": 1.5,
    }
    assert fired[0].ts_ns == 1002  # the step's start: a re-analysis gives the same row
    message = fired[0].message()
    assert message["kind"] == "straggler" and message["severity"] == "warning"


def test_restored_episode_is_not_fired_again() -> None:
    alerts = StragglerAlerts(CFG)
    alerts.restore("j", {2: 1.4, 3: 1.5}, "straggler:j:2")
    fired = run(alerts, [1.5, 1.0, 1.0], first=4)
    assert [(a.state, a.alert_id) for a in fired] == [("resolved", "straggler:j:2")]


CHRONIC = AlertConfig(fire_at=1.2, clear_below=1.1, window=10, min_steps=3)


def fire(leaders_per_step: list[dict[str, tuple[str, float]]]) -> dict:
    """The blame of the alert that the steps (each S = 1.5) fire."""
    alerts = StragglerAlerts(CHRONIC)
    for step, lead in enumerate(leaders_per_step):
        fired = alerts.observe("j", step, step, 1.5, TOP, lead)
        if fired is not None:
            return fired.evidence["blame"] | {"summary": fired.summary}
    raise AssertionError("no alert fired")


def test_a_rank_that_leads_most_steps_is_named_chronic() -> None:
    lead = [{"worker": ("3,1", 1.4), "dp_rank": ("3", 1.4), "stage": ("1", 1.4)}] * 3
    blame = fire(lead)
    assert blame["chronic"] and (blame["dimension"], blame["group"]) == ("worker", "3,1")
    assert "chronic: worker 3,1 led 3 of the last 3 steps" in blame["summary"]


def test_a_lead_that_moves_every_step_is_spread() -> None:
    """The probe's SE job: the top DP rank changed every step, yet the alert named one."""
    lead = [{"worker": (f"{i},{i}", 1.2), "dp_rank": (str(i), 1.2), "stage": (str(i), 1.2)}
            for i in range(3)]  # fmt: skip
    blame = fire(lead)
    assert not blame["chronic"] and blame["needed"] == 2
    assert "spread: no worker, DP rank or stage led 2 of the last 3 steps" in blame["summary"]


def test_a_stage_can_be_chronic_when_its_workers_take_turns() -> None:
    lead = [{"worker": (f"{i},1", 1.1), "dp_rank": (str(i), 1.1), "stage": ("1", 1.4)}
            for i in range(3)]  # fmt: skip
    blame = fire(lead)
    assert blame["chronic"] and (blame["dimension"], blame["group"]) == ("stage", "1")


def test_the_blame_survives_a_restart() -> None:
    alerts = StragglerAlerts(CHRONIC)
    lead = {"worker": ("3,1", 1.3), "dp_rank": ("3", 1.3), "stage": ("1", 1.3)}
    alerts.restore("j", {0: 1.0, 1: 1.0}, None, {0: lead, 1: lead})
    other = {"worker": ("0,0", 1.3), "dp_rank": ("0", 1.3), "stage": ("0", 1.3)}
    fired = alerts.observe("j", 2, 2, 2.0, TOP, other)
    assert fired is not None and fired.evidence["blame"]["group"] == "3,1"


def test_a_stage_that_explains_more_than_its_chronic_worker_is_named() -> None:
    """ST: one worker of the last stage leads every step, but the stage explains more
    (offline M_S 1.22 against M_W 0.03): the stage is to blame."""
    lead = [{"worker": ("0,3", 1.05), "dp_rank": ("0", 1.04), "stage": ("3", 1.20)}] * 3
    blame = fire(lead)
    assert (blame["dimension"], blame["group"]) == ("stage", "3")


def test_one_attributed_step_is_never_chronic() -> None:
    alerts = StragglerAlerts(AlertConfig(fire_at=1.2, clear_below=1.1, window=10, min_steps=3))
    lead = {"worker": ("3,1", 1.4), "dp_rank": ("3", 1.4), "stage": ("1", 1.4)}
    fired = [alerts.observe("j", s, s, 1.5, None, lead if s == 2 else None) for s in range(3)]
    assert fired[2] is not None and not fired[2].evidence["blame"]["chronic"]
