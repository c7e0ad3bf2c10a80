"""Residual scoring (each machine against its peers and its own usual offset) and the
fused decision over several metrics (``docs/minder.md``, "Residual scoring")."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankwatch.streams.minder import MinderConfig, MinderModel, detect
from rankwatch.streams.minder.detector import (
    FUSED,
    calibrate_fused,
    decide,
    fused_scores,
    metric_scores,
)
from rankwatch.streams.minder.residual import fit_own_baseline, residual_scores
from rankwatch.streams.minder.similarity import may_have_gaps, window_starts

FLOOR = 0.02
CONFIG = MinderConfig(window=16, stride=16, continuity=2, denoise=False, scoring="residual")


def machines(m: int = 8, t: int = 320, k: int = 3, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = 0.5 + 0.3 * np.sin(np.arange(t) / 9.0)[None, :, None]
    return np.asarray(base + 0.02 * rng.standard_normal((m, t, k)))


def test_a_lasting_offset_is_learnt_and_a_departure_from_it_scores_in_floor_units() -> None:
    base = 0.5 + 0.2 * np.sin(np.arange(64) / 5.0)
    train = np.tile(base, (5, 1))
    train[4] += 0.1  # machine 4 always runs 0.1 above its peers
    own = fit_own_baseline(train[:, :, None], FLOOR)
    assert own.loc_KM[0].tolist() == pytest.approx([0, 0, 0, 0, 0.1])
    assert own.scale_KM[0].tolist() == [FLOOR] * 5  # no spread at all: the floor
    test = train.copy()
    test[4, 16:32] += 3 * FLOOR  # three units beyond its usual offset, one window
    s = residual_scores(test, window_starts(64, 16, 16), 16, own.loc_KM[0], own.scale_KM[0])
    assert s[:, :4].tolist() == [[0.0] * 4] * 4
    assert s[:, 4].tolist() == pytest.approx([0.0, 3.0, 0.0, 0.0])


def test_an_offset_that_peer_scoring_flags_is_normal_for_residual_scoring() -> None:
    x = machines()
    x[2] += 0.2  # a machine built differently, always
    model = MinderModel(metrics=("a", "b", "c"), thresholds={"a": 4.0, "b": 4.0, "c": 4.0})
    model = replace(model, own=fit_own_baseline(x[:, :160], FLOOR), peer_scale={"a": FLOOR})
    assert detect(x[:, 160:], model, replace(CONFIG, scoring="peer")).confirmed_NM[1:, 2].all()
    assert not detect(x[:, 160:], model, CONFIG).confirmed_NM.any()


@settings(max_examples=30, deadline=None)
@given(
    shift=st.floats(-0.3, 0.3),
    amp=st.floats(0.0, 0.5),
    period=st.floats(3.0, 50.0),
)
def test_a_load_every_machine_shares_changes_no_score(
    shift: float, amp: float, period: float
) -> None:
    x = machines(k=1)
    shared = shift + amp * np.sin(np.arange(x.shape[1]) / period)
    moved = x + shared[None, :, None]
    starts = window_starts(160, 16, 16)
    own, own_moved = fit_own_baseline(x[:, :160], FLOOR), fit_own_baseline(moved[:, :160], FLOOR)
    a = residual_scores(x[:, 160:, 0], starts, 16, own.loc_KM[0], own.scale_KM[0])
    b = residual_scores(moved[:, 160:, 0], starts, 16, own_moved.loc_KM[0], own_moved.scale_KM[0])
    assert np.allclose(a, b, atol=1e-6)


def test_fused_decision_needs_the_mean_over_metrics_and_names_the_strongest() -> None:
    x = machines(t=480)
    own = fit_own_baseline(x[:, :160], FLOOR)
    test = x[:, 160:].copy()
    test[3, 160:, 0] += 0.5  # one metric, very far
    test[5, 160:, 1] += 0.15  # two metrics, moderately far
    test[5, 160:, 2] += 0.2
    model = MinderModel(metrics=("a", "b", "c"), own=own)
    cfg = replace(CONFIG, fuse=True)
    healthy = metric_scores(x[:, :160], model, cfg)
    level = calibrate_fused(healthy, model, cfg, 1.0)
    assert level == pytest.approx(fused_scores(healthy, model, cfg).max())
    fused = replace(model, thresholds={FUSED: 4.0})
    det = detect(test, fused, cfg)
    assert set(np.nonzero(det.confirmed_NM)[1].tolist()) == {3, 5}
    two = detect(test, replace(fused, priority=("b", "c", "a")), replace(cfg, fuse_metrics=2))
    assert set(np.nonzero(two.confirmed_NM)[1].tolist()) == {5}  # "a" is not fused
    named = two.metric_N[two.confirmed_NM.any(axis=1)]
    assert {model.metrics[k] for k in named} == {"c"}
    conf, _ = decide(metric_scores(test, fused, cfg), fused, cfg)
    assert (conf == det.confirmed_NM).all()


def test_residual_scoring_needs_an_own_baseline_of_the_same_machines() -> None:
    x = machines()
    with pytest.raises(ValueError, match=r"needs MinderModel\.own"):
        detect(x, MinderModel(metrics=("a", "b", "c")), CONFIG)
    own = fit_own_baseline(x[:5], FLOOR)
    with pytest.raises(ValueError, match="knows 5 machines, 8 given"):
        detect(x, MinderModel(metrics=("a", "b", "c"), own=own), CONFIG)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.floats(-1e3, 1e3, width=32), st.just(float("nan"))), min_size=1, max_size=50
    ),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_the_quick_gap_check_never_misses_a_missing_value(values: list[float], dtype: type) -> None:
    x = np.asarray(values, dtype=dtype)
    assert may_have_gaps(x) == bool(np.isnan(x).any())  # finite values: exact either way
