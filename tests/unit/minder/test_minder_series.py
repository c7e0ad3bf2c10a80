"""Unequal and gappy series offline: servers are aligned on time, never on row numbers,
and a server is compared (and scored) only where it has samples."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.streams.minder import MinderConfig, MinderModel, detect
from rankwatch.streams.minder.baseline import fit_reference, window_means
from rankwatch.streams.minder.detector import calibrate_thresholds
from rankwatch.streams.minder.evaluation import score
from rankwatch.streams.minder.grid import align_on_times
from rankwatch.streams.minder.priority import max_z_features
from rankwatch.streams.minder.series import make_split
from rankwatch.streams.minder.similarity import window_scores, window_starts
from rankwatch.streams.minder.study import (
    baseline_loso,
    group_from_arrays,
    group_from_splits,
    minder_loso,
)
from rankwatch.streams.minder.vae import VaeWeights, denoise_series

CONFIG = MinderConfig(window=16, stride=16, continuity=3, threshold=3.0, denoise=False)


def servers(m: int = 8, t: int = 320, k: int = 2, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = 0.5 + 0.3 * np.sin(np.arange(t) / 9.0)[None, :, None]
    return np.clip(base + 0.02 * rng.standard_normal((m, t, k)), 0, 1)


def random_weights() -> VaeWeights:
    rng = np.random.default_rng(0)
    shapes = {
        "enc_w_ih": (16, 1),
        "enc_w_hh": (16, 4),
        "enc_b": (16,),
        "mu_w": (8, 4),
        "mu_b": (8,),
        "dec_w_ih": (16, 8),
        "dec_w_hh": (16, 4),
        "dec_b": (16,),
        "out_w": (1, 4),
        "out_b": (1,),
    }
    return VaeWeights(8, {n: rng.normal(0, 0.5, s).astype(np.float32) for n, s in shapes.items()})


def test_align_on_times_bridges_short_gaps_and_invents_nothing() -> None:
    grid = np.arange(0, 100, 10)
    times = [
        np.array([0, 10, 20, 30, 40, 50, 60, 70, 80, 90]),
        np.array([40, 50, 60, 70, 80, 90]),  # joined late
        np.array([0, 10, 20, 30]),  # left early
        np.array([0, 10, 30, 40, 80, 90]),  # a short gap (20) and a long one (50-70)
    ]
    values = [t[:, None].astype(float) for t in times]
    x = align_on_times(times, values, grid, max_age=10)[:, :, 0]
    assert np.isnan(x[1, :4]).all() and x[1, 4:].tolist() == [40, 50, 60, 70, 80, 90]
    assert x[2, :5].tolist() == [0, 10, 20, 30, 30] and np.isnan(x[2, 5:]).all()
    assert x[3, :6].tolist() == [0, 10, 10, 30, 40, 40]
    assert np.isnan(x[3, 6:8]).all() and x[3, 8:].tolist() == [80, 90]


def test_unequal_lengths_line_up_at_the_split_boundary() -> None:
    """A short train split is a late joiner (it ends where the test split starts); a
    short test split is a server that left early."""
    x = servers(m=4, t=300)
    labels = np.zeros(100, dtype=np.uint8)
    parts = [(x[s, :200], x[s, 200:], labels) for s in range(4)]
    parts[1] = (x[1, 50:200], x[1, 200:], labels)  # 150 train rows, not 200
    parts[2] = (x[2, :200], x[2, 200:270], labels[:70])  # 70 test rows, not 100
    g = group_from_arrays(parts)
    assert g.train_MTK.shape == (4, 200, 2) and g.test_MTK.shape == (4, 100, 2)
    assert np.isnan(g.train_MTK[1, :50]).all()
    ref = group_from_arrays([(x[s, :200], x[s, 200:], labels) for s in range(4)])
    assert np.allclose(g.train_MTK[1, 50:], ref.train_MTK[1, 50:])  # same times, same values
    assert g.present_MT[2].tolist() == [True] * 70 + [False] * 30
    assert np.allclose(g.test_MTK[2, :70], ref.test_MTK[2, :70])


def test_timestamps_with_holes_and_nan_rows() -> None:
    x = servers(m=4, t=100, k=1)[:, :, 0]
    labels = np.zeros(100, dtype=np.uint8)
    train = [make_split(x[s, :, None], "train") for s in range(4)]
    times = np.arange(100) * 5
    keep = (times < 200) | (times >= 300)  # 20 samples missing on server 3
    test = [make_split(x[s, :, None], "test", times, labels) for s in range(3)]
    test.append(make_split(x[3, keep, None], "test", times[keep], labels[keep]))
    g = group_from_splits(train, test)
    assert g.test_MTK.shape[1] == 100  # the grid step (5) comes from the timestamps
    assert g.present_MT[3].sum() == 80 + 2  # a gap of 20 samples: 2 bridged, 18 missing
    rows = x.copy()[:, :, None]
    rows[0, 10] = np.nan  # one lost sample, written as a row of NaN: bridged
    g2 = group_from_arrays([(rows[s, :60], rows[s, 60:], labels[:40]) for s in range(4)])
    assert not np.isnan(g2.train_MTK).any()
    with pytest.raises(ValueError, match="timestamps must increase"):
        make_split(x[0, :3, None], "test", np.array([0, 2, 1]))
    with pytest.raises(ValueError, match="2 labels for 3 rows"):
        make_split(x[0, :3, None], "test", labels=labels[:2])


def test_a_machine_missing_from_a_window_is_not_scored_there() -> None:
    x = servers(m=6, t=64, k=1)[:, :, 0]
    x[5, 20:] = np.nan  # left
    x[4, :20] = np.nan  # joined late
    starts = window_starts(64, 16, 16)
    s = window_scores(x, starts, 16, 0.02)
    assert np.isnan(s[0, 4]) and np.isnan(s[1:, 5]).all() and np.isnan(s[1, 4])
    assert np.isfinite(s[0, :4]).all() and np.isfinite(s[2:, :5]).all()
    alone = window_scores(x[:4, 32:48], np.array([0]), 16, 0.02)
    assert np.allclose(s[2, :4], window_scores(x[:5, 32:48], np.array([0]), 16, 0.02)[0, :4])
    assert alone.shape == (1, 4)
    x[2:, :] = np.nan  # two machines left: no one to compare
    assert np.isnan(window_scores(x, starts, 16, 0.02)).all()


def test_detect_finds_the_drifting_machine_among_late_joiners_and_leavers() -> None:
    x = servers(m=10, t=320, k=2)
    x[7, 160:, 1] -= 0.3  # the faulty one
    x[2, :100] = np.nan  # joined late
    x[3, 200:] = np.nan  # left
    x[4, 50:90] = np.nan  # a long gap
    model = MinderModel(metrics=("a", "b"))
    det = detect(x, model, CONFIG)
    assert set(np.nonzero(det.confirmed_NM)[1].tolist()) == {7}
    weights = random_weights()
    rec = denoise_series(weights, x[:, :, 0])
    assert np.isnan(rec[2, :96]).all() and np.isfinite(rec[2, 104:]).all()  # whole chunks
    detect(x, MinderModel(metrics=("a", "b"), denoisers={"a": weights, "b": weights}), CONFIG)


def test_thresholds_priority_baseline_and_scoring_skip_missing_points() -> None:
    scores = np.full((1, 4, 3), np.nan)
    scores[0, 2:] = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert calibrate_thresholds(scores, ["a"], 1.0) == {"a": 6.0}
    assert calibrate_thresholds(np.full((1, 2, 3), np.nan), ["a"], 0.9) == {"a": 3.0}
    x = servers(m=5, t=40, k=2)
    x[0, :10] = np.nan
    starts = window_starts(40, 10, 10)
    feats = max_z_features(x, starts, 10)
    assert np.isfinite(feats).all()
    means = window_means(x, starts, 10)
    assert np.isnan(means[0, 0]).all() and np.isfinite(means[1:]).all()
    ref = fit_reference(means.reshape(-1, 2))
    assert np.isfinite(ref.mean_K).all()
    label = np.zeros((2, 40), dtype=np.uint8)
    label[0, 5:8] = 1  # labelled while server 0 was away: it cannot be seen
    present = np.ones((2, 40), dtype=bool)
    present[0, :10] = False
    pred = np.zeros((4, 2), dtype=bool)
    pred[0, 1] = True
    s = score(pred, label, starts, 10, present_MT=present)
    assert (s.true_positives, s.false_positives, s.false_negatives) == (0, 1, 0)


def test_the_study_runs_on_unequal_servers() -> None:
    x = servers(m=6, t=900, k=3)
    labels = np.zeros((6, 300), dtype=np.uint8)
    x[3, 700:780, 1] -= 0.4
    labels[3, 100:180] = 1
    parts = [(x[s, :600], x[s, 600:], labels[s]) for s in range(6)]
    parts[0] = (x[0, 200:600], x[0, 600:], labels[0])
    parts[5] = (x[5, :600], x[5, 600:850], labels[5, :250])
    group = group_from_arrays(parts)
    config = MinderConfig(window=8, stride=4, denoise=False)
    minder, folds = minder_loso(group, MinderModel(metrics=group.metrics), config)
    base, _ = baseline_loso(group, config)
    assert minder.segments_detected == 1 and len(folds) == 6
    assert minder.f1 > 0.5 and 0.0 <= base.f1 <= 1.0
