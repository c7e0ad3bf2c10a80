"""The default detector (``streams/minder/blend.py``): peer metrics, own history, one unit."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.streams.minder.blend import (
    blend_decide,
    blend_scores,
    explained_share,
    fit_blend,
    peer_metrics,
    still_peers,
)


def fleet(machines: int = 6, points: int = 1200, seed: int = 0) -> np.ndarray:
    """(M, T, 2): metric 0 follows a cycle every machine shares, metric 1 is each
    machine's own noise around its own level."""
    rng = np.random.default_rng(seed)
    t = np.arange(points)
    shared = 0.5 + 0.3 * np.sin(2 * np.pi * t / 96)
    x = np.empty((machines, points, 2))
    for m in range(machines):
        x[m, :, 0] = shared + 0.02 * rng.standard_normal(points)
        x[m, :, 1] = 0.2 + 0.1 * m + 0.05 * rng.standard_normal(points)
    return x


def test_only_the_metric_that_moves_with_the_peers_is_a_peer_metric() -> None:
    assert peer_metrics(fleet()) == (0,)


def test_machines_out_of_step_have_no_peer_metric_and_own_history_decides() -> None:
    x = fleet()
    rolled = np.stack([np.roll(x[m], 17 * m, axis=0) for m in range(x.shape[0])])
    fit = fit_blend(rolled[:, :800], window=8, stride=4)
    assert fit.peer_k == () and fit.peer_train_KNM.shape[0] == 0
    test = rolled[:, 800:].copy()
    test[2, 200:260, 1] += 0.5  # machine 2 leaves its own level
    hit = blend_decide(blend_scores(fit, test, 0.99), continuity=2)
    assert hit[51:63, 2].all()  # windows 50-63 lie inside the fault
    assert hit[:, [0, 1, 3, 4, 5]].sum() <= 4  # the others: a stray window at most


def test_a_machine_leaving_the_shared_cycle_is_found_through_its_peers() -> None:
    x = fleet()
    fit = fit_blend(x[:, :800], window=8, stride=4)
    test = x[:, 800:].copy()
    test[4, 100:160, 0] = 0.5  # machine 4 stops following the cycle: its level stays usual
    scores = blend_scores(fit, test, 0.99)
    hit = blend_decide(scores, continuity=2)
    assert hit[25:38, 4].sum() >= 8
    assert hit[:, [0, 1, 2, 3, 5]].sum() <= 4


def test_a_healthy_fleet_sits_near_its_own_quantile() -> None:
    x = fleet(seed=1)
    fit = fit_blend(x[:, :800], window=8, stride=4)
    scores = blend_scores(fit, x[:, 800:], 0.95)
    assert 0.02 < float(np.mean(scores > 1.0)) < 0.15  # about 5% of healthy windows
    assert float(np.mean(blend_decide(scores, continuity=3))) < 0.01  # runs of three: rare


def test_missing_points_are_not_scored() -> None:
    x = fleet()
    fit = fit_blend(x[:, :800], window=8, stride=4)
    test = x[:, 800:].copy()
    test[1, 40:48] = np.nan
    scores = blend_scores(fit, test, 0.95)
    assert np.isnan(scores[10, 1]) and not np.isnan(scores[10, 0])
    assert not blend_decide(scores, 1)[10, 1]


def test_peers_in_step_in_the_history_and_out_of_step_when_scored_lose_their_peer_half() -> None:
    x = fleet()
    fit = fit_blend(x[:, :800], window=8, stride=4)
    assert fit.peer_k == (0,)
    test = x[:, 800:].copy()
    out_of_step = np.stack([np.roll(test[m], 13 * m, axis=0) for m in range(test.shape[0])])
    assert still_peers(fit, test) == [0] and still_peers(fit, out_of_step) == []
    # scored without its peer half, the shifted fleet looks like its own history
    assert float(np.mean(blend_decide(blend_scores(fit, out_of_step, 0.99), 3))) < 0.02


def test_a_metric_a_machine_never_moved_does_not_swamp_its_score() -> None:
    """Without a floor its variance is ~0, its weight ~1e9, and a change of 0.01 (half
    the floor) would score in the thousands."""
    x = fleet()
    x[3, :, 1] = 0.5  # machine 3's own metric never moved in its history
    fit = fit_blend(x[:, :800], window=8, stride=4)
    test = x[:, 800:].copy()
    test[3, :, 1] = 0.51
    assert float(np.nanmax(blend_scores(fit, test, 0.95)[:, 3])) < 3.0


def test_a_constant_metric_is_no_peer_metric() -> None:
    """Its share would be rounding noise over rounding noise, often near 1."""
    x = fleet()
    x[:, :, 1] = 0.3
    assert peer_metrics(x) == (0,)
    assert np.isnan(explained_share(x)[1])


def test_a_machine_without_a_complete_train_window_is_scored_by_its_peer_half() -> None:
    x = fleet()
    train = x[:, :800].copy()
    train[2, ::5, 1] = np.nan  # every window of machine 2 misses a point of metric 1
    fit = fit_blend(train, window=8, stride=4)
    assert fit.references[2] is None and fit.peer_k == (0,)
    scores = blend_scores(fit, x[:, 800:], 0.95)
    assert np.isfinite(scores[:, 2]).all()


def test_a_train_split_that_can_score_nothing_is_a_clear_error() -> None:
    x = fleet()
    empty = x.copy()
    empty[:, :, 1] = np.nan
    with pytest.raises(ValueError, match=r"column\(s\) 1 have no value"):
        fit_blend(empty, window=8, stride=4)
    rng = np.random.default_rng(0)
    holes = rng.normal(0.5, 0.05, (4, 400, 2))  # no shared movement: no peer metric
    holes[:, ::5, 0] = np.nan
    with pytest.raises(ValueError, match="nothing can be scored"):
        fit_blend(holes, window=8, stride=4)
