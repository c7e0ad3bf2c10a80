"""Held-out servers: every choice made on some servers' labels, results on the others'.

The protocol (``docs/minder.md``, "Evaluation on held-out servers"): the group's
servers are split into *development* and *held-out* ones before anything is looked
at. Models, thresholds, peer scales and each machine's own peer-residual baseline
come from the unlabelled train split of all servers (as a fleet's history would); the
metric priority is learnt from the development servers' labelled test windows; each
detector's free settings (threshold quantile, continuity, denoising, for the peer
variant the vote, for the fused one how many metrics are fused) are picked from a
fixed grid by window F1 on the development servers (or, given a false-alarm budget,
by the labelled segments they find there within it). Only then are the held-out
servers scored, once. Detection itself always runs on the whole group: the held-out
servers' data are peers like any other, their labels are never read before scoring.
``rotation_study`` does the same with each server held out in turn and pools them.

Legend: M servers, T points, K metrics, N windows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.baseline import fit_reference, mahalanobis, window_means
from rankwatch.streams.minder.blend import fit_blend
from rankwatch.streams.minder.continuity import confirm
from rankwatch.streams.minder.detector import (
    FUSED,
    MinderConfig,
    MinderModel,
    calibrate_fused,
    calibrate_thresholds,
    decide,
    fit_peer_scales,
    metric_scores,
)
from rankwatch.streams.minder.evaluation import (
    compare,
    day_blocks,
    event_scores,
    score,
    segment_outcomes,
    window_labels,
)
from rankwatch.streams.minder.nested import DEFAULT, default_candidates
from rankwatch.streams.minder.online import OnlineConfig
from rankwatch.streams.minder.priority import max_z_features, rank_metrics
from rankwatch.streams.minder.replay import replay_group
from rankwatch.streams.minder.residual import fit_own_baseline
from rankwatch.streams.minder.similarity import window_starts
from rankwatch.streams.minder.study import QUANTILES, Group

Bool = NDArray[np.bool_]
LIVE_THRESHOLDS = (2.0, 2.5, 3.0, 4.0, 5.0)
"""The live monitor's fused threshold: a score is an RMS in units of the host's own
usual spread, so these are multiples of it (``docs/minder.md``)."""
CONTINUITY = (1, 2, 3)
VOTES = (1, 2, 3)
VOTE_METRICS = (3, 5, 0)
FUSE_METRICS = (5, 10, 0)


@dataclass(frozen=True)
class Choice:
    """One detector's settings, as picked on the development servers."""

    detector: str
    quantile: float
    continuity: int
    denoise: bool = False
    vote: int = 0
    vote_metrics: int = 0
    fuse_metrics: int | None = None
    threshold: float | None = None
    """The live monitor's threshold (it has no train split to take a quantile of)."""

    def to_json(self) -> dict[str, Any]:
        if self.threshold is not None:
            return {"threshold": self.threshold, "continuity": self.continuity}
        out: dict[str, Any] = {
            "quantile": self.quantile,
            "continuity": self.continuity,
        }
        if self.detector not in ("baseline", DEFAULT):
            out["denoise"] = self.denoise
        if self.vote:
            out.update(vote=self.vote, vote_metrics=self.vote_metrics or "all")
        if self.fuse_metrics is not None:
            out.update(fuse_metrics=self.fuse_metrics or "all")
        return out


@dataclass(frozen=True)
class Context:
    group: Group
    starts: NDArray[np.int64]
    window: int
    dev: NDArray[np.int64]
    held: NDArray[np.int64]
    points_per_day: float = 288.0
    fa_budget: float | None = None
    """None: settings picked by window F1 on the development servers. A number: by the
    labelled segments they find there, among the settings raising at most this many
    false alarms per machine-day there (``docs/minder.md``, "At a false-alarm
    budget")."""

    def dev_f1(self, pred_NM: Bool) -> float:
        g = self.group
        return score(pred_NM, g.label_MT, self.starts, self.window, self.dev, g.present_MT).f1

    def merit(self, pred_NM: Bool) -> tuple[tuple[float, ...], float]:
        """How a setting ranks on the development servers (larger is better), and the
        figure reported for it (window F1, or segments found at the budget)."""
        if self.fa_budget is None:
            f1 = self.dev_f1(pred_NM)
            return (f1,), f1
        g = self.group
        e = event_scores(
            pred_NM,
            g.label_MT,
            self.starts,
            self.window,
            self.dev,
            g.present_MT,
            self.points_per_day,
        )
        rate = e.false_alarms / e.machine_days if e.machine_days else 0.0
        delay = float(np.median(e.delays_points)) if e.delays_points else np.inf
        within = rate <= self.fa_budget
        # within the budget: most segments, then the fastest, then the quietest;
        # outside it (only if no setting fits): the quietest
        rank = (1.0, e.detected, -delay, -rate) if within else (0.0, -rate, e.detected, -delay)
        return rank, float(e.detected)


def _minder_candidates(
    ctx: Context, model: MinderModel, config: MinderConfig, scoring: str
) -> Iterator[tuple[Choice, Bool]]:
    """Every setting on the grid for one scoring, with its predictions."""
    g = ctx.group
    denoise_options = (False, True) if model.denoisers else (False,)
    for denoise in denoise_options:
        cfg = replace(config, scoring=scoring, denoise=denoise)
        train = metric_scores(g.train_MTK, model, cfg)
        test = metric_scores(g.test_MTK, model, cfg)
        for q in QUANTILES:
            levels = calibrate_thresholds(train, g.metrics, q, per_machine=scoring == "peer")
            fitted = replace(model, thresholds=levels)
            votes = (
                [(0, 0)]
                if scoring == "pairwise"
                else [(v, k) for v in VOTES for k in VOTE_METRICS if not k or v <= k]
            )
            for (vote, metrics), c in ((vm, c) for vm in votes for c in CONTINUITY):
                run = replace(cfg, continuity=c, vote=vote, vote_metrics=metrics)
                conf, _ = decide(test, fitted, run)
                name = "minder" if scoring == "pairwise" else "minder_peer"
                yield Choice(name, q, c, denoise, vote, metrics), conf


def _fused_candidates(
    ctx: Context, model: MinderModel, config: MinderConfig
) -> Iterator[tuple[Choice, Bool]]:
    """Residual scoring fused over the most telling metrics, every setting on the grid."""
    g = ctx.group
    denoise_options = (False, True) if model.denoisers else (False,)
    for denoise in denoise_options:
        cfg = replace(config, scoring="residual", denoise=denoise, fuse=True)
        train = metric_scores(g.train_MTK, model, cfg)
        test = metric_scores(g.test_MTK, model, cfg)
        for q, metrics in ((q, k) for q in QUANTILES for k in FUSE_METRICS):
            run = replace(cfg, fuse_metrics=metrics)
            fitted = replace(model, thresholds={FUSED: calibrate_fused(train, model, run, q)})
            for c in CONTINUITY:
                conf, _ = decide(test, fitted, replace(run, continuity=c))
                yield Choice("minder_fused", q, c, denoise, fuse_metrics=metrics), conf


def _default_candidates(ctx: Context, config: MinderConfig) -> Iterator[tuple[Choice, Bool]]:
    """The default detector (``blend``; ``nested`` for its own protocol) on the grid."""
    fit = fit_blend(ctx.group.train_MTK, config.window, config.stride)
    for (q, c), pred in default_candidates(ctx.group, fit).items():
        yield Choice(DEFAULT, q, c), pred


def _baseline_candidates(ctx: Context, config: MinderConfig) -> Iterator[tuple[Choice, Bool]]:
    g = ctx.group
    train_starts = window_starts(g.train_MTK.shape[1], config.window, config.stride)
    train_f = window_means(g.train_MTK, train_starts, config.window)
    ref = fit_reference(train_f.reshape(-1, train_f.shape[2]))
    train_d = mahalanobis(train_f, ref)
    d = mahalanobis(window_means(g.test_MTK, ctx.starts, config.window), ref)
    for q in QUANTILES:
        for c in CONTINUITY:
            yield Choice("baseline", q, c), confirm(d > float(np.nanquantile(train_d, q)), c)


def live_predictions(
    group: Group, config: MinderConfig, base: OnlineConfig | None = None
) -> dict[tuple[str, float, int], Bool]:
    """The live monitor replayed over the group (``replay``) with each scoring (residual;
    pairwise, the paper's and the worker's default) at every setting of its grid: (scoring,
    threshold, continuity) -> (N, M) reports on the test windows. No label is read."""
    hosts = [f"server{m}" for m in range(group.test_MTK.shape[0])]
    online = base or OnlineConfig()
    return {
        (scoring, thr, c): replay_group(
            group,
            hosts,
            replace(online, scoring=scoring, threshold=thr, continuity=c, floor=config.floor),
            config.window,
            config.stride,
        )
        for scoring in ("residual", "pairwise")
        for thr in LIVE_THRESHOLDS
        for c in CONTINUITY
    }


def _live_candidates(
    live: dict[tuple[str, float, int], Bool], scoring: str
) -> Iterator[tuple[Choice, Bool]]:
    name = LIVE if scoring == "residual" else LIVE_PAIRWISE
    for (how, thr, c), pred in live.items():
        if how == scoring:
            yield Choice(name, 0.0, c, threshold=thr), pred


def _best(ctx: Context, candidates: Iterator[tuple[Choice, Bool]]) -> tuple[Choice, float, Bool]:
    """The first setting of the grid with the best merit on the development servers."""
    best: tuple[tuple[float, ...], Choice, float, Bool] | None = None
    for choice, pred in candidates:
        rank, figure = ctx.merit(pred)
        if best is None or rank > best[0]:
            best = (rank, choice, figure, pred)
    assert best is not None
    return best[1], best[2], best[3]


DETECTORS = ("minder", "minder_peer", "minder_fused", DEFAULT, "baseline")
LIVE = "minder_live"
LIVE_PAIRWISE = "minder_live_pairwise"


def _choose(
    group: Group,
    model: MinderModel,
    config: MinderConfig,
    dev: Sequence[int],
    points_per_day: float,
    fa_budget: float | None,
    live: dict[tuple[str, float, int], Bool] | None = None,
) -> tuple[dict[str, tuple[Choice, float, Bool]], MinderModel]:
    """Every detector's setting chosen on the ``dev`` servers' labels, with its
    predictions for all servers; and the model with the priority learnt on them."""
    starts = window_starts(group.test_MTK.shape[1], config.window, config.stride)
    none = np.zeros(0, dtype=np.int64)
    ctx = Context(group, starts, config.window, np.asarray(dev), none, points_per_day, fa_budget)
    truth = window_labels(group.label_MT, starts, config.window)
    feats = max_z_features(group.test_MTK, starts, config.window)
    order = rank_metrics(feats, np.asarray(truth[:, ctx.dev].any(axis=1)))
    model = replace(
        model,
        priority=tuple(group.metrics[k] for k in order),
        peer_scale=fit_peer_scales(group.train_MTK, group.metrics, config.floor),
        own=fit_own_baseline(group.train_MTK, config.floor),
    )
    chosen = {}
    for candidates in (
        _minder_candidates(ctx, model, config, "pairwise"),
        _minder_candidates(ctx, model, config, "peer"),
        _fused_candidates(ctx, model, config),
        *(
            [_live_candidates(live, "residual"), _live_candidates(live, "pairwise")]
            if live is not None
            else []
        ),
        _default_candidates(ctx, config),
        _baseline_candidates(ctx, config),
    ):
        best = _best(ctx, candidates)
        chosen[best[0].detector] = best
    return chosen, model


def _held_out_scores(
    group: Group, pred: Bool, config: MinderConfig, held: NDArray[np.int64], points_per_day: float
) -> dict[str, Any]:
    starts = window_starts(group.test_MTK.shape[1], config.window, config.stride)
    minutes = 24 * 60 / points_per_day
    win = score(pred, group.label_MT, starts, config.window, held, group.present_MT)
    events = event_scores(
        pred, group.label_MT, starts, config.window, held, group.present_MT, points_per_day
    )
    outcomes = segment_outcomes(pred, group.label_MT, starts, config.window, held)
    return {
        "held_out": {"window_f1": round(win.f1, 4), **events.to_json(minutes)},
        "held_out_segments": [
            {
                "server": m,
                "first": first,
                "last": last,
                "detect_minutes": None if d is None else round(d * minutes, 1),
            }
            for m, first, last, d in outcomes
        ],
    }


def comparisons(
    group: Group,
    preds: dict[str, Bool],
    config: MinderConfig,
    servers: NDArray[np.int64],
    points_per_day: float,
) -> dict[str, Any]:
    """Each Minder variant against the baseline on the scored servers, with bootstrap
    intervals (``evaluation.compare``): is the margin clear, or within the noise of a
    few dozen segments? With the live monitor replayed, also its residual scoring
    against its pairwise scoring."""
    starts = window_starts(group.test_MTK.shape[1], config.window, config.stride)

    def blocks(pred: Bool) -> Any:
        return day_blocks(
            pred, group.label_MT, starts, config.window, servers, group.present_MT, points_per_day
        )

    base = blocks(preds["baseline"])
    minutes = 24 * 60 / points_per_day
    out = {
        f"{name}_vs_baseline": compare(blocks(pred), base, minutes)
        for name, pred in preds.items()
        if name != "baseline"
    }
    if LIVE in preds and LIVE_PAIRWISE in preds:  # the live default against what it replaced
        out[f"{LIVE}_vs_{LIVE_PAIRWISE}"] = compare(
            blocks(preds[LIVE]), blocks(preds[LIVE_PAIRWISE]), minutes
        )
    return out


def holdout_study(
    group: Group,
    model: MinderModel,
    config: MinderConfig,
    dev: Sequence[int],
    held: Sequence[int],
    points_per_day: float,
    fa_budget: float | None = None,
    live: bool = False,
) -> dict[str, Any]:
    """Pick each detector's settings on ``dev`` servers, score them on ``held`` ones;
    with ``live``, the live monitor replayed over the group is one of them."""
    replays = live_predictions(group, config) if live else None
    chosen, model = _choose(group, model, config, dev, points_per_day, fa_budget, replays)
    figure = "dev_window_f1" if fa_budget is None else "dev_segments_detected"
    results: dict[str, Any] = {}
    for name, (choice, dev_figure, pred) in chosen.items():
        results[name] = {
            "chosen": choice.to_json(),
            figure: round(dev_figure, 4),
            **_held_out_scores(group, pred, config, np.asarray(held), points_per_day),
        }
    results["priority_top5"] = list(model.priority[:5])
    preds = {name: pred for name, (_, _, pred) in chosen.items()}
    results["comparisons"] = comparisons(group, preds, config, np.asarray(held), points_per_day)
    return results


def rotation_study(
    group: Group,
    model: MinderModel,
    config: MinderConfig,
    points_per_day: float,
    fa_budget: float | None = None,
    live: bool = False,
) -> dict[str, Any]:
    """Each server held out in turn, everything chosen on the others (as
    :func:`holdout_study` with one held-out server); the held-out predictions of the
    folds are pooled and scored over all servers. More segments than one split, at the
    price of the servers' shared anomaly times (``docs/minder.md``)."""
    m = group.test_MTK.shape[0]
    starts = window_starts(group.test_MTK.shape[1], config.window, config.stride)
    names = (*DETECTORS[:-1], LIVE, LIVE_PAIRWISE, DETECTORS[-1]) if live else DETECTORS
    pooled = {name: np.zeros((starts.size, m), dtype=bool) for name in names}
    picks: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    replays = live_predictions(group, config) if live else None  # no label read: once
    for h in range(m):
        others = [j for j in range(m) if j != h]
        chosen, _ = _choose(group, model, config, others, points_per_day, fa_budget, replays)
        for name, (choice, _, pred) in chosen.items():
            pooled[name][:, h] = pred[:, h]
            picks[name].append(choice.to_json())
    out: dict[str, Any] = {
        name: {"chosen_per_fold": picks[name]}
        | _held_out_scores(group, pooled[name], config, np.arange(m), points_per_day)
        for name in names
    }
    out["comparisons"] = comparisons(group, pooled, config, np.arange(m), points_per_day)
    return out
