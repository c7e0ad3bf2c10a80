"""The nested evaluation of the default detector against the baseline (``rankwatch
minder eval DIR``; ``docs/minder.md``, "The nested protocol").

Outer loop: each server is scored once, as the held-out server of its own fold.
Inner: in that fold, each detector's two settings (the threshold quantile and the
continuity) are picked from one grid by window F1 on the *other* servers' labels;
the held-out server's labels are read only to score it. Everything else is learnt
without labels from the train split of every server (a fleet's history): the
default's per-machine yardsticks and peer metrics (``blend``), the baseline's
reference distribution; except that the default also keeps only the peer metrics the
peers still explain over the whole test split (``blend.still_peers``, unlabelled, but
a look ahead a live monitor cannot make). The held-out predictions of the folds are
pooled and scored over all servers, and the default is compared with the baseline by
a paired bootstrap over server-days (``evaluation.compare``).

What it leaves in: the servers of a group share anomaly times, so the other servers'
labels hint at when the held-out one was anomalous; with two settings on a grid of
fifteen, that hint has little to act on. And the design of the default (its two
halves, the peer-metric rule) was chosen looking at the development servers: the
folds choose its settings, not its design, so only other servers say how it holds.

Legend: M servers, T points, N windows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.baseline import fit_reference, mahalanobis, window_means
from rankwatch.streams.minder.blend import (
    BlendFit,
    blend_decide,
    blend_scores,
    explained_share,
    fit_blend,
    still_peers,
)
from rankwatch.streams.minder.continuity import confirm
from rankwatch.streams.minder.evaluation import compare, day_blocks, event_scores, score
from rankwatch.streams.minder.similarity import window_starts
from rankwatch.streams.minder.study import CONTINUITY, QUANTILES, Group

Bool = NDArray[np.bool_]
Setting = tuple[float, int]
DEFAULT = "default"
BASELINE = "baseline"


def default_candidates(group: Group, fit: BlendFit) -> dict[Setting, Bool]:
    """The default detector's (N, M) reports on the test windows at every setting."""
    out = {}
    for q in QUANTILES:
        scores = blend_scores(fit, group.test_MTK, q)
        for c in CONTINUITY:
            out[(q, c)] = blend_decide(scores, c)
    return out


def baseline_candidates(group: Group, window: int, stride: int) -> dict[Setting, Bool]:
    """The Mahalanobis baseline (one reference for all machines pooled) at every setting."""
    train_f = window_means(
        group.train_MTK, window_starts(group.train_MTK.shape[1], window, stride), window
    )
    ref = fit_reference(train_f.reshape(-1, train_f.shape[2]))
    train_d = mahalanobis(train_f, ref)
    starts = window_starts(group.test_MTK.shape[1], window, stride)
    d = mahalanobis(window_means(group.test_MTK, starts, window), ref)
    return {
        (q, c): confirm(np.nan_to_num(d, nan=0.0) > float(np.nanquantile(train_d, q)), c)
        for q in QUANTILES
        for c in CONTINUITY
    }


def pick(
    candidates: dict[Setting, Bool], group: Group, starts: NDArray[np.int64], window: int,
    servers: list[int],
) -> Setting:  # fmt: skip
    """The setting with the best window F1 on ``servers`` (the first on the grid of
    equals)."""
    cols = np.asarray(servers, dtype=np.int64)

    def f1(setting: Setting) -> float:
        return score(candidates[setting], group.label_MT, starts, window, cols, group.present_MT).f1

    return max(candidates, key=f1)


def held_out_predictions(
    candidates: dict[Setting, Bool], group: Group, starts: NDArray[np.int64], window: int
) -> tuple[Bool, list[dict[str, Any]]]:
    """(N, M): each server's reports at the setting picked on the other servers' labels,
    and the setting per fold. A server's own labels never reach its column."""
    m = group.test_MTK.shape[0]
    pooled = np.zeros((starts.size, m), dtype=bool)
    chosen = []
    for h in range(m):
        setting = pick(candidates, group, starts, window, [j for j in range(m) if j != h])
        pooled[:, h] = candidates[setting][:, h]
        chosen.append({"quantile": setting[0], "continuity": setting[1]})
    return pooled, chosen


def nested_study(
    group: Group, window: int = 8, stride: int = 4, points_per_day: float = 288.0
) -> dict[str, Any]:
    """Leave one server out with the settings picked inside each fold; the pooled
    held-out scores of the default and the baseline, and their differences."""
    m = group.test_MTK.shape[0]
    if m < 2:
        raise ValueError(
            "the nested protocol needs at least two servers (one to score, one to tune on)"
        )
    starts = window_starts(group.test_MTK.shape[1], window, stride)
    every = np.arange(m)
    fit = fit_blend(group.train_MTK, window, stride)
    out: dict[str, Any] = {}
    blocks = {}
    for name, candidates in (
        (DEFAULT, default_candidates(group, fit)),
        (BASELINE, baseline_candidates(group, window, stride)),
    ):
        pooled, chosen = held_out_predictions(candidates, group, starts, window)
        win = score(pooled, group.label_MT, starts, window, every, group.present_MT)
        events = event_scores(
            pooled, group.label_MT, starts, window, every, group.present_MT, points_per_day
        )
        out[name] = {
            "window_precision": round(win.precision, 4),
            "window_recall": round(win.recall, 4),
            "window_f1": round(win.f1, 4),
            **events.to_json(24 * 60 / points_per_day),
            "chosen_per_fold": chosen,
        }
        blocks[name] = day_blocks(
            pooled, group.label_MT, starts, window, every, group.present_MT, points_per_day
        )
    out["default_vs_baseline"] = compare(
        blocks[DEFAULT], blocks[BASELINE], 24 * 60 / points_per_day
    )
    explained = explained_share(group.train_MTK)
    out["peer_metrics_history"] = [group.metrics[k] for k in fit.peer_k]
    out["peer_metrics"] = [group.metrics[fit.peer_k[i]] for i in still_peers(fit, group.test_MTK)]
    out["explained_by_peers"] = {
        name: None if np.isnan(e) else round(float(e), 3)
        for name, e in zip(group.metrics, explained, strict=True)
    }
    out["protocol"] = {
        "outer": "each server held out once",
        "inner": "quantile x continuity by window F1 on the other servers",
        "quantiles": list(QUANTILES),
        "continuity": list(CONTINUITY),
        "window": window,
        "stride": stride,
    }
    return out
