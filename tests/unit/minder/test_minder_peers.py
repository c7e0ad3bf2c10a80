"""Peer scoring, the metric vote, event-level scores and the held-out protocol."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rankwatch.streams.minder import MinderConfig, MinderModel, detect
from rankwatch.streams.minder.detector import decide, fit_peer_scales, metric_scores
from rankwatch.streams.minder.evaluation import alarm_episodes, event_scores, segment_outcomes
from rankwatch.streams.minder.holdout import Choice, Context, _best, holdout_study
from rankwatch.streams.minder.peers import fit_peer_scale, peer_deviation, peer_scores
from rankwatch.streams.minder.serial import model_from_arrays, model_to_arrays
from rankwatch.streams.minder.similarity import window_starts
from rankwatch.streams.minder.study import group_from_arrays

CONFIG = MinderConfig(window=16, stride=16, continuity=2, denoise=False, scoring="peer")


def machines(m: int = 8, t: int = 320, k: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = 0.5 + 0.3 * np.sin(np.arange(t) / 9.0)[None, :, None]
    return np.clip(base + 0.02 * rng.standard_normal((m, t, k)), 0, 1)


def test_peer_deviation_is_from_the_median_of_the_machines_present() -> None:
    x = np.array([[1.0, 1.0], [2.0, np.nan], [3.0, 5.0], [10.0, 7.0]])
    dev = peer_deviation(x)
    assert dev[:, 0].tolist() == [-1.5, -0.5, 0.5, 7.5]  # median 2.5 of four
    assert np.isnan(dev[1, 1]) and dev[:, 1][[0, 2, 3]].tolist() == [-4.0, 0.0, 2.0]
    assert np.isnan(peer_deviation(np.array([[1.0], [np.nan], [2.0]]))).all()  # two left


def test_peer_scale_is_the_healthy_spread_and_scores_are_in_its_units() -> None:
    rng = np.random.default_rng(0)
    train = 0.5 + 0.05 * rng.standard_normal((50, 2000))
    assert fit_peer_scale(train, floor=0.0) == pytest.approx(0.05, rel=0.05)
    assert fit_peer_scale(np.full((5, 10), 0.3), floor=0.01) == 0.01
    x = 0.5 + 0.05 * rng.standard_normal((50, 64))
    x[7, 32:] += 0.5  # ten healthy spreads away
    s = peer_scores(x, window_starts(64, 16, 16), 16, 0.05)
    assert s[2:, 7].min() > 9 and np.median(s) == pytest.approx(1.0, abs=0.2)


def test_the_vote_needs_several_metrics_to_agree() -> None:
    x = machines()
    x[3, 160:, 0] += 0.3  # one metric only
    x[5, 160:, 1] += 0.3  # two metrics
    x[5, 160:, 2] += 0.3
    model = MinderModel(metrics=("a", "b", "c"), thresholds={"a": 5.0, "b": 5.0, "c": 5.0})
    model = replace(model, peer_scale=fit_peer_scales(machines(seed=1), model.metrics, 0.01))
    one = detect(x, model, replace(CONFIG, vote=1))
    assert set(np.nonzero(one.confirmed_NM)[1].tolist()) == {3, 5}
    two = detect(x, model, replace(CONFIG, vote=2))
    assert set(np.nonzero(two.confirmed_NM)[1].tolist()) == {5}
    assert model.metrics[int(two.metric_N[np.nonzero(two.confirmed_NM)[0][0]])] in ("b", "c")
    only_a = detect(
        x, replace(model, priority=("a", "b", "c")), replace(CONFIG, vote=1, vote_metrics=1)
    )
    assert set(np.nonzero(only_a.confirmed_NM)[1].tolist()) == {3}
    conf, _ = decide(metric_scores(x, model, CONFIG), model, replace(CONFIG, vote=2))
    assert (conf == two.confirmed_NM).all()
    back = model_from_arrays(model_to_arrays(model))
    assert back.peer_scale == pytest.approx(model.peer_scale)


def test_event_scores_count_segments_delays_and_false_alarms() -> None:
    assert alarm_episodes(np.array([0, 1, 1, 0, 1], dtype=bool)) == [(1, 2), (4, 4)]
    label = np.zeros((2, 40), dtype=np.uint8)
    label[0, 10:14] = 1
    label[1, 30:34] = 1
    starts = window_starts(40, 4, 4)
    pred = np.zeros((10, 2), dtype=bool)
    pred[[3, 4], 0] = True  # server 0: segment found at window 3 (ends at point 15)
    pred[[6], 0] = True  # server 0: an alarm on unlabelled points
    present = np.ones((2, 40), dtype=bool)
    e = event_scores(pred, label, starts, 4, np.array([0, 1]), present, points_per_day=40)
    assert (e.segments, e.detected, e.delays_points, e.false_alarms) == (2, 1, (5,), 1)
    assert e.machine_days == 2.0
    assert e.point_precision == pytest.approx(2 / 12) and e.point_recall == pytest.approx(2 / 8)
    out = e.to_json(minutes_per_point=5)
    assert out["detect_minutes_median"] == 25 and out["false_alarms_per_machine_day"] == 0.5


@pytest.mark.parametrize("fa_budget", [None, 1.0])
def test_holdout_never_reads_the_held_out_labels_before_scoring(fa_budget: float | None) -> None:
    rng = np.random.default_rng(4)
    x = machines(m=6, t=900, k=3)
    labels = np.zeros((6, 300), dtype=np.uint8)
    for s, (a, b) in enumerate(
        [(20, 60), (80, 120), (140, 180), (200, 240), (100, 150), (250, 290)]
    ):
        x[s, 600 + a : 600 + b, rng.integers(3)] += 0.3
        labels[s, a:b] = 1
    group = group_from_arrays([(x[s, :600], x[s, 600:], labels[s]) for s in range(6)])
    config = MinderConfig(window=8, stride=4, denoise=False)
    model = MinderModel(metrics=group.metrics)
    out = holdout_study(
        group, model, config, dev=[0, 1, 2, 3], held=[4, 5], points_per_day=288, fa_budget=fa_budget
    )
    scrambled = group_from_arrays(
        [(x[s, :600], x[s, 600:], labels[s] if s < 4 else labels[0]) for s in range(6)]
    )
    again = holdout_study(
        scrambled,
        model,
        config,
        dev=[0, 1, 2, 3],
        held=[4, 5],
        points_per_day=288,
        fa_budget=fa_budget,
    )
    for name in ("minder", "minder_peer", "minder_fused", "baseline"):
        assert out[name]["chosen"] == again[name]["chosen"]  # chosen without servers 4, 5
        assert out[name]["held_out"]["segments"] == 2
        assert [s["server"] for s in out[name]["held_out_segments"]] == [4, 5]
    assert out["minder_peer"]["held_out"]["segments_detected"] == 2


def test_segment_outcomes_name_each_segment_and_its_delay() -> None:
    labels = np.zeros((2, 40), dtype=np.uint8)
    labels[0, 5:9] = 1  # reported by the window [4, 12): delay 11 - 5 = 6
    labels[0, 30:33] = 1  # never reported
    labels[1, 0:20] = 1  # reported by the window [0, 8) as it starts: delay 7
    starts = window_starts(40, 8, 4)
    pred = np.zeros((starts.size, 2), dtype=bool)
    pred[1, 0] = True
    pred[0, 1] = True
    out = segment_outcomes(pred, labels, starts, 8, np.array([0, 1]))
    assert out == [(0, 5, 8, 6), (0, 30, 32, None), (1, 0, 19, 7)]
    assert segment_outcomes(pred, labels, starts, 8, np.array([1])) == [(1, 0, 19, 7)]


def _two_settings() -> tuple[Context, list[tuple[Choice, np.ndarray]]]:
    """Two development servers of 1 day (288 points, 71 windows of 8, stride 4), one
    labelled segment each. "eager" finds both segments and raises 3 false alarms;
    "quiet" finds one segment and raises none."""
    labels = np.zeros((2, 288), dtype=np.uint8)
    labels[0, 40:60] = 1
    labels[1, 200:220] = 1
    x = np.zeros((2, 288, 1))
    group = group_from_arrays([(x[s], x[s], labels[s]) for s in range(2)])
    starts = window_starts(288, 8, 4)
    ctx = Context(group, starts, 8, np.array([0, 1]), np.zeros(0, dtype=np.int64), 288.0)
    eager = np.zeros((starts.size, 2), dtype=bool)
    eager[10, 0] = eager[50, 1] = True  # windows [40, 48) and [200, 208): both segments
    eager[[25, 35], 0] = eager[65, 1] = True  # three alarms on unlabelled points
    quiet = np.zeros_like(eager)
    quiet[11, 0] = True  # [44, 52): the first segment only
    return ctx, [(Choice("x", 0.9, 1), eager), (Choice("x", 0.99, 1), quiet)]


def test_a_false_alarm_budget_picks_the_most_segments_it_allows() -> None:
    ctx, settings = _two_settings()
    by_f1 = _best(ctx, iter(settings))
    tight = _best(replace(ctx, fa_budget=0.5), iter(settings))  # 3 alarms in 2 days: 1.5/day
    loose = _best(replace(ctx, fa_budget=2.0), iter(settings))
    assert (tight[0].quantile, tight[1]) == (0.99, 1.0)  # one segment, within budget
    assert (loose[0].quantile, loose[1]) == (0.9, 2.0)  # both segments, 1.5/day allowed
    assert by_f1[0].quantile == 0.9 and by_f1[1] == pytest.approx(ctx.dev_f1(settings[0][1]))


def test_when_no_setting_fits_the_budget_the_quietest_is_taken() -> None:
    ctx, settings = _two_settings()
    noisy = settings[1][1].copy()
    noisy[[30, 40], 1] = True  # two false alarms: 1/day, above a budget of 0.1
    chosen = _best(replace(ctx, fa_budget=0.1), iter([settings[0], (settings[1][0], noisy)]))
    assert chosen[0].quantile == 0.99
