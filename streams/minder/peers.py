"""Peer scoring: how far each machine lies from the median machine, in units of how far
healthy peers usually disagree in that metric (``docs/minder.md``, "Peer scoring").

The paper's similarity (``similarity``) compares every machine's window with every
other's and standardises the result per window by the machines' own spread (median
and MAD of M distances). With a handful of machines that spread is estimated from a
handful of numbers: one quiet window makes a small wobble look large, and two machines
failing alike pull the spread up and hide each other. Peer scoring keeps the idea (a
faulty machine is unlike its peers) and changes the yardstick:

- at each point, a machine's *peer deviation* is its value minus the median of the
  machines present there (the median is untouched by a minority of faulty machines);
- the unit is learnt once per metric from normal data (the train split): ``scale`` is
  1.4826 x the median absolute peer deviation over all machines and points, i.e. the
  standard deviation of a healthy machine's disagreement with its peers (at least
  ``floor``, so that a metric on which healthy machines agree exactly does not turn
  rounding into alarms);
- a machine's score in a window is the root mean square of its scaled deviation.

It also costs O(M x T) per metric instead of O(M^2) per window.

Legend: M machines, T grid points, N windows.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from rankwatch.streams.minder.similarity import MIN_MACHINES

F64 = NDArray[np.float64]


def peer_deviation(x_MT: NDArray[np.floating]) -> F64:
    """Each machine's value minus the median of the machines present at that point;
    NaN where the machine is missing or fewer than ``MIN_MACHINES`` are present."""
    x = np.asarray(x_MT, dtype=np.float64)
    missing = np.isnan(x)
    if not missing.any():
        return np.asarray(x - np.median(x, axis=0))
    present_T = (~missing).sum(axis=0)
    filled = np.where(missing, np.inf, x)  # sorted last, never the median of the present
    ordered = np.sort(filled, axis=0)
    lo = np.clip((present_T - 1) // 2, 0, None)
    hi = np.clip(present_T // 2, 0, None)
    cols = np.arange(x.shape[1])
    median_T = (ordered[lo, cols] + ordered[hi, cols]) / 2
    median_T[present_T < MIN_MACHINES] = np.nan
    return np.asarray(x - median_T)


def fit_peer_scale(train_MT: NDArray[np.floating], floor: float) -> float:
    """The metric's unit: 1.4826 x the median |peer deviation| over normal data."""
    dev = np.abs(peer_deviation(train_MT))
    dev = dev[~np.isnan(dev)]
    level = 1.4826 * float(np.median(dev)) if dev.size else 0.0
    return max(level, floor)


def peer_scores(
    x_MT: NDArray[np.floating], starts: NDArray[np.int64], window: int, scale: float
) -> F64:
    """(N, M): RMS of each machine's scaled peer deviation over each window; NaN where
    the machine misses a point of the window."""
    return window_rms(peer_deviation(x_MT) / scale, starts, window)


def window_rms(z_MT: F64, starts: NDArray[np.int64], window: int) -> F64:
    """(N, M): root mean square of each row over each window; NaN where the row misses
    a point of the window."""
    gaps = np.isnan(z_MT)
    zeros = np.zeros((z_MT.shape[0], 1))
    sq = np.concatenate([zeros, np.cumsum(np.where(gaps, 0.0, z_MT * z_MT), axis=1)], axis=1)
    holes = np.concatenate([zeros, np.cumsum(gaps, axis=1)], axis=1)
    mean_sq = (sq[:, starts + window] - sq[:, starts]) / window
    out = np.sqrt(np.maximum(mean_sq, 0.0))
    out[(holes[:, starts + window] - holes[:, starts]) > 0] = np.nan
    return np.asarray(out.T)
