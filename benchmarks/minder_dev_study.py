"""Why Minder scores low on ASD: the study behind ``docs/minder.md`` ("Why Minder scored
low"), on the *development* servers' labels only.

    .venv/bin/python benchmarks/minder_dev_study.py ../shared/data/asd --dev omi-1,omi-2,omi-3,omi-4

Uses every server's metrics (the held-out servers are peers like any other) but only
the labels of the ``--dev`` servers. Prints, as JSON:

- per metric, the median correlation between servers' test series (do peers move
  together?);
- per development server, how often it is the server farthest from the peer median
  at its labelled and at its unlabelled points (the peer premise);
- best window F1 over a small grid (quantile x continuity) of two single scores
  fused over all metrics: each machine against its own train history alone, and the
  peer residual against its own usual offset (``residual``);
- for the pairwise Minder, the residual + fused detector and the Mahalanobis baseline,
  at the settings the held-out protocol chose on the development servers: each
  development segment found or missed and when, and the false alarms per server (and
  for Minder, per deciding metric);
- ways to fuse the per-metric residual scores (priority subsets, all, capped, top-j,
  quadratic mean) at equal false-alarm budgets on the development servers.

No torch: distances on the raw windows (the held-out protocol chose no denoising for
every detector).
"""

from __future__ import annotations

import argparse
import collections
import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rankwatch.streams.minder import MinderConfig, MinderModel
from rankwatch.streams.minder.baseline import fit_reference, mahalanobis, window_means
from rankwatch.streams.minder.continuity import confirm
from rankwatch.streams.minder.detector import (
    FUSED,
    calibrate_fused,
    calibrate_thresholds,
    decide,
    metric_scores,
)
from rankwatch.streams.minder.evaluation import (
    alarm_episodes,
    event_scores,
    score,
    segment_outcomes,
    window_labels,
)
from rankwatch.streams.minder.files import load_group
from rankwatch.streams.minder.peers import peer_deviation, window_rms
from rankwatch.streams.minder.priority import max_z_features, rank_metrics
from rankwatch.streams.minder.residual import fit_own_baseline
from rankwatch.streams.minder.similarity import window_starts
from rankwatch.streams.minder.study import QUANTILES, Group

WINDOW, STRIDE, FLOOR, MINUTES = 8, 4, 0.02, 5


def peer_correlation(g: Group) -> dict[str, float]:
    m = g.test_MTK.shape[0]
    out = {}
    for k, name in enumerate(g.metrics):
        x = np.nan_to_num(g.test_MTK[:, :, k])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # flat series: no correlation
            c = [np.corrcoef(x[a], x[b])[0, 1] for a in range(m) for b in range(a + 1, m)]
        out[name] = round(float(np.nanmedian(c)), 2) if np.isfinite(c).any() else float("nan")
    return out


def farthest(g: Group, dev: list[int], names: list[str]) -> dict[str, dict[str, float]]:
    """How often each dev server is the farthest from the peer median (mean over metrics
    of |peer residual| in units of the metric's usual peer spread on the train split)."""
    k_all = g.test_MTK.shape[2]
    dev_T = np.stack([peer_deviation(g.test_MTK[:, :, k]) for k in range(k_all)], axis=2)
    dev_train = np.stack([peer_deviation(g.train_MTK[:, :, k]) for k in range(k_all)], axis=2)
    unit = np.maximum(1.4826 * np.nanmedian(np.abs(dev_train), axis=(0, 1)), FLOOR)
    top_T = np.nanmean(np.abs(dev_T) / unit, axis=2).argmax(axis=0)
    out = {}
    for m in dev:
        lab = g.label_MT[m] > 0
        out[names[m]] = {
            "labelled": round(float((top_T[lab] == m).mean()), 2),
            "unlabelled": round(float((top_T[~lab] == m).mean()), 2),
        }
    return out


def dev_segments(g: Group, dev: list[int], names: list[str]) -> dict[str, Any]:
    """Per dev segment: the other dev servers labelled during it (held-out servers'
    labels are not read), and its peak peer residual (in its own train spread, as
    ``residual``) over the 99th percentile of the server's unlabelled points, per metric:
    the best metric's ratio and how many metrics exceed 1."""
    from rankwatch.streams.minder.evaluation import segments

    z = np.abs(residual_z(g, g.test_MTK))
    out: dict[str, Any] = {}
    shared = 0
    for m in dev:
        normal = np.nanpercentile(z[m][g.label_MT[m] == 0], 99, axis=0)
        for a, b in segments(g.label_MT[m]):
            others = [names[j] for j in dev if j != m and g.label_MT[j, a : b + 1].any()]
            shared += bool(others)
            ratio = np.nanmax(z[m, a : b + 1], axis=0) / np.maximum(normal, 1.0)
            out[f"{names[m]} {a}-{b}"] = {
                "shared_with": others,
                "best_metric": g.metrics[int(np.nanargmax(ratio))],
                "best_ratio": round(float(np.nanmax(ratio)), 2),
                "metrics_over_1": int((ratio > 1).sum()),
            }
    return {"shared_with_another_dev_server": shared, "per_segment": out}


def own_history_z(train_MTK: np.ndarray, x_MTK: np.ndarray) -> np.ndarray:
    med = np.nanmedian(train_MTK, axis=1, keepdims=True)
    mad = np.nanmedian(np.abs(train_MTK - med), axis=1, keepdims=True)
    return np.asarray((x_MTK - med) / np.maximum(1.4826 * mad, FLOOR))


def residual_z(g: Group, x_MTK: np.ndarray) -> np.ndarray:
    own = fit_own_baseline(g.train_MTK, FLOOR)
    r = np.stack([peer_deviation(x_MTK[:, :, k]) for k in range(x_MTK.shape[2])], axis=2)
    return np.asarray((r - own.loc_KM.T[:, None, :]) / own.scale_KM.T[:, None, :])


def fused_rms(z_MTK: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.mean([window_rms(z_MTK[:, :, k], starts, WINDOW) for k in range(z_MTK.shape[2])], 0)


def best_dev_f1(g: Group, dev: np.ndarray, train_NM: np.ndarray, test_NM: np.ndarray) -> float:
    starts = window_starts(g.test_MTK.shape[1], WINDOW, STRIDE)
    best = 0.0
    for q in QUANTILES:
        level = float(np.nanquantile(train_NM, q))
        for c in (1, 2, 3):
            pred = confirm(np.nan_to_num(test_NM, nan=-np.inf) > level, c)
            best = max(best, score(pred, g.label_MT, starts, WINDOW, dev, g.present_MT).f1)
    return round(best, 3)


def outcomes(
    g: Group, pred: np.ndarray, dev: np.ndarray, names: list[str], decided: Any = None
) -> dict[str, Any]:
    starts = window_starts(g.test_MTK.shape[1], WINDOW, STRIDE)
    segs = [
        f"{names[m]} {a}-{b}: " + ("missed" if d is None else f"{d * MINUTES} min")
        for m, a, b, d in segment_outcomes(pred, g.label_MT, starts, WINDOW, dev)
    ]
    by_server: collections.Counter[str] = collections.Counter()
    by_metric: collections.Counter[str] = collections.Counter()
    for m in dev.tolist():
        for first, last in alarm_episodes(pred[:, m]):
            if not g.label_MT[m, starts[first] : starts[last] + WINDOW].any():
                by_server[names[m]] += 1
                if decided is not None:
                    by_metric[g.metrics[decided[first]]] += 1
    return {
        "window_f1": round(score(pred, g.label_MT, starts, WINDOW, dev, g.present_MT).f1, 3),
        "segments_found": sum(not s.endswith("missed") for s in segs),
        "segments": segs,
        "false_alarms_by_server": dict(by_server),
        "false_alarms_by_metric": dict(by_metric.most_common()),
    }


def detectors(g: Group, dev: np.ndarray, names: list[str]) -> dict[str, Any]:
    starts = window_starts(g.test_MTK.shape[1], WINDOW, STRIDE)
    truth = window_labels(g.label_MT, starts, WINDOW)
    order = rank_metrics(max_z_features(g.test_MTK, starts, WINDOW), truth[:, dev].any(axis=1))
    model = MinderModel(
        metrics=g.metrics,
        priority=tuple(g.metrics[k] for k in order),
        own=fit_own_baseline(g.train_MTK, FLOOR),
    )
    base = MinderConfig(window=WINDOW, stride=STRIDE, denoise=False, floor=FLOOR)
    pairwise = replace(base, continuity=2)
    levels = calibrate_thresholds(metric_scores(g.train_MTK, model, pairwise), g.metrics, 0.95)
    conf, named = decide(
        metric_scores(g.test_MTK, model, pairwise), replace(model, thresholds=levels), pairwise
    )
    fused = replace(base, scoring="residual", fuse=True, fuse_metrics=10, continuity=1)
    level = calibrate_fused(metric_scores(g.train_MTK, model, fused), model, fused, 0.95)
    conf_f, named_f = decide(
        metric_scores(g.test_MTK, model, fused), replace(model, thresholds={FUSED: level}), fused
    )
    train_f = window_means(g.train_MTK, window_starts(g.train_MTK.shape[1], WINDOW, STRIDE), WINDOW)
    ref = fit_reference(train_f.reshape(-1, train_f.shape[2]))
    d = mahalanobis(window_means(g.test_MTK, starts, WINDOW), ref)
    conf_b = confirm(d > float(np.nanquantile(mahalanobis(train_f, ref), 0.95)), 1)
    return {
        "priority": list(model.priority),
        "minder_pairwise_q0.95_c2": outcomes(g, conf, dev, names, named),
        "residual_fused_q0.95_c1_top10": outcomes(g, conf_f, dev, names, named_f),
        "baseline_q0.95_c1": outcomes(g, conf_b, dev, names),
    }


def fusion_variants(g: Group, dev: np.ndarray) -> dict[str, Any]:
    """Ways to combine the per-metric residual scores, each over the same grid
    (quantile of the train split's fused scores x continuity 1-3), on the development
    servers: the best window F1, and at false-alarm budgets of 0.5, 1 and 2 per
    machine-day the setting finding the most segments (as ``--fa-budget`` picks)."""
    starts = window_starts(g.test_MTK.shape[1], WINDOW, STRIDE)
    truth = window_labels(g.label_MT, starts, WINDOW)
    order = rank_metrics(max_z_features(g.test_MTK, starts, WINDOW), truth[:, dev].any(axis=1))
    model = MinderModel(metrics=g.metrics, own=fit_own_baseline(g.train_MTK, FLOOR))
    cfg = MinderConfig(window=WINDOW, stride=STRIDE, denoise=False, scoring="residual")
    train, test = metric_scores(g.train_MTK, model, cfg), metric_scores(g.test_MTK, model, cfg)

    def top(j: int) -> Any:
        def f(s: np.ndarray) -> np.ndarray:
            v = np.sort(np.nan_to_num(s, nan=-np.inf), axis=0)[::-1][:j].mean(axis=0)
            return np.where(np.isfinite(v), v, np.nan)

        return f

    variants: dict[str, Any] = {
        "mean of the first 5 in priority": lambda s: s[order[:5]].mean(axis=0),
        "mean of the first 10 in priority": lambda s: s[order[:10]].mean(axis=0),
        "mean of all": lambda s: s.mean(axis=0),
        "mean of all, each capped at 3": lambda s: np.minimum(s, 3).mean(axis=0),
        "mean of all, each capped at 10": lambda s: np.minimum(s, 10).mean(axis=0),
        "largest (one metric decides)": top(1),
        "mean of the 3 largest": top(3),
        "mean of the 5 largest": top(5),
        "quadratic mean of all": lambda s: np.sqrt(np.nanmean(s * s, axis=0)),
    }
    train_f = window_means(g.train_MTK, window_starts(g.train_MTK.shape[1], WINDOW, STRIDE), WINDOW)
    ref = fit_reference(train_f.reshape(-1, train_f.shape[2]))
    mahal = (mahalanobis(train_f, ref), mahalanobis(window_means(g.test_MTK, starts, WINDOW), ref))
    out = {}
    for name, fuse_fn in (*variants.items(), ("Mahalanobis baseline (for comparison)", None)):
        if fuse_fn is None:
            f_train, f_test = mahal[0], np.nan_to_num(mahal[1], nan=-np.inf)
        else:
            f_train, f_test = fuse_fn(train), np.nan_to_num(fuse_fn(test), nan=-np.inf)
        rows = []
        for q in QUANTILES:
            level = float(np.nanquantile(f_train, q))
            for c in (1, 2, 3):
                pred = confirm(f_test > level, c)
                e = event_scores(pred, g.label_MT, starts, WINDOW, dev, g.present_MT, 288.0)
                f1 = score(pred, g.label_MT, starts, WINDOW, dev, g.present_MT).f1
                delay = float(np.median(e.delays_points)) * MINUTES if e.delays_points else None
                rows.append((f1, e.detected, delay, e.false_alarms / e.machine_days, q, c))
        best = max(rows, key=lambda r: r[0])
        entry = {"best_window_f1": round(best[0], 3), "at": f"q {best[4]}, continuity {best[5]}"}
        for budget in (0.5, 1.0, 2.0):
            fits = [r for r in rows if r[3] <= budget]
            if fits:
                b = max(fits, key=lambda r: (r[1], -(r[2] or 1e9), -r[3]))
                entry[f"budget {budget:g}"] = (
                    f"{b[1]}/{e.segments} segments, median {b[2]} min, {b[3]:.2f} FA/machine-day"
                )
        out[name] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--dev", required=True, help="development servers, comma-separated")
    args = parser.parse_args()
    g, names = load_group(args.dir)
    dev = np.array([names.index(s.strip()) for s in args.dev.split(",")])
    tr = window_starts(g.train_MTK.shape[1], WINDOW, STRIDE)
    te = window_starts(g.test_MTK.shape[1], WINDOW, STRIDE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices of flat metrics
        result = {
            "peer_correlation": peer_correlation(g),
            "farthest_from_peers": farthest(g, dev.tolist(), names),
            "dev_segments": dev_segments(g, dev.tolist(), names),
            "best_dev_window_f1": {
                "own_history_only": best_dev_f1(
                    g,
                    dev,
                    fused_rms(own_history_z(g.train_MTK, g.train_MTK), tr),
                    fused_rms(own_history_z(g.train_MTK, g.test_MTK), te),
                ),
                "peer_residual_own_offset": best_dev_f1(
                    g,
                    dev,
                    fused_rms(residual_z(g, g.train_MTK), tr),
                    fused_rms(residual_z(g, g.test_MTK), te),
                ),
            },
            **detectors(g, dev, names),
            "fusion_variants": fusion_variants(g, dev),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
