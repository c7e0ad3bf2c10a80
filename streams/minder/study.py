"""The offline study: Minder and the Mahalanobis baseline on a labelled server group.

Protocol: leave one server out. To score server h, everything that uses labels is
chosen on the test labels of the *other* servers only, never on h's:
- the detector's models are trained on the train split (by the caller, no labels);
- thresholds are a quantile of the top machine's score over the train split's
  windows, per metric (Minder) or over all servers (baseline), so they carry to a
  group never seen; which quantile, and how many windows of continuity, is picked
  from a small grid by F1 on the other servers;
- the metric priority is learnt from the other servers' labelled windows.
The group is then detected and only h is scored; the held-out scorings are pooled
into one precision/recall/F1. Caveat: servers of one group share anomaly times, so
the other servers' labels say something about when h was anomalous; the protocol
keeps h's own labels out, not the group's timing.

Legend: M servers, T points, K metrics, N windows.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.baseline import fit_reference, mahalanobis, window_means
from rankwatch.streams.minder.continuity import confirm
from rankwatch.streams.minder.detector import (
    MinderConfig,
    MinderModel,
    calibrate_thresholds,
    decide,
    metric_scores,
)
from rankwatch.streams.minder.evaluation import Scores, score, window_labels
from rankwatch.streams.minder.priority import max_z_features, rank_metrics
from rankwatch.streams.minder.series import Split, align_splits, common_grid, grid_step, make_split
from rankwatch.streams.minder.similarity import window_starts

F64 = NDArray[np.float64]
QUANTILES = (0.9, 0.95, 0.98, 0.99, 0.995)
CONTINUITY = (1, 2, 3)


MAX_GAP = 2
"""Grid steps a missing sample may be bridged by repeating the last one."""


@dataclass(frozen=True)
class Group:
    """One server group's splits on common time grids, normalised; NaN where a server
    has no sample (``series``)."""

    metrics: tuple[str, ...]
    train_MTK: F64
    test_MTK: F64
    label_MT: NDArray[np.uint8]

    @property
    def present_MT(self) -> NDArray[np.bool_]:
        """Where each server has a test sample."""
        return np.asarray(~np.isnan(self.test_MTK).all(axis=2))


def group_from_splits(
    train: Sequence[Split], test: Sequence[Split], max_gap: int = MAX_GAP
) -> Group:
    """Per server its train and test :class:`Split` -> a group aligned on timestamps and
    normalised by the train split's per-metric bounds, not clipped: a test value beyond
    them stays."""
    if len(train) != len(test) or not train:
        raise ValueError("one train and one test split per server, at least one server")
    widths = {s.values.shape[1] for s in (*train, *test)}
    if len(widths) != 1:
        raise ValueError(f"servers disagree on the number of metrics: {sorted(widths)}")
    parts = []
    for splits in (train, test):
        step = grid_step(splits)
        parts.append(align_splits(splits, common_grid(splits, step), step, max_gap))
    (train_x, _), (test_x, labels) = parts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a metric never sampled: NaN bounds
        low, high = np.nanmin(train_x, axis=(0, 1)), np.nanmax(train_x, axis=(0, 1))
    low, high = np.nan_to_num(low), np.nan_to_num(high)
    span = np.where(high > low, high - low, 1.0)
    metrics = tuple(f"m{k + 1}" for k in range(train_x.shape[2]))
    return Group(metrics, (train_x - low) / span, (test_x - low) / span, labels)


def group_from_arrays(parts: Sequence[tuple[NDArray, NDArray, NDArray]]) -> Group:
    """Per server (train [T, K], test [T, K], test_label [T]) without timestamps: rows
    placed by :func:`rankwatch.streams.minder.series.implied_times`, any lengths."""
    return group_from_splits(
        [make_split(p[0], "train") for p in parts],
        [make_split(p[1], "test", labels=p[2]) for p in parts],
    )


@dataclass(frozen=True)
class Fold:
    server: int
    quantile: float
    continuity: int
    priority: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "held_out": self.server,
            "quantile": self.quantile,
            "continuity": self.continuity,
            "priority_top5": list(self.priority[:5]),
        }


def _score(
    group: Group,
    pred_NM: NDArray[np.bool_],
    starts: NDArray[np.int64],
    window: int,
    servers: NDArray[np.int64] | None = None,
) -> Scores:
    return score(pred_NM, group.label_MT, starts, window, servers, group.present_MT)


def minder_loso(
    group: Group,
    model: MinderModel,
    config: MinderConfig,
    continuity: Sequence[int] = CONTINUITY,
    quantiles: Sequence[float] = QUANTILES,
) -> tuple[Scores, list[Fold]]:
    train_scores = metric_scores(group.train_MTK, model, config)
    test_scores = metric_scores(group.test_MTK, model, config)
    starts = window_starts(group.test_MTK.shape[1], config.window, config.stride)
    truth = window_labels(group.label_MT, starts, config.window)
    feats = max_z_features(group.test_MTK, starts, config.window)
    thresholds = {q: calibrate_thresholds(train_scores, group.metrics, q) for q in quantiles}
    m = group.test_MTK.shape[0]
    pred = np.zeros((starts.size, m), dtype=bool)
    folds: list[Fold] = []
    for h in range(m):
        others = np.array([j for j in range(m) if j != h])
        labelled = np.asarray(truth[:, others].any(axis=1))
        order = tuple(group.metrics[k] for k in rank_metrics(feats, labelled))
        best: tuple[float, Fold, NDArray[np.bool_]] | None = None
        for q in quantiles:
            for c in continuity:
                fitted = replace(model, priority=order, thresholds=thresholds[q])
                conf, _ = decide(test_scores, fitted, replace(config, continuity=c))
                f1 = _score(group, conf, starts, config.window, others).f1
                if best is None or f1 > best[0]:
                    best = (f1, Fold(h, q, c, order), conf)
        assert best is not None
        folds.append(best[1])
        pred[:, h] = best[2][:, h]
    return _score(group, pred, starts, config.window), folds


def baseline_loso(
    group: Group,
    config: MinderConfig,
    continuity: Sequence[int] = (1,),
    quantiles: Sequence[float] = QUANTILES,
) -> tuple[Scores, list[Fold]]:
    """Mahalanobis distance of each server's window means to the train split's windows."""
    train_starts = window_starts(group.train_MTK.shape[1], config.window, config.stride)
    train_f = window_means(group.train_MTK, train_starts, config.window)
    ref = fit_reference(train_f.reshape(-1, train_f.shape[2]))
    train_d = mahalanobis(train_f, ref)
    starts = window_starts(group.test_MTK.shape[1], config.window, config.stride)
    d = mahalanobis(window_means(group.test_MTK, starts, config.window), ref)
    m = group.test_MTK.shape[0]
    pred = np.zeros((starts.size, m), dtype=bool)
    folds: list[Fold] = []
    for h in range(m):
        others = np.array([j for j in range(m) if j != h])
        best: tuple[float, Fold, NDArray[np.bool_]] | None = None
        for q in quantiles:
            for c in continuity:
                conf = confirm(d > float(np.nanquantile(train_d, q)), c)
                f1 = _score(group, conf, starts, config.window, others).f1
                if best is None or f1 > best[0]:
                    best = (f1, Fold(h, q, c, ()), conf)
        assert best is not None
        folds.append(best[1])
        pred[:, h] = best[2][:, h]
    return _score(group, pred, starts, config.window), folds


def study(group: Group, models: dict[str, MinderModel], config: MinderConfig) -> dict[str, Any]:
    """Minder, the baseline and the ablations; ``models`` holds "minder" (per-metric
    denoisers) and optionally "joint" (one model for all metrics)."""
    main, folds = minder_loso(group, models["minder"], config)
    base, base_folds = baseline_loso(group, config)
    ablations: dict[str, Any] = {
        "no_denoising": minder_loso(group, models["minder"], replace(config, denoise=False)),
        "no_continuity": minder_loso(group, models["minder"], config, continuity=(1,)),
        "no_priority": minder_loso(group, models["minder"], replace(config, use_priority=False)),
        "baseline_with_continuity": baseline_loso(group, config, continuity=CONTINUITY),
    }
    if "joint" in models:
        ablations["one_joint_model"] = minder_loso(group, models["joint"], config)
    return {
        "minder": main.to_json(),
        "baseline": base.to_json(),
        "folds": {
            "minder": [f.to_json() for f in folds],
            "baseline": [f.to_json() for f in base_folds],
        },
        "ablations": {name: result[0].to_json() for name, result in ablations.items()},
        "protocol": {
            "window_points": config.window,
            "stride_points": config.stride,
            "quantiles": list(QUANTILES),
            "continuity_windows": list(CONTINUITY),
            "selection": "leave-one-server-out: per held-out server, quantile and continuity "
            "by F1 on the other servers, thresholds = that quantile of the train split's scores",
        },
    }
