"""Residual scoring: each machine against its peers *and* against its own history of
how it relates to them (``docs/minder.md``, "Residual scoring").

The paper's similarity asks "is this machine unlike the others now?" and answers with a
yardstick taken from the window itself (the spread of M distances). On the ASD servers
that fails twice over (``docs/minder.md``, "Why Minder scored low"): servers have
lasting offsets from one another in some metrics (a metric that is zero on four
servers and busy on two), which pairwise distances read as anomalies every window;
and six numbers give a poor spread. Residual scoring keeps the peer comparison and
asks "is this machine's distance from its peers unusual *for this machine*?":

- at each point, the machine's *peer residual* is its value minus the median of the
  machines present there (``peers.peer_deviation``): the load every machine shares
  (daily cycles, job phases) cancels;
- per machine and metric, the residual's usual level and spread are learnt from the
  train split (median and 1.4826 x MAD, at least ``floor``): a machine that always
  runs a little hotter than its peers is not an anomaly, one that departs from its
  own usual offset is;
- per window, a machine's score in a metric is the RMS of its standardised residual.

The scores of several metrics are then fused (``fuse``): the mean score over the
metrics most telling first (``priority``), since the faults of the data touch many
metrics at once and a mean lets no single noisy metric decide.

Machines are identified by their row: the train and the scored arrays must list the
same machines in the same order. Cost O(M x T) per metric.

Legend: M machines, T grid points, K metrics, N windows.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.peers import peer_deviation, window_rms

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class OwnBaseline:
    """Per metric and machine, the usual peer residual and its spread (train split)."""

    loc_KM: F64
    scale_KM: F64


def fit_own_baseline(train_MTK: NDArray[np.floating], floor: float) -> OwnBaseline:
    """Median and 1.4826 x MAD of each machine's peer residual, per metric; a machine
    never seen in a metric gets location 0 and scale ``floor``."""
    k_all, m = train_MTK.shape[2], train_MTK.shape[0]
    loc = np.zeros((k_all, m))
    scale = np.full((k_all, m), floor, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: left at defaults
        for k in range(k_all):
            r = peer_deviation(train_MTK[:, :, k])
            med = np.nanmedian(r, axis=1)
            mad = np.nanmedian(np.abs(r - med[:, None]), axis=1)
            seen = ~np.isnan(med)
            loc[k, seen] = med[seen]
            scale[k, seen] = np.maximum(1.4826 * mad[seen], floor)
    return OwnBaseline(loc, scale)


def residual_scores(
    x_MT: NDArray[np.floating],
    starts: NDArray[np.int64],
    window: int,
    loc_M: F64,
    scale_M: F64,
) -> F64:
    """(N, M): RMS over each window of the machine's standardised peer residual; NaN
    where the machine misses a point of the window."""
    if loc_M.shape[0] != x_MT.shape[0]:
        raise ValueError(f"own baseline knows {loc_M.shape[0]} machines, {x_MT.shape[0]} given")
    z = (peer_deviation(x_MT) - loc_M[:, None]) / scale_M[:, None]
    return window_rms(z, starts, window)


def fuse(scores_KNM: F64, metrics_k: list[int]) -> F64:
    """(N, M): the mean score over the given metrics; NaN where any of them is NaN."""
    if not metrics_k:
        return np.full(scores_KNM.shape[1:], np.nan)
    return np.asarray(scores_KNM[metrics_k].mean(axis=0))
