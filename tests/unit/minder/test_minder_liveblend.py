"""The default detector on the live stream (``scoring="blend"``, ``liveblend``): silent on
healthy jobs and job-wide phases, the faulty host named, the same after a restore."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import orjson
import pytest
from support.minderfeeds import phase_alerts

from rankwatch.streams.minder.blend import job_phase
from rankwatch.streams.minder.online import NS, JobMonitor, OnlineConfig
from rankwatch.streams.minder.worker import monitor_state, restore_monitor

BLEND = OnlineConfig(scoring="blend", window_s=20, stride_s=20, continuity=3, resolve_after=2)
T0 = 1_790_000_000 * NS


def feed(
    monitor: JobMonitor, seconds: int, fault: tuple[int, int] | None = None, after_ns: int = 0
) -> tuple[list[dict], list[dict]]:
    """8 hosts at 1 Hz on a load cycle they share, jittered clocks, a sample lost now
    and then; host 5's CPU drops by a third during ``fault``. Samples at or before
    ``after_ns`` are not handed in (a restored monitor reads on from its snapshot)."""
    rng = np.random.default_rng(0)
    alerts, rows = [], []
    for s in range(seconds):
        for h in range(8):
            lost = rng.random() < 0.03
            cpu = 60 + 20 * np.sin(s / 20) + rng.normal(0, 1.5)
            if fault and h == 5 and fault[0] <= s < fault[1]:
                cpu -= 30
            ts = T0 + s * NS + int(rng.integers(0, NS // 5))
            rx = 1e9 + rng.normal(0, 1e6)
            if not lost and ts > after_ns:
                monitor.add(f"host{h}", ts, {"cpu_util": cpu, "net_rx_Bps": rx})
        out = monitor.evaluate()
        alerts += out.alerts
        rows += out.rows.get("machine_scores", [])
    return alerts, rows


def test_a_healthy_job_stays_silent_and_both_halves_are_stored() -> None:
    alerts, rows = feed(JobMonitor("job", BLEND), 1200)
    assert alerts == []
    assert {r["metric"] for r in rows} == {"own history", "peers", "fused"}


def test_the_faulty_host_is_named_within_its_continuity_then_resolved() -> None:
    alerts, _ = feed(JobMonitor("job", BLEND), 1200, fault=(600, 800))
    assert [(a["state"], a["evidence"]["host"]) for a in alerts] == [
        ("firing", "host5"),
        ("resolved", "host5"),
    ]
    fired = (alerts[0]["ts_ns"] - T0) / NS
    assert 600 < fired <= 600 + (BLEND.continuity + 1) * BLEND.window_s
    assert alerts[0]["evidence"]["metric"] == "cpu_util"
    assert "unlike its own record and its peers" in alerts[0]["summary"]


def test_a_host_that_always_runs_hotter_is_normal_for_itself() -> None:
    rng = np.random.default_rng(5)
    monitor, alerts = JobMonitor("job", BLEND), []
    for s in range(1200):
        for h in range(6):
            cpu = 60 + 20 * np.sin(s / 20) + rng.normal(0, 1.5) + (15 if h == 3 else 0)
            monitor.add(f"host{h}", T0 + s * NS, {"cpu_util": cpu})
        alerts += monitor.evaluate().alerts
    assert alerts == []


def test_a_phase_of_the_whole_job_raises_nothing() -> None:
    """Every host leaves its own history at once: the own half sits the window out
    (``job_phase``), and the peer residual, on a stable unit, does not move."""
    assert phase_alerts(BLEND) == []
    assert phase_alerts(replace(BLEND, window_s=60, stride_s=60, continuity=4)) == []


def test_a_job_phase_is_three_quarters_of_the_scored_hosts_or_more() -> None:
    scored = np.array([True] * 8 + [False] * 2)
    above = np.zeros(10, dtype=bool)
    above[:6] = True
    assert job_phase(above, scored)  # 6 of 8
    above[5] = False
    assert not job_phase(above, scored)  # 5 of 8: a fault of many, still reported
    assert not job_phase(np.array([False] * 8 + [True] * 2), scored)  # unscored ones
    assert not job_phase(above, np.zeros(10, dtype=bool))


def test_a_restored_monitor_scores_as_an_uninterrupted_one() -> None:
    """The worker's snapshot, through JSON, carries the blend's rings, peer sums,
    pending windows and units: a monitor restored mid-episode goes on unchanged."""

    def scores(rows: list[dict]) -> list[tuple]:
        return [(r["host"], r["time"], r["metric"], round(r["score"], 9)) for r in rows]

    whole_alerts, whole = feed(JobMonitor("job", BLEND), 1000, fault=(600, 800))
    first = JobMonitor("job", BLEND)
    head_alerts, head = feed(first, 700, fault=(600, 800))
    assert first.episodes and first.next_end_ns is not None
    end = first.next_end_ns - BLEND.stride_s * NS
    state = orjson.loads(orjson.dumps(monitor_state(first, end), option=orjson.OPT_SERIALIZE_NUMPY))
    second = JobMonitor("job", BLEND)
    restore_monitor(second, state)
    tail_alerts, tail = feed(second, 1000, fault=(600, 800), after_ns=end)
    assert scores(head) + scores(tail) == scores(whole)
    assert [a["state"] for a in head_alerts + tail_alerts] == [a["state"] for a in whole_alerts]


def test_stored_rings_of_another_length_warm_up_again() -> None:
    first = JobMonitor("job", BLEND)
    feed(first, 400)
    state = monitor_state(first, first.next_end_ns or 0)
    other = JobMonitor("job", replace(BLEND, blend_history=30))
    restore_monitor(other, state)
    assert other.blend.rings == {} and other.next_end_ns == first.next_end_ns


def _own_scored(rows: list[dict], after_s: int) -> set[str]:
    return {
        r["host"] for r in rows if r["metric"] == "own history" and r["time"] > T0 + after_s * NS
    }


def test_a_faults_windows_never_enter_its_hosts_ring() -> None:
    """Neither the first windows of a confirmed run (still pending when the episode
    opens) nor the last (decided while it is open), whatever ``resolve_after`` is."""
    monitor = JobMonitor("job", BLEND)
    feed(monitor, 1200, fault=(600, 800))
    ring = monitor.blend.rings["host5"]
    cpu = ring.means[:, monitor.blend.metrics.index("cpu_util")]
    healthy = monitor.blend.rings["host4"].means[:, monitor.blend.metrics.index("cpu_util")]
    # the fault takes 30 of a typical 60-80 off: no admitted window of host 5 is that low
    assert np.nanmin(cpu) > np.nanmin(healthy) - 0.15


def test_one_absurd_sample_does_not_blind_a_host() -> None:
    """A value near the float limit: the scores are capped, the host's unit stays finite,
    and the state still goes through JSON."""
    monitor = JobMonitor("job", BLEND)
    feed(monitor, 700)
    monitor.add("host2", T0 + 700 * NS, {"cpu_util": 1e300, "net_rx_Bps": 1e9})
    _, rows = feed(monitor, 1400, after_ns=T0 + 700 * NS + NS)
    assert "host2" in _own_scored(rows, 1000)
    assert all(np.isfinite(v) for v in monitor.blend.rings["host2"].own)
    snapshot = monitor_state(monitor, monitor.next_end_ns or 0)
    state = orjson.loads(orjson.dumps(snapshot, option=orjson.OPT_SERIALIZE_NUMPY))
    again = JobMonitor("job", BLEND)
    restore_monitor(again, state)
    assert list(again.blend.rings["host2"].own) == list(monitor.blend.rings["host2"].own)


def test_a_metric_that_appears_later_blinds_neither_half() -> None:
    monitor = JobMonitor("job", BLEND)
    feed(monitor, 700)
    rng = np.random.default_rng(3)
    rows: list[dict] = []
    for s in range(700, 900):
        for h in range(8):
            cpu = 60 + 20 * np.sin(s / 20) + rng.normal(0, 1.5)
            sample = {"cpu_util": cpu, "net_rx_Bps": 1e9 + rng.normal(0, 1e6), "gpu0_util": 50.0}
            monitor.add(f"host{h}", T0 + s * NS + 1, sample)
        rows += monitor.evaluate().rows.get("machine_scores", [])
    first_new = T0 + 720 * NS
    own = {
        r["host"] for r in rows if r["metric"] == "own history" and r["time"] <= first_new + 20 * NS
    }
    assert own == {f"host{h}" for h in range(8)}


def test_a_phase_needs_enough_scored_hosts() -> None:
    """One warm host above 1 is no phase of the job: it may fire on its own history."""
    assert not job_phase(np.array([True, False]), np.array([True, False]))
    assert job_phase(np.array([True] * 3), np.array([True] * 3))


def test_settings_whose_unit_could_never_be_taken_are_refused() -> None:
    with pytest.raises(ValueError, match="never holds"):
        JobMonitor("job", replace(BLEND, blend_history=10))
    with pytest.raises(ValueError, match="quantile"):
        JobMonitor("job", replace(BLEND, quantile=1.0))
