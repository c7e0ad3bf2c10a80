"""The live residual baselines (``residual.LiveBaselines``), the replay of a labelled
group through the live monitor (``replay``) and the bootstrap comparison of two
detectors (``evaluation.compare``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.streams.minder.evaluation import compare, day_blocks
from rankwatch.streams.minder.online import OnlineConfig
from rankwatch.streams.minder.replay import replay_group
from rankwatch.streams.minder.residual import LiveBaselines
from rankwatch.streams.minder.similarity import window_starts
from rankwatch.streams.minder.study import Group


def summaries(value: float, hosts: int = 3, metrics: int = 2) -> tuple[np.ndarray, np.ndarray]:
    return np.full((hosts, metrics), value), np.full((hosts, metrics), 0.1)


HOSTS, METRICS = ["a", "b", "c"], ["m0", "m1"]


def test_a_host_is_scored_after_warm_up_and_lag_and_its_level_is_the_median() -> None:
    base = LiveBaselines(history=8, warmup=3, lag=2, floor=0.01)
    for i in range(4):
        base.observe(i, HOSTS, METRICS, *summaries(float(i)), set(), set())
        loc, _ = base.levels(HOSTS, METRICS)
        assert np.isnan(loc).all()  # admitted so far: windows 0..i-2, fewer than 3
    base.observe(4, HOSTS, METRICS, *summaries(4.0), set(), set())
    loc, scale = base.levels(HOSTS, METRICS)
    assert loc == pytest.approx(np.full((3, 2), 1.0))  # median of 0, 1, 2
    # spread: between windows 1.4826 x MAD(0, 1, 2) = 1.4826, within 1.4826 x 0.1
    assert scale == pytest.approx(np.full((3, 2), np.hypot(1.4826, 0.14826)))


def test_candidate_windows_and_open_episodes_never_enter_the_baseline() -> None:
    base = LiveBaselines(history=8, warmup=1, lag=2, floor=0.01)
    for i in range(3):
        base.observe(i, HOSTS, METRICS, *summaries(0.0), set(), set())
    # a drift starts at window 3 (still sub-threshold), b becomes a candidate at 4
    base.observe(3, HOSTS, METRICS, *summaries(5.0), set(), set())
    base.observe(4, HOSTS, METRICS, *summaries(5.0), {"b"}, set())
    for i in range(5, 9):
        base.observe(i, HOSTS, METRICS, *summaries(5.0), set(), {"b"})
    ring_a, ring_b = base.ring("a", "m0"), base.ring("b", "m0")
    assert ring_a == [0, 0, 0, 5, 5, 5, 5]  # windows 0..6
    # b lost what was pending when it became a candidate (windows 2 and 3: the onset),
    # and nothing enters while its episode is open
    assert ring_b == [0, 0]


@settings(max_examples=40, deadline=None)
@given(
    history=st.integers(1, 6),
    windows=st.integers(0, 30),
    candidate_every=st.integers(2, 7),
)
def test_memory_is_bounded_and_the_state_survives_json(
    history: int, windows: int, candidate_every: int
) -> None:
    base = LiveBaselines(history=history, warmup=1, lag=1)
    rng = np.random.default_rng(windows)
    for i in range(windows):
        med, mad = rng.normal(size=(3, 2)), rng.random((3, 2))
        med[0, 1] = np.nan  # host a lacks m1 in every window
        names = METRICS if i % 5 else ["m2", "m0"]  # a new metric, and the order changes
        cands = {"c"} if i % candidate_every == 0 else set()
        base.observe(i, HOSTS, names, med, mad, cands, set())
    assert base.meds.shape[1] == history  # one ring of ``history`` rows per host
    assert base.meds.shape[0] <= 8  # three hosts: the first allocation
    assert all(len(base.ring(h, m)) <= history for h in HOSTS for m in METRICS)
    assert len(base.pending) <= base.lag + 1
    restored = LiveBaselines(history=history, warmup=1, lag=1)
    restored.restore(orjson.loads(orjson.dumps(base.to_state())))
    a, b = base.levels(HOSTS, METRICS), restored.levels(HOSTS, METRICS)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_a_host_gone_for_a_whole_history_is_forgotten() -> None:
    base = LiveBaselines(history=4, warmup=1, lag=1)
    for i in range(3):
        base.observe(i, HOSTS, METRICS, *summaries(0.0), set(), set())
    for i in range(3, 9):
        base.observe(i, ["a", "b"], METRICS, *summaries(0.0, hosts=2), set(), set())
    assert "c" not in base.slots and "c" not in base.last_seen
    assert set(base.slots) == {"a", "b"} and base.ring("c", "m0") == []
    base.observe(9, HOSTS, METRICS, *summaries(0.0), set(), set())
    base.observe(10, HOSTS, METRICS, *summaries(0.0), set(), set())
    assert base.ring("c", "m0") == [0.0]  # back: a fresh ring, warming up again
    assert base.meds.shape[0] == 8  # its old slot reused


def planted_group(servers: int = 6, fault: tuple[int, int] = (300, 340)) -> Group:
    """Six servers of two metrics sharing a cycle; server 2 drifts in the test split."""
    rng = np.random.default_rng(0)
    t = np.arange(1000)
    x = 0.5 + 0.3 * np.sin(t / 12.0)[None, :, None] + 0.02 * rng.standard_normal((servers, 1000, 2))
    train, test = x[:, :600].copy(), x[:, 600:].copy()
    test[2, fault[0] : fault[1], :] -= 0.3
    labels = np.zeros((servers, 400), dtype=np.uint8)
    labels[2, fault[0] : fault[1]] = 1
    return Group(("m0", "m1"), train, test, labels)


def test_the_replay_reports_the_drifting_server_in_the_offline_windows_it_covers() -> None:
    g = planted_group()
    hosts = [f"s{m}" for m in range(6)]
    pred = replay_group(g, hosts, OnlineConfig(continuity=1), window=8, stride=4)
    starts = window_starts(400, 8, 4)
    assert pred.shape == (starts.size, 6)
    reported = np.flatnonzero(pred[:, 2])
    assert not pred[:, [0, 1, 3, 4, 5]].any()
    # every window wholly inside the drift is reported, none wholly outside it
    inside = np.flatnonzero((starts >= 300) & (starts + 8 <= 340))
    outside = np.flatnonzero((starts + 8 <= 300) | (starts >= 340))
    assert set(inside) <= set(reported)
    assert not set(outside) & set(reported)


def test_the_replay_warms_up_on_the_train_split_only_once() -> None:
    """A drift at the very start of the test split is found: the train split was the
    stream's history, so the baselines are warm by then."""
    g = planted_group(fault=(0, 40))
    pred = replay_group(g, [f"s{m}" for m in range(6)], OnlineConfig(continuity=2), 8, 4)
    assert pred[:8, 2].any() and not pred[:, [0, 1, 3, 4, 5]].any()


def blocks_of(pred: np.ndarray, label: np.ndarray, window: int = 4, ppd: float = 10.0) -> Any:
    starts = window_starts(label.shape[1], window, window)
    present = np.ones(label.shape, dtype=bool)
    return day_blocks(pred, label, starts, window, np.arange(label.shape[0]), present, ppd)


def test_day_blocks_put_segments_and_false_alarms_in_their_server_day() -> None:
    label = np.zeros((2, 40), dtype=np.uint8)
    label[0, 12:16] = 1  # server 0, day 1 (10 points a day)
    label[1, 24:28] = 1  # server 1, day 2
    pred = np.zeros((10, 2), dtype=bool)
    pred[3, 0] = True  # window 12-15: finds server 0's segment
    pred[8, 0] = True  # window 32-35: a false alarm in server 0's day 3
    b = blocks_of(pred, label)
    assert b.segment_block.tolist() == [1, 4 + 2]  # 4 blocks per server
    assert b.segment_delay.tolist() == [3, -1]
    assert b.block_false_alarms.tolist() == [0, 0, 0, 1, 0, 0, 0, 0]
    assert b.block_days == pytest.approx([1.0] * 8)


def test_compare_a_detector_that_finds_more_sooner_and_quieter_is_clear() -> None:
    days, per_day = 40, 10
    label = np.zeros((1, days * per_day), dtype=np.uint8)
    good = np.zeros((days * per_day // 2, 1), dtype=bool)  # windows of 2 points
    bad = good.copy()
    for d in range(days):
        first = d * per_day + 4
        label[0, first : first + 4] = 1
        good[first // 2, 0] = True  # found in its first window: 1 point
        if d % 2 == 0:
            bad[first // 2 + 1, 0] = True  # half of them, a window later: 3 points
        if d % 3 == 0:
            bad[(d * per_day) // 2, 0] = True  # and a false alarm every third day

    def blocks(pred: np.ndarray) -> Any:
        return blocks_of(pred, label, window=2)

    c = compare(blocks(good), blocks(bad), minutes_per_point=5.0)
    assert c["segments_detected"]["difference"] == 20
    assert c["detect_minutes_median"]["difference"] == -10.0
    assert c["false_alarms_per_machine_day"]["difference"] == pytest.approx(-14 / 40, abs=1e-3)
    assert c["clear_on_all_three"] is True
    same = compare(blocks(good), blocks(good), minutes_per_point=5.0)
    assert same["segments_detected"]["ci95"] == [0.0, 0.0]
    assert same["clear_on_all_three"] is False
