"""Minder: similarity + continuity + denoising + metric priority, in one detection call.

Input: one job's metrics on a common grid, normalised to [0, 1] (``grid``), x_MTK;
NaN where a machine has no sample (it is then not compared in that window).
Per metric in priority order: denoise each machine's series with the metric's VAE,
cut it into windows, score each machine per window (``similarity``), mark
candidates above the metric's threshold, keep those that last (``continuity``). At
each window the first metric (in priority order) that confirms a machine names it;
later metrics are computed only while some window is still undecided.

Two choices change that (``MinderConfig``, ``docs/minder.md``): ``scoring="peer"``
scores each machine by its distance from the median machine in units learnt from
normal data (``peers``) instead of the per-window standardised pairwise distances;
``vote=v`` makes a machine a candidate only when v of the most telling metrics agree,
instead of letting the first metric that confirms decide alone. ``scoring="residual"``
compares each machine's distance from the median machine with its own usual distance
(``residual``); ``fuse=True`` makes a machine a candidate when the mean score of the
``fuse_metrics`` most telling metrics exceeds one fused threshold.

Legend: M machines, T grid points, K metrics, N windows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.continuity import confirm
from rankwatch.streams.minder.peers import fit_peer_scale, peer_scores
from rankwatch.streams.minder.residual import OwnBaseline, fuse, residual_scores
from rankwatch.streams.minder.similarity import window_scores, window_starts
from rankwatch.streams.minder.vae import (
    BLOCK,
    THREADED_BLOCK,
    VaeWeights,
    denoise_joint,
    denoise_series,
)

F64 = NDArray[np.float64]
FUSED = "*fused*"
"""Key of the fused score's threshold in ``MinderModel.thresholds``."""


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
    scoring: str = "pairwise"
    """"pairwise": the paper's mean distance to every other machine, standardised per
    window (``similarity``); "peer": distance from the median machine in units learnt
    per metric from normal data (``peers``, needs ``MinderModel.peer_scale``)."""
    vote: int = 0
    """0: metrics in priority order, the first that confirms a machine decides. v >= 1:
    a machine is a candidate in a window when at least v of the ``vote_metrics`` first
    metrics in priority order exceed their thresholds there (``docs/minder.md``)."""
    vote_metrics: int = 0
    """How many metrics, in priority order, take part in the vote (0: all)."""
    fuse: bool = False
    """True: a machine is a candidate in a window when the mean of its scores over the
    ``fuse_metrics`` first metrics in priority order exceeds ``thresholds[FUSED]``
    (``residual.fuse``); the metric named is the one it scores highest in."""
    fuse_metrics: int = 0
    """How many metrics, in priority order, are fused (0: all)."""
    workers: int = 1
    """Metrics scored at once, on that many threads (numpy releases the GIL in the
    LSTM's and the distances' array work); the result does not depend on it."""


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
    peer_scale: Mapping[str, float] = field(default_factory=dict)
    """Per metric, how far healthy machines usually lie from the median machine
    (``peers.fit_peer_scale`` on normal data); used by ``scoring="peer"``."""
    own: OwnBaseline | None = None
    """Per metric and machine, its usual peer residual (``residual.fit_own_baseline``);
    used by ``scoring="residual"``."""

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
    return denoise_series(model.denoisers[name], x_MTK[:, :, k], _block(config))


def metric_scores(x_MTK: NDArray[np.floating], model: MinderModel, config: MinderConfig) -> F64:
    """Scores of every metric, (K, N, M), with no early stop (calibration, ablations)."""
    starts = window_starts(x_MTK.shape[1], config.window, config.stride)
    joint = _joint(x_MTK, model, config)
    out = np.empty((x_MTK.shape[2], starts.size, x_MTK.shape[0]))
    for k in range(x_MTK.shape[2]):
        series = joint[:, :, k] if joint is not None else denoised(x_MTK, model, config, k)
        out[k] = _scores(series, starts, model, config, k)
    return out


def _scores(
    series_MT: NDArray, starts: NDArray[np.int64], model: MinderModel, config: MinderConfig, k: int
) -> F64:
    if config.scoring == "peer":
        scale = model.peer_scale.get(model.metrics[k], config.floor)
        return peer_scores(series_MT, starts, config.window, scale)
    if config.scoring == "residual":
        if model.own is None:
            raise ValueError('scoring="residual" needs MinderModel.own')
        own = model.own
        return residual_scores(series_MT, starts, config.window, own.loc_KM[k], own.scale_KM[k])
    if config.scoring != "pairwise":
        raise ValueError(f"unknown scoring {config.scoring!r}")
    return window_scores(series_MT, starts, config.window, config.floor)


def fit_peer_scales(
    train_MTK: NDArray[np.floating], metrics: Sequence[str], floor: float
) -> dict[str, float]:
    """Per metric, the unit of peer scoring, from normal data (``peers``)."""
    return {name: fit_peer_scale(train_MTK[:, :, k], floor) for k, name in enumerate(metrics)}


def _joint(x_MTK: NDArray[np.floating], model: MinderModel, config: MinderConfig) -> NDArray | None:
    if model.joint is None or not config.denoise:
        return None
    return denoise_joint(model.joint, x_MTK, _block(config))


def _block(config: MinderConfig) -> int:
    return BLOCK if config.workers <= 1 else THREADED_BLOCK


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

    def score_metric(k: int) -> F64:
        series = joint[:, :, k] if joint is not None else denoised(x_MTK, model, config, k)
        return _scores(series, starts, model, config, k)

    order = _metrics_to_score(model, config)
    batch = max(config.workers, 1)
    with ThreadPoolExecutor(batch) if batch > 1 else nullcontext() as pool:
        for i in range(0, len(order), batch):
            ks = order[i : i + batch]
            done = pool.map(score_metric, ks) if pool is not None else map(score_metric, ks)
            for k, scored in zip(ks, done, strict=True):
                if _stops_early(config) and (decided >= 0).all():
                    break  # decided before k: k is not reported (as if never computed)
                scores[k] = scored
                if _per_metric(config):
                    _decide_metric(scores[k], k, model, config, confirmed, decided)
            if _stops_early(config) and (decided >= 0).all():
                break
    if config.fuse:
        confirmed, decided = _fused(scores, model, config)
    elif config.vote > 0:
        confirmed, decided = _vote(scores, model, config)
    return Detection(starts, scores, confirmed, decided)


def _per_metric(config: MinderConfig) -> bool:
    """Each metric confirms machines on its own (neither a vote nor a fused score)."""
    return config.vote == 0 and not config.fuse


def _stops_early(config: MinderConfig) -> bool:
    """The paper's rule: metrics in priority order, the first that confirms decides."""
    return _per_metric(config) and config.use_priority


def _metrics_to_score(model: MinderModel, config: MinderConfig) -> list[int]:
    order = model.order()
    if config.fuse:
        return order[: config.fuse_metrics] if config.fuse_metrics else order
    return order[: config.vote_metrics] if config.vote > 0 and config.vote_metrics else order


def fused_scores(scores_KNM: F64, model: MinderModel, config: MinderConfig) -> F64:
    """(N, M): the mean score over the metrics ``config`` fuses."""
    return fuse(scores_KNM, _metrics_to_score(model, config))


def _fused(scores_KNM: F64, model: MinderModel, config: MinderConfig) -> tuple[NDArray, NDArray]:
    """Candidates: machines whose fused score exceeds the fused threshold; reported once
    candidates for ``continuity`` windows. The metric named for a window is the one its
    first reported machine scores highest in."""
    ks = _metrics_to_score(model, config)
    fused = np.nan_to_num(fuse(scores_KNM, ks), nan=-np.inf)
    confirmed = confirm(fused > model.thresholds.get(FUSED, config.threshold), config.continuity)
    n = confirmed.shape[0]
    named = np.full(n, -1, dtype=np.int64)
    rows = np.flatnonzero(confirmed.any(axis=1))
    if rows.size and ks:
        first = confirmed[rows].argmax(axis=1)
        per_metric = np.nan_to_num(scores_KNM[ks][:, rows, first], nan=-np.inf)
        named[rows] = np.asarray(ks)[per_metric.argmax(axis=0)]
    return confirmed, named


def _vote(scores_KNM: F64, model: MinderModel, config: MinderConfig) -> tuple[NDArray, NDArray]:
    """Candidates: machines over threshold in at least ``vote`` of the voting metrics;
    reported once candidates for ``continuity`` windows. The metric named for a window
    is the one its reported machines exceed most (score / threshold)."""
    ks = _metrics_to_score(model, config)
    n, m = scores_KNM.shape[1:]
    if not ks:
        return np.zeros((n, m), dtype=bool), np.full(n, -1, dtype=np.int64)
    thr = np.array([model.thresholds.get(model.metrics[k], config.threshold) for k in ks])
    scores = np.nan_to_num(scores_KNM[ks], nan=-np.inf)
    hits = scores > thr[:, None, None]
    confirmed = confirm(hits.sum(axis=0) >= config.vote, config.continuity)
    ratio = scores / np.maximum(thr, 1e-9)[:, None, None]
    strongest = np.where(confirmed[None], ratio, -np.inf).reshape(len(ks), n * m)
    best = np.asarray(ks)[strongest.argmax(axis=0).reshape(n, m)]
    named = np.where(confirmed.any(axis=1), best[np.arange(n), confirmed.argmax(axis=1)], -1)
    return confirmed, named.astype(np.int64)


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
    if config.fuse:
        return _fused(scores_KNM, model, config)
    if config.vote > 0:
        confirmed_NM, named_N = _vote(scores_KNM, model, config)
        return confirmed_NM, named_N
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
    per_machine: bool = False,
) -> dict[str, float]:
    """Per metric, the given quantile of the top machine's score over normal windows, or
    with ``per_machine`` of every machine's score (a level that does not grow with the
    number of machines; the peer scoring's). Unscored points are left out; a metric with
    none gets ``default``."""
    top_KN = np.where(np.isnan(scores_KNM), -np.inf, scores_KNM)
    top_KN = top_KN.reshape(top_KN.shape[0], -1) if per_machine else top_KN.max(axis=2)
    out = {}
    for k, name in enumerate(metrics):
        scored = top_KN[k][np.isfinite(top_KN[k])]
        level = float(np.quantile(scored, quantile)) if scored.size else default
        out[name] = max(level, minimum)
    return out


def calibrate_fused(
    scores_KNM: F64, model: MinderModel, config: MinderConfig, quantile: float
) -> float:
    """The given quantile of every machine's fused score over normal windows."""
    fused = fused_scores(scores_KNM, model, config)
    scored = fused[np.isfinite(fused)]
    return float(np.quantile(scored, quantile)) if scored.size else config.threshold
