"""The default detector: each machine against its own history *and* against its peers,
each measured in units of that machine's own healthy record (``docs/minder.md``, "The
default detector").

Why two halves. The peer comparison (the paper's premise) removes what every machine
goes through together, a daily cycle or a job phase, and finds the machine that leaves
the group; it is blind where machines do not move together, and it reads a lasting
difference between machines as a fault. A machine's own history (the Mahalanobis
distance of its window means from its own train windows: correlated metrics, such as
a load every metric follows, count once) needs no peers at all, and misses what the
whole group does at once. On the development servers each half finds faults the
other misses; their mean lets neither decide alone.

- **Own history**: per machine, the mean and shrunk covariance of its per-metric
  window means over its train split (``baseline.fit_reference``, the same estimate the
  Mahalanobis baseline fits to all machines pooled, but no metric's spread below
  ``FLOOR``: a metric one machine never moved would otherwise outweigh all the others);
  a window's score is its distance from them.
- **Peers**: the residual score (``residual``), mean over the *peer metrics* only: the
  metrics in which the peer median explains at least half of the machines' variance,
  over the train split (:func:`peer_metrics`) and over the data being scored
  (:func:`still_peers`). A metric that does not move with the peers carries no peer
  information: comparing it with the peers is noise. No peer metric (a group whose
  machines do not move together, or fewer than three machines): the peer half is left
  out and the own history decides alone.
- **One unit**: each half is divided by the machine's own ``quantile`` of that half's
  scores over its train split, so 1 means "as odd as this machine's odd windows used
  to be", whatever the metric count or the machine; the score is the mean of the two
  halves, a candidate where it exceeds 1, reported after ``continuity`` windows.

Two settings (the quantile and the continuity), the same two as the baseline's, and
chosen the same way (``nested``). No labels are read here.

Legend: M machines, T grid points, K metrics, N windows.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.baseline import Reference, fit_reference, mahalanobis, window_means
from rankwatch.streams.minder.continuity import confirm
from rankwatch.streams.minder.peers import peer_deviation
from rankwatch.streams.minder.residual import OwnBaseline, fit_own_baseline, residual_scores
from rankwatch.streams.minder.similarity import MIN_MACHINES, window_starts

F64 = NDArray[np.float64]
PEER_SHARE = 0.5
"""A metric is a peer metric where the peer median explains at least this share of the
machines' variance over the train split: more of a machine's movement is the group's
than its own. On ASD the metrics split far from it (at most 0.17 or at least 0.64)."""
FLOOR = 0.02
"""The residual's smallest spread, in normalised units (``MinderConfig.floor``)."""
UNIT_FLOOR = 1.0
"""The smallest unit of a half: a score is a distance in spreads of at least ``FLOOR``,
so 1 is about one floor-sized step in one metric. A machine whose metrics move less
than the floor (a steady load) has tiny scores, and a unit taken as their quantile
would scale that noise back up to 1 and fire on it. It never binds on ASD."""
PHASE_SHARE = 0.75
"""A window is a phase of the group when at least this share of the scored machines
(and at least ``MIN_MACHINES`` of them) is above 1 in the own-history half
(:func:`job_phase`): most of them, not all, since in a job of a thousand hosts a few
noisy ones stay under 1 through any phase. Chosen with ASD seen (window F1 0.330 at
one half, 0.342 here, 0.368 at all; docs/minder.md)."""
SCORE_CAP = 1e6
"""Scores are capped here, far past any unit: a value near the float limit (which a
sample may carry) would otherwise square to infinity, and an infinite score would be
left out as not finite, or, live, become a host's unit and blind it."""


@dataclass(frozen=True)
class BlendFit:
    """What the default detector learns from the unlabelled train split."""

    peer_k: tuple[int, ...]
    """The peer metrics' column indices; empty: own history only."""
    own: OwnBaseline
    references: tuple[Reference | None, ...]
    """Per machine, its own history's window means (None: no complete train window)."""
    history_train_NM: F64
    """Own-history scores of the train windows (for the per-machine quantiles)."""
    peer_train_KNM: F64
    """Per peer metric (in ``peer_k``'s order), its residual scores of the train windows
    (for the per-machine quantiles)."""
    window: int
    stride: int


def explained_share(train_MTK: NDArray[np.floating]) -> F64:
    """(K,): per metric, the share of the machines' movement (around their own means)
    that the peer median explains: 1 - mean((value - peer median)^2) / mean((value -
    own mean)^2), pooled over machines. The numerator is not centred on purpose: a
    machine that sits at a constant offset from its peers is not explained by them.
    Near 1 where machines move together, near 0 or below where they do not. NaN for a
    metric that does not move (:func:`moves`: a constant metric's share would be noise
    over noise) or with fewer than 3 machines."""
    x = np.asarray(train_MTK, dtype=np.float64)
    out = np.full(x.shape[2], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN metric: stays NaN
        for k in range(x.shape[2]):
            own = x[:, :, k] - np.nanmean(x[:, :, k], axis=1, keepdims=True)
            total = float(np.nanmean(own**2))
            level = float(np.nanmax(np.abs(x[:, :, k]))) if np.isfinite(x[:, :, k]).any() else 0.0
            if moves(np.array([total]), np.array([level]))[0] and x.shape[0] >= 3:
                out[k] = 1.0 - float(np.nanmean(peer_deviation(x[:, :, k]) ** 2)) / total
    return out


MOVES = 1e-6


def moves(variance: F64, level: F64) -> NDArray[np.bool_]:
    """Whether a metric moves: its variance is above rounding of its level (a spread
    of a millionth of the level is a constant for this purpose; the live sums, which
    subtract squares, round at about 1e-8 of it)."""
    with np.errstate(invalid="ignore"):
        return np.asarray((variance > (MOVES * np.abs(level)) ** 2) & (variance > 0))


def peer_metrics(train_MTK: NDArray[np.floating], share: float = PEER_SHARE) -> tuple[int, ...]:
    """The metrics whose peer median explains at least ``share`` of the variance."""
    explained = explained_share(train_MTK)
    return tuple(int(k) for k in np.flatnonzero(np.nan_to_num(explained, nan=-1.0) >= share))


def fit_blend(
    train_MTK: NDArray[np.floating], window: int, stride: int, floor: float = FLOOR
) -> BlendFit:
    """Both halves' yardsticks from the train split (no labels). ``ValueError`` where
    the split cannot score anything: a metric with no value at all (every window of
    every machine would miss a point), or no machine with a complete window and no
    peer metric."""
    x = np.asarray(train_MTK, dtype=np.float64)
    empty = np.flatnonzero(np.isnan(x).all(axis=(0, 1)))
    if empty.size:
        raise ValueError(
            f"metric column(s) {', '.join(map(str, empty))} have no value in the train "
            "split: every window would miss a point; drop them"
        )
    starts = window_starts(x.shape[1], window, stride)
    means_NMK = window_means(x, starts, window)
    refs: list[Reference | None] = []
    for m in range(x.shape[0]):
        rows = means_NMK[:, m]
        complete = rows[~np.isnan(rows).any(axis=1)]
        refs.append(fit_reference(complete, floor=floor) if complete.shape[0] >= 2 else None)
    peer_k = peer_metrics(x)
    if not peer_k and all(r is None for r in refs):
        raise ValueError(
            f"no machine has a complete train window of {window} points and no metric "
            "moves with the peers: nothing can be scored"
        )
    own = fit_own_baseline(x, floor)
    history = _history(refs, means_NMK)
    peer = _peer(peer_k, own, window, x, starts)
    return BlendFit(peer_k, own, tuple(refs), history, peer, window, stride)


def still_peers(fit: BlendFit, x_MTK: NDArray[np.floating]) -> list[int]:
    """Which of the fit's peer metrics (positions in ``peer_k``) the peers' median still
    explains at least half of in ``x``, the data being scored (no labels): a group that
    moved together in its history and no longer does keeps no peer half that is now
    noise."""
    explained = np.nan_to_num(explained_share(x_MTK), nan=-1.0)
    return [i for i, k in enumerate(fit.peer_k) if explained[k] >= PEER_SHARE]


def _history(refs: Sequence[Reference | None], means_NMK: F64) -> F64:
    out = np.full(means_NMK.shape[:2], np.nan)
    for m, ref in enumerate(refs):
        if ref is not None:
            out[:, m] = mahalanobis(means_NMK[:, m], ref)
    return out


def _peer(
    peer_k: Sequence[int], own: OwnBaseline, window: int, x_MTK: F64, starts: NDArray[np.int64]
) -> F64:
    """(len(peer_k), N, M): each peer metric's residual score per window and machine."""
    out = np.full((len(peer_k), starts.size, x_MTK.shape[0]), np.nan)
    for i, k in enumerate(peer_k):
        out[i] = residual_scores(x_MTK[:, :, k], starts, window, own.loc_KM[k], own.scale_KM[k])
    return out


def _unit(train_NM: F64, quantile: float) -> F64:
    """(M,): each machine's own ``quantile`` of its train scores, at least
    ``UNIT_FLOOR`` (NaN: no train score)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        q = np.nanquantile(train_NM, quantile, axis=0)
    return np.where(np.isfinite(q), np.maximum(q, UNIT_FLOOR), np.nan)


def blend_scores(fit: BlendFit, x_MTK: NDArray[np.floating], quantile: float) -> F64:
    """(N, M) on ``x``'s windows: the mean of the two halves, each in units of the
    machine's own train ``quantile``. A machine with one half only (no complete train
    window for its own history, or no peer yardstick) is scored by that half; NaN
    where it has neither (a missing point in the window)."""
    x = np.asarray(x_MTK, dtype=np.float64)
    if x.shape[0] != len(fit.references):
        raise ValueError(f"fitted on {len(fit.references)} machines, {x.shape[0]} given")
    starts = window_starts(x.shape[1], fit.window, fit.stride)
    history = _history(fit.references, window_means(x, starts, fit.window))
    halves = [without_phases(history / _unit(fit.history_train_NM, quantile))]
    active = still_peers(fit, x)
    if active:
        peer = _peer([fit.peer_k[i] for i in active], fit.own, fit.window, x, starts).mean(axis=0)
        halves.append(peer / _unit(fit.peer_train_KNM[active].mean(axis=0), quantile))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # neither half: stays NaN
        return np.asarray(np.nanmean(halves, axis=0))


def without_phases(own_NM: F64) -> F64:
    """The own-history half with the windows that are a phase of the group
    (:func:`job_phase`) left out (NaN): there the peer half decides, or, with no peer
    half, nobody is scored."""
    out = np.array(own_NM, dtype=np.float64)
    for n in range(out.shape[0]):
        if job_phase(out[n] > 1.0, np.isfinite(out[n])):
            out[n] = np.nan
    return out


def job_phase(candidates_M: NDArray[np.bool_], scored_M: NDArray[np.bool_]) -> bool:
    """Whether a window is a phase of the whole group in the own-history half, not a
    fault of some machines: at least ``PHASE_SHARE`` of the scored machines are above
    their unit in it. Minder's premise is that faulty machines are few; a checkpoint or an
    evaluation moves every machine off its own history at once, and only the peers
    can tell a fault from it there."""
    n = int(np.count_nonzero(scored_M))
    return n >= MIN_MACHINES and int(np.count_nonzero(candidates_M & scored_M)) >= PHASE_SHARE * n


def blend_decide(scores_NM: F64, continuity: int) -> NDArray[np.bool_]:
    """Reported windows: score above 1 for ``continuity`` windows in a row."""
    return confirm(np.nan_to_num(scores_NM, nan=0.0) > 1.0, continuity)
