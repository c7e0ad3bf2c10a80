"""Minder: similarity + continuity + denoising + metric priority, in one detection call.

Input: one job's metrics on a common grid, normalised to [0, 1] (``grid``), x_MTK;
NaN where a machine has no sample (it is then not compared in that window).
Per metric in priority order: denoise each machine's series with the metric's VAE,
cut it into windows, score each machine per window (``similarity``), mark
candidates above the metric's threshold, keep those that last (``continuity``). At
each window the first metric (in priority order) that confirms a machine names it;
later metrics are computed only while some window is still undecided.

Legend: M machines, T grid points, K metrics, N windows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.continuity import confirm
from rankwatch.streams.minder.similarity import window_scores, window_starts
from rankwatch.streams.minder.vae import VaeWeights, denoise_joint, denoise_series

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class MinderConfig:
    """Plain values of one detector; windows are counted in grid points."""

    window: int = 64
    stride: int = 64
    continuity: int = 4
    """Consecutive candidate windows before a machine is reported (1 = no continuity)."""
    threshold: float = 3.0
    """Score threshold for metrics with no calibrated threshold of their own."""
    floor: float = 0.02
    denoise: bool = True
    """False: distances on the raw normalised windows (ablation "no denoising")."""
    use_priority: bool = True
    """False: report every metric's confirmed machines (no early stop)."""


@dataclass(frozen=True)
class MinderModel:
    """What Minder learns: per-metric denoisers, the metric order and thresholds."""

    metrics: tuple[str, ...]
    denoisers: Mapping[str, VaeWeights] = field(default_factory=dict)
    priority: tuple[str, ...] = ()
    """Metric names, most telling first; empty: the order of ``metrics``."""
    thresholds: Mapping[str, float] = field(default_factory=dict)
    joint: VaeWeights | None = None
    """Set only for the ablation "one joint model" (replaces the per-metric models)."""

    def order(self) -> list[int]:
        names = self.priority or self.metrics
        return [self.metrics.index(n) for n in names if n in self.metrics]


@dataclass(frozen=True)
class Detection:
    starts: NDArray[np.int64]
    """(N,) window start indices on the grid."""
    scores_KNM: F64
    """Scores per metric (NaN where the metric was not computed)."""
    confirmed_NM: NDArray[np.bool_]
    """Machines reported at each window."""
    metric_N: NDArray[np.int64]
    """Index of the metric that decided each window, -1 where none did."""

    @property
    def window_count(self) -> int:
        return int(self.starts.size)


def denoised(
    x_MTK: NDArray[np.floating], model: MinderModel, config: MinderConfig, k: int
) -> NDArray:
    name = model.metrics[k]
    if not config.denoise or (model.joint is None and name not in model.denoisers):
        return np.asarray(x_MTK[:, :, k])
    return denoise_series(model.denoisers[name], x_MTK[:, :, k])


def metric_scores(x_MTK: NDArray[np.floating], model: MinderModel, config: MinderConfig) -> F64:
    """Scores of every metric, (K, N, M), with no early stop (calibration, ablations)."""
    starts = window_starts(x_MTK.shape[1], config.window, config.stride)
    joint = _joint(x_MTK, model, config)
    out = np.empty((x_MTK.shape[2], starts.size, x_MTK.shape[0]))
    for k in range(x_MTK.shape[2]):
        series = joint[:, :, k] if joint is not None else denoised(x_MTK, model, config, k)
        out[k] = window_scores(series, starts, config.window, config.floor)
    return out


def _joint(x_MTK: NDArray[np.floating], model: MinderModel, config: MinderConfig) -> NDArray | None:
    if model.joint is None or not config.denoise:
        return None
    return denoise_joint(model.joint, x_MTK)


def detect(
    x_MTK: NDArray[np.floating], model: MinderModel, config: MinderConfig = MinderConfig()
) -> Detection:
    """One detection call over a job's normalised metrics."""
    m, t, k_all = x_MTK.shape
    if k_all != len(model.metrics):
        raise ValueError(f"{k_all} metrics given, the model knows {len(model.metrics)}")
    starts = window_starts(t, config.window, config.stride)
    n = starts.size
    scores = np.full((k_all, n, m), np.nan)
    confirmed = np.zeros((n, m), dtype=bool)
    decided = np.full(n, -1, dtype=np.int64)
    joint = _joint(x_MTK, model, config)
    for k in model.order():
        if config.use_priority and (decided >= 0).all():
            break
        series = joint[:, :, k] if joint is not None else denoised(x_MTK, model, config, k)
        scores[k] = window_scores(series, starts, config.window, config.floor)
        _decide_metric(scores[k], k, model, config, confirmed, decided)
    return Detection(starts, scores, confirmed, decided)


def _decide_metric(
    scores_NM: F64,
    k: int,
    model: MinderModel,
    config: MinderConfig,
    confirmed_NM: NDArray[np.bool_],
    decided_N: NDArray[np.int64],
) -> None:
    """Fold metric k's confirmed machines into the windows it may still decide."""
    threshold = model.thresholds.get(model.metrics[k], config.threshold)
    hits = confirm(scores_NM > threshold, config.continuity)
    new = hits.any(axis=1) & ((decided_N < 0) | (not config.use_priority))
    confirmed_NM[new] |= hits[new]
    decided_N[new & (decided_N < 0)] = k


def decide(scores_KNM: F64, model: MinderModel, config: MinderConfig) -> tuple[NDArray, NDArray]:
    """What :func:`detect` reports, from scores already computed for every metric
    (:func:`metric_scores`): (confirmed_NM, metric_N). Cheap, for studies."""
    _, n, m = scores_KNM.shape
    confirmed = np.zeros((n, m), dtype=bool)
    decided = np.full(n, -1, dtype=np.int64)
    for k in model.order():
        if config.use_priority and (decided >= 0).all():
            break
        _decide_metric(scores_KNM[k], k, model, config, confirmed, decided)
    return confirmed, decided


def calibrate_thresholds(
    scores_KNM: F64,
    metrics: Sequence[str],
    quantile: float,
    minimum: float = 0.0,
    default: float = MinderConfig.threshold,
) -> dict[str, float]:
    """Per metric, the given quantile of the top machine's score over normal windows
    (windows where no machine was scored are left out; a metric with none gets
    ``default``)."""
    top_KN = np.where(np.isnan(scores_KNM), -np.inf, scores_KNM).max(axis=2)
    out = {}
    for k, name in enumerate(metrics):
        scored = top_KN[k][np.isfinite(top_KN[k])]
        level = float(np.quantile(scored, quantile)) if scored.size else default
        out[name] = max(level, minimum)
    return out
