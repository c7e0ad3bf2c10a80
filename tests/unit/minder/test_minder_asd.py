"""Minder against the baseline on the real ASD group (``../shared/data/asd``), with the
leave-one-server-out protocol of the study and no denoising (no torch, ~5 s); the full
study with trained denoisers and every ablation is ``benchmarks/bench_minder.py --asd``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rankwatch.streams.minder import similarity
from rankwatch.streams.minder.detector import MinderConfig, MinderModel
from rankwatch.streams.minder.study import baseline_loso, group_from_arrays, minder_loso

ASD = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "asd"


def test_similarity_beats_mahalanobis_on_asd() -> None:
    if not ASD.is_dir():
        pytest.skip("../shared/data is absent")
    parts = []
    for i in range(1, 7):
        with np.load(ASD / f"omi-{i}.npz", allow_pickle=False) as z:
            parts.append((z["train"], z["test"], z["test_label"]))
    group = group_from_arrays(parts)
    config = MinderConfig(window=8, stride=4, denoise=False)
    minder, folds = minder_loso(group, MinderModel(metrics=group.metrics), config)
    base, _ = baseline_loso(group, config)
    assert minder.f1 > base.f1 + 0.05, (minder, base)
    assert minder.f1 == pytest.approx(0.275, abs=0.01)
    assert base.f1 == pytest.approx(0.179, abs=0.01)
    assert minder.mean_delay_points is not None and base.mean_delay_points is not None
    assert minder.mean_delay_points < base.mean_delay_points
    assert len(folds) == 6


def test_batched_scores_equal_window_by_window(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((6, 300))
    starts = similarity.window_starts(300, 8, 4)
    batched = similarity.window_scores(x, starts, 8, 0.02)
    monkeypatch.setattr(similarity, "BATCH_ELEMENTS", 0)
    looped = similarity.window_scores(x, starts, 8, 0.02)
    assert np.allclose(batched, looped, atol=1e-4)
