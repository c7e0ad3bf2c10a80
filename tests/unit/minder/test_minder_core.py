"""Minder's pure pieces: grid, similarity, continuity, priority, baseline, scoring."""

from __future__ import annotations

import numpy as np
import pytest

from rankwatch.streams.minder.baseline import fit_reference, mahalanobis, window_means
from rankwatch.streams.minder.continuity import confirm, run_lengths
from rankwatch.streams.minder.evaluation import score, segments, window_labels
from rankwatch.streams.minder.grid import align_to_grid, fill_gaps, normalise
from rankwatch.streams.minder.priority import max_z_features, rank_metrics
from rankwatch.streams.minder.similarity import mean_distances, normalised_scores, window_starts


def test_align_takes_the_last_sample_and_fills_the_lead() -> None:
    times = [np.array([10, 20, 40]), np.array([25])]
    values = [np.array([[1.0], [2.0], [4.0]]), np.array([[7.0]])]
    x = align_to_grid(times, values, np.array([10, 20, 30, 40, 50]))
    assert x[0, :, 0].tolist() == [1, 2, 2, 4, 4]
    assert x[1, :, 0].tolist() == [7, 7, 7, 7, 7]


def test_fill_gaps_forward_then_backward() -> None:
    x = np.array([[[np.nan, 1.0], [2.0, np.nan], [np.nan, np.nan], [5.0, 3.0]]])
    out = fill_gaps(x)
    assert out[0, :, 0].tolist() == [2, 2, 2, 5]
    assert out[0, :, 1].tolist() == [1, 1, 1, 3]
    assert fill_gaps(np.full((1, 3, 1), np.nan)).tolist() == [[[0.0], [0.0], [0.0]]]


def test_normalise_by_bounds_and_constant_metric() -> None:
    x = np.array([[[0.0, 5.0], [50.0, 5.0], [150.0, 5.0]]])
    out = normalise(x, np.array([0.0, 5.0]), np.array([100.0, 5.0]))
    assert out[0, :, 0].tolist() == [0.0, 0.5, 1.0]
    assert out[0, :, 1].tolist() == [0.0, 0.0, 0.0]


def test_window_starts() -> None:
    assert window_starts(10, 4, 3).tolist() == [0, 3, 6]
    assert window_starts(3, 4, 1).size == 0
    with pytest.raises(ValueError):
        window_starts(10, 0, 1)


def test_the_odd_machine_out_has_the_top_score() -> None:
    rng = np.random.default_rng(0)
    w = np.sin(np.linspace(0, 3, 32))[None, :] + 0.01 * rng.standard_normal((20, 32))
    w[7] += 0.3
    d = mean_distances(w)
    rms = [[np.sqrt(np.mean((w[i] - w[j]) ** 2)) for j in range(20) if j != i] for i in range(20)]
    brute = np.mean(rms, axis=1)
    assert np.allclose(d, brute)
    s = normalised_scores(d, floor=0.02)
    assert int(np.argmax(s)) == 7 and s[7] > 5 and np.sort(s)[-2] < 1


def test_continuity_counts_consecutive_windows() -> None:
    c = np.array([[1, 0], [1, 1], [0, 1], [1, 1]], dtype=bool)
    assert run_lengths(c).tolist() == [[1, 0], [2, 1], [0, 2], [1, 3]]
    assert confirm(c, 2).tolist() == [[False, False], [True, False], [False, True], [False, True]]
    assert confirm(c, 1).tolist() == c.tolist()


def test_priority_puts_the_telling_metric_first() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0.5, 0.01, (8, 400, 3))
    faulty = np.zeros(400 // 20, dtype=bool)
    for n in range(0, 20, 3):
        x[n % 8, n * 20 : n * 20 + 20, 2] += 0.5
        faulty[n] = True
    starts = window_starts(400, 20, 20)
    feats = max_z_features(x, starts, 20)
    assert rank_metrics(feats, faulty)[0] == 2


def test_mahalanobis_matches_the_formula() -> None:
    rng = np.random.default_rng(2)
    ref = fit_reference(rng.normal(size=(500, 3)), shrinkage=0.0)
    v = np.array([1.0, -2.0, 0.5])
    d = v - ref.mean_K
    assert mahalanobis(v, ref) == pytest.approx(np.sqrt(d @ ref.precision_KK @ d))
    x = np.arange(12, dtype=float).reshape(1, 6, 2)
    assert window_means(x, np.array([0, 3]), 3)[:, 0].tolist() == [[2.0, 3.0], [8.0, 9.0]]


def test_scores_and_delay() -> None:
    label = np.zeros((2, 20), dtype=np.uint8)
    label[0, 5:9] = 1
    assert segments(label[0]) == [(5, 8)]
    starts = window_starts(20, 4, 4)
    truth = window_labels(label, starts, 4)
    assert truth[:, 0].tolist() == [False, True, True, False, False]
    pred = np.zeros_like(truth)
    pred[2, 0] = True
    pred[4, 1] = True
    s = score(pred, label, starts, 4)
    assert (s.true_positives, s.false_positives, s.false_negatives) == (1, 1, 1)
    assert s.precision == 0.5 and s.recall == 0.5 and s.f1 == 0.5
    assert s.mean_delay_points == 11 - 5
    assert score(pred, label, starts, 4, servers=np.array([1])).false_positives == 1
