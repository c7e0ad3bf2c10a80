"""One straggler alert per episode, with a stable id, the top attribution as evidence,
resolved when the rolling slowdown clears; a restart that restores the open episode
does not fire it again."""

from __future__ import annotations

from rankwatch.streams.alerts import AlertConfig, StragglerAlerts

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
